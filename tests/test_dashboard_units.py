"""The dashboard's pure parts: filter semantics, the prior matrices, the sensitivity slice, and the launcher's
command line (loopback by default, issue 7)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from dashboard import RESULTS_ENV, launch, prior, queries
from dashboard.queries import Filters
from orchestrator.cli import app


def runs_frame() -> pd.DataFrame:
    return pd.DataFrame({
        "run_id": ["a", "b", "c", "d", "e"],
        "sweep": ["s"] * 5,
        "backbone": ["RN50"] * 5,
        "dataset": ["imagenet"] * 5,
        "method": ["clip", "bca", "bca", "bca", "bca"],
        "seed": [1, 1, 2, 1, 1],
        "status": ["finished", "finished", "finished", "running", "finished"],
        "num_templates": [1, 1, 1, 1, 1],
        "tau": [math.nan, 0.3, 0.3, 0.5, 0.5],
        "n1": [pd.NA, 30000, 30000, 30000, 1000],
        "n2": [pd.NA, 10, 10, 10, 10],
        "accuracy": [50.0, 60.0, 62.0, 55.0, 58.0],
    }).astype({"n1": "Int64", "n2": "Int64"})


def test_filters_hparams_let_runs_without_them_through() -> None:
    runs = runs_frame()
    assert Filters(tau=(0.3,)).apply(runs)["run_id"].tolist() == ["a", "b", "c"]
    assert Filters(n1=(1000,)).apply(runs)["run_id"].tolist() == ["a", "e"]
    assert Filters(method=("bca",), seed=(1,)).apply(runs)["run_id"].tolist() == ["b", "d", "e"]
    assert Filters(status=("running",)).apply(runs)["run_id"].tolist() == ["d"]
    assert Filters().apply(runs)["run_id"].tolist() == list("abcde")


def test_with_clip_adds_the_baseline_only_when_needed() -> None:
    assert Filters(method=("bca",)).with_clip().method == ("bca", "clip")
    assert Filters(method=("clip", "bca")).with_clip().method == ("clip", "bca")
    assert Filters().with_clip().method == ()


def test_series_labels_name_what_varies_within_a_method() -> None:
    runs = runs_frame()
    labels = queries.series_labels(runs, ["tau", "n1", "n2"])
    assert labels.tolist() == ["CLIP", "BCA (tau=0.3, n1=30000)", "BCA (tau=0.3, n1=30000)",
                               "BCA (tau=0.5, n1=30000)", "BCA (tau=0.5, n1=1000)"]


def test_sensitivity_holds_the_other_hparams_at_their_most_common_value() -> None:
    points, held = queries.sensitivity_points(runs_frame(), "tau", ["tau", "n1", "n2"])
    # finished bca runs with n1 = 30000 (the most common): tau 0.3 twice; the tau 0.5 one is running
    assert held == {"n1": 30000}
    assert points.empty  # a single tau value is left: nothing to plot
    runs = runs_frame().assign(status="finished")
    points, held = queries.sensitivity_points(runs, "tau", ["tau", "n1", "n2"])
    assert held == {"n1": 30000}
    assert points[["value", "mean", "n"]].values.tolist() == [[0.3, 61.0, 2], [0.5, 55.0, 1]]
    assert set(points["series"]) == {"BCA · ImageNet"}


def test_default_window_gives_about_the_asked_points() -> None:
    assert queries.default_window(1000, points=25) == 40
    assert queries.default_window(3, points=25) == 1


def state(k: int = 4, templates: int = 2) -> dict[str, np.ndarray]:
    class_ids = np.arange(k * templates) % k
    v = np.eye(k)[class_ids].astype(np.float32)
    v[1] = [0.1, 0.6, 0.3, 0.0]  # embedding 1 (class 1, first template) moved mass to class 2
    c2 = np.full(k * templates, 10.0)
    c2[[1, 5]] = [14.0, 11.0]  # class 1: 5 updates; class 3: none; class 2 (embedding 2): 2
    c2[2] = 12.0
    return {"V": v, "class_ids": class_ids, "C2": c2}


def test_class_prior_averages_the_embeddings_of_each_class() -> None:
    s = state()
    p = prior.class_prior(s["V"], s["class_ids"])
    assert np.allclose(p[1], [0.05, 0.8, 0.15, 0.0])
    assert np.allclose(p[[0, 2, 3]], np.eye(4)[[0, 2, 3]])


def test_top_classes_by_prior_updates_then_class_id() -> None:
    assert prior.top_classes(state(), n2=10, top=3) == [1, 2, 0]
    assert prior.top_classes(state(), n2=None, top=4) == [1, 2, 0, 3]  # n2 unknown: counted from min(C2)


def test_heatmap_other_column_keeps_the_mass_outside_the_shown_classes() -> None:
    learned, clip = prior.heatmap_frames(state(), [1, 0])
    row = learned[learned["embedding_class"] == "class 1"].set_index("class")["prior"]
    assert row.to_dict() == pytest.approx({"class 1": 0.8, "class 0": 0.05, prior.OTHER: 0.15})
    assert clip.groupby("embedding_class")["prior"].sum().tolist() == [1.0, 1.0]
    assert prior.check_state({"V": np.ones((2, 3))}) is not None  # no class_ids: explained, not a crash


@pytest.fixture
def captured_exec(monkeypatch: pytest.MonkeyPatch) -> dict:
    seen: dict = {}

    def fake_execve(path: str, argv: list[str], env: dict) -> None:
        seen.update(path=path, argv=argv, env=env)

    monkeypatch.setattr(launch.os, "execve", fake_execve)
    return seen


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_bca_dashboard_binds_loopback_by_default(captured_exec: dict, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["dashboard", "--results", str(tmp_path), "--port", "8765"])
    assert result.exit_code == 0, result.output
    argv = captured_exec["argv"]
    assert argv[1:4] == ["-m", "streamlit", "run"] and Path(argv[4]).name == "app.py" and Path(argv[4]).is_file()
    assert option(argv, "--server.address") == "127.0.0.1"
    assert option(argv, "--server.port") == "8765"
    assert option(argv, "--browser.gatherUsageStats") == "false"
    assert captured_exec["env"][RESULTS_ENV] == str(tmp_path.resolve())


def test_bca_dashboard_host_option(captured_exec: dict, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["dashboard", "--results", str(tmp_path), "--host", "0.0.0.0"])
    assert result.exit_code == 0, result.output
    assert option(captured_exec["argv"], "--server.address") == "0.0.0.0"
    assert option(captured_exec["argv"], "--server.port") == "8501"
