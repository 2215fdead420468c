"""Image views per test sample: 'single' (the backbone's own eval transform), 'augmix' or 'crops'
(the original + 63 augmented views each).

'single': resize the shorter side to the backbone's input size (bicubic for CLIP), centre crop, CLIP
normalisation: open_clip's eval transform for the backbone, so its size follows the model (224 for the
paper's backbones).

'augmix' and 'crops' follow the public protocol's AugMixAugmenter (TPT/TDA, also used by MTA and
BoostAdapter): view 0 is the 'single' view; each of the others is a RandomResizedCrop to the input size
(torchvision defaults: scale (0.08, 1), ratio (3/4, 4/3), bilinear) and a random horizontal flip of the
original image, then CLIP normalisation. 'crops' stops there: it is AugMixAugmenter with augmix=False,
the views of MTA and BoostAdapter. 'augmix' (TDA, DPE) mixes each crop with AugMix before normalising
(torchvision's, severity 1, width 3, depth 1-3, the geometric + posterize/solarize/equalize/autocontrast
operations the public augmentation list uses, i.e. all_ops=False).
AugMix runs as `PilAugMix`: torchvision's sampling and operations, applied to the PIL image instead of a
tensor copy: the same augmentations for a seed, pixels within the two backends' interpolation differences
(tested), and several times faster per image on a busy CPU, where torchvision's tensor path spends its time
in tiny multi-threaded kernels.
Randomness is seeded per image from (seed, image id), so a view set does not depend on DataLoader workers,
batch order or which images were skipped.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import functional as TF
from torchvision.transforms.autoaugment import _apply_op

from orchestrator.registry.methods import VIEW_KINDS as METHOD_VIEW_KINDS

VIEW_KINDS = ("single", *METHOD_VIEW_KINDS)  # the kinds a method card may name, and no views at all
AUGMIX_VIEWS = 63  # augmented views per image in the public protocols (augmix and crops alike)
_PIPELINE_VERSION = 1  # bump when the transforms change, so old cache entries are not reused


@dataclass(frozen=True)
class ViewConfig:
    """A view protocol: 'single', or 'augmix' / 'crops' with n_aug augmented views (plus the original) and a
    seed; severity applies to 'augmix' only."""

    kind: str = "single"
    n_aug: int = AUGMIX_VIEWS
    severity: int = 1
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in VIEW_KINDS:
            raise ValueError(f"unknown view kind {self.kind!r}: expected one of {list(VIEW_KINDS)}")

    @property
    def num_views(self) -> int:
        return 1 if self.kind == "single" else 1 + self.n_aug

    @property
    def name(self) -> str:
        return self.kind if self.kind == "single" or self.n_aug == AUGMIX_VIEWS else f"{self.kind}{self.n_aug}"

    def identity(self) -> dict[str, Any]:
        """What decides the views' pixels; 'single' is deterministic, so its seed is left out (one cache entry)."""
        if self.kind == "single":
            return {"kind": "single", "pipeline": _PIPELINE_VERSION}
        if self.kind == "crops":
            return {"kind": "crops", "n_aug": self.n_aug, "seed": self.seed, "crop": "RandomResizedCrop+hflip",
                    "pipeline": _PIPELINE_VERSION}
        return {"kind": "augmix", "n_aug": self.n_aug, "severity": self.severity, "seed": self.seed,
                "crop": "RandomResizedCrop+hflip", "augmix": "torchvision all_ops=False width=3 depth=-1 alpha=1",
                "pipeline": _PIPELINE_VERSION}


def parse_views(views: str | ViewConfig, seed: int | None = None) -> ViewConfig:
    """'single', 'augmix' / 'crops' (63 augmented views + the original) or 'augmixN' / 'cropsN' (N + the
    original)."""
    if isinstance(views, ViewConfig):
        return views
    key = views.strip().lower()
    if key == "single":
        return ViewConfig("single", seed=None)
    for kind in ("augmix", "crops"):
        if key.startswith(kind):
            rest = key[len(kind):].lstrip(":-_")
            if rest == "" or (rest.isdigit() and int(rest) > 0):
                return ViewConfig(kind, n_aug=int(rest) if rest else AUGMIX_VIEWS, seed=1 if seed is None else seed)
    raise ValueError(f"unknown views {views!r}: expected 'single', 'augmix' (63 AugMix views + the original), "
                     f"'crops' (63 random resized crops with flips + the original) or 'augmixN' / 'cropsN' "
                     f"(N augmented views + the original)")


class PilAugMix(T.AugMix):
    """torchvision's AugMix with its operations applied to the PIL image (PIL in, PIL out).

    Draws from torch's RNG in exactly torchvision's order (mixing weights, then per chain its depth, ops,
    magnitudes and signs), so a seed gives the same augmentation as T.AugMix; only the geometric ops'
    interpolation differs (PIL's kernels instead of grid_sample).
    """

    def forward(self, img: Image.Image) -> Image.Image:
        width, height = img.size
        op_meta = self._augmentation_space(self._PARAMETER_MAX, (height, width))
        op_names = list(op_meta)
        m = self._sample_dirichlet(torch.tensor([self.alpha, self.alpha]).expand(1, -1))
        weights = self._sample_dirichlet(torch.tensor([self.alpha] * self.mixture_width).expand(1, -1)) * m[:, 1:]
        mix = m[0, 0] * TF.pil_to_tensor(img).float()
        for i in range(self.mixture_width):
            aug = img
            depth = self.chain_depth if self.chain_depth > 0 else int(torch.randint(low=1, high=4, size=(1,)).item())
            for _ in range(depth):
                op_name = op_names[int(torch.randint(len(op_meta), (1,)).item())]
                magnitudes, signed = op_meta[op_name]
                magnitude = (float(magnitudes[torch.randint(self.severity, (1,), dtype=torch.long)].item())
                             if magnitudes.ndim > 0 else 0.0)
                if signed and torch.randint(2, (1,)):
                    magnitude *= -1.0
                aug = _apply_op(aug, op_name, magnitude, interpolation=self.interpolation, fill=self.fill)
            mix.add_(weights[0, i] * TF.pil_to_tensor(aug).float())
        return TF.to_pil_image(mix.to(torch.uint8))


# 16-bit greyscale as Pillow opens it (PNG, TIFF); "I" (32-bit integer) is how some 16-bit files open.
_WIDE_GREY = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL image as 8-bit RGB. Pillow's own convert('RGB') clips 16-bit greyscale at 255, which turns a
    16-bit image almost white; such images keep their top 8 bits instead ("I" images whose values fit 8 bits
    are taken as they are)."""
    if image.mode in _WIDE_GREY:
        values = np.asarray(image).astype(np.int64)
        if image.mode != "I" or values.max(initial=0) > 255:
            values = np.clip(values, 0, 65535) >> 8
        image = Image.fromarray(values.astype(np.uint8))
    return image.convert("RGB")


def _item_seed(seed: int, image_id: str) -> int:
    digest = hashlib.sha256(f"{seed}\0{image_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class ViewTransform:
    """PIL image (+ its id) -> [V, 3, H, W] tensor of views, view 0 the backbone's own eval transform."""

    def __init__(self, config: ViewConfig, base: Any, preprocess_cfg: dict[str, Any]):
        self.config = config
        self.base = base
        if config.kind != "single":
            size = preprocess_cfg["size"]
            size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
            mix = ([PilAugMix(severity=config.severity, mixture_width=3, chain_depth=-1, alpha=1.0, all_ops=False)]
                   if config.kind == "augmix" else [])
            self.augment = T.Compose([
                T.RandomResizedCrop(size),
                T.RandomHorizontalFlip(),
                *mix,
                T.ToTensor(),
                T.Normalize(preprocess_cfg["mean"], preprocess_cfg["std"]),
            ])

    def __call__(self, image: Image.Image, image_id: str) -> torch.Tensor:
        image = to_rgb(image)
        original = self.base(image)
        if self.config.kind == "single":
            return original.unsqueeze(0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_item_seed(self.config.seed, image_id))
            views = [self.augment(image) for _ in range(self.config.n_aug)]
        return torch.stack([original, *views])
