"""Methods that adapt the image encoder in a sweep, at the trial level (no Ray): a spec mixing Tent, SAR, DeYO, BATCLIP,
CLIPArTT and WATT with cached-feature methods runs on a real-layout image dataset and a zero-code class-folder one
with the tiny model, rows in `bca report`; a continual run killed mid-stream resumes from the state its state file
holds to the rows of an uninterrupted run; an episodic run split into shards writes the unsharded run's rows; the
spec's checks."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.clip.testing import TINY_VIT, build_dataset, write_image, write_model_config
from orchestrator.methods.encoder import EncoderMethod
from orchestrator.results.writer import RunWriter, load_state
from orchestrator.sweep.load import load_spec
from orchestrator.sweep.plan import expand, make_trials
from orchestrator.sweep.pieces import STATE_ROWS, settings_of
from orchestrator.sweep.trial import execute_trial

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


def bca(*args: str):
    return CliRunner().invoke(app, list(args), env=ENV)


def write_spec(tmp_path: Path, methods: list[dict], data: Path, datasets: tuple[str, ...] = ("dtd",)) -> Path:
    spec = {"name": "enc", "results_dir": "results", "cache_dir": str(data.parent / "cache"), "data_root": str(data),
            "backbones": [{"model": TINY_VIT, "pretrained": "random",
                           "config": str(write_model_config(TINY_VIT, tmp_path / "models"))}],
            "datasets": list(datasets), "methods": methods, "seeds": [1], "resources": {"cpus": 1}, "part_rows": 4}
    path = tmp_path / "enc.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("images") / "data"
    build_dataset("dtd", root, num_classes=3, per_class=3)
    # a zero-code class-folder dataset (docs/adding-a-dataset.md, section 1)
    shapes = root / "toyshapes"
    shapes.mkdir()
    (shapes / "classnames.txt").write_text("circle\nsquare\ntriangle\n")
    (shapes / "templates.txt").write_text("a photo of a {c}.\n")
    for label, folder in enumerate(("0_circle", "1_square", "2_triangle")):
        for index in range(2):
            write_image(shapes / folder / f"{index}.png", label, index)
    return root


def run_all(path: Path, failpoint: str | None = None) -> list:
    spec = load_spec(path)
    settings = settings_of(spec)
    if failpoint:
        settings = settings.__class__(**{**settings.__dict__, "failpoint": failpoint})
    return [(trial, execute_trial(trial, settings)) for trial in make_trials(expand(spec), spec.pack)]


def rows(path: Path, method: str) -> list[dict]:
    spec = load_spec(path)
    run = next(r for r in expand(spec) if r.method == method)
    writer = RunWriter(spec.results_dir, run.config)
    return [row for part in sorted(writer.samples_dir.glob("part-*.parquet")) for row in pq.read_table(part).to_pylist()]


def test_a_spec_mixing_encoder_and_cached_feature_methods_reports_every_method(tmp_path, data, monkeypatch):
    path = write_spec(tmp_path, [{"method": "clip"}, {"method": "tda"}, {"method": "tent", "batch_size": 2},
                                 {"method": "sar", "batch_size": 2}, {"method": "deyo", "batch_size": 2},
                                 {"method": "batclip", "batch_size": 2}, {"method": "clipartt", "batch_size": 2,
                                                                          "steps": 1},
                                 {"method": "watt", "batch_size": 2, "rounds": 1}], data, ("dtd", "toyshapes"))
    done = run_all(path)
    # each encoder run alone, the others packed: per dataset
    assert sorted(len(trial.runs) for trial, _ in done) == [1] * 12 + [2, 2]
    monkeypatch.chdir(tmp_path)
    r = bca("report", "--sweep", "enc", "--results", "results")
    assert r.exit_code == 0, r.output
    for label in ("CLIP (batch_size=1)", "TDA (batch_size=1)", "Tent (batch_size=2)", "SAR (batch_size=2)",
                  "DeYO (batch_size=2)", "BATCLIP (batch_size=2)", "CLIPArTT (batch_size=2)", "WATT (batch_size=2)"):
        # its DTD cell (the paper's Table 2) and its toyshapes cell (the other datasets' table): finished runs, all rows
        lines = [line for line in r.stdout.splitlines() if f"│ {label} " in line]
        assert len(lines) == 2 and all("(n=1)" in line for line in lines), lines
    assert len(rows(path, "sar")) == 9


def test_a_continual_run_killed_mid_stream_resumes_from_its_state_to_the_same_rows(tmp_path, data, monkeypatch):
    methods = [{"method": "tent", "batch_size": 2, "lr": 0.05}]
    whole = write_spec(tmp_path / "whole", methods, data)
    run_all(whole)
    killed = write_spec(tmp_path / "killed", methods, data)
    with pytest.raises(RuntimeError, match="failpoint"):
        run_all(killed, failpoint=f"raise:1:{tmp_path / 'flag'}")
    spec = load_spec(killed)
    (run,) = expand(spec)
    assert RunWriter(spec.results_dir, run.config).rows_done() == 4
    assert int(load_state(spec.results_dir, run.run_id)[STATE_ROWS]) == 4  # the state after the first part
    loaded = []
    restore = EncoderMethod.load_state_tensors
    monkeypatch.setattr(EncoderMethod, "load_state_tensors",
                        lambda self, state: loaded.append(int(state.get(STATE_ROWS, -1))) or restore(self, state))
    ((_, (result,)),) = run_all(killed)
    assert loaded == [4]  # it went on from the saved state, not by replaying the first part
    assert result["resumed_from"] == 4 and result["rows_written"] == 5
    volatile = {"samples_per_s"}
    assert [{k: v for k, v in r.items() if k not in volatile} for r in rows(killed, "tent")] == \
           [{k: v for k, v in r.items() if k not in volatile} for r in rows(whole, "tent")]


def test_an_episodic_run_in_shards_writes_the_unsharded_runs_rows(tmp_path, data):
    one = write_spec(tmp_path / "one", [{"method": "tent", "batch_size": 2, "lr": 0.05, "episodic": True}], data)
    run_all(one)
    sharded = write_spec(tmp_path / "sharded", [{"method": "tent", "batch_size": 2, "lr": 0.05, "episodic": True,
                                                 "shards": 2}], data)
    done = run_all(sharded)
    assert len(done) == 2 and all(trial.shard is not None for trial, _ in done)
    assert rows(sharded, "tent") == rows(one, "tent")


def test_the_dry_run_says_what_the_encoder_methods_need(tmp_path, data):
    """Also: a spec's augmented views are not encoded for an encoder method, which takes the single view."""
    path = write_spec(tmp_path, [{"method": "clip"}, {"method": "sar", "batch_size": "official"},
                                 {"method": "batclip", "batch_size": "official"}], data)
    path.write_text(path.read_text() + "views: augmix7\n")
    r = bca("sweep", str(path), "--dry-run")
    assert r.exit_code == 0, r.output
    assert "dtd views=single" in r.stdout and "dtd views=augmix7 seed=1" in r.stdout
    assert "methods adapting CLIP's image encoder on the images (one trial per run, never packed" in r.stdout
    assert "  sar at batch size 64: CLIP's image encoder adapted at test time (its norm layers' affine parameters), " \
           "wants any device, 396.2 MB per image (~24.8 GB at batch size 64)" in r.stdout
    assert "  batclip at batch size 64 on 47 classes: CLIP's image encoder adapted at test time (its norm layers' " \
           "affine parameters), running its text tower too, wants any device, 396.2 MB per image (~24.8 GB at batch " \
           "size 64) and 18.1 MB per class for its text tower (~0.8 GB at K = 47)" in r.stdout


def test_the_spec_refuses_shards_of_a_continual_run_fp16_on_a_cpu_and_synthetic_data(tmp_path, data):
    r = bca("sweep", str(write_spec(tmp_path, [{"method": "tent", "shards": 2},
                                               {"method": "sar", "precision": "amp_fp16"}], data)), "--dry-run")
    assert r.exit_code == 2
    assert "methods[0].shards: 'tent' carries the adapted encoder from batch to batch unless episodic: true" in r.stderr
    assert "methods[1].precision: 'amp_fp16' runs 'sar''s encoder under CUDA fp16 autocast, and resources.gpu is 0" \
        in r.stderr
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "results_dir": "results", "datasets": [
        {"synthetic": "label_shift", "n": 60, "num_classes": 4, "dim": 16}], "methods": [{"method": "sar"}],
        "seeds": [1]}))
    r = bca("sweep", str(path), "--dry-run")
    assert r.exit_code == 2
    assert "'sar' adapts CLIP's image encoder on the images at test time, and the synthetic dataset" in r.stderr
