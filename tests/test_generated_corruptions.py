"""Corruptions generated for a dataset with no released corrupted copy: the released ImageNet-C pipeline's resize
and crop, the corruptions against a reference written from its definitions (hendrycks/robustness,
make_imagenet_c.py) on the fixture images, each image generated once under the data root and read from there after,
a spec naming `{name: dtd, corruption: ..., severity: ...}` running through a trial (a method entry's `datasets:
[dtd]` naming its generated corruptions), and a bad corruption refused."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from scipy.ndimage import correlate
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.clip.testing import TINY_VIT, build_dataset, write_model_config
from orchestrator.data.datasets import open_image
from orchestrator.data.generated import centre_crop, corrupt_array, image_seed
from orchestrator.data.listing import read_dataset

pytest.importorskip("imagecorruptions")

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("data")
    build_dataset("dtd", data, num_classes=2, per_class=2)
    return data


# ------------------------------------------------------------------ the released definitions, written plainly
def _to_uint8(x: np.ndarray) -> np.ndarray:
    return np.uint8(x)  # the pipeline's Image.fromarray(np.uint8(img)): truncation


def _hsv_brightness(x: np.ndarray, c: float) -> np.ndarray:
    """RGB in [0, 1] -> value + c in HSV, back to RGB (the HSV hexcone, as skimage's rgb2hsv / hsv2rgb)."""
    v = x.max(-1)
    delta = v - x.min(-1)
    s = np.where(v > 0, delta / np.where(v > 0, v, 1), 0)
    safe = np.where(delta > 0, delta, 1)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    h = np.where(v == r, (g - b) / safe, np.where(v == g, 2 + (b - r) / safe, 4 + (r - g) / safe))
    h = np.where(delta > 0, (h / 6) % 1, 0)
    v = np.clip(v + c, 0, 1)
    i = np.floor(h * 6).astype(int) % 6
    f = h * 6 - np.floor(h * 6)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    table = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]
    out = np.zeros_like(x)
    for k, (a, bb, cc) in enumerate(table):
        out[i == k] = np.stack([a, bb, cc], -1)[i == k]
    return out


def _disk(radius: float, alias_blur: float) -> np.ndarray:
    """The definition's anti-aliased disk: a disk of the radius on a grid of at least 17 x 17, normalised, then a
    Gaussian blur of sigma alias_blur (3 x 3 below radius 9, else 5 x 5) with reflected borders."""
    half = 8 if radius <= 8 else int(radius)
    grid = np.arange(-half, half + 1)
    X, Y = np.meshgrid(grid, grid)
    disk = ((X ** 2 + Y ** 2) <= radius ** 2).astype(np.float32)
    disk /= disk.sum()
    k = 3 if radius <= 8 else 5
    g = np.exp(-((np.arange(k) - k // 2) ** 2) / (2 * alias_blur ** 2))
    g /= g.sum()
    return correlate(correlate(disk.astype(np.float64), g[None], mode="mirror"), g[:, None], mode="mirror")


def reference(pixels: np.ndarray, corruption: str, severity: int, seed: int) -> np.ndarray:
    rng = np.random.RandomState(seed)   # the stream numpy's global generator gives after np.random.seed(seed)
    x = pixels / 255.
    if corruption == "gaussian_noise":
        c = [.08, .12, .18, .26, .38][severity - 1]
        return _to_uint8(np.clip(x + rng.normal(size=x.shape, scale=c), 0, 1) * 255)
    if corruption == "shot_noise":
        c = [60, 25, 12, 5, 3][severity - 1]
        return _to_uint8(np.clip(rng.poisson(x * c) / c, 0, 1) * 255)
    if corruption == "contrast":
        c = [.4, .3, .2, .1, .05][severity - 1]
        means = x.mean(axis=(0, 1), keepdims=True)
        return _to_uint8(np.clip((x - means) * c + means, 0, 1) * 255)
    if corruption == "brightness":
        return _to_uint8(np.clip(_hsv_brightness(x, [.1, .2, .3, .4, .5][severity - 1]), 0, 1) * 255)
    if corruption == "defocus_blur":
        radius, alias = [(3, .1), (4, .5), (6, .5), (8, .5), (10, .5)][severity - 1]
        kernel = _disk(radius, alias)
        out = np.stack([correlate(x[..., d], kernel, mode="mirror") for d in range(3)], -1)
        return _to_uint8(np.clip(out, 0, 1) * 255)
    if corruption == "jpeg_compression":
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=[25, 18, 15, 10, 7][severity - 1])
        return np.asarray(Image.open(buffer))
    raise AssertionError(corruption)


# Exact where both sides draw the same numbers and round the same way; elsewhere a value within float64 rounding
# of an integer may truncate to either side of it: one level.
LEVELS = {"gaussian_noise": 0, "shot_noise": 0, "contrast": 1, "brightness": 1, "defocus_blur": 1, "jpeg_compression": 0}


@pytest.mark.parametrize("corruption", sorted(LEVELS))
@pytest.mark.parametrize("severity", [1, 5])
def test_generated_corruptions_match_the_released_definitions(root, corruption, severity):
    clean = read_dataset("dtd", root)
    for image_id in clean.image_ids[:2]:
        with open_image(root / image_id) as image:
            pixels = centre_crop(image)
        seed = image_seed("dtd", corruption, severity, image_id)
        generated = corrupt_array(pixels, corruption, severity, seed)
        expected = reference(pixels, corruption, severity, seed)
        assert generated.shape == expected.shape == (224, 224, 3) and generated.dtype == np.uint8
        assert np.abs(generated.astype(int) - expected.astype(int)).max() <= LEVELS[corruption]
        assert not np.array_equal(generated, pixels)


def test_the_crop_is_the_released_resize_and_centre_crop(root):
    from torchvision import transforms

    with open_image(root / read_dataset("dtd", root).image_ids[0]) as image:
        released = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224)])(image.convert("RGB"))
        assert np.array_equal(centre_crop(image), np.asarray(released))


def test_each_image_is_generated_once_and_read_after(root):
    variant = read_dataset("DTD.contrast.2", root)
    clean = read_dataset("dtd", root)
    assert variant.name == "dtd.contrast.2" and variant.labels == clean.labels
    assert variant.image_ids[0] == f"generated-c/dtd/contrast/2/{clean.image_ids[0]}.JPEG"
    path = variant.path(0)
    assert not path.exists()
    with open_image(path) as image:
        first = np.asarray(image)
    written = path.stat().st_mtime_ns
    with open_image(path) as image:
        assert np.array_equal(np.asarray(image), first) and path.stat().st_mtime_ns == written
    with open_image(root / clean.image_ids[0]) as image:
        pixels = corrupt_array(centre_crop(image), "contrast", 2, image_seed("dtd", "contrast", 2, clean.image_ids[0]))
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=85, optimize=True)
    assert np.array_equal(first, np.asarray(Image.open(buffer)))


def _spec(tmp_path: Path, root: Path, dataset: dict) -> Path:
    spec = {"name": "generated", "results_dir": "results", "cache_dir": "cache", "data_root": str(root),
            "backbones": [{"model": TINY_VIT, "pretrained": "random",
                           "config": str(write_model_config(TINY_VIT, tmp_path / "models"))}],
            "datasets": [dataset], "methods": [{"method": "clip", "datasets": ["dtd"]}], "seeds": [1],
            "resources": {"cpus": 1}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_spec_runs_a_generated_corruption_of_any_dataset(tmp_path, root):
    from orchestrator.results.writer import read_run
    from orchestrator.sweep.load import load_spec
    from orchestrator.sweep.pieces import settings_of
    from orchestrator.sweep.plan import expand, make_trials
    from orchestrator.sweep.trial import execute_trial

    spec = load_spec(_spec(tmp_path, root, {"name": "dtd", "corruption": ["fog", "pixelate"], "severity": 3}))
    assert [d.name for d in spec.datasets] == ["dtd.fog.3", "dtd.pixelate.3"]
    runs = [run for run in expand(spec) if run.source.dataset == "dtd.pixelate.3"]
    for trial in make_trials(runs, "auto"):
        execute_trial(trial, settings_of(spec))
    record = read_run(spec.results_dir, spec.name, runs[0].run_id)
    assert record["status"] == "finished" and record["n_samples"] == 4 and record["dataset"] == "dtd.pixelate.3"
    assert len(list((root / "generated-c" / "dtd" / "pixelate" / "3").rglob("*.JPEG"))) == 4


def test_an_unknown_corruption_exits_2_naming_the_field(tmp_path, root):
    r = CliRunner().invoke(app, ["sweep", str(_spec(tmp_path, root, {"name": "dtd", "corruption": "rain",
                                                                      "severity": 3})), "--dry-run"], env=ENV)
    assert r.exit_code == 2, r.output
    assert "datasets[0].corruption" in r.stderr and "gaussian_noise" in r.stderr and "Traceback" not in r.output
