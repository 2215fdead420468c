"""CLIPArTT one batch after another, transcribed from the official forward_and_adapt (target_method 1), getprompt,
cross_entropy, configure_model and collect_params (dosowiechi/CLIPArTT@6f439ba models/tent.py) and adapt.py's loop
(the reset before every batch, the class prompts 'a photo of a {c}', the prediction after adapting), on a whole
open_clip CLIP model in any dtype (the tests run it in float64 as the truth and in float32 to measure float32's
drift)."""

from __future__ import annotations

from copy import deepcopy
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


def getprompt(K: int, c: list[int], classes: list[str]) -> str:
    for k in range(K):
        if k == 0:
            text_prompt = "a photo of a " + classes[c[k]]
        else:
            text_prompt = text_prompt + " or " + classes[c[k]]
    return text_prompt


def cross_entropy(preds: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (-targets * nn.LogSoftmax(dim=-1)(preds)).sum(1).mean()


def run_reference(images: torch.Tensor, clip: nn.Module, tokenize: Callable, classes: list[str], *, batch_size: int,
                  lr: float = 1e-3, steps: int = 10, top_k: int = 3, temperature: float = 0.01,
                  episodic: bool = True, logit_scale: float = 100.0, dtype: torch.dtype = torch.float64
                  ) -> torch.Tensor:
    """[n, 3, H, W] images, `clip` an open_clip CLIP, `tokenize` its tokenizer -> [n, K] posteriors in stream
    order."""
    model = deepcopy(clip).to(dtype)
    model.requires_grad_(False)
    model.visual.train()  # configure_model (model.visual); the ViT's LayerNorms are mode-free
    params = []
    for m in model.visual.modules():
        if isinstance(m, (nn.LayerNorm, nn.BatchNorm2d)):  # the ViT's LayerNorms, a ResNet's BatchNorm2d
            m.requires_grad_(True)
            if isinstance(m, nn.BatchNorm2d):
                m.track_running_stats = False
                m.running_mean = None
                m.running_var = None
            params += [p for name, p in m.named_parameters() if name in ("weight", "bias")]
    opt = torch.optim.Adam(params, lr=lr, betas=(0.9, 0.999), weight_decay=0.0)
    model_state, optimizer_state = deepcopy(model.state_dict()), deepcopy(opt.state_dict())
    text_inputs = tokenize([f"a photo of a {c}" for c in classes])

    def forward(image: torch.Tensor, text: torch.Tensor):  # the repository's CLIP.forward (clip/model.py)
        image_features = model.encode_image(image)
        text_features = model.encode_text(text)
        image_features = image_features / image_features.norm(dim=1, keepdim=True)
        text_features = text_features / text_features.norm(dim=1, keepdim=True)
        return logit_scale * text_features @ image_features.t(), image_features, text_features

    out = []
    for s in range(0, images.shape[0], batch_size):
        x = images[s:s + batch_size].to(dtype)
        if episodic:
            model.load_state_dict(model_state, strict=True)
            opt.load_state_dict(optimizer_state)
        for _ in range(steps):
            with torch.enable_grad():
                with torch.no_grad():
                    image_features = model.encode_image(x)
                    text_features = model.encode_text(text_inputs)
                image_features = image_features / image_features.norm(dim=-1, keepdim=True)
                text_features = text_features / text_features.norm(dim=-1, keepdim=True)
                similarity = (logit_scale * image_features @ text_features.T).softmax(dim=-1)
                _, pred = similarity.topk(top_k, 1, True, True)
                pred_inputs = tokenize([getprompt(top_k, c, classes) for c in pred.tolist()])
                logits, image_features, text_features = forward(x, pred_inputs)
                images_similarity = image_features @ image_features.t()
                texts_similarity = text_features @ text_features.t()
                targets = F.softmax(((images_similarity + texts_similarity) / 2) / temperature, dim=-1)
                loss = cross_entropy(logits.t(), targets.t())
                loss.backward()
                opt.step()
                opt.zero_grad()
        with torch.no_grad():
            image_features = model.encode_image(x)
            text_features = model.encode_text(text_inputs)
            image_features = image_features / image_features.norm(dim=-1, keepdim=True)
            text_features = text_features / text_features.norm(dim=-1, keepdim=True)
            out.append((logit_scale * image_features @ text_features.T).softmax(dim=-1))
    return torch.cat(out)
