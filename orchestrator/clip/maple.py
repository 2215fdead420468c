"""MaPLe's deep-prompted forward of open_clip's CLIP towers (Khattak et al., CVPR 2023; muzairkhattak/
multimodal-prompt-learning, trainers/maple.py and clip/model.py), for the prompts of a released file
(`orchestrator.clip.context.MapleContext`).

With n = n_ctx, depth D and the vision prompts P_0 = proj(ctx), P_j = proj_j(T_j) (T_j the text prompt of layer j):

    text    class k's prompt "<prefix> <name_k>." tokenized (prefix: MaPLe's CTX_INIT "a photo of a" when n <= 4,
            else "X" * n, as its prompt learner lays it out), its token embeddings at positions 1..n replaced by ctx,
            plus the positional embedding; before block j (1 <= j < D) positions 1..n are replaced by T_j; then
            ln_final, the end-of-text token, the text projection (TextEncoder.forward, ResidualAttentionBlock_MaPLe).
    vision  the patch tokens with the class token and positional embedding, P_0 appended after them, then ln_pre;
            before block j (1 <= j < D) the last n tokens are replaced by P_j; then ln_post of the class token and
            the projection (VisionTransformer_MaPLe.forward).

Every class and image shares the same prompts. Deeper prompts beyond the towers' layers are refused (MaPLe's code
would leave them unused). The towers must be open_clip's CLIP layout: a ViT image tower pooled at its class token,
and a text tower with a start token, pooled at the end-of-text token; `fit_issue` checks a model config for it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from orchestrator.clip.context import MapleContext
from orchestrator.methods.maple import image_features, prompted_text

CTX_INIT = "a photo of a"   # MaPLe's configs (configs/trainers/MaPLe/*.yaml: CTX_INIT), used when N_CTX <= 4


def prompt_prefix(n_ctx: int) -> str:
    """The words before a class name in MaPLe's prompts: its init when it has at least n_ctx words, else X's."""
    return CTX_INIT if n_ctx <= 4 else " ".join(["X"] * n_ctx)


def fit_issue(context: MapleContext, model: str, cfg: dict[str, Any]) -> str | None:
    """What keeps a MaPLe file from prompting the open_clip model `model` of config `cfg`, or None."""
    vision, text = cfg.get("vision_cfg", {}), cfg.get("text_cfg", {})
    where = f"context file {context.path}"
    if not isinstance(vision.get("layers", 12), int) or vision.get("timm_model_name") or vision.get("attentional_pool") \
            or vision.get("pool_type", "tok") != "tok":
        return (f"{where}: MaPLe prompts a ViT's tokens and reads its class token; {model}'s image tower is not "
                f"open_clip's ViT pooled at the class token; expected a ViT backbone (MaPLe's are ViT-B/16)")
    if cfg.get("custom_text") or text.get("hf_model_name") or text.get("pool_type", "argmax") != "argmax" \
            or text.get("no_causal_mask"):
        return (f"{where}: MaPLe's text prompts follow a start token and are read at the end-of-text token; "
                f"{model}'s text tower is not open_clip's CLIP text tower (causal, pooled at the end-of-text token)")
    widths = (int(text.get("width", 512)), int(vision.get("width", 768)))
    if (context.text_width, context.vision_width) != widths:
        return (f"{where}: its prompts are {context.text_width} wide in text and {context.vision_width} in vision; "
                f"{model}'s towers are {widths[0]} and {widths[1]}; expected a file learnt on the same CLIP model")
    patch = vision.get("patch_size")
    if context.patch_size is not None and patch is not None and context.patch_size != int(patch):
        return (f"{where}: it was learnt on a ViT of patch size {context.patch_size} (its image_encoder.conv1.weight); "
                f"{model}'s is {patch}; expected a file learnt on the same CLIP model")
    layers = min(int(text.get("layers", 12)), int(vision.get("layers", 12)))
    if context.depth > layers:
        return (f"{where}: prompt depth {context.depth} (ctx and {context.depth - 1} compound prompts) exceeds "
                f"{model}'s {layers} layers; expected at most {layers}")
    if 1 + context.n_ctx + 2 > int(text.get("context_length", 77)):
        return f"{where}: {context.n_ctx} context vectors leave no room for a class name"
    return None


def class_tokens(tokenizer: Any, class_names: list[str], n_ctx: int) -> torch.Tensor:
    """[K, L] MaPLe's class prompts tokenized (underscores in names read as spaces, as its prompt learner does)."""
    prefix = prompt_prefix(n_ctx)
    return tokenizer([f"{prefix} {name.replace('_', ' ')}." for name in class_names])


def text_features(clip: torch.nn.Module, tokens: torch.Tensor, context: MapleContext) -> torch.Tensor:
    """[K, L] class prompts (`class_tokens`) -> [K, d] (not normalised): open_clip's CLIP.encode_text with MaPLe's
    text context in the first layer and its compound prompts in the next."""
    return prompted_text(clip, tokens, [context.ctx, *context.text_deep])


def maple_prompt_text(backbone: Any, class_names: list[str], context: MapleContext) -> Any:
    """What a method tuning MaPLe's prompts takes as its text side (`orchestrator.methods.prompt.PromptText`): the
    backbone's text tower, MaPLe's class prompts (`class_tokens`) and the file's context, on the backbone's device."""
    from orchestrator.methods.prompt import PromptText, TextTower

    names = [name.replace("_", " ") for name in class_names]
    tokens = class_tokens(backbone.tokenizer, class_names, context.n_ctx).to(backbone.device)
    return PromptText(TextTower(backbone.model), tokens, context.n_ctx, tuple(names), backbone.tokenizer,
                      context.ctx.to(backbone.device))


class PromptedEncoder:
    """A loaded backbone seen through MaPLe's prompts, as the feature cache encodes with one (`encode_images`,
    `encode_texts`, `spec`, `device`, `embed_dim`): features L2-normalised, float32, on the CPU."""

    def __init__(self, backbone: Any, context: MapleContext) -> None:
        self.backbone, self.context = backbone, context
        self.spec, self.device, self.embed_dim = backbone.spec, backbone.device, backbone.embed_dim
        self._vision = [p.to(backbone.device) for p in context.vision_prompts()]

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        self.backbone.encoder_calls += int(pixels.shape[0])
        with self.backbone.autocast():
            feats = image_features(self.backbone.model.visual, pixels.to(self.device, non_blocking=True),
                                   self._vision)
        return F.normalize(feats.float(), dim=-1).cpu()

    @torch.no_grad()
    def class_features(self, class_names: list[str]) -> torch.Tensor:
        """[K, d] each class's MaPLe prompt through the prompted text tower."""
        tokens = class_tokens(self.backbone.tokenizer, class_names, self.context.n_ctx).to(self.device)
        with self.backbone.autocast():
            feats = text_features(self.backbone.model, tokens, self.context)
        return F.normalize(feats.float(), dim=-1).cpu()
