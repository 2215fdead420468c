"""Numerics shared by methods that follow official half-precision code: a GPU's float16 product, and the public
TDA code's averaged-view entropy operation for operation."""

from __future__ import annotations

import math

import torch


def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b as a GPU's half-precision GEMM computes it for float16 operands (float32 accumulation, one rounding
    of the result), whatever the device: a CPU's float16 product accumulates otherwise. Plain a @ b in float32."""
    return (a.float() @ b.float()).to(a.dtype)


def avg_entropy(logits: torch.Tensor) -> torch.Tensor:
    """[..., k, K] logits of k views -> [...]: entropy of the views' averaged softmax, computed as the public
    code's avg_entropy (log-mean-exp of the log-softmaxes, clamped to the dtype's finite range), operation for
    operation: its log-softmax is z - logsumexp(z), two roundings in float16."""
    log_p = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    avg = torch.logsumexp(log_p, dim=-2) - math.log(logits.shape[-2])
    avg = torch.clamp(avg, min=torch.finfo(avg.dtype).min)
    return -(avg * torch.exp(avg)).sum(dim=-1)
