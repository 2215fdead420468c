"""SAR one batch after another, transcribed from the official SAR.forward, forward_and_adapt_sar, update_ema,
collect_params (mr-eggplant/SAR@492c1ad sar.py) and SAM's first_step / second_step (sam.py, adaptive=False), in any
dtype (the tests run it in float64 as the truth and in float32 to measure float32's drift)."""

from __future__ import annotations

import math
from copy import deepcopy

import numpy as np
import torch

from orchestrator.methods.tent.reference import clip_logits, configure, softmax_entropy


def run_reference(images: torch.Tensor, vision: torch.nn.Module, text: torch.Tensor, *, batch_size: int, lr: float,
                  margin: float = 0.4, reset_constant: float = 0.2, rho: float = 0.05, steps: int = 1,
                  episodic: bool = False, logit_scale: float = 100.0,
                  dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, int]:
    """[n, 3, H, W] images -> ([n, K] posteriors in stream order, how many times the model was recovered)."""
    model, params = configure(vision, dtype, skip=("layer4", "blocks.9", "blocks.10", "blocks.11", "norm."))
    base = torch.optim.SGD(params, lr=lr, momentum=0.9)
    model_state, optimizer_state = deepcopy(model.state_dict()), deepcopy(base.state_dict())
    margin_e0 = margin * math.log(text.shape[0])
    text = text.to(dtype)
    ema, resets, out = None, 0, []
    old: dict[int, torch.Tensor] = {}

    def reset() -> None:
        model.load_state_dict(model_state, strict=True)
        base.load_state_dict(optimizer_state)

    for s in range(0, images.shape[0], batch_size):
        x = images[s:s + batch_size].to(dtype)
        if episodic:
            reset()
            ema = None
        for _ in range(steps):
            with torch.enable_grad():
                base.zero_grad()
                outputs = clip_logits(model, x, text, logit_scale)
                entropys = softmax_entropy(outputs)
                filter_ids_1 = torch.where(entropys < margin_e0)
                entropys[filter_ids_1].mean(0).backward()
                with torch.no_grad():  # SAM first_step: climb to w + rho g / ||g||
                    grad_norm = torch.norm(torch.stack([p.grad.norm(p=2) for p in params if p.grad is not None]), p=2)
                    scale = rho / (grad_norm + 1e-12)
                    for p in params:
                        if p.grad is not None:
                            old[id(p)] = p.data.clone()
                            p.add_(p.grad * scale.to(p))
                base.zero_grad()
                entropys2 = softmax_entropy(clip_logits(model, x, text, logit_scale))[filter_ids_1]
                filter_ids_2 = torch.where(entropys2 < margin_e0)
                loss_second = entropys2[filter_ids_2].mean(0)
                if not np.isnan(loss_second.item()):
                    ema = loss_second.item() if ema is None else 0.9 * ema + (1 - 0.9) * loss_second.item()
                loss_second.backward()
                with torch.no_grad():  # SAM second_step: back to w, step the base optimiser there
                    for p in params:
                        if p.grad is not None:
                            p.data = old[id(p)]
                base.step()
                base.zero_grad()
            if ema is not None and ema < reset_constant:
                reset()  # SAR.forward: reset() clears the ema, then `self.ema = ema` restores it
                resets += 1
        out.append(outputs.detach().softmax(1))
    return torch.cat(out), resets
