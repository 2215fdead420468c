"""Bad data through the dataset readers and the feature cache (issue 7, item 5), without Ray.

The documented policy (orchestrator/features/cache.py): an image that cannot be decoded is a recorded skip
(left out of the entry, listed in the manifest with the reason); every decodable image is encoded whatever its
mode or size; a dataset folder with no images is a DatasetLayoutError naming the folder and the layout; a
dataset none of whose images decode is a CorruptImageError. Covered next door (tests/test_feature_cache.py):
bytes no decoder accepts, a listed file that is missing, corrupt='error', two processes asking for one entry.
A sweep over such data (finished runs kept, the failing dataset recorded) is in test_sweep_bad_data.py.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from orchestrator.clip import BackboneSpec
from orchestrator.clip.testing import TINY_VIT, build_dataset, register_tiny_models
from orchestrator.data.datasets import DatasetLayoutError
from orchestrator.data.listing import read_dataset
from orchestrator.features import CorruptImageError, FeatureCache, load_benchmark

SPEC = BackboneSpec(TINY_VIT, None)
_RNG = np.random.default_rng(7)
_PIXELS = (_RNG.random((48, 40, 3)) * 255).astype(np.uint8)
_GREY = np.asarray(Image.fromarray(_PIXELS).convert("L"))


def _png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (a decompression bomb) with one pixel of data behind it."""
    buf = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buf, format="PNG")
    data = bytearray(buf.getvalue())
    data[16:24] = struct.pack(">II", width, height)  # IHDR data follows the signature, length and type
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def _save(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def _truncated_jpeg() -> bytes:
    data = _save(Image.fromarray(_PIXELS), "JPEG", quality=95)
    return data[: len(data) // 2]


def _animated_gif() -> bytes:
    frames = [Image.fromarray(np.roll(_PIXELS, k, axis=0)) for k in range(3)]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    return buf.getvalue()


# name -> (file bytes written under a .jpg name, expected outcome: 'encoded' or the reason of a recorded skip)
CASES = {
    "zero-byte file": (lambda: b"", "UnidentifiedImageError"),
    "HTML with a .jpg name": (lambda: b"<html><body>404 Not Found</body></html>", "UnidentifiedImageError"),
    "truncated JPEG": (_truncated_jpeg, "truncated"),
    "decompression bomb (30000 x 30000 header)": (lambda: _png_claiming(30000, 30000), "DecompressionBombError"),
    "8-bit grayscale PNG": (lambda: _save(Image.fromarray(_GREY), "PNG"), "encoded"),
    "16-bit grayscale PNG": (lambda: _save(Image.fromarray(_GREY.astype(np.uint16) * 257), "PNG"), "encoded"),
    "CMYK JPEG": (lambda: _save(Image.fromarray(_PIXELS).convert("CMYK"), "JPEG"), "encoded"),
    "palette PNG with transparency": (lambda: _save(Image.fromarray(_PIXELS).convert("P", palette=Image.ADAPTIVE),
                                                    "PNG", transparency=0), "encoded"),
    "RGBA PNG": (lambda: _save(Image.fromarray(_PIXELS).convert("RGBA"), "PNG"), "encoded"),
    "1-bit PNG": (lambda: _save(Image.fromarray(_PIXELS).convert("1"), "PNG"), "encoded"),
    "animated GIF": (_animated_gif, "encoded"),
    "very large image (4000 x 3000)": (lambda: _save(Image.new("RGB", (4000, 3000), (200, 30, 90)), "PNG"),
                                       "encoded"),
}


@pytest.fixture(scope="module")
def bad_dataset(tmp_path_factory):
    """A DTD-layout dataset whose first len(CASES) images are replaced by the cases, encoded once with single
    views and once with AugMix views (AugMix runs its own operations on each image's pixels)."""
    register_tiny_models()
    root = tmp_path_factory.mktemp("bad-data")
    build_dataset("dtd", root, num_classes=2, per_class=len(CASES))
    images = read_dataset("dtd", root)
    case_of = {}
    for i, (name, (make, _)) in enumerate(CASES.items()):
        images.path(i).write_bytes(make())
        case_of[name] = images.image_ids[i]
    entries = {views: FeatureCache(root / "cache").get_or_encode(SPEC, "dtd", root, views=views, num_workers=0,
                                                                  device="cpu")
               for views in ("single", "augmix2")}
    return root, images, case_of, entries


@pytest.mark.parametrize("views", ["single", "augmix2"])
@pytest.mark.parametrize("case", list(CASES))
def test_each_bad_image_is_encoded_or_a_recorded_skip(bad_dataset, case, views, ledger):
    root, images, case_of, entries = bad_dataset
    entry = entries[views]
    image_id = case_of[case]
    expected = CASES[case][1]
    skipped = {s["image_id"]: s["reason"] for s in entry.skipped}
    if expected == "encoded":
        assert image_id not in skipped, skipped.get(image_id)
        row = entry.image_ids.index(image_id)
        assert np.isfinite(entry.features[row].numpy()).all()
        ledger.bad_input(f"image: {case} [{views}]", "encoded")
    else:
        assert image_id in skipped and expected in skipped[image_id], skipped.get(image_id)
        assert image_id not in entry.image_ids
        ledger.bad_input(f"image: {case} [{views}]", "recorded skip")
    # the good images around the bad ones are all there, labels aligned
    assert len(entry) + len(entry.skipped) == len(images)
    assert entry.labels.tolist() == [images.labels[images.image_ids.index(i)] for i in entry.image_ids]


def test_sixteen_bit_images_keep_their_content(bad_dataset):
    """A 16-bit image encodes like its 8-bit version (Pillow's own RGB conversion would clip it to white)."""
    _, _, case_of, entries = bad_dataset
    entry = entries["single"]
    grey = entry.features[entry.image_ids.index(case_of["8-bit grayscale PNG"])]
    wide = entry.features[entry.image_ids.index(case_of["16-bit grayscale PNG"])]
    assert np.array_equal(grey.numpy(), wide.numpy())


def test_manifest_records_every_skip_with_its_reason(bad_dataset):
    root, images, case_of, entries = bad_dataset
    for entry in entries.values():
        manifest = entry.manifest
        bad = sorted(case_of[c] for c, (_, outcome) in CASES.items() if outcome != "encoded")
        assert sorted(s["image_id"] for s in manifest["skipped"]) == bad
        assert manifest["listed"] == len(images) and manifest["skipped_count"] == len(bad)
        assert manifest["count"] == len(images) - len(bad)


def test_empty_dataset_folder_names_the_folder(tmp_path, ledger):
    register_tiny_models()
    build_dataset("imagenet-a", tmp_path, num_classes=2, per_class=1)
    for image in tmp_path.rglob("*.jpg"):
        image.unlink()  # class folders left, no images in them
    for call in (lambda: read_dataset("imagenet-a", tmp_path),
                 lambda: load_benchmark("imagenet-a", tmp_path, tmp_path / "cache", TINY_VIT, num_workers=0,
                                        device="cpu")):
        with pytest.raises(DatasetLayoutError, match=f"no test images found under {tmp_path}/imagenet-adversarial"):
            call()
    (tmp_path / "eurosat").mkdir()
    with pytest.raises(DatasetLayoutError, match="eurosat/split_zhou_EuroSAT.json does not exist"):
        read_dataset("eurosat", tmp_path)
    assert not (tmp_path / "cache" / "features").exists() or not [
        p for p in (tmp_path / "cache" / "features").iterdir() if not p.name.endswith(".lock")]
    ledger.bad_input("empty dataset folder (class folders without images)", "error")
    ledger.bad_input("dataset folder without its split file", "error")


def test_dataset_whose_every_image_is_unreadable(tmp_path, ledger):
    register_tiny_models()
    build_dataset("dtd", tmp_path, num_classes=2, per_class=2)
    images = read_dataset("dtd", tmp_path)
    for i in range(len(images)):
        images.path(i).write_bytes(b"")
    with pytest.raises(CorruptImageError, match=f"none of the {len(images)} images of dtd"):
        FeatureCache(tmp_path / "cache").get_or_encode(SPEC, "dtd", tmp_path, num_workers=0, device="cpu")
    assert [p.name for p in (tmp_path / "cache" / "features").iterdir() if not p.name.endswith(".lock")] == []
    ledger.bad_input("dataset whose every image is unreadable", "error")
