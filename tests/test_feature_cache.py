"""Feature cache and load_benchmark end to end: tiny images in real layouts through a tiny open_clip model."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import orchestrator.features.cache as cache_module
from orchestrator.clip import BackboneSpec, class_embeddings, load_backbone, select_views
from orchestrator.clip.backbone import Backbone
from orchestrator.clip.testing import TINY_RN, TINY_VIT, build_dataset, register_tiny_models, write_corrupt_image
from orchestrator.data.listing import read_dataset
from orchestrator.features import CorruptImageError, FeatureCache, load_benchmark

SPEC = BackboneSpec(TINY_VIT, None)


@pytest.fixture(scope="module", autouse=True)
def tiny_models():
    register_tiny_models()


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    build_dataset("dtd", root, num_classes=3, per_class=2)
    build_dataset("imagenet-a", root, num_classes=2, per_class=2)
    return root


@pytest.fixture
def no_encoder(monkeypatch):
    """Fail the test on any model load or image encode."""

    def refuse(*args, **kwargs):
        raise AssertionError("the encoder was called")

    monkeypatch.setattr(cache_module, "shared_backbone", refuse)
    monkeypatch.setattr(Backbone, "encode_images", refuse)


def test_single_view_benchmark_end_to_end(tmp_path, data_root):
    bench = load_benchmark("dtd", data_root, tmp_path, TINY_VIT, None, views="single", num_workers=0, device="cpu")
    images = read_dataset("dtd", data_root)
    assert bench.name == "dtd" and len(bench) == 6 and bench.num_classes == 3
    assert bench.features.shape == (6, 64) and bench.features.dtype == torch.float32
    torch.testing.assert_close(bench.features.norm(dim=-1), torch.ones(6), atol=2e-3, rtol=0)  # float16 storage
    assert bench.labels.dtype == torch.int64 and bench.labels.tolist() == images.labels
    assert bench.image_ids == images.image_ids  # dataset order; the trial permutes
    assert bench.class_names == images.class_names
    assert bench.class_embeddings.shape == (3, 64) and bench.class_ids.tolist() == [0, 1, 2]
    assert bench.encode_seconds > 0 and bench.skipped == []

    entry = Path(bench.cache_path)
    assert np.load(entry / "features.npy").dtype == np.float16
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["count"] == manifest["listed"] == 6 and manifest["skipped_count"] == 0
    assert manifest["image_ids"] == images.image_ids and manifest["class_names"] == images.class_names
    assert manifest["key_fields"]["backbone"]["model"] == TINY_VIT
    assert manifest["key_fields"]["precision"] == "fp32"
    assert {"torch", "torchvision", "open_clip", "numpy"} <= set(manifest["versions"])
    assert manifest["created_at"] and manifest["encode_seconds"] > 0

    # the features are the backbone's own
    direct = load_backbone(TINY_VIT, None, device="cpu")
    from PIL import Image

    first = direct.encode_images(direct.preprocess(Image.open(images.path(0)).convert("RGB"))[None])[0]
    torch.testing.assert_close(bench.features[0], first, atol=2e-3, rtol=0)


def test_cache_hit_performs_no_encoder_call(tmp_path, data_root, monkeypatch):
    first = load_benchmark("dtd", data_root, tmp_path, TINY_VIT, num_workers=0, device="cpu")

    def refuse(*args, **kwargs):
        raise AssertionError("the encoder was called")

    monkeypatch.setattr(cache_module, "shared_backbone", refuse)
    monkeypatch.setattr(Backbone, "encode_images", refuse)
    monkeypatch.setattr(Backbone, "encode_texts", refuse)
    again = load_benchmark("dtd", data_root, tmp_path, TINY_VIT, num_workers=0, device="cpu")
    torch.testing.assert_close(again.features, first.features)
    torch.testing.assert_close(again.class_embeddings, first.class_embeddings)
    assert again.encode_seconds == 0.0 and again.cached_encode_seconds == first.encode_seconds


def test_a_loaded_backbone_hits_the_same_entry(tmp_path, data_root):
    cache = FeatureCache(tmp_path)
    first = cache.get_or_encode(SPEC, "dtd", data_root, num_workers=0, device="cpu")
    backbone = load_backbone(TINY_VIT, None, device="cpu")
    again = cache.get_or_encode(backbone, "dtd", data_root, num_workers=0)
    assert first.encoded and not again.encoded and again.key == first.key
    assert backbone.encoder_calls == 0


def test_key_covers_what_decides_the_features(tmp_path, data_root):
    cache = FeatureCache(tmp_path)

    def key(**kw):
        args = {"backbone": SPEC, "dataset": "imagenet-a", "views": "single", "seed": 1} | kw
        return cache.get_or_encode(args.pop("backbone"), data_root=data_root, num_workers=0, device="cpu",
                                   **args).key

    single = key()
    assert key(seed=2) == single  # one entry for the deterministic single view, whatever the seed
    augmix = key(views="augmix2")
    crops = key(views="crops2")  # the same view count and seed, another kind: another entry
    assert len({single, augmix, crops, key(views="augmix2", seed=2), key(views="augmix3"),
                key(backbone=BackboneSpec(TINY_RN)), key(backbone=BackboneSpec(TINY_VIT, quick_gelu=True))}) == 7
    assert len(list((tmp_path / "features").glob("*/manifest.json"))) == 7


def test_crops_and_augmix_entries_are_kept_apart(tmp_path, data_root):
    cache = FeatureCache(tmp_path)
    crops = cache.get_or_encode(SPEC, "imagenet-a", data_root, "crops2", num_workers=0, device="cpu")
    augmix = cache.get_or_encode(SPEC, "imagenet-a", data_root, "augmix2", num_workers=0, device="cpu")
    assert crops.key != augmix.key and crops.encoded and augmix.encoded
    assert (crops.manifest["view_kind"], crops.manifest["views"]) == ("crops", "crops2")
    assert (augmix.manifest["view_kind"], augmix.manifest["views"]) == ("augmix", "augmix2")
    assert crops.manifest["key_fields"]["views"]["kind"] == "crops"
    assert crops.features.shape == augmix.features.shape == (4, 3, 64)
    torch.testing.assert_close(crops.features[:, 0], augmix.features[:, 0])  # the same original image
    assert not torch.allclose(crops.features[:, 1:], augmix.features[:, 1:], atol=1e-2)
    again = cache.get_or_encode(SPEC, "imagenet-a", data_root, "crops2", num_workers=0, device="cpu")
    assert not again.encoded and again.key == crops.key
    torch.testing.assert_close(again.features, crops.features)


def test_augmix_entry_keeps_every_view(tmp_path, data_root):
    bench = load_benchmark("imagenet-a", data_root, tmp_path, TINY_VIT, views="augmix", templates="handcrafted1",
                           num_workers=0, device="cpu")
    assert bench.features.shape == (4, 64, 64)  # 63 AugMix views + the original, 64-d
    assert bench.num_classes == 200 and bench.class_embeddings.shape == (200, 64)
    single = load_benchmark("imagenet-a", data_root, tmp_path, TINY_VIT, views="single", templates="handcrafted1",
                            num_workers=0, device="cpu")
    torch.testing.assert_close(bench.features[:, 0], single.features)  # view 0 is the original image
    reduced = load_benchmark("imagenet-a", data_root, tmp_path, TINY_VIT, views="augmix", templates="handcrafted1",
                             reduce_views=True, num_workers=0, device="cpu")
    expected = select_views(bench.features, bench.class_embeddings, bench.class_ids, 200)
    torch.testing.assert_close(reduced.features, expected)
    assert reduced.cache_key == bench.cache_key


def test_protocol_views(tmp_path, data_root):
    bench = load_benchmark("dtd", data_root, tmp_path, TINY_VIT, views="dataset", num_workers=0, device="cpu")
    assert bench.features.ndim == 2


def test_dataloader_workers_give_the_same_features(tmp_path, data_root):
    cache = FeatureCache(tmp_path)
    in_process = cache.get_or_encode(SPEC, "imagenet-a", data_root, "augmix2", num_workers=0, device="cpu")
    workers = cache.get_or_encode(SPEC, "imagenet-a", data_root, "augmix2", num_workers=2, device="cpu",
                                  force=True, batch_size=3)
    assert workers.encoded and workers.key == in_process.key
    torch.testing.assert_close(workers.features, in_process.features, atol=2e-3, rtol=0)


_CONCURRENT = textwrap.dedent("""
    import json, sys
    from orchestrator.clip import BackboneSpec
    from orchestrator.clip.testing import TINY_VIT, register_tiny_models
    from orchestrator.features import FeatureCache
    register_tiny_models()
    got = FeatureCache(sys.argv[1]).get_or_encode(BackboneSpec(TINY_VIT), "imagenet-a", sys.argv[2], "augmix2",
                                                  num_workers=0, device="cpu")
    print(json.dumps({"encoded": got.encoded, "key": got.key, "n": len(got)}))
""")


def test_two_processes_asking_at_once_encode_once(tmp_path, data_root):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [subprocess.Popen([sys.executable, "-c", _CONCURRENT, str(tmp_path), str(data_root)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    assert sorted(o["encoded"] for o in outs) == [False, True]
    assert outs[0]["key"] == outs[1]["key"] and outs[0]["n"] == outs[1]["n"] == 4
    assert len(list((tmp_path / "features").iterdir())) == 2  # the entry and its lock file, no temp folders


def _damaged_copy(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    build_dataset("dtd", root, num_classes=3, per_class=2)
    images = read_dataset("dtd", root)
    write_corrupt_image(images.path(1))
    write_corrupt_image(images.path(3), truncated=True)
    images.path(4).unlink()
    return root


def test_unreadable_images_are_recorded_and_skipped(tmp_path, caplog):
    root = _damaged_copy(tmp_path)
    images = read_dataset("dtd", root)
    with caplog.at_level(logging.WARNING):
        bench = load_benchmark("dtd", root, tmp_path / "cache", TINY_VIT, num_workers=0, device="cpu")
    assert len(bench) == 3 and bench.features.shape == (3, 64)
    assert bench.image_ids == [images.image_ids[i] for i in (0, 2, 5)]
    assert bench.labels.tolist() == [images.labels[i] for i in (0, 2, 5)]
    assert [s["image_id"] for s in bench.skipped] == [images.image_ids[i] for i in (1, 3, 4)]
    reasons = [s["reason"] for s in bench.skipped]
    assert reasons[0].startswith("UnidentifiedImageError")
    assert reasons[1].startswith("OSError") and "truncated" in reasons[1]
    assert reasons[2].startswith("FileNotFoundError")
    manifest = json.loads((Path(bench.cache_path) / "manifest.json").read_text())
    assert manifest["listed"] == 6 and manifest["count"] == 3 and manifest["skipped_count"] == 3
    assert manifest["skipped"] == bench.skipped
    assert "skipped 3 unreadable image(s)" in caplog.text
    # a hit reports the same skips without re-reading any file
    again = load_benchmark("dtd", root, tmp_path / "cache", TINY_VIT, num_workers=0, device="cpu")
    assert again.skipped == bench.skipped and again.encode_seconds == 0.0


def test_unreadable_image_with_error_policy_names_the_file(tmp_path):
    root = _damaged_copy(tmp_path)
    bad = read_dataset("dtd", root).path(1)
    with pytest.raises(CorruptImageError, match=f"cannot read image {bad}: UnidentifiedImageError"):
        FeatureCache(tmp_path / "cache").get_or_encode(SPEC, "dtd", root, corrupt="error", num_workers=0,
                                                       device="cpu")
    assert [p.name for p in (tmp_path / "cache" / "features").iterdir() if not p.name.endswith(".lock")] == []


def test_an_interrupted_encode_leaves_nothing_behind(tmp_path, data_root, monkeypatch):
    calls = {"n": 0}
    real = Backbone.encode_images

    def dies_on_second_batch(self, pixels):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(self, pixels)

    monkeypatch.setattr(Backbone, "encode_images", dies_on_second_batch)
    cache = FeatureCache(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        cache.get_or_encode(SPEC, "dtd", data_root, batch_size=2, num_workers=0, device="cpu")
    assert [p.name for p in (tmp_path / "features").iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.setattr(Backbone, "encode_images", real)
    assert len(cache.get_or_encode(SPEC, "dtd", data_root, num_workers=0, device="cpu")) == 6


def test_bad_arguments(tmp_path, data_root):
    cache = FeatureCache(tmp_path)
    with pytest.raises(ValueError, match="corrupt must be one of"):
        cache.get_or_encode(SPEC, "dtd", data_root, corrupt="ignore")
    with pytest.raises(ValueError, match="unknown views 'double'"):
        cache.get_or_encode(SPEC, "dtd", data_root, views="double")


def test_text_embeddings_share_the_cache_dir(tmp_path, data_root):
    bench = load_benchmark("dtd", data_root, tmp_path, TINY_VIT, templates="handcrafted2", num_workers=0,
                           device="cpu")
    emb, ids = class_embeddings(SPEC, bench.class_names, "handcrafted2", cache_dir=tmp_path, device="cpu")
    torch.testing.assert_close(emb, bench.class_embeddings)
    assert bench.class_embeddings.shape == (6, 64) and bench.class_ids.tolist() == [0, 1, 2, 0, 1, 2]


# --------------------------------------------------------------------------------------------- bca cache


def test_bca_cache_explicit_args_then_no_op(tmp_path, data_root):
    from orchestrator.cli import app

    args = ["cache", "--model", TINY_VIT, "--dataset", "dtd", "--dataset", "A", "--data-root", str(data_root),
            "--cache-dir", str(tmp_path), "--views", "dataset", "--seed", "1", "--templates", "handcrafted1",
            "--workers", "0", "--device", "cpu"]
    runner = CliRunner()
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "encoded" in first.output and "dtd views=single" in first.output
    assert "imagenet-a views=augmix seed=1" in first.output and "(4, 64, 64)" in first.output
    second = runner.invoke(app, args)
    assert second.exit_code == 0 and second.output.count(" hit ") == 2 and "encoded" not in second.output


def test_bca_cache_reports_layout_errors(tmp_path):
    from orchestrator.cli import app

    result = CliRunner().invoke(app, ["cache", "--model", TINY_VIT, "--dataset", "dtd", "--data-root",
                                      str(tmp_path / "missing"), "--cache-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert f"data root {tmp_path / 'missing'} does not exist" in result.output


def test_bca_cache_needs_a_spec_or_the_explicit_options(tmp_path):
    from orchestrator.cli import app

    result = CliRunner().invoke(app, ["cache", "--model", TINY_VIT])
    assert result.exit_code != 0 and "--dataset" in result.output and "--data-root" in result.output


def test_bca_cache_from_a_sweep_spec(tmp_path, data_root):
    from orchestrator.cli import app

    spec = tmp_path / "spec.yaml"
    spec.write_text(textwrap.dedent(f"""
        name: cache-from-spec
        results_dir: results
        data_root: {data_root}
        cache_dir: cache
        backbones: [{{model: {TINY_VIT}, pretrained: random}}]
        datasets: [dtd, {{name: imagenet-a, views: augmix2}}, {{synthetic: iid}}]
        templates: [handcrafted1]
        methods: [{{method: clip}}]
        seeds: [1, 2]
    """))
    result = CliRunner().invoke(app, ["cache", str(spec), "--workers", "0", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    # single views need one entry whatever the seeds; AugMix one per seed; synthetic datasets none
    assert "[1/3] encoded bca-tiny-vit/random dtd views=single" in result.output
    assert "imagenet-a views=augmix2 seed=1" in result.output and "imagenet-a views=augmix2 seed=2" in result.output
    assert len(list((tmp_path / "cache" / "features").glob("*/manifest.json"))) == 3
    again = CliRunner().invoke(app, ["cache", str(spec), "--workers", "0", "--device", "cpu"])
    assert again.exit_code == 0 and again.output.count(" hit ") == 3
