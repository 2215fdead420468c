"""The compacted store: every view the same before and after `compact`, runs read back by pruning, writers on
compacted runs, crashes between the steps of a compaction, and what `bca verify` finds."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.results import compaction, schema, store
from orchestrator.results.db import VIEWS, ResultsDB
from orchestrator.results.testing import make_fake_results, write_fake_run
from orchestrator.results.verify import verify_results
from orchestrator.results.writer import RunWriter, read_run


def _config(seed, method="bca", **extra):
    return {"sweep": "s", "backbone": "RN50", "pretrained": None, "dataset": "imagenet", "method": method,
            "seed": seed, "templates": "ensemble7", "num_templates": 1, "views": "1",
            "hparams": {"tau": 0.3, "n1": 30000, "n2": 10} if method == "bca" else {}, **extra}


def _mixed_results(root):
    """Finished runs of two methods and three stream orders, a run still running, a failed one, an OOD stream."""
    make_fake_results(root, datasets=("imagenet", "imagenet_a"), seeds=(1, 2))
    for order in range(3):
        write_fake_run(root, _config(7, stream='{"scenario":"label_shift"}', order_index=order), n=90)
        write_fake_run(root, _config(7, method="clip", stream='{"scenario":"label_shift"}', order_index=order), n=90)
    running = write_fake_run(root, _config(8), n=100, rows=60, status="running")
    failed = write_fake_run(root, _config(9), n=100, rows=20, status="failed")
    return running, failed


def _snapshot(root):
    out = {}
    with ResultsDB(root) as db:
        for view in VIEWS:
            df = db.df(f"SELECT * FROM {view}")
            keys = [c for c in ("run_id", "sample_idx", "group_id", "baseline_run") if c in df.columns]
            out[view] = df[sorted(df.columns)].sort_values(keys).reset_index(drop=True)
    return out


def _files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_compaction_keeps_every_view_and_leaves_large_files(tmp_path):
    running, failed = _mixed_results(tmp_path)
    before = _snapshot(tmp_path)
    done = compaction.compact(tmp_path)
    assert done.runs == 14 and done.rows == 8 * 100 + 6 * 90 and len(done.segments) == 1
    after = _snapshot(tmp_path)
    for view in VIEWS:
        pd.testing.assert_frame_equal(before[view], after[view], check_dtype=False, obj=view)
    # the unfinished runs stay live, every finished run left its live files
    live_parts = [f for f in _files(tmp_path) if f.startswith("samples/")]
    assert live_parts and all(running.run_id in f or failed.run_id in f for f in live_parts)
    assert [f for f in _files(tmp_path) if f.startswith("runs/")] == sorted(
        f"runs/sweep=s/run_id={r.run_id}.parquet" for r in (running, failed))
    assert {(p.kind, p.where) for p in verify_results(tmp_path).problems} == {
        ("missing_rows", running.run_id), ("missing_rows", failed.run_id)}


def test_samples_carry_stream_and_order_live_and_compacted(tmp_path):
    _mixed_results(tmp_path)
    sql = ("SELECT order_index, stream, count(*) AS n FROM samples WHERE order_index IS NOT NULL "
           "GROUP BY ALL ORDER BY 1")
    with ResultsDB(tmp_path) as db:
        live = db.sql(sql).to_pylist()
    compaction.compact(tmp_path)
    with ResultsDB(tmp_path) as db:
        compacted = db.sql(sql).to_pylist()
    assert live == compacted == [{"order_index": i, "stream": '{"scenario":"label_shift"}', "n": 180}
                                 for i in range(3)]


def test_a_runs_rows_are_found_by_pruning(tmp_path):
    runs = make_fake_results(tmp_path, seeds=range(40), n=300)
    compaction.compact(tmp_path, segment_rows=10**7)
    seg = store.load_catalog(tmp_path).segments[0]
    pf = pq.ParquetFile(seg.path(tmp_path, "samples"))
    assert pf.metadata.num_rows == 80 * 300
    # row groups end at run boundaries: no run spans two of them (runs of 300 rows, groups of >= 300)
    col = pf.schema_arrow.get_field_index("run_id")
    ranges = [(pf.metadata.row_group(i).column(col).statistics.min, pf.metadata.row_group(i).column(col).statistics.max)
              for i in range(pf.num_row_groups)]
    assert all(hi < lo for (_, hi), (lo, _) in zip(ranges, ranges[1:]))
    target = sorted(r.run_id for r in runs)[37]
    hits = [i for i, (lo, hi) in enumerate(ranges) if lo <= target <= hi]
    assert len(hits) == 1
    with ResultsDB(tmp_path) as db:
        got = db.df("SELECT sample_idx, correct FROM samples WHERE run_id = $r ORDER BY sample_idx", {"r": target})
    want = next(r for r in runs if r.run_id == target)
    assert got["sample_idx"].tolist() == list(range(300)) and got["correct"].tolist() == want.correct.tolist()


def test_small_row_groups_close_at_run_boundaries(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "ROW_GROUP_ROWS", 250)
    make_fake_results(tmp_path, seeds=range(5), n=100)
    compaction.compact(tmp_path)
    pf = pq.ParquetFile(store.load_catalog(tmp_path).segments[0].path(tmp_path, "samples"))
    assert [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)] == [300, 300, 300, 100]


def test_writers_on_compacted_runs(tmp_path):
    runs = make_fake_results(tmp_path, seeds=(1, 2))
    compaction.compact(tmp_path)
    first, second = (RunWriter(tmp_path, r.config) for r in runs[:2])
    assert first.complete() and first.rows_done() == 100 and first.status() == "finished"
    assert read_run(tmp_path, "fake", first.run_id)["accuracy"] == pytest.approx(runs[0].accuracy)
    with pytest.raises(ValueError, match="compacted"):
        first.write_part(0, {"image_id": ["x"], "label": [1], "pred": [1], "confidence": np.ones(1, np.float32)})
    # marking a compacted run runs it again: it goes back to live files with its rows
    first.mark("running", n_samples=100)
    assert first.rows_done() == 100 and first.status() == "running"
    assert first.run_id not in store.load_catalog(tmp_path).compacted()
    # discarding a compacted run's rows removes them from its segment
    second.discard_rows()
    assert second.rows_done() == 0
    with ResultsDB(tmp_path) as db:
        counts = {r["run_id"]: r["n"] for r in db.sql("SELECT run_id, count(*) AS n FROM samples GROUP BY 1")
                  .to_pylist()}
    assert second.run_id not in counts and counts[first.run_id] == 100
    assert all(counts[r.run_id] == 100 for r in runs[2:])


def test_crash_after_commit_leaves_leftovers_that_no_view_counts(tmp_path, monkeypatch):
    make_fake_results(tmp_path, seeds=(1, 2))
    before = _snapshot(tmp_path)
    monkeypatch.setattr(store, "unlink_live", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        compaction.compact(tmp_path)
    monkeypatch.undo()
    after = _snapshot(tmp_path)
    for view in VIEWS:
        pd.testing.assert_frame_equal(before[view], after[view], check_dtype=False, obj=view)
    assert {p.kind for p in verify_results(tmp_path).problems} == {"leftover"}
    assert compaction.compact(tmp_path).leftovers == 4
    assert verify_results(tmp_path).ok


def test_crash_before_commit_leaves_an_orphan_that_no_view_reads(tmp_path, monkeypatch):
    make_fake_results(tmp_path, seeds=(1, 2))
    before = _snapshot(tmp_path)
    monkeypatch.setattr(store, "write_manifest", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        compaction.compact(tmp_path)
    monkeypatch.undo()
    assert len(store.orphan_files(tmp_path)) == 3
    after = _snapshot(tmp_path)
    for view in VIEWS:
        pd.testing.assert_frame_equal(before[view], after[view], check_dtype=False, obj=view)
    assert [p.kind for p in verify_results(tmp_path, temp_grace_s=0).problems] == ["orphan_segment"] * 3
    assert store.remove_orphans(tmp_path, older_than_s=0) == 3
    assert verify_results(tmp_path, temp_grace_s=0).ok


def test_a_run_marked_while_compacting_is_given_back(tmp_path, monkeypatch):
    runs = make_fake_results(tmp_path, seeds=(1, 2))
    real, calls = store.write_manifest, []

    def commit_after_a_rerun_started(root, segments):
        if not calls:  # a re-run starts between the compaction's read and its commit
            RunWriter(tmp_path, runs[0].config).mark("running", n_samples=100)
        calls.append(1)
        real(root, segments)

    monkeypatch.setattr(store, "write_manifest", commit_after_a_rerun_started)
    done = compaction.compact(tmp_path)
    assert done.given_back == [runs[0].run_id] and done.runs == 3
    monkeypatch.undo()
    assert RunWriter(tmp_path, runs[0].config).status() == "running"
    with ResultsDB(tmp_path) as db:
        status = dict((r["run_id"], r["status"]) for r in db.sql("SELECT run_id, status FROM runs").to_pylist())
        rows = db.sql("SELECT count(*) AS n FROM samples").to_pylist()[0]["n"]
    assert status[runs[0].run_id] == "running" and rows == 400


def test_verify_finds_tampered_metrics_and_damaged_segments(tmp_path):
    make_fake_results(tmp_path, seeds=(1, 2))
    compaction.compact(tmp_path)
    seg = store.load_catalog(tmp_path).segments[0]
    path = seg.path(tmp_path, "metrics")
    table = pq.read_table(path)
    acc = table.column("accuracy").to_numpy().copy()
    acc[0] += 1.0
    pq.write_table(table.set_column(table.schema.get_field_index("accuracy"), "accuracy", pa.array(acc)), path)
    problems = verify_results(tmp_path).problems
    assert [p.kind for p in problems] == ["stale_metrics"] and "accuracy" in problems[0].detail
    data = seg.path(tmp_path, "samples")
    data.write_bytes(data.read_bytes()[:-100])
    assert "bad_segment" in {p.kind for p in verify_results(tmp_path).problems}
    # the views leave the damaged segment out, and say so
    with ResultsDB(tmp_path) as db:
        assert db.sql("SELECT count(*) AS n FROM samples").to_pylist()[0]["n"] == 0
        assert any(str(data) in str(b) for b in db.bad_files)


def test_later_segments_are_merged(tmp_path, monkeypatch):
    monkeypatch.setattr(compaction, "MERGE_FANIN", 3)
    make_fake_results(tmp_path, seeds=(1,))
    compaction.compact(tmp_path)
    for seed in (2, 3):
        make_fake_results(tmp_path, seeds=(seed,))
        done = compaction.compact(tmp_path)
    assert done.merged == 3 and len(store.load_catalog(tmp_path).segments) == 1
    assert len(list((tmp_path / "catalog" / "segments").iterdir())) == 3
    with ResultsDB(tmp_path) as db:
        assert db.sql("SELECT count(*) AS n, count(DISTINCT run_id) AS r FROM samples").to_pylist() == [
            {"n": 600, "r": 6}]
    assert verify_results(tmp_path).ok


def test_bca_compact_converts_an_old_results_dir(tmp_path):
    make_fake_results(tmp_path, seeds=(1, 2, 3))
    before = _snapshot(tmp_path)
    result = CliRunner().invoke(app, ["compact", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "6 run(s), 600 row(s) compacted into 1 new segment(s)" in result.output
    after = _snapshot(tmp_path)
    pd.testing.assert_frame_equal(before["summary"], after["summary"], check_dtype=False)
    result = CliRunner().invoke(app, ["verify", str(tmp_path)])
    assert result.exit_code == 0 and "1 segment(s), 0 live part(s), 600 row(s), 6 run(s): OK" in " ".join(
        result.output.split())


def test_a_damaged_manifest_is_named(tmp_path):
    make_fake_results(tmp_path, seeds=(1,))
    compaction.compact(tmp_path)
    schema.manifest_file(tmp_path).write_text(json.dumps({"format": 99}))
    result = CliRunner().invoke(app, ["compact", str(tmp_path)])
    assert result.exit_code == 2 and "manifest.json" in result.output and "format" in result.output


def test_paired_view_mixes_materialised_and_row_pairings_exactly(tmp_path):
    """Pairings materialised at compaction, of a run compacted before its baseline existed, and of a live run
    against a compacted baseline: the paired view, and paired_against('clip') which reads it, equal every pair
    computed from the rows (the plain SQL of orchestrator.results.sql); paired_against another method pairs the
    rows."""
    from orchestrator.results.sql import baseline_pairs_sql, paired_rows_sql, paired_statistics_sql

    for seed in (1, 2):
        write_fake_run(tmp_path, _config(seed, method="clip"), n=80)
        write_fake_run(tmp_path, _config(seed), n=80)
    write_fake_run(tmp_path, _config(3), n=80)  # compacted before its CLIP run is written
    compaction.compact(tmp_path)
    write_fake_run(tmp_path, _config(3, method="clip"), n=80)
    write_fake_run(tmp_path, _config(1, hparams={"tau": 0.5, "n1": 30000, "n2": 10}), n=80)  # live, CLIP compacted
    with ResultsDB(tmp_path) as db:
        unpaired = db.df("SELECT run_id FROM unpaired_pairs")["run_id"]
        view = db.df("SELECT * FROM paired ORDER BY run_id")
        against = db.df("SELECT * FROM paired_against('clip') ORDER BY run_id")
        plain = paired_statistics_sql(paired_rows_sql(f"({baseline_pairs_sql('runs', repr('clip'))})", "samples",
                                                      "samples"), repr("clip"))
        rows = db.df(f"SELECT * FROM ({plain}) ORDER BY run_id")
        other = db.df("SELECT run_id, baseline_run, helped, hurt FROM paired_against('bca') ORDER BY run_id")
        pairs = paired_rows_sql(f"({baseline_pairs_sql('runs', repr('bca'))})", "samples", "samples")
        other_plain = db.df(f"SELECT run_id, baseline_run, helped, hurt FROM ({pairs}) ORDER BY run_id")
    assert len(unpaired) == 2 and len(view) == 4
    pd.testing.assert_frame_equal(view, rows, check_dtype=False)
    pd.testing.assert_frame_equal(against, rows, check_dtype=False)
    assert len(other) == 3 and set(other["baseline_run"]) <= set(view["run_id"])  # each seed's CLIP run against BCA
    pd.testing.assert_frame_equal(other, other_plain, check_dtype=False)


def _curves(root, window=None, extra=()):
    from dashboard import queries

    with ResultsDB(root) as db:
        runs = db.df("SELECT run_id, n_rows FROM accuracy WHERE backbone = 'RN50' AND dataset = 'imagenet'")
        ids = [*runs["run_id"], *extra]
        window = window or queries.default_window(int(runs["n_rows"].max()))
        return queries.online_curves(db, ids, "RN50", "imagenet", window), db.df("SELECT * FROM run_curves")


def test_stream_curves_read_from_compaction_equal_those_from_the_rows(tmp_path):
    """The dashboard's stream curves: from the points compaction materialised when every shown run is compacted
    at the default window; from the rows otherwise (another window, a live run among them): the same numbers."""
    for seed in (1, 2, 3):
        write_fake_run(tmp_path, _config(seed, method="clip"), n=137)
        write_fake_run(tmp_path, _config(seed), n=137, accuracy=0.8)
    rows, _ = _curves(tmp_path)
    rows7, _ = _curves(tmp_path, window=7)
    compaction.compact(tmp_path)
    compacted, materialised = _curves(tmp_path)
    assert len(materialised) == 6 and set(materialised["curve_window"]) == {6}  # ceil(137 / 25)
    assert len(compacted) == 6 * 23 and not compacted.empty
    pd.testing.assert_frame_equal(rows, compacted)
    pd.testing.assert_frame_equal(rows7, _curves(tmp_path, window=7)[0])
    live = write_fake_run(tmp_path, _config(4), n=137)
    mixed, _ = _curves(tmp_path)
    pd.testing.assert_frame_equal(mixed[mixed["run_id"] != live.run_id].reset_index(drop=True), rows)
    assert verify_results(tmp_path).ok


def test_older_segments_get_curves_and_verify_recomputes_them(tmp_path):
    make_fake_results(tmp_path, seeds=(1, 2))
    rows, _ = _curves(tmp_path)
    compaction.compact(tmp_path)
    # a segment as written before curves were materialised: its metrics file and manifest entry without them
    manifest = schema.manifest_file(tmp_path)
    data = json.loads(manifest.read_text())
    seg = store.load_catalog(tmp_path).segments[0]
    path = seg.path(tmp_path, "metrics")
    pq.write_table(pq.read_table(path).drop_columns(["curve_window", "curve_win", "curve_n", "curve_k"]), path)
    for entry in data["segments"]:
        entry["metrics_columns"] = [c for c in entry["metrics_columns"] if not c.startswith("curve_")]
    manifest.write_text(json.dumps(data))
    before, materialised = _curves(tmp_path)
    assert materialised.empty
    pd.testing.assert_frame_equal(rows, before)
    assert compaction.compact(tmp_path).upgraded == 1
    after, materialised = _curves(tmp_path)
    assert len(materialised) == 4  # make_fake_results' four runs of seeds 1 and 2
    pd.testing.assert_frame_equal(rows, after)
    assert verify_results(tmp_path).ok
    # a tampered curve is named
    table = pq.read_table(path)
    k = table.column("curve_k").to_pylist()
    k[0][3] += 1
    pq.write_table(table.set_column(table.schema.get_field_index("curve_k"), "curve_k",
                                    pa.array(k, table.schema.field("curve_k").type)), path)
    problems = verify_results(tmp_path).problems
    assert [p.kind for p in problems] == ["stale_metrics"] and "stream curve" in problems[0].detail
    assert "window(s) [3]" in problems[0].detail


def test_bca_report_prints_the_same_numbers_from_aggregates_as_from_rows(tmp_path):
    """Before compaction every number of `bca report` comes from the rows; after it, from the materialised per-run
    metrics and pairings (a live run beside them still from its rows): the printed report is the same."""
    _mixed_results(tmp_path)
    runner = CliRunner()
    before = runner.invoke(app, ["report", "--results", str(tmp_path)])
    compaction.compact(tmp_path)
    after = runner.invoke(app, ["report", "--results", str(tmp_path)])
    assert before.exit_code == after.exit_code == 0
    assert "Δ CLIP" in before.stdout and before.stdout == after.stdout


def test_paired_statistics_are_stored_by_compaction_read_and_verified(tmp_path):
    """The paired view's interval and p-value (a bootstrap per run) are stored with the pairing at compaction:
    the same numbers as computed from the rows before, read back as stored, recomputed by `bca verify`; a segment
    written before they were stored has them computed by the view."""
    make_fake_results(tmp_path, seeds=(1, 2))
    query = "SELECT * FROM paired ORDER BY run_id"

    def paired() -> pd.DataFrame:
        with ResultsDB(tmp_path) as db:
            return db.df(query)

    live = paired()
    assert live["gain_ci_low"].notna().all() and len(live) == 2
    compaction.compact(tmp_path)
    pd.testing.assert_frame_equal(paired(), live)
    assert verify_results(tmp_path).ok
    seg = store.load_catalog(tmp_path).segments[0]
    path = seg.path(tmp_path, "metrics")
    original = pq.read_table(path)
    low = original.column("gain_ci_low").to_pylist()
    at = next(i for i, v in enumerate(low) if v is not None)
    low[at] -= 1.0
    pq.write_table(original.set_column(original.schema.get_field_index("gain_ci_low"), "gain_ci_low",
                                       pa.array(low, pa.float64())), path)
    shown = paired().set_index("run_id")["gain_ci_low"]
    assert shown[original.column("run_id")[at].as_py()] == low[at]  # the view reads what compaction stored
    problems = verify_results(tmp_path).problems
    assert [p.kind for p in problems] == ["stale_metrics"] and "gain_ci_low" in problems[0].detail
    # a segment as written before the statistics were stored: its metrics file and manifest entry without them
    pq.write_table(original.drop_columns(["gain_ci_low", "gain_ci_high", "p_mcnemar"]), path)
    manifest = schema.manifest_file(tmp_path)
    data = json.loads(manifest.read_text())
    for entry in data["segments"]:
        entry["metrics_columns"] = [c for c in entry["metrics_columns"]
                                    if c not in ("gain_ci_low", "gain_ci_high", "p_mcnemar")]
    manifest.write_text(json.dumps(data))
    pd.testing.assert_frame_equal(paired(), live)
    assert verify_results(tmp_path).ok
    # `bca compact` gives it them, from its stored counts
    assert compaction.compact(tmp_path).upgraded == 1
    assert set(store.load_catalog(tmp_path).segments[0].metrics_columns) >= {"gain_ci_low", "gain_ci_high",
                                                                             "p_mcnemar"}
    stored = ["run_id", "gain_ci_low", "gain_ci_high", "p_mcnemar"]
    pd.testing.assert_frame_equal(pq.read_table(path).select(stored).to_pandas(),
                                  original.select(stored).to_pandas())
    pd.testing.assert_frame_equal(paired(), live)
    assert verify_results(tmp_path).ok


def test_older_segments_get_the_metrics_added_since(tmp_path):
    """A segment written before macro_f1, balanced_accuracy and ece20 existed: the views compute them from its
    rows, `bca compact` materialises them (the same numbers), `bca verify` recomputes them."""
    make_fake_results(tmp_path, seeds=(1, 2))
    compaction.compact(tmp_path)
    query = "SELECT run_id, macro_f1, balanced_accuracy, ece20 FROM accuracy ORDER BY run_id"
    with ResultsDB(tmp_path) as db:
        fresh = db.df(query)
    added = ["ece20", "macro_f1", "balanced_accuracy"]
    seg = store.load_catalog(tmp_path).segments[0]
    path = seg.path(tmp_path, "metrics")
    pq.write_table(pq.read_table(path).drop_columns(added), path)
    manifest = schema.manifest_file(tmp_path)
    data = json.loads(manifest.read_text())
    for entry in data["segments"]:
        entry["metrics_columns"] = [c for c in entry["metrics_columns"] if c not in added]
    manifest.write_text(json.dumps(data))
    with ResultsDB(tmp_path) as db:
        pd.testing.assert_frame_equal(db.df(query), fresh)  # from the rows
    assert compaction.compact(tmp_path).upgraded == 1
    assert set(store.load_catalog(tmp_path).segments[0].metrics_columns) >= set(added)
    materialised = pq.read_table(path, columns=["run_id", *added]).to_pandas().sort_values("run_id")
    pd.testing.assert_frame_equal(materialised[fresh.columns].reset_index(drop=True), fresh)
    assert verify_results(tmp_path).ok
