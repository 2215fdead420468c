"""COSMIC through a sweep on a tiny real dataset with the tiny open_clip model and a tiny DINOv2 checkpoint in the
official format: the DINOv2 features encoded once and read by every COSMIC run; the dry run lists their entry and
counts it; a backbone without the encoder is refused naming the field. COSMIC takes augmented views on every dataset
(its official protocol, as MCP and DMN-ZS), which the synthetic benchmark does not have, so it does not run there;
the synthetic benchmark's simulated auxiliary features reach a stream in its order all the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.results.writer import read_run
from orchestrator.sweep.load import load_spec
from orchestrator.sweep.plan import expand

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


def write(tmp_path: Path, auxiliary: bool = True) -> Path:
    from orchestrator.clip.testing import TINY_VIT, build_dataset, write_dinov2_checkpoint, write_model_config

    build_dataset("dtd", tmp_path / "data", num_classes=3, per_class=3)
    config = write_model_config(TINY_VIT, tmp_path / "models")
    dino = write_dinov2_checkpoint(tmp_path / "weights" / "dinov2_tiny_reg4_pretrain.pth")
    backbone = {"model": TINY_VIT, "config": str(config), "pretrained": "random"}
    if auxiliary:
        backbone["auxiliary"] = [{"name": "dinov2", "arch": "bca-tiny-dinov2", "checkpoint": str(dino)}]
    spec = {"name": "cosmic", "results_dir": "results", "cache_dir": "cache", "data_root": "data",
            "backbones": [backbone],
            "datasets": ["dtd"],
            "views": "protocol",
            "methods": [{"method": "clip"}, {"method": "cosmic", "ratio": [0.2, 0.5], "mac_step": 10}],
            "seeds": [1], "resources": {"cpus": 1}, "part_rows": 50}
    path = tmp_path / "cosmic.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_backbone_without_the_encoder_is_refused_naming_the_field(tmp_path):
    result = CliRunner().invoke(app, ["sweep", str(write(tmp_path, auxiliary=False)), "--dry-run"], env=ENV)
    assert result.exit_code == 2, result.output
    assert "backbones[0].auxiliary" in result.output and "reads the dinov2 auxiliary encoder" in result.output


def test_the_dry_run_lists_the_auxiliary_entry_and_its_cost(tmp_path):
    result = CliRunner().invoke(app, ["sweep", str(write(tmp_path)), "--dry-run"], env=ENV)
    assert result.exit_code == 0, result.output
    assert "auxiliary-encoder entries the trials read (1" in result.output
    assert "dinov2:bca-tiny-dinov2" in result.output and "dtd views=augmix7 seed=1: to encode" in result.output
    # 9 images: the single view for CLIP's run, the original and 7 AugMix views for CLIP's entry and for DINOv2's
    assert "153 image views to encode" in result.output
    assert "not priced for bca-tiny-vit, dinov2:bca-tiny-dinov2" in result.output


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.usefixtures("local_ray")
def test_cosmic_runs_in_a_sweep_on_a_real_layout_dataset(tmp_path):
    from orchestrator.sweep.runner import run_sweep

    spec = load_spec(write(tmp_path))
    outcome = run_sweep(spec, out=lambda line: None)
    assert outcome.ok, outcome.failed
    runs = expand(spec)
    cosmic = [r for r in runs if r.config["method"] == "cosmic"]
    assert len(cosmic) == 2
    for run in runs:
        assert read_run(spec.results_dir, spec.name, run.run_id)["status"] == "finished", run.label
    assert all(r.config["auxiliary"]["dinov2"].startswith("bca-tiny-dinov2/") for r in cosmic)
    assert "auxiliary" not in next(r for r in runs if r.config["method"] == "clip").config
    # one DINOv2 entry for the two COSMIC runs, beside CLIP's of the same views (and CLIP's single view for clip)
    manifests = [json.loads(p.read_text()) for p in Path(spec.cache_dir).rglob("manifest.json")]
    aux = [m for m in manifests if "auxiliary" in m["key_fields"]]
    assert len(aux) == 1 and aux[0]["views"] == "augmix7"
    assert sorted(m["views"] for m in manifests if "backbone" in m["key_fields"]) == ["augmix7", "single"]


def test_the_synthetic_benchmark_simulates_the_auxiliary_encoder_in_stream_order():
    import torch

    from orchestrator.data.synthetic import auxiliary_features, synthesize
    from orchestrator.sweep.pieces import Settings, load_stream
    from orchestrator.sweep.plan import DataSource

    params = {"n": 50, "num_classes": 4, "dim": 8}
    source = DataSource(dataset="synthetic-label_shift", seed=2, synthetic="label_shift",
                        synthetic_params=json.dumps(params), stream=json.dumps("iid"),
                        auxiliary=json.dumps([{"name": "dinov2", "synthetic": True}]))
    stream, _ = load_stream(source, Settings(results_dir="r", cache_dir=None, data_root=None, part_rows=10))
    bench = synthesize("label_shift", seed=2, **params)
    expected = auxiliary_features(bench, 2)[stream.order]
    torch.testing.assert_close(stream.auxiliary["dinov2"].cpu(), expected, atol=0, rtol=0)
    torch.testing.assert_close(stream.features.cpu(), bench.features[stream.order], atol=0, rtol=0)
