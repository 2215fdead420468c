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
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import functional as TF
from torchvision.transforms.autoaugment import _apply_op

# The vocabulary (ViewConfig, parse_views, the kinds) has its home in the registry; this module makes the pixels.
from orchestrator.registry.views import AUGMIX_VIEWS, VIEW_KINDS, ViewConfig, parse_views

__all__ = ["AUGMIX_VIEWS", "PilAugMix", "VIEW_KINDS", "ViewConfig", "ViewTransform", "parse_views", "to_rgb"]


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
