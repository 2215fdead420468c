"""A checkpoint is set beside the published numbers only when it is known to be the published file (issue 24
item 4): its sha256 equals the one OpenAI's download URL records. Any other checkpoint's rows read
"RN50 (checkpoint x.pt)" and have no published row or "Δ paper" beside them."""

from __future__ import annotations

from pathlib import Path

import open_clip
import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.clip.backbone import file_sha256
from orchestrator.results import report
from orchestrator.results.db import ResultsDB
from orchestrator.results.testing import write_fake_run
from orchestrator.sweep import catalog
from orchestrator.sweep.load import load_spec
from orchestrator.sweep.plan import expand


def fake_runs(root: Path, pretrained: str | None) -> None:
    for seed in (1, 2):
        for method in ("clip", "bca"):
            write_fake_run(root, {"sweep": "ck", "backbone": "RN50", "pretrained": pretrained, "dataset": "eurosat",
                                  "method": method, "seed": seed, "templates": "dataset", "num_templates": 1,
                                  "views": "single", "hparams": {}}, n=40)


def test_a_checkpoint_of_unknown_weights_stays_out_of_the_paper_comparison(tmp_path):
    fake_runs(tmp_path, "/data/weights/x.pt")
    fake_runs(tmp_path, "openai")
    table = report.build_table(ResultsDB(tmp_path), report.TABLE2, paper=True)
    rows = set(table.mean.index)
    assert ("RN50 (checkpoint x.pt)", "CLIP", "measured") in rows
    assert not any(b.startswith("RN50 (checkpoint") and s != "measured" for b, _, s in rows)
    assert ("RN50", "CLIP", "Δ paper") in rows  # the published weights are compared
    r = CliRunner().invoke(app, ["report", "--results", str(tmp_path), "--paper"], env={"COLUMNS": "240"})
    assert r.exit_code == 0, r.output
    assert "RN50 (checkpoint x.pt)" in r.stdout


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    path = tmp_path / "RN50.pt"
    path.write_bytes(b"not the published weights")
    return path


def spec_with(tmp_path: Path, checkpoint: Path) -> Path:
    from orchestrator.clip.testing import build_dataset

    build_dataset("eurosat", tmp_path / "data", num_classes=2, per_class=2)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "ck", "results_dir": "results", "cache_dir": "cache", "data_root": "data",
                                    "backbones": [{"model": "RN50", "checkpoint": str(checkpoint)}],
                                    "datasets": ["eurosat"], "methods": [{"method": "clip"}], "seeds": [1]}))
    return path


def test_any_other_checkpoint_is_recorded_as_its_file(tmp_path, checkpoint):
    assert catalog.published_tag("RN50", str(checkpoint)) is None
    (run,) = expand(load_spec(spec_with(tmp_path, checkpoint)))
    assert run.config["pretrained"] == str(checkpoint) and "checkpoint" not in run.config
    assert run.config["weights_sha256"] == file_sha256(checkpoint)  # the runs table's column: the file's content


def test_the_published_file_is_recorded_as_its_tag(tmp_path, checkpoint, monkeypatch):
    # The official file is 244 MB and cannot be fetched here: point open_clip's recorded URL at this file's hash,
    # which is exactly what the check compares.
    official = open_clip.get_pretrained_cfg("RN50", "openai")
    url = official["url"].replace(official["url"].split("/")[-2], file_sha256(checkpoint))
    monkeypatch.setattr(open_clip, "get_pretrained_cfg", lambda model, tag: {**official, "url": url})
    assert catalog.published_tag("RN50", str(checkpoint)) == "openai"
    (run,) = expand(load_spec(spec_with(tmp_path, checkpoint)))
    assert run.config["pretrained"] == "openai" and run.config["checkpoint"] == str(checkpoint)
