"""BATCLIP one batch after another, transcribed from the official OURS.forward_and_adapt, configure_model and
collect_params (sarthaxxxxx/BATCLIP@7a3b716 classification/methods/ours.py), its losses' loops (utils/losses.py:
Entropy, I2TLoss, InterMeanLoss), ZeroShotCLIP.forward with the text encoder run on the tokenized prompts
(models/model.py) and the episodic reset of methods/base.py, on a whole open_clip CLIP model in any dtype (the tests
run it in float64 as the truth and in float32 to measure float32's drift)."""

from __future__ import annotations

from copy import deepcopy

import torch
import torch.nn as nn

NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)


def i2t_loss(logits: torch.Tensor, img_feats: torch.Tensor, text_norm_feats: torch.Tensor) -> torch.Tensor:
    labels = torch.argmax(logits.softmax(1), dim=1)
    loss = 0.0
    for label in torch.unique(labels, sorted=True).tolist():
        mean_feats = img_feats[labels == label].mean(0)
        loss += torch.matmul(mean_feats.unsqueeze(0), text_norm_feats[label].unsqueeze(0).t()).mean()
    return loss / len(torch.unique(labels))


def inter_mean_loss(logits: torch.Tensor, img_feats: torch.Tensor) -> torch.Tensor:
    labels = torch.argmax(logits.softmax(1), dim=1)
    mean_feats = []
    for label in torch.unique(labels, sorted=True).tolist():
        mean = img_feats[labels == label].mean(0)
        mean_feats.append(mean / mean.norm())
    loss = 1 - torch.matmul(torch.stack(mean_feats), torch.stack(mean_feats).t())
    loss.fill_diagonal_(0)
    return loss.sum()


def run_reference(images: torch.Tensor, clip: nn.Module, tokens: torch.Tensor, *, batch_size: int, lr: float,
                  optimizer: str = "adamw", weight_decay: float = 0.01, steps: int = 1, episodic: bool = False,
                  logit_scale: float = 100.0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """[n, 3, H, W] images, `clip` an open_clip CLIP, `tokens` [K, L] the tokenized class prompts -> [n, K]
    posteriors in stream order."""
    model = deepcopy(clip).to(dtype)
    model.eval()
    model.requires_grad_(False)
    params = []
    for m in model.modules():  # configure_model, then collect_params over the same modules
        if isinstance(m, NORMS):
            m.train()
            m.requires_grad_(True)
            if isinstance(m, nn.BatchNorm2d):
                m.track_running_stats = False
                m.running_mean = None
                m.running_var = None
            params += [p for name, p in m.named_parameters() if name in ("weight", "bias")]
    adam = torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam
    opt = adam(params, lr=lr, betas=(0.9, 0.999), weight_decay=weight_decay)
    model_state, optimizer_state = deepcopy(model.state_dict()), deepcopy(opt.state_dict())
    out = []
    for s in range(0, images.shape[0], batch_size):
        x = images[s:s + batch_size].to(dtype)
        if episodic:
            model.load_state_dict(model_state, strict=True)
            opt.load_state_dict(optimizer_state)
        for _ in range(steps):
            with torch.enable_grad():
                img_pre_features = model.encode_image(x)
                img_features = img_pre_features / img_pre_features.norm(dim=1, keepdim=True)
                text_pre_features = model.encode_text(tokens)
                text_features = text_pre_features / text_pre_features.norm(dim=1, keepdim=True)
                logits = logit_scale * img_features @ text_features.T
                loss = -(logits.softmax(1) * logits.log_softmax(1)).sum(1).mean(0)
                loss -= i2t_loss(logits, img_pre_features, text_features)
                loss -= inter_mean_loss(logits, img_pre_features)
                opt.zero_grad()
                loss.backward()
                opt.step()
        out.append(logits.detach().softmax(1))
    return torch.cat(out)
