"""MaPLe's deep-prompted forward of open_clip's CLIP towers (muzairkhattak/multimodal-prompt-learning, clip/model.py:
VisionTransformer_MaPLe, TextEncoder, ResidualAttentionBlock_MaPLe), from the prompts themselves: pure tensor code, which
`orchestrator.clip.maple` runs with a released file's prompts and PromptAlign (`orchestrator.methods.promptalign`)
with the prompts it tunes. The equations: `orchestrator.clip.maple`'s docstring."""

from __future__ import annotations

from typing import Callable

import torch


def _blocks(transformer: torch.nn.Module, x: torch.Tensor, prompts: list[torch.Tensor],
            splice: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
            attn_mask: torch.Tensor | None = None, inputs: list[torch.Tensor] | None = None) -> torch.Tensor:
    """open_clip's Transformer.forward on batch-first x, `splice(x, prompts[j])` before block j (1 <= j < len);
    each block's input (after the splice) appended to `inputs` where given."""
    if len(prompts) > len(transformer.resblocks):
        raise ValueError(f"MaPLe prompt depth {len(prompts)} exceeds the tower's {len(transformer.resblocks)} layers")
    lnd = not getattr(transformer, "batch_first", True)
    for j, block in enumerate(transformer.resblocks):
        if 1 <= j < len(prompts):
            x = splice(x, prompts[j])
        if inputs is not None:
            inputs.append(x)
        x = block(x.transpose(0, 1), attn_mask=attn_mask).transpose(0, 1) if lnd else block(x, attn_mask=attn_mask)
    return x


def image_features(visual: torch.nn.Module, pixels: torch.Tensor, prompts: list[torch.Tensor],
                   inputs: list[torch.Tensor] | None = None) -> torch.Tensor:
    """[B, 3, H, W] -> [B, d] (not normalised): open_clip's VisionTransformer with MaPLe's vision prompts
    (`MapleContext.vision_prompts`, one [n, w_v] per prompted layer). `inputs`: where given, each block's input
    [B, 1 + patches + n, w_v] (class token, patches, the prompts; after the splice) is appended to it, the tokens
    PromptAlign aligns (its ResidualAttentionBlock_MaPLe's `visual_feat`)."""
    from open_clip.transformer import VisionTransformer

    if not isinstance(visual, VisionTransformer) or visual.attn_pool is not None or visual.pool_type != "tok":
        raise ValueError(f"MaPLe prompts a ViT pooled at its class token, got {type(visual).__name__}")
    n = int(prompts[0].shape[0])
    x = visual.conv1(pixels)
    x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
    b = x.shape[0]
    x = torch.cat([visual.class_embedding.view(1, 1, -1).expand(b, -1, -1).to(x.dtype), x], dim=1)
    x = x + visual.positional_embedding.to(x.dtype)
    x = torch.cat([x, prompts[0].to(x.dtype).expand(b, -1, -1)], dim=1)
    x = visual.ln_pre(x)
    x = _blocks(visual.transformer, x, prompts,
                lambda x, p: torch.cat([x[:, :-n], p.to(x.dtype).expand(x.shape[0], -1, -1)], dim=1),
                inputs=inputs)
    pooled = visual.ln_post(x[:, 0])
    return pooled @ visual.proj if visual.proj is not None else pooled


def prompted_text(clip: torch.nn.Module, tokens: torch.Tensor, prompts: list[torch.Tensor]) -> torch.Tensor:
    """`text_features` from the text prompts themselves, one [n, w_t] per prompted layer (the context first): clip
    is open_clip's CLIP or its text tower (`orchestrator.methods.prompt.TextTower`)."""
    if getattr(clip, "text_pool_type", None) != "argmax" or not hasattr(clip, "token_embedding"):
        raise ValueError(f"MaPLe's text prompts need open_clip's CLIP text tower pooled at the end-of-text token, got "
                         f"{type(clip).__name__}")
    n = int(prompts[0].shape[0])
    x = clip.token_embedding(tokens)
    k = x.shape[0]
    prompts = [p.to(x.device) for p in prompts]

    def splice(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[:, :1], p.to(x.dtype).expand(k, -1, -1), x[:, 1 + n:]], dim=1)

    x = splice(x, prompts[0]) + clip.positional_embedding.to(x.dtype)
    x = _blocks(clip.transformer, x, prompts, splice, attn_mask=clip.attn_mask)
    x = clip.ln_final(x)
    x = x[torch.arange(k, device=x.device), tokens.argmax(dim=-1)]
    if isinstance(clip.text_projection, torch.nn.Linear):
        return clip.text_projection(x)
    return x @ clip.text_projection
