"""Cost in the tables: each run's latency per sample and memory are its own method's, even inside a pack of
several methods; `bca report --table cost` and the dashboard's cost panel show them against the metric; results
written before these columns existed read as not measured."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.results import report
from orchestrator.results.db import ResultsDB
from orchestrator.results.testing import make_fake_results
from orchestrator.sweep.load import validate_spec
from orchestrator.sweep.plan import expand, make_trials
from orchestrator.sweep.pieces import settings_of
from orchestrator.sweep.trial import execute_trial

N = 400
# Seconds a fake clock advances in each method's pass: CLIP shares the BCA family's lockstep pass (and its cost)
# with the two BCA configurations; TDA has a pass of its own.
BCA_FAMILY_S, TDA_S = 3.0, 0.4
SPEC = {"name": "cost", "results_dir": "results", "seeds": [1], "pack": 4,
        "datasets": [{"synthetic": "iid", "n": N, "num_classes": 8, "dim": 16}],
        "methods": [{"method": "clip"}, {"method": "bca", "tau": [0.2, 0.3], "n1": 50}, {"method": "tda"}]}
runner = CliRunner()


@pytest.fixture(scope="module")
def pack_results(tmp_path_factory) -> Path:
    """One trial of CLIP, two BCA configurations and TDA, each method's pass timed by a fake clock."""
    from orchestrator.methods import many
    from orchestrator.sweep import memory

    root = tmp_path_factory.mktemp("cost")
    real = many.run_traces_many
    now = [0.0]

    def timed(*args, **kwargs):
        now[0] += TDA_S if args[4][0]["method"] == "tda" else BCA_FAMILY_S
        return real(*args, **kwargs)

    spec = validate_spec(copy.deepcopy(SPEC), base_dir=root)
    trials = make_trials(expand(spec), spec.pack)
    assert [len(t.runs) for t in trials] == [4]  # one pack of every method
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(many, "run_traces_many", timed)
        mp.setattr(memory, "_clock", lambda: now[0])
        execute_trial(trials[0], settings_of(spec))
    return Path(spec.results_dir)


def test_a_packs_methods_each_get_their_own_latency(pack_results):
    runs = ResultsDB(pack_results).df("SELECT method, latency_ms, samples_per_s, method_mem_mb FROM runs")
    latency = dict(zip(runs["method"], runs["latency_ms"]))
    # ms per sample: a pass's seconds over its configurations and the stream's samples
    assert latency["tda"] == pytest.approx(1000 * TDA_S / N, rel=1e-12)
    family = runs[runs["method"] != "tda"]["latency_ms"]
    assert family.to_numpy() == pytest.approx(1000 * BCA_FAMILY_S / 3 / N, rel=1e-12)
    assert runs["latency_ms"].to_numpy() == pytest.approx(1000 / runs["samples_per_s"].to_numpy(), rel=1e-12)
    assert runs["method_mem_mb"].notna().all() and (runs["method_mem_mb"] >= 0).all()


def test_report_cost_table_is_the_runs_means(pack_results):
    db = ResultsDB(pack_results)
    runs = db.df("SELECT a.method, a.tau, a.accuracy, r.latency_ms, r.method_mem_mb FROM accuracy a "
                 "JOIN runs r USING (run_id)")
    table = report.cost_table(db)
    frame = table.frame.reset_index()
    assert list(frame["row"]) == ["CLIP", "BCA (tau=0.2)", "BCA (tau=0.3)", "TDA"]
    for row, tau in (("BCA (tau=0.2)", 0.2), ("BCA (tau=0.3)", 0.3)):
        own = runs[(runs["method"] == "bca") & (runs["tau"] == tau)]
        got = frame[frame["row"] == row].iloc[0]
        assert got["mean"] == pytest.approx(own["accuracy"].mean())
        assert got["latency_ms"] == pytest.approx(own["latency_ms"].mean())
        assert got["method_mem_mb"] == pytest.approx(own["method_mem_mb"].mean())
        clip = runs[runs["method"] == "clip"]["accuracy"].mean()
        assert got["gain"] == pytest.approx(own["accuracy"].mean() - clip)
    out = runner.invoke(app, ["report", "--table", "cost", "--results", str(pack_results)],
                        env={"COLUMNS": "300", "NO_COLOR": "1"})
    assert out.exit_code == 0, out.output
    assert "latency (ms/sample)" in out.output and "method memory (MB)" in out.output


def test_results_written_before_the_cost_columns_read_as_not_measured(tmp_path):
    make_fake_results(tmp_path, datasets=("dtd",), methods={"clip": {}, "bca": {"tau": 0.3}}, seeds=(1,), n=20)
    db = ResultsDB(tmp_path)
    assert db.df("SELECT count(latency_ms) AS n FROM runs")["n"][0] == 0
    out = runner.invoke(app, ["report", "--table", "cost", "--results", str(tmp_path)],
                        env={"COLUMNS": "300", "NO_COLOR": "1"})
    assert out.exit_code == 0 and "│ RN50     │ DTD     │ BCA    │" in out.output
    assert "—" in out.output.split("BCA")[1].splitlines()[0]


def test_the_dashboard_sets_the_metric_against_each_cost(pack_results, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from dashboard import APP_PATH, RESULTS_ENV

    monkeypatch.setenv(RESULTS_ENV, str(pack_results))
    at = AppTest.from_file(str(APP_PATH), default_timeout=180)
    at.query_params["panel"] = "Cost"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    titles = [c.proto.spec for c in at.get("vega_lite_chart")]
    assert any("against latency (ms per sample)" in t for t in titles)
    assert any("against method memory (MB)" in t for t in titles)
