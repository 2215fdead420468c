"""Auxiliary image encoders: a second vision model whose features the feature cache stores beside CLIP's, for the
same images and the same views (COSMIC reads DINOv2's next to CLIP's).

An auxiliary encoder sees exactly the pixels the CLIP backbone sees (its eval transform and views): COSMIC's
official code feeds DINOv2 the CLIP-normalised 224-px views (hf618/COSMIC cosmic_main.py, get_image_features_aux).
Its feature is the L2-normalised final-norm CLS token (DINOv2's `x_norm_clstoken`), float32 on the CPU.

DINOv2 (facebookresearch/dinov2) runs as timm's VisionTransformer with the DINOv2 architecture (LayerScale,
registers, no class-token position): checkpoints in the official format (`dinov2_vitl14_reg4_pretrain.pth`, keys
`cls_token`, `pos_embed`, `register_tokens`, `mask_token`, `blocks.N.ls1.gamma`, ...) are converted on load. The
official model interpolates its 37x37 position grid at every forward (bicubic, scale factor (g + 0.1) / 37, no
antialiasing: DinoVisionTransformer.interpolate_pos_encoding); here that is done once, the same way, for the
backbone's image size. `pretrained: random` builds random weights from a fixed seed (tests and smoke runs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from orchestrator.clip.backbone import RANDOM_INIT_SEED, WeightsNotFoundError, file_sha256
from orchestrator.device import auto_device
from orchestrator.registry.card import AUXILIARY_ENCODERS

PATCH = 14
INTERPOLATE_OFFSET = 0.1  # the official interpolate_offset
# DINOv2 with 4 registers (the hub's dinov2_vit*14_reg): width, depth, heads. bca-tiny-dinov2 is the same
# architecture at toy size, for tests and smoke runs.
ARCHS = {
    "vits14_reg": (384, 12, 6),
    "vitb14_reg": (768, 12, 12),
    "vitl14_reg": (1024, 24, 16),
    "bca-tiny-dinov2": (32, 2, 2),
}
REGISTERS = 4


@dataclass(frozen=True)
class AuxiliarySpec:
    """What names an auxiliary encoder: its kind (`dinov2`), architecture and weights (a checkpoint file in the
    official format, or None for random weights)."""

    name: str
    arch: str
    checkpoint: str | None = None

    def identity(self) -> dict[str, Any]:
        """Everything that decides its features (part of the feature cache key)."""
        weights = f"sha256:{file_sha256(self.checkpoint)}" if self.checkpoint else f"random:{RANDOM_INIT_SEED}"
        return {"name": self.name, "arch": self.arch, "weights": weights}

    @property
    def label(self) -> str:
        return f"{self.name}:{self.arch}/{'checkpoint' if self.checkpoint else 'random'}"


def check_auxiliary(spec: AuxiliarySpec) -> None:
    if spec.name not in AUXILIARY_ENCODERS:
        raise ValueError(f"auxiliary encoder {spec.name!r}: expected one of {list(AUXILIARY_ENCODERS)}")
    if spec.arch not in ARCHS:
        raise ValueError(f"auxiliary encoder {spec.name}: arch {spec.arch!r} is not one of {sorted(ARCHS)}")
    if spec.checkpoint is not None:
        import os

        if not os.path.isfile(spec.checkpoint):
            raise WeightsNotFoundError(f"auxiliary encoder {spec.name}: checkpoint {spec.checkpoint!r} does not exist")


def build_dinov2(arch: str, image_size: int) -> torch.nn.Module:
    """timm's VisionTransformer in DINOv2's architecture for `image_size` px inputs (random weights)."""
    from timm.models.vision_transformer import VisionTransformer

    width, depth, heads = ARCHS[arch]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(RANDOM_INIT_SEED)
        return VisionTransformer(img_size=image_size, patch_size=PATCH, embed_dim=width, depth=depth,
                                 num_heads=heads, init_values=1e-5, reg_tokens=REGISTERS, no_embed_class=True,
                                 num_classes=0, dynamic_img_size=False)


def official_to_timm(state: dict[str, torch.Tensor], image_size: int) -> dict[str, torch.Tensor]:
    """An official DINOv2 state dict as the timm model's, its position grid interpolated as the official forward
    interpolates it for `image_size` px inputs."""
    state = dict(state)
    missing = [k for k in ("cls_token", "pos_embed", "register_tokens") if k not in state]
    if missing:
        raise ValueError(f"not a DINOv2 checkpoint with registers in the official format: no {missing}")
    state.pop("mask_token", None)
    pos = state.pop("pos_embed")
    cls = state.pop("cls_token") + pos[:, :1]
    patches = pos[:, 1:]
    m = int(math.isqrt(patches.shape[1]))
    grid = image_size // PATCH
    if m != grid:
        scale = (grid + INTERPOLATE_OFFSET) / m
        patches = F.interpolate(patches.float().reshape(1, m, m, -1).permute(0, 3, 1, 2), mode="bicubic",
                                antialias=False, scale_factor=(scale, scale))
        patches = patches.permute(0, 2, 3, 1).reshape(1, grid * grid, -1)
    state.update(cls_token=cls, pos_embed=patches, reg_token=state.pop("register_tokens"))
    return state


def load_dinov2(spec: AuxiliarySpec, image_size: int) -> torch.nn.Module:
    """The DINOv2 model of `spec` for `image_size` px inputs, its checkpoint (if any) loaded strictly."""
    check_auxiliary(spec)
    net = build_dinov2(spec.arch, image_size)
    if spec.checkpoint is not None:
        state = torch.load(spec.checkpoint, map_location="cpu", weights_only=True)
        try:
            net.load_state_dict(official_to_timm(state, image_size), strict=True)
        except RuntimeError as e:
            raise ValueError(f"checkpoint {spec.checkpoint} does not fit DINOv2 arch {spec.arch!r}: "
                             f"{str(e)[:600]}") from e
    return net.eval()


class AuxiliaryEncoder:
    """A loaded auxiliary encoder: `encode_images` as the CLIP Backbone's (float32, L2-normalised, on the CPU)."""

    def __init__(self, spec: AuxiliarySpec, image_size: int, device: str | torch.device | None = None) -> None:
        self.spec = spec
        self.device = auto_device(device)
        self.model = load_dinov2(spec, image_size).to(self.device)
        self.embed_dim = ARCHS[spec.arch][0]
        self.precision = "amp_fp16" if self.device.type == "cuda" else "fp32"
        self.encoder_calls = 0

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] CLIP-preprocessed images -> [B, d] the normalised final-norm CLS token."""
        self.encoder_calls += int(pixels.shape[0])
        with torch.autocast("cuda", dtype=torch.float16, enabled=self.precision == "amp_fp16"):
            tokens = self.model.forward_features(pixels.to(self.device, non_blocking=True))
        return F.normalize(tokens[:, 0].float(), dim=-1).cpu()
