"""The dashboard app run in-process with streamlit.testing's AppTest.

Against a real small sweep (`bca sweep`, shared with the browser test): renders without exception, the
comparison table holds every method, changing a filter changes the table, the charts are there. Against the
results module's fake runs: the paper rows, a run still being written, a truncated Parquet part (named and
left out), and an empty or missing results dir (a clear message, no traceback).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard import APP_PATH, RESULTS_ENV
from dashboard_results import real_sweep_results
from orchestrator.results.testing import make_fake_results, write_fake_run
from orchestrator.results.writer import RunWriter

# Generous: the first run opens DuckDB and reads every footer on a busy 2-core machine.
TIMEOUT_S = 180
METHOD_ROWS = {"CLIP", "CLIP+LA", "CLIP+PA", "BCA (tau=0.2)", "BCA (tau=0.5)", "TDA", "TDA+PA"}


def run_app(results_dir: Path, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv(RESULTS_ENV, str(results_dir))
    return AppTest.from_file(str(APP_PATH), default_timeout=TIMEOUT_S).run()


def assert_no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def comparison(at: AppTest, index: int = 0):
    return at.table[index].value


@pytest.fixture(scope="module")
def sweep_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return real_sweep_results(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def fake_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fake_results")
    make_fake_results(root, datasets=("imagenet", "imagenet_a"),
                      methods={"clip": {}, "bca": [{"tau": 0.3, "n1": 30000, "n2": 10},
                                                   {"tau": 0.5, "n1": 30000, "n2": 10}]},
                      seeds=(1, 2), n=120)
    return root


# ------------------------------------------------------------------------------------------- real sweep
def test_real_sweep_renders_table_and_charts(sweep_results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_app(sweep_results, monkeypatch)
    assert_no_exception(at)
    assert not at.error and not at.warning, [m.value for m in [*at.error, *at.warning]]
    table = comparison(at)
    assert METHOD_ROWS <= set(table["method"]), table["method"].tolist()
    assert {"synthetic-label_shift", "synthetic-continual", "Average", "Δ CLIP (Average)"} <= set(table.columns)
    gains = dict(zip(table["method"], table["Δ CLIP (Average)"]))
    assert gains["CLIP"] == "+0.00" and all(g != "—" for g in gains.values()), gains
    # online accuracy, sensitivity to tau, learned and CLIP prior, per class, parallel coordinates, time, memory
    assert len(at.get("vega_lite_chart")) >= 8
    assert len(at.download_button) >= 8  # every table has its CSV export


def test_method_filter_changes_table(sweep_results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_app(sweep_results, monkeypatch)
    before = comparison(at)
    at.multiselect(key="filter_method").set_value(["bca"]).run()
    assert_no_exception(at)
    after = comparison(at)
    assert not after.equals(before)
    assert set(after["method"]) == {"BCA (tau=0.2)", "BCA (tau=0.5)"}, after["method"].tolist()
    # CLIP's rows are hidden, yet still the baseline of the gain
    assert all(g.startswith(("+", "-")) for g in after["Δ CLIP (Average)"]), after["Δ CLIP (Average)"].tolist()


def test_tau_filter_keeps_methods_without_tau(sweep_results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_app(sweep_results, monkeypatch)
    at.multiselect(key="filter_tau").set_value([0.2]).run()
    assert_no_exception(at)
    methods = set(comparison(at)["method"])
    # one BCA configuration is left, so its row needs no tau label; CLIP has no tau, so it passes
    assert {"BCA", "CLIP"} <= methods and not any("tau=" in m for m in methods), methods


def test_dataset_and_seed_filters(sweep_results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_app(sweep_results, monkeypatch)
    at.multiselect(key="filter_dataset").set_value(["synthetic-continual"]).run()
    at.multiselect(key="filter_seed").set_value([1]).run()
    assert_no_exception(at)
    table = comparison(at)
    assert "synthetic-label_shift" not in table.columns and "synthetic-continual" in table.columns
    assert not any("±" in cell for cell in table["synthetic-continual"])  # one seed: no spread


# ------------------------------------------------------------------------------------------- fake runs
def test_paper_rows(fake_results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_app(fake_results, monkeypatch)
    assert "source" not in comparison(at).columns
    at.toggle(key="paper_rows").set_value(True).run()
    assert_no_exception(at)
    table = comparison(at)
    assert {"measured", "paper", "Δ paper"} <= set(table["source"])
    paper_bca = table[table["method"].str.startswith("BCA") & (table["source"] == "paper")
                      & (table["backbone"] == "RN50")]
    assert set(paper_bca["ImageNet"]) == {"61.81"}  # REFERENCE.md section 2, Table 1


def test_prior_view_from_saved_state(fake_results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_app(fake_results, monkeypatch)
    assert at.selectbox(key="prior_run").value is not None
    titles = [c.proto.spec for c in at.get("vega_lite_chart")]
    assert any("learned prior" in spec for spec in titles) and any("one-hot" in spec for spec in titles)


def test_run_still_writing_and_refresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = {"sweep": "live", "backbone": "RN50", "dataset": "imagenet", "method": "bca", "seed": 1,
              "hparams": {"tau": 0.3, "n1": 30000, "n2": 10}}
    write_fake_run(tmp_path, {**config, "method": "clip", "hparams": {}}, n=100)
    write_fake_run(tmp_path, config, n=100, rows=40, status="running")
    at = run_app(tmp_path, monkeypatch)
    assert_no_exception(at)
    assert "1 running · 1 finished" in at.main.caption[0].value
    listing = at.dataframe[-1].value
    running = listing[listing["status"] == "running"]
    assert running["rows_written"].tolist() == [40] and running["n_samples"].tolist() == [100]

    write_fake_run(tmp_path, {**config, "seed": 2}, n=100)  # the sweep goes on while the page is open
    at.button(key="refresh").click().run()
    assert_no_exception(at)
    assert "1 running · 2 finished" in at.main.caption[0].value


def test_runs_started_without_samples_yet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    RunWriter(tmp_path, {"sweep": "s", "backbone": "RN50", "dataset": "imagenet", "method": "bca", "seed": 1,
                         "hparams": {"tau": 0.3}}).mark("running", n_samples=100)
    at = run_app(tmp_path, monkeypatch)
    assert_no_exception(at)
    assert "none has written samples yet" in at.info[0].value
    assert at.dataframe[0].value["status"].tolist() == ["running"]


def test_truncated_part_is_named_and_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = make_fake_results(tmp_path, methods={"clip": {}, "bca": {"tau": 0.3}}, seeds=(1,), n=120, part_size=40)
    bad = sorted((tmp_path / "samples").glob(f"*/*/*/method=bca/run_id={runs[1].run_id}/part-*.parquet"))[1]
    bad.write_bytes(bad.read_bytes()[:100])
    at = run_app(tmp_path, monkeypatch)
    assert_no_exception(at)
    assert len(at.warning) == 1 and str(bad) in at.warning[0].value, [w.value for w in at.warning]
    listing = at.dataframe[-1].value
    rows = dict(zip(listing["method"], listing["rows_written"]))
    assert rows == {"clip": 120, "bca": 80}  # the other parts of the run are still read
    assert len(at.table) == 1


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_missing_or_empty_results_dir(make: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "results"
    if make == "empty":
        results.mkdir()
    at = run_app(results, monkeypatch)
    assert_no_exception(at)
    assert not at.error
    messages = " ".join(i.value for i in at.info)
    expected = "No results directory at" if make == "missing" else "No runs in"
    assert expected in messages and str(results) in messages, messages
    assert not at.table and not at.get("vega_lite_chart")
