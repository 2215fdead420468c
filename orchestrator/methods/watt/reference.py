"""WATT one batch after another, transcribed from the official WATT.adapt / perform_adaptation / evaluate,
set_ln_grads, collect_ln_params, weight_average and cross_entropy (Mehrdad-Noori/WATT@89d5089 adapt/watt.py) and
CLIP.forward with a text ensemble (clip/model.py), with main.py's reset before every batch, in any dtype (the tests
run it in float64 as the truth and in float32 to measure float32's drift). `templates` [t, K, d] holds each
template's unit class text embeddings."""

from __future__ import annotations

import copy
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F


def cross_entropy(preds: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (-targets * nn.LogSoftmax(dim=-1)(preds)).sum(1).mean()


def ln_weights(model: nn.Module) -> OrderedDict:
    weights = OrderedDict()
    for name, module in model.named_modules():
        if isinstance(module, nn.LayerNorm):
            for nparam, p in module.named_parameters():
                if nparam in ("weight", "bias"):
                    weights[f"{name}.{nparam}"] = copy.deepcopy(p)
    return weights


def weight_average(all_weights: list) -> OrderedDict:
    avg = OrderedDict()
    for name in all_weights[0]:
        avg[name] = sum(sd[name] for sd in all_weights) / len(all_weights)
    return avg


def run_reference(images: torch.Tensor, vision: nn.Module, templates: torch.Tensor, *, batch_size: int, lr: float,
                  variant: str = "sequential", template_steps: int = 2, rounds: int = 5, logit_scale: float = 100.0,
                  dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """[n, 3, H, W] images -> [n, K] posteriors in stream order."""
    model = copy.deepcopy(vision).to(dtype).eval()  # clip.load's model, never put in train mode
    model.requires_grad_(False)
    params = []
    for m in model.modules():
        if isinstance(m, nn.LayerNorm):
            m.requires_grad_(True)
            params += [p for n, p in m.named_parameters() if n in ("weight", "bias")]
    optimizer = torch.optim.Adam(params, lr=lr, betas=(0.9, 0.999), weight_decay=0.0)
    model_state, optimizer_state = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    templates = templates.to(dtype)
    text_eval = F.normalize(templates.mean(0), dim=-1)
    out = []
    for s in range(0, images.shape[0], batch_size):
        x = images[s:s + batch_size].to(dtype)
        model.load_state_dict(model_state, strict=True)
        optimizer.load_state_dict(optimizer_state)
        for m in range(rounds):
            all_weights = []
            if variant == "sequential":
                if m == 0:
                    model.load_state_dict(model_state, strict=True)
                    optimizer.load_state_dict(optimizer_state)
                else:
                    model.load_state_dict(avg_state_dict, strict=False)
            for text_feat in templates:
                if variant == "parallel":
                    if m == 0:
                        model.load_state_dict(model_state, strict=True)
                        optimizer.load_state_dict(optimizer_state)
                    else:
                        model.load_state_dict(avg_state_dict, strict=False)
                for _ in range(template_steps):
                    with torch.no_grad():
                        image_features = model(x)
                    image_features = image_features / image_features.norm(dim=-1, keepdim=True)
                    pred = (logit_scale * image_features @ text_feat.t()).softmax(1).topk(1, 1, True, True)[1]
                    pred_inputs = torch.cat([text_feat[c, ] for c in pred])
                    with torch.enable_grad():
                        image_features = model(x)
                        image_features = image_features / image_features.norm(dim=1, keepdim=True)
                        logits = logit_scale * pred_inputs @ image_features.t()
                        targets = F.softmax(((image_features @ image_features.t() + pred_inputs @ pred_inputs.t())
                                             / 2) / 0.01, dim=-1)
                        cross_entropy(logits.t(), targets.t()).backward()
                    optimizer.step()
                    optimizer.zero_grad()
                all_weights.append(ln_weights(model))
            avg_state_dict = weight_average(all_weights)
        model.load_state_dict(avg_state_dict, strict=False)
        with torch.no_grad():
            features = F.normalize(model(x), dim=-1)
            out.append((logit_scale * features @ text_eval.T).softmax(dim=-1))
    return torch.cat(out)
