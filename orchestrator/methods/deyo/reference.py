"""DeYO one batch after another, transcribed from the official forward_and_adapt_deyo, collect_params and
configure_model (Jhyun17/DeYO@35ce821 methods/deyo.py, config.py's defaults: the 'patch' augmentation, both filters
and both weights on) in any dtype, the patch shuffle's permutation drawn as the method draws it (a generator seeded
with the samples seen before the batch). The tests run it in float64 as the truth and in float32 to measure
float32's drift."""

from __future__ import annotations

import math

import torch
import torchvision

from orchestrator.methods.tent.reference import clip_logits, configure, softmax_entropy


def shuffle_patches(x_prime: torch.Tensor, patch_len: int, generator: torch.Generator) -> torch.Tensor:
    """deyo.py's aug_type 'patch', its einops rearranges written as reshapes."""
    side = x_prime.shape[-1]
    resize_t = torchvision.transforms.Resize(((side // patch_len) * patch_len, (side // patch_len) * patch_len))
    resize_o = torchvision.transforms.Resize((side, side))
    x_prime = resize_t(x_prime)
    b, c, H, W = x_prime.shape
    h, w = H // patch_len, W // patch_len
    # 'b c (ps1 h) (ps2 w) -> b (ps1 ps2) c h w'
    x_prime = x_prime.reshape(b, c, patch_len, h, patch_len, w).permute(0, 2, 4, 1, 3, 5).reshape(
        b, patch_len * patch_len, c, h, w)
    perm_idx = torch.argsort(torch.rand(x_prime.shape[0], x_prime.shape[1], generator=generator), dim=-1)
    x_prime = x_prime[torch.arange(x_prime.shape[0]).unsqueeze(-1), perm_idx]
    # 'b (ps1 ps2) c h w -> b c (ps1 h) (ps2 w)'
    x_prime = x_prime.reshape(b, patch_len, patch_len, c, h, w).permute(0, 3, 1, 4, 2, 5).reshape(b, c, H, W)
    return resize_o(x_prime)


def run_reference(images: torch.Tensor, vision: torch.nn.Module, text: torch.Tensor, *, batch_size: int, lr: float,
                  margin: float = 0.5, margin_e0: float = 0.4, plpd_threshold: float = 0.2, patch_len: int = 4,
                  steps: int = 1, logit_scale: float = 100.0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """[n, 3, H, W] images -> [n, K] posteriors in stream order."""
    model, params = configure(vision, dtype, skip=("layer4", "blocks.9", "blocks.10", "blocks.11", "norm."))
    optimizer = torch.optim.SGD(params, lr, momentum=0.9)
    deyo_margin, e0 = margin * math.log(text.shape[0]), margin_e0 * math.log(text.shape[0])
    text = text.to(dtype)
    out = []
    for s in range(0, images.shape[0], batch_size):
        x = images[s:s + batch_size].to(dtype)
        generator = torch.Generator().manual_seed(s)
        for _ in range(steps):
            with torch.enable_grad():
                outputs = clip_logits(model, x, text, logit_scale)
                optimizer.zero_grad()
                entropys = softmax_entropy(outputs)
                filter_ids_1 = torch.where(entropys < deyo_margin)
                entropys = entropys[filter_ids_1]
                if len(entropys) == 0:
                    continue
                x_prime = shuffle_patches(x[filter_ids_1].detach(), patch_len, generator)
                with torch.no_grad():
                    outputs_prime = clip_logits(model, x_prime, text, logit_scale)
                prob_outputs = outputs[filter_ids_1].softmax(1)
                prob_outputs_prime = outputs_prime.softmax(1)
                cls1 = prob_outputs.argmax(dim=1)
                plpd = (torch.gather(prob_outputs, dim=1, index=cls1.reshape(-1, 1))
                        - torch.gather(prob_outputs_prime, dim=1, index=cls1.reshape(-1, 1))).reshape(-1)
                filter_ids_2 = torch.where(plpd > plpd_threshold)
                entropys = entropys[filter_ids_2]
                if len(entropys) == 0:
                    continue
                plpd = plpd[filter_ids_2]
                coeff = 1 / torch.exp(entropys.clone().detach() - e0) + 1 / torch.exp(-1.0 * plpd.clone().detach())
                entropys.mul(coeff).mean(0).backward()
                optimizer.step()
                optimizer.zero_grad()
        out.append(outputs.detach().softmax(1))
    return torch.cat(out)
