"""Tent one batch after another, transcribed from the official Tent.forward, forward_and_adapt, configure_model and
collect_params (DequanWang/tent@7d236b4 tent.py), the norm layers TTABC's CLIP version collects, in any dtype (the
tests run it in float64 as the truth and in float32 to measure float32's drift). The classifier is CLIP's zero-shot
head over the class text features `text` [K, d]."""

from __future__ import annotations

from copy import deepcopy

import torch
import torch.nn as nn
import torch.nn.functional as F

NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)


def softmax_entropy(x: torch.Tensor) -> torch.Tensor:
    return -(x.softmax(1) * x.log_softmax(1)).sum(1)


def configure(vision: nn.Module, dtype: torch.dtype, skip: tuple[str, ...] = ()) -> tuple[nn.Module, list]:
    """A copy of the tower in `dtype` set up as configure_model does, and the norm layers' affine parameters
    (collect_params; module names containing any of `skip` left out, SAR's rule)."""
    model = deepcopy(vision).to(dtype)
    model.train()
    model.requires_grad_(False)
    params = []
    for nm, m in model.named_modules():
        if isinstance(m, nn.BatchNorm2d):
            m.track_running_stats = False
            m.running_mean = None
            m.running_var = None
        if isinstance(m, NORMS) and not any(s in nm for s in skip):
            for np_, p in m.named_parameters(recurse=False):
                if np_ in ("weight", "bias"):
                    p.requires_grad_(True)
                    params.append(p)
    return model, params


def clip_logits(model: nn.Module, x: torch.Tensor, text: torch.Tensor, logit_scale: float) -> torch.Tensor:
    return logit_scale * F.normalize(model(x), dim=-1) @ text.T


def run_reference(images: torch.Tensor, vision: nn.Module, text: torch.Tensor, *, batch_size: int, lr: float,
                  optimizer: str = "adam", steps: int = 1, episodic: bool = False, logit_scale: float = 100.0,
                  dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """[n, 3, H, W] images -> [n, K] posteriors in stream order."""
    model, params = configure(vision, dtype)
    opt = (torch.optim.Adam(params, lr=lr, betas=(0.9, 0.999), weight_decay=0.0) if optimizer == "adam"
           else torch.optim.SGD(params, lr=lr, momentum=0.9))
    model_state, optimizer_state = deepcopy(model.state_dict()), deepcopy(opt.state_dict())
    text = text.to(dtype)
    out = []
    for s in range(0, images.shape[0], batch_size):
        x = images[s:s + batch_size].to(dtype)
        if episodic:
            model.load_state_dict(model_state, strict=True)
            opt.load_state_dict(optimizer_state)
        for _ in range(steps):
            with torch.enable_grad():
                outputs = clip_logits(model, x, text, logit_scale)
                loss = softmax_entropy(outputs).mean(0)
                loss.backward()
                opt.step()
                opt.zero_grad()
        out.append(outputs.detach().softmax(1))
    return torch.cat(out)
