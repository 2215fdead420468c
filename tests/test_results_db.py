"""DuckDB views over results: known answers on hand-made and writer-made files, empty dirs, bad files, live growth."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.results import schema
from orchestrator.results.db import VIEWS, ResultsDB
from orchestrator.results.testing import make_fake_results, write_fake_run


def _hand_run(root, sweep, method, run_id, correct, n_samples, status="finished", group="g", setting="s1", seed=1):
    """A run written with plain pyarrow (no RunWriter): minimal columns, layout paths."""
    d = root / "samples" / f"sweep={sweep}" / "backbone=RN50" / "dataset=dtd" / f"method={method}" / f"run_id={run_id}"
    d.mkdir(parents=True)
    n = len(correct)
    label = np.zeros(n, np.int32)
    pred = np.where(correct, 0, 1).astype(np.int32)
    pq.write_table(pa.table({"run_id": [run_id] * n, "sample_idx": np.arange(n), "label": label, "pred": pred,
                             "correct": np.array(correct)}), d / "part-000000000.parquet")
    r = root / "runs" / f"sweep={sweep}"
    r.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"run_id": [run_id], "sweep": [sweep], "backbone": ["RN50"], "dataset": ["dtd"],
                             "method": [method], "seed": [seed], "status": [status], "n_samples": [n_samples],
                             "group_id": [group], "setting_id": [setting]}), r / f"run_id={run_id}.parquet")


def test_views_on_hand_made_files_give_known_answers(tmp_path):
    # run a: 4 rows, 3 correct, last half (positions 2, 3) all correct
    _hand_run(tmp_path, "s", "bca", "a" * 16, [True, False, True, True], 4, group="gb", seed=1)
    # run b: 5 rows, 2 correct, last half = positions 2..4 (numpy's correct[5 // 2:]) -> 2 of 3
    _hand_run(tmp_path, "s", "bca", "b" * 16, [False, False, True, True, False], 5, group="gb", seed=2)
    _hand_run(tmp_path, "s", "clip", "c" * 16, [True, False, False, False], 4, group="gc")
    db = ResultsDB(tmp_path)
    acc = db.df("SELECT run_id, accuracy, last50_accuracy, n_rows, complete, backbone FROM accuracy ORDER BY run_id")
    assert acc["accuracy"].tolist() == [75.0, 40.0, 25.0]
    assert acc["last50_accuracy"].tolist()[0] == 100.0
    assert math.isclose(acc["last50_accuracy"][1], 200 / 3)
    assert acc["n_rows"].tolist() == [4, 5, 4] and acc["complete"].all() and set(acc["backbone"]) == {"RN50"}
    summary = db.df("SELECT method, n, mean, std, clip_mean, gain FROM summary ORDER BY method")
    bca = summary.iloc[0]
    assert bca["n"] == 2 and bca["mean"] == 57.5 and math.isclose(bca["std"], np.std([75, 40], ddof=1))
    assert bca["clip_mean"] == 25.0 and bca["gain"] == 32.5
    assert summary.iloc[1]["gain"] == 0.0 and math.isnan(summary.iloc[1]["std"])  # one seed: no std
    assert db.bad_files == []


def test_views_match_writer_made_runs(tmp_path):
    runs = make_fake_results(tmp_path, datasets=("imagenet", "dtd"), methods={"clip": {}, "bca": [
        {"tau": 0.3, "n1": 30000, "n2": 10}, {"tau": 0.5, "n1": 30000, "n2": 10}]}, seeds=(1, 2, 3), n=61)
    db = ResultsDB(tmp_path)
    acc = db.df("SELECT * FROM accuracy").set_index("run_id")
    assert len(acc) == len(runs)
    for run in runs:
        row = acc.loc[run.run_id]
        assert math.isclose(row["accuracy"], run.accuracy) and math.isclose(row["last50_accuracy"], run.last50_accuracy)
        assert row["complete"] and row["n_rows"] == 61 and row["status"] == "finished"
    # runs-table metrics (what the trial reports) agree with what the views compute from the rows
    metrics = db.df("SELECT r.accuracy AS a, a.accuracy AS b, r.last50_accuracy AS c, a.last50_accuracy AS d "
                    "FROM runs r JOIN accuracy a USING (run_id)")
    assert np.allclose(metrics["a"], metrics["b"]) and np.allclose(metrics["c"], metrics["d"])
    summary = db.df("SELECT * FROM summary")
    assert len(summary) == 2 * 3 and (summary["n"] == 3).all()
    for _, row in summary.iterrows():
        members = [r for r in runs if schema.group_id(r.config) == row["group_id"]]
        values = [r.accuracy for r in members]
        assert math.isclose(row["mean"], np.mean(values)) and math.isclose(row["std"], np.std(values, ddof=1))
        clip = [r.accuracy for r in runs if r.config["method"] == "clip" and r.config["dataset"] == row["dataset"]]
        assert math.isclose(row["gain"], np.mean(values) - np.mean(clip))
        assert list(row["seeds"]) == [1, 2, 3]
    assert set(summary["tau"].dropna()) == {0.3, 0.5}


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_empty_or_missing_results_dir_gives_empty_typed_views(tmp_path, make):
    root = tmp_path / "results"
    if make == "empty":
        root.mkdir()
    db = ResultsDB(root)
    for view in VIEWS:
        assert db.sql(f"SELECT * FROM {view}").num_rows == 0
    samples = db.sql("SELECT * FROM samples").schema
    assert samples.names[:len(schema.SAMPLE_COLUMNS)] == [c.name for c in schema.SAMPLE_COLUMNS]
    assert samples.field("sample_idx").type == pa.int64() and samples.field("correct").type == pa.bool_()
    runs = db.sql("SELECT * FROM runs").schema
    assert runs.names == [c.name for c in schema.run_columns()]
    assert runs.field("tau").type == pa.float64() and runs.field("n1").type == pa.int64()
    for col in ("mean", "std", "n", "gain", "clip_mean", "tau", "n1", "n2"):
        assert col in db.sql("SELECT * FROM summary").schema.names
    for col in ("accuracy", "last50_accuracy", "complete", "seed"):
        assert col in db.sql("SELECT * FROM accuracy").schema.names


def test_new_runs_appear_without_reopening(tmp_path):
    db = ResultsDB(tmp_path)
    cursor = db.cursor()  # e.g. a dashboard thread holding its cursor
    assert cursor.execute("SELECT count(*) FROM samples").fetchone()[0] == 0
    write_fake_run(tmp_path, {"sweep": "s", "backbone": "RN50", "dataset": "dtd", "method": "clip", "seed": 1}, n=30)
    assert db.sql("SELECT count(*) AS c FROM samples").to_pylist() == [{"c": 30}]
    write_fake_run(tmp_path, {"sweep": "s", "backbone": "RN50", "dataset": "dtd", "method": "clip", "seed": 2}, n=20)
    assert cursor.execute("SELECT count(*) FROM samples").fetchone()[0] == 50  # the views' globs re-expand
    assert db.sql("SELECT count(*) AS c FROM runs").to_pylist() == [{"c": 2}]


def test_running_runs_are_in_accuracy_but_not_in_summary(tmp_path):
    cfg = {"sweep": "s", "backbone": "RN50", "dataset": "dtd", "method": "clip"}
    write_fake_run(tmp_path, {**cfg, "seed": 1}, n=40)
    write_fake_run(tmp_path, {**cfg, "seed": 2}, n=40, rows=20, status="running")
    db = ResultsDB(tmp_path)
    acc = db.df("SELECT seed, status, n_rows, complete FROM accuracy ORDER BY seed")
    assert acc["status"].tolist() == ["finished", "running"] and acc["complete"].tolist() == [True, False]
    assert db.df("SELECT n FROM summary")["n"].tolist() == [1]


def test_truncated_part_is_named_and_skipped(tmp_path):
    runs = make_fake_results(tmp_path, methods={"clip": {}}, seeds=(1, 2), n=100, part_size=40)
    db = ResultsDB(tmp_path)
    assert db.sql("SELECT count(*) AS c FROM samples").to_pylist() == [{"c": 200}]
    part = next((tmp_path / "samples").rglob(f"run_id={runs[0].run_id}/part-000000040.parquet"))
    part.write_bytes(part.read_bytes()[:-30])  # lose the footer: an interrupted copy
    assert db.sql("SELECT count(*) AS c FROM samples").to_pylist() == [{"c": 160}]
    assert [b.path for b in db.bad_files] == [part]
    assert "footer" in db.bad_files[0].error
    acc = db.df("SELECT run_id, n_rows, complete FROM accuracy ORDER BY n_rows")
    assert acc["n_rows"].tolist() == [60, 100] and acc["complete"].tolist() == [False, True]
    # the damaged run no longer counts
    assert db.df("SELECT n, n_incomplete FROM summary").values.tolist() == [[1, 1]]
    part.unlink()
    assert db.sql("SELECT count(*) AS c FROM samples").to_pylist() == [{"c": 160}] and db.bad_files == []


def test_damaged_pages_behind_a_good_footer_are_found_and_skipped(tmp_path):
    make_fake_results(tmp_path, methods={"clip": {}}, seeds=(1,), n=1000, part_size=500)
    part = sorted((tmp_path / "samples").rglob("part-000000500.parquet"))[0]
    data = bytearray(part.read_bytes())
    for i in range(4, len(data) // 2):  # scramble the column pages, keep the footer
        data[i] = (data[i] * 7 + 13) % 256
    part.write_bytes(bytes(data))
    db = ResultsDB(tmp_path)
    assert db.bad_files == []  # the footer reads fine
    out = db.sql("SELECT count(*) AS c, count(DISTINCT image_id) AS i FROM samples").to_pylist()
    assert out == [{"c": 500, "i": 500}]
    assert [b.path for b in db.bad_files] == [part] and "unreadable data" in db.bad_files[0].error


def test_inconsistent_part_is_bad(tmp_path):
    """A part whose sample_idx does not match its name (e.g. renamed by hand) would duplicate rows: left out."""
    runs = make_fake_results(tmp_path, methods={"clip": {}}, seeds=(1,), n=80, part_size=40)
    d = next((tmp_path / "samples").rglob(f"run_id={runs[0].run_id}"))
    (d / "part-000000040.parquet").rename(d / "part-000000080.parquet")
    db = ResultsDB(tmp_path)
    assert db.sql("SELECT count(*) AS c FROM samples").to_pylist() == [{"c": 40}]
    assert "sample_idx spans 40..79" in db.bad_files[0].error


def test_partition_values_round_trip(tmp_path):
    cfg = {"sweep": "my sweep/1", "backbone": "hf-hub:org/m=1", "dataset": "a b", "method": "bca", "seed": 1,
           "hparams": {"tau": 0.3, "kept": 0.1}}
    write_fake_run(tmp_path, cfg, n=10)
    row = ResultsDB(tmp_path).df("SELECT DISTINCT sweep, backbone, dataset, method FROM samples").iloc[0].tolist()
    assert row == ["my sweep/1", "hf-hub:org/m=1", "a b", "bca"]
    db = ResultsDB(tmp_path)
    assert db.extra_run_columns == ["kept"]  # no registered card declares it
    assert db.df("SELECT kept FROM summary")["kept"].tolist() == [0.1]
    assert db.df("SELECT kept FROM accuracy")["kept"].tolist() == [0.1]


def test_concurrent_readers_while_a_writer_writes(tmp_path):
    db = ResultsDB(tmp_path)
    errors: list[BaseException] = []
    counts: list[int] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                counts.append(db.sql("SELECT count(*) AS c FROM accuracy").to_pylist()[0]["c"])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for seed in range(6):
        write_fake_run(tmp_path, {"sweep": "s", "backbone": "RN50", "dataset": "dtd", "method": "clip",
                                  "seed": seed}, n=50, part_size=10)
    stop.set()
    for t in threads:
        t.join()
    assert errors == [] and counts and db.sql("SELECT count(*) AS c FROM accuracy").to_pylist() == [{"c": 6}]


def test_connection_cannot_reach_outside_the_results_even_without_the_query_check(tmp_path):
    import duckdb

    (tmp_path / "results").mkdir()
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    cur = ResultsDB(tmp_path / "results").cursor()  # raw cursor: no safety.check_query in the way
    with pytest.raises(duckdb.PermissionException):
        cur.sql(f"SELECT * FROM read_csv('{secret}')").fetchall()
    with pytest.raises(duckdb.PermissionException):
        cur.execute(f"COPY (SELECT 1) TO '{tmp_path / 'out.csv'}'")
    with pytest.raises(duckdb.Error, match="locked"):
        cur.execute("SET enable_external_access = true")
    assert not (tmp_path / "out.csv").exists()


def test_status_changes_show_on_the_next_query(tmp_path):
    from orchestrator.results.writer import RunWriter

    db = ResultsDB(tmp_path)
    w = RunWriter(tmp_path, {"sweep": "s", "backbone": "RN50", "dataset": "dtd", "method": "clip", "seed": 1})
    w.mark("running", n_samples=4)
    w.write_part(0, {"image_id": list("abcd"), "label": np.arange(4), "pred": np.arange(4),
                     "confidence": np.ones(4)})
    assert db.df("SELECT status FROM runs")["status"].tolist() == ["running"]
    assert len(db.df("SELECT * FROM summary")) == 0
    w.mark("finished", accuracy=100.0)
    assert db.df("SELECT status FROM runs")["status"].tolist() == ["finished"]
    assert db.df("SELECT n, mean FROM summary").values.tolist() == [[1, 100.0]]


def test_results_dir_with_glob_characters(tmp_path):
    root = tmp_path / "we[ir]d*" / "results"
    make_fake_results(root, seeds=(1,), n=10)
    db = ResultsDB(root)
    assert db.sql("SELECT count(*) AS c FROM samples").to_pylist() == [{"c": 20}]
    assert db.sql("SELECT count(*) AS c FROM summary").to_pylist() == [{"c": 2}]


def test_paired_gains_are_read_once_and_again_when_runs_arrive(tmp_path):
    """ResultsDB.paired_gains (shared by the report's significance and the dashboard's gains) equals the paired
    view's rows with a gain, and a new pair appears without reopening."""
    _hand_run(tmp_path, "s", "clip", "c" * 16, [True, False, False, False], 4, group="gc")
    _hand_run(tmp_path, "s", "bca", "a" * 16, [True, False, True, True], 4, group="gb")
    db = ResultsDB(tmp_path)
    query = "SELECT run_id, baseline_run, helped, hurt, n, gain FROM paired WHERE gain IS NOT NULL ORDER BY run_id"
    first = db.paired_gains()
    assert first.sort_values("run_id").reset_index(drop=True).equals(db.df(query))
    assert db.paired_gains() is first  # nothing changed: not read again
    assert first.set_index("run_id").at["a" * 16, "helped"] == 2
    _hand_run(tmp_path, "s", "bca", "b" * 16, [False, False, True, True], 4, group="gb2")
    again = db.paired_gains()
    assert sorted(again["run_id"]) == ["a" * 16, "b" * 16]
    assert again.sort_values("run_id").reset_index(drop=True).equals(db.df(query))


NEW_METRIC = '''
import json, sys
from orchestrator.results import metrics

error = metrics.Metric("error_rate", "top-1 error", "%", False, 100.0, lambda m: 1.0 - m.top1,
                       sql_aggregate="avg((NOT s.correct)::DOUBLE) FILTER (WHERE NOT coalesce(s.is_ood, false))",
                       summary="error")
metrics.RUN_METRICS = (*metrics.RUN_METRICS, error)
metrics.METRICS[error.name] = error

from orchestrator.results.compaction import compact
from orchestrator.results.db import ResultsDB
from orchestrator.results.testing import make_fake_results

make_fake_results(sys.argv[1], seeds=(1, 2))
query = "SELECT method, mean, error_mean, std, error_std FROM summary ORDER BY method"
live = ResultsDB(sys.argv[1]).df(query).values.tolist()
compact(sys.argv[1])
print(json.dumps([live, ResultsDB(sys.argv[1]).df(query).values.tolist()]))
'''


def test_a_new_metric_is_in_the_summary_view(tmp_path):
    """A metric added to the registry (metrics.RUN_METRICS) and nowhere else gets its mean and std columns in the
    summary view, over live files and over the compacted store. Here the top-1 error: 100 - accuracy (equal up to
    float64 rounding of 100 (1 - p) against 100 p)."""
    done = subprocess.run([sys.executable, "-c", NEW_METRIC, str(tmp_path / "results")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    live, compacted = json.loads(done.stdout)
    assert [row[0] for row in live] == ["bca", "clip"] and compacted == live
    for _, mean, error_mean, std, error_std in live:
        assert error_mean == pytest.approx(100 - mean, rel=1e-12) and error_std == pytest.approx(std, rel=1e-9)
