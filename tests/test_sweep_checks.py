"""What `bca sweep --dry-run` (and the spec checks every command runs) refuses before Ray starts, each with exit 2
and a whole message naming the field: weights not on this machine, continual over datasets with different label
spaces, resources this machine lacks, an empty split file (issue 24 item 10); and settings that act on images
in a spec whose datasets are all synthetic (item 13), and methods that run a CLIP tower on synthetic datasets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.clip.testing import TINY_VIT, build_dataset, write_model_config
from orchestrator.registry import dataset_card

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


def bca(*args: str):
    return CliRunner().invoke(app, list(args), env=ENV)


def synthetic_spec(directory: Path, **overrides) -> Path:
    spec = {"name": "s", "results_dir": "results",
            "datasets": [{"synthetic": "label_shift", "n": 60, "num_classes": 4, "dim": 16}],
            "methods": [{"method": "clip"}], "seeds": [1], **overrides}
    path = directory / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def real_spec(directory: Path, datasets=("dtd",), backbone=None, **overrides) -> Path:
    for name in datasets:
        if not (directory / "data" / dataset_card(name).folder).exists():
            build_dataset(name, directory / "data", num_classes=3, per_class=2)
    backbone = backbone or {"model": TINY_VIT, "pretrained": "random",
                            "config": str(write_model_config(TINY_VIT, directory / "models"))}
    return synthetic_spec(directory, data_root="data", cache_dir="cache", datasets=list(datasets),
                          backbones=[backbone], **overrides)


def refused(path: Path) -> str:
    r = bca("sweep", str(path), "--dry-run")
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and "..." not in r.stderr, r.stderr
    assert not (path.parent / "results").exists()
    return r.stderr


def test_weights_not_on_this_machine_are_a_dry_run_error_with_the_whole_remedy(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # ~/.cache/clip, where OpenAI's files go
    err = refused(real_spec(tmp_path, backbone={"model": "RN50", "pretrained": "openai"}))
    assert "backbones[0].pretrained: weights for model 'RN50' with tag 'openai' are not on this machine" in err
    assert err.rstrip().endswith("(`bca cache --allow-download`) where the network is reachable.")


def test_a_local_sweep_checks_the_weights_before_ray_starts(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    r = bca("sweep", str(real_spec(tmp_path, backbone={"model": "RN50", "pretrained": "openai"})))
    assert r.exit_code == 2 and "are not on this machine" in r.stderr and "..." not in r.stderr, r.output
    assert not (tmp_path / "results").exists()


def test_continual_over_datasets_with_different_label_spaces_is_refused(tmp_path):
    path = real_spec(tmp_path, datasets=("dtd", "eurosat"), stream={"continual": ["dtd", "eurosat"]})
    err = refused(path)
    assert ("stream: continual runs one method state over datasets that share a label space, but class 0 is "
            "'Annual Crop Land' in eurosat but 'class 0 name' in dtd") in err


def test_continual_over_one_label_space_passes(tmp_path):
    path = real_spec(tmp_path, datasets=("imagenet", "imagenet-sketch"),
                     stream={"continual": ["imagenet", "imagenet-sketch"]})
    r = bca("sweep", str(path), "--dry-run")
    assert r.exit_code == 0, r.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_resources_this_machine_lacks_are_refused_by_the_dry_run(tmp_path):
    err = refused(real_spec(tmp_path, resources={"gpu": 0.5, "cpus": 4096}))
    assert "resources.gpu: each trial asks for 0.5 GPU but this machine has none" in err
    assert "resources.cpus: each trial asks for 4096 CPUs but this machine has" in err


@pytest.mark.parametrize("content, message", [
    ({"train": [], "val": [], "test": []}, "has an empty 'test' list; expected [relative_path, label, classname]"),
    ("", "is not a split file with a 'test' list"),
])
def test_an_empty_split_file_is_named(tmp_path, content, message):
    path = real_spec(tmp_path)
    card = dataset_card("dtd")
    split = tmp_path / "data" / card.folder / card.split_file
    split.write_text(content if isinstance(content, str) else json.dumps(content))
    err = refused(path)
    assert f"datasets[0]: DTD: {split.resolve()} {message}" in err


def test_a_dry_run_that_joins_a_cluster_leaves_the_machine_checks_to_it(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = real_spec(tmp_path, backbone={"model": "RN50", "pretrained": "openai"})
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # as --address sets it (restored after the test)
    r = bca("sweep", str(path), "--dry-run")
    assert r.exit_code == 0, r.output  # the workers hold the weights, not this machine


@pytest.mark.parametrize("setting, field, words", [
    ({"views": "augmix"}, "views", "views 'augmix' would change nothing"),
    ({"templates": "cupl"}, "templates", "template set(s) 'cupl' would change nothing"),
    ({"backbones": [{"model": "ViT-B-16", "pretrained": "openai"}]}, "backbones",
     "backbone(s) ViT-B-16 would change nothing"),
])
def test_image_settings_on_a_synthetic_only_spec_are_refused(tmp_path, setting, field, words):
    err = refused(synthetic_spec(tmp_path, **setting))
    assert f"{field}: {words}: every dataset of this spec is synthetic" in err


def test_every_method_running_a_clip_tower_is_refused_on_a_synthetic_dataset(tmp_path):
    """One rule for both towers: each method whose card names an image or a text encoder, in one spec, is named
    with what it does and what the generated embeddings lack."""
    from orchestrator.registry import method_cards

    towers = [c for c in method_cards() if c.image_encoder is not None or c.text_encoder is not None]
    assert {"tent", "tpt"} <= {c.name for c in towers}
    err = refused(synthetic_spec(tmp_path, views="augmix7", methods=[{"method": c.name} for c in towers]))
    for i, card in enumerate(towers):
        does = ("adapts CLIP's image encoder on the images" if card.image_encoder else
                "tunes the prompt through CLIP's text encoder")
        assert (f"methods[{i}].method: {card.name!r} {does} at test time, and the synthetic dataset "
                f"'synthetic-label_shift' has generated embeddings only") in err, card.name


def test_an_address_where_no_head_answers_ends_after_a_bounded_wait(tmp_path, monkeypatch):
    import time

    from orchestrator.sweep.runner import JOIN_WAIT_S

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # --address sets it; restored after the test
    path = synthetic_spec(tmp_path)
    began = time.monotonic()
    r = bca("sweep", str(path), "--address", "127.0.0.1:1")
    assert r.exit_code == 2, r.output
    assert time.monotonic() - began < JOIN_WAIT_S + 30
    assert "--address 127.0.0.1:1: no Ray head answers there (Connection refused, retried for 20 s)" in r.stderr
    assert not (tmp_path / "results").exists()
