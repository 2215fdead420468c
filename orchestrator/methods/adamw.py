"""AdamW's first step from a fresh optimizer at a zero parameter, written out: DPE and TPS take one such step
per sample, from zero, and each writes its own around this (DPE the step, TPS an lr-free direction that a
pack's learning rates share).

torch.optim.AdamW (its single-tensor path, default betas) at step 1 from zero moments: weight decay leaves
the zero parameter at zero, m = (1 - b1) g, v = (1 - b2) g g, and the step is
-(lr / (1 - b1)) m / (sqrt(v) / sqrt(1 - b2) + eps), rounded operation by operation in that order.
"""

from __future__ import annotations

import math

import torch

BETA1, BETA2 = 0.9, 0.999  # torch.optim.AdamW's defaults, which both methods' optimizers keep


def denominator(grad: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """sqrt(v) / sqrt(1 - b2) + eps with v = (1 - b2) g g, as torch rounds it (into `out` when given)."""
    return torch.mul(grad, 1 - BETA2, out=out).mul_(grad).sqrt_().div_(math.sqrt(1 - BETA2)).add_(eps)


def first_step(grad: torch.Tensor, lr: torch.Tensor, eps: float) -> torch.Tensor:
    """The step itself, bitwise torch's for the same gradient. lr: float64, broadcasting against grad (e.g.
    one per stream)."""
    return (-lr / (1 - BETA1)).float() * (grad * (1 - BETA1)) / denominator(grad, eps)
