"""Honest tuning: `bca report --tune-on`, the tuned_choice / tuned macros, and the caption of a table that shows a
method's best of several configurations on the runs it chose them on. Checked against a plain pandas
computation of the same choice."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.results import report, tuning
from orchestrator.results.db import ResultsDB
from orchestrator.results.testing import make_fake_results

GRID = [{"tau": 0.2}, {"tau": 0.3}, {"tau": 0.4}]
runner = CliRunner()


def bca(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "300", "NO_COLOR": "1"})


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tuning")
    make_fake_results(root, datasets=("dtd", "eurosat"), methods={"clip": {}, "bca": GRID}, seeds=(1, 2, 3), n=40)
    return root


def _expected_choice(runs: pd.DataFrame, tune: pd.Series, metric: str, higher: bool) -> dict[tuple, str]:
    """Per (method, dataset): the group_id with the best mean `metric` over the tuning runs, ties to the smaller id."""
    means = runs[tune].groupby(["method", "dataset", "group_id"])[metric].mean().reset_index()
    means["key"] = means[metric] if higher else -means[metric]
    best = means.sort_values(["method", "dataset", "key", "group_id"], ascending=[True, True, False, True])
    return {(m, d): g for (m, d), g in best.groupby(["method", "dataset"])["group_id"].first().items()}


@pytest.mark.parametrize(("metric", "higher"), [("accuracy", True), ("ece", False)])
def test_the_choice_is_the_best_mean_on_the_tuning_runs(results, metric, higher):
    db = ResultsDB(results)
    runs = db.df("SELECT * FROM accuracy")
    expected = _expected_choice(runs, runs["seed"] == 1, metric, higher)
    got = tuning.tune(db, "seed = 1", metric)
    assert {(r.method, r.dataset): r.group_id for r in got.choices.itertuples()} == expected
    assert set(got.choices.loc[got.choices["method"] == "bca", "candidates"]) == {3}
    # the macro gives the chosen configurations' other runs, as the report does
    rows = db.df(f"SELECT * FROM tuned((SELECT list(run_id) FROM runs WHERE seed = 1), metric := '{metric}')")
    want = runs[runs["group_id"].isin(expected.values()) & (runs["seed"] != 1)]
    assert sorted(rows["run_id"]) == sorted(want["run_id"]) == sorted(got.evaluation(runs)["run_id"])


def test_report_tune_on_reports_the_choice_on_the_other_runs_only(results):
    db = ResultsDB(results)
    runs = db.df("SELECT * FROM accuracy")
    choice = _expected_choice(runs, runs["seed"] < 3, "accuracy", True)
    out = bca("report", "--results", str(results), "--tune-on", "seed < 3")
    assert out.exit_code == 0, out.output
    table = report.report_tables(db, runs=tuning.tune(db, "seed < 3").evaluation(report.recorded_runs(db)))[0]
    for dataset, title in (("dtd", "DTD"), ("eurosat", "EuroSAT")):
        held_out = runs[(runs["group_id"] == choice[("bca", dataset)]) & (runs["seed"] == 3)]
        assert table.mean.at[("RN50", "BCA"), title] == pytest.approx(held_out["accuracy"].mean())
        assert table.n.at[("RN50", "BCA"), title] == 1
    text = " ".join(out.output.split())
    assert "tuned on the 16 run(s) where seed < 3" in text and "the cells stand on its other 4 run(s) only" in text
    assert "BCA · RN50 · DTD: tau=" in text and "(best of 3 configurations, mean" in text
    assert "chosen on these runs" not in text  # one configuration per cell now


def test_a_table_of_several_configurations_says_they_were_chosen_on_its_runs(results):
    out = bca("report", "--results", str(results))
    assert out.exit_code == 0, out.output
    assert "BCA (RN50): best of 3 configurations, chosen on these runs" in " ".join(out.output.split())


@pytest.mark.parametrize(("predicate", "message"), [
    ("sed = 1", 'Referenced column "sed" not found'),
    ("seed = 1; DROP TABLE runs", "Parser Error"),
    ("seed = 9", "--tune-on 'seed = 9' matches none of the 24 runs: nothing to tune on"),
    ("seed > 0", "matches every one of the 24 runs: nothing left to report on"),
])
def test_a_bad_predicate_exits_2_with_the_reason(results, predicate, message):
    out = bca("report", "--results", str(results), "--tune-on", predicate)
    assert out.exit_code == 2 and message in out.output and "Traceback" not in out.output


def test_the_macros_are_open_to_bca_query(results):
    out = bca("query", "--results", str(results), "--csv",
              "SELECT method, dataset, candidates FROM tuned_choice((SELECT list(run_id) FROM runs WHERE seed = 1)) "
              "ORDER BY 1, 2")
    assert out.exit_code == 0, out.output
    assert out.output.split() == ["method,dataset,candidates", "bca,dtd,3", "bca,eurosat,3", "clip,dtd,1",
                                  "clip,eurosat,1"]
    bad = bca("query", "--results", str(results),
              "SELECT * FROM tuned((SELECT list(run_id) FROM runs), metric := 'acc')")
    assert bad.exit_code == 2 and "tuned: unknown metric acc; expected one of: accuracy" in bad.output


def test_the_dashboard_shows_the_tuned_configurations_on_the_other_runs(results, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from dashboard import APP_PATH, RESULTS_ENV

    monkeypatch.setenv(RESULTS_ENV, str(results))
    at = AppTest.from_file(str(APP_PATH), default_timeout=180)
    at.query_params["tune_on"] = "seed < 3"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    captions = " ".join(c.value for c in at.caption)
    assert "tuned on the 16 run(s) where seed < 3" in captions and "(best of 3 configurations" in captions
    table = at.table[0].value
    assert all("(n=1)" in str(v) for v in table.filter(like="DTD").to_numpy().ravel() if str(v) != "—")
    # the Paper tables panel stands on the same tuned runs, and says so
    at.query_params["panel"] = "Paper tables"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert sum("tuned on the 16 run(s) where seed < 3" in c.value for c in at.caption) == 2
    paper = [t.value for t in at.table if "method" in t.value.columns]
    assert paper and all("(n=1)" in str(v) for t in paper for v in t.filter(like="DTD").to_numpy().ravel())
    at.text_input(key="tune_on").set_value("sed < 3").run()
    assert 'Referenced column "sed" not found' in at.sidebar.error[0].value
