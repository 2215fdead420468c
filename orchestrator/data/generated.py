"""Corruptions generated from a dataset's clean images, for datasets with no released corrupted copy.

A spec's `{name: dtd, corruption: fog, severity: 3}` names the dataset `dtd.fog.3` (`orchestrator.registry.
corruptions.generated_card`): dtd's images, each corrupted as the released ImageNet-C pipeline does it
(hendrycks/robustness, ImageNet-C/create_c/make_imagenet_c.py): resized to 256 on the shorter side (bilinear),
centre-cropped to 224, corrupted at the severity, and saved as a JPEG of quality 85. The corruption itself is the
maintained package imagecorruptions (PyPI: imagecorruptions-imaug, the imaug fork that runs on numpy 2 and current
scikit-image; the original imagecorruptions 1.1.2 fails on them for glass_blur, fog and gaussian_blur), installed
with the `corruptions` extra.

Generated once, like features: each image is written on its first decode to
`<data_root>/generated-c/<dataset>/<corruption>/<severity>/<clean image id>.JPEG` (atomically) and read from there
after. Its randomness is seeded from (dataset, corruption, severity, image id), so a file written again is the same.

Where imagecorruptions differs from the released definitions (docs/real-data.md lists it too): motion_blur and
snow blur with its own line kernel instead of ImageMagick's MagickMotionBlurImage; frost picks among 6 frost images
(the released code among the first 5) and rescales them to 1.1 times the image's size before its random crop;
pixelate scales back up with NEAREST (released: BOX); elastic_transform is redefined (no random affine step, its
displacement scaled by the image size) and so is not ImageNet-C's; glass_blur and impulse_noise draw from their
own generators (seeded here). The noises, the other blurs, fog, brightness, contrast and jpeg_compression follow
the released definitions (tests/test_generated_corruptions.py holds them to a reference written from those).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
from PIL import Image

GENERATED = "generated-c"  # the folder under the data root that holds generated copies
RESIZE, CROP = 256, 224    # the released pipeline's Resize(256) and CenterCrop(224)
JPEG_QUALITY = 85          # the released pipeline's save
SUFFIX = ".JPEG"
_OWN_SEED = ("impulse_noise", "glass_blur")  # the corruptions that take a seed instead of numpy's global generator


def generated_id(dataset: str, corruption: str, severity: int, clean_id: str) -> str:
    """Where a clean image's generated copy lives, relative to the data root."""
    return f"{GENERATED}/{dataset}/{corruption}/{severity}/{clean_id}{SUFFIX}"


def _parse(path: Path) -> tuple[Path, str, str, int, str] | None:
    """(data root, dataset, corruption, severity, clean id) of a generated copy's path, or None."""
    parts = path.parts
    if GENERATED not in parts or not path.name.endswith(SUFFIX):
        return None
    at = len(parts) - 1 - parts[::-1].index(GENERATED)
    if len(parts) < at + 5 or not parts[at + 3].isdigit():
        return None
    clean = "/".join(parts[at + 4:])[:-len(SUFFIX)]
    return Path(*parts[:at]), parts[at + 1], parts[at + 2], int(parts[at + 3]), clean


def image_seed(dataset: str, corruption: str, severity: int, clean_id: str) -> int:
    digest = hashlib.sha256(f"{dataset}/{corruption}/{severity}/{clean_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def centre_crop(image: Image.Image) -> np.ndarray:
    """The released pipeline's Resize(256) (shorter side, bilinear) and CenterCrop(224), as uint8 RGB [224, 224, 3]."""
    image = image.convert("RGB")
    w, h = image.size
    scale = RESIZE / min(w, h)
    size = (RESIZE, int(RESIZE * h / w)) if w <= h else (int(RESIZE * w / h), RESIZE)
    if scale != 1:
        image = image.resize(size, Image.BILINEAR)
    w, h = image.size
    left, top = int(round((w - CROP) / 2.0)), int(round((h - CROP) / 2.0))
    return np.asarray(image.crop((left, top, left + CROP, top + CROP)))


def corrupt_array(pixels: np.ndarray, corruption: str, severity: int, seed: int) -> np.ndarray:
    """uint8 [H, W, 3] -> the corrupted uint8 image (imagecorruptions' `corrupt`, its randomness seeded; numpy's
    global generator is restored after)."""
    try:
        from imagecorruptions import corrupt
    except ImportError:
        raise ValueError(f"generating {corruption} needs the package imagecorruptions-imaug; install it with "
                         f"`pip install 'bca-orchestrator[corruptions]'` (or `pip install imagecorruptions-imaug`)"
                         ) from None
    state = np.random.get_state()
    try:
        np.random.seed(seed)
        extra = {"seed": seed} if corruption in _OWN_SEED else {}
        return corrupt(pixels, severity=severity, corruption_name=corruption, **extra)
    finally:
        np.random.set_state(state)


def materialise(path: Path) -> bool:
    """Write the generated copy at `path` from its clean image if it is one and missing; True if `path` names a
    generated copy. A concurrent writer of the same file writes the same bytes; the rename is atomic."""
    parsed = _parse(path)
    if parsed is None:
        return False
    if path.is_file():
        return True
    root, dataset, corruption, severity, clean_id = parsed
    with Image.open(root / clean_id) as clean:  # a clean dataset's image is a file
        pixels = corrupt_array(centre_crop(clean), corruption, severity,
                               image_seed(dataset, corruption, severity, clean_id))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    Image.fromarray(pixels).save(tmp, format="JPEG", quality=JPEG_QUALITY, optimize=True)
    os.replace(tmp, path)
    return True
