"""RunWriter: atomic parts, resume counts, refused overlaps, runs-table rows, state artifacts, storage errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from orchestrator.results import schema
from orchestrator.results.atomic import ResultsWriteError
from orchestrator.results.writer import RunWriter, load_state, read_run

CONFIG = {"sweep": "s", "backbone": "RN50", "dataset": "dtd", "method": "bca", "seed": 1,
          "hparams": {"tau": 0.3, "n1": 30000, "n2": 10}}
REPO = Path(__file__).resolve().parents[1]


def cols(start: int, n: int, wrong: int = 0) -> dict:
    label = np.arange(start, start + n) % 5
    pred = label.copy()
    pred[:wrong] = (pred[:wrong] + 1) % 5
    return {"image_id": [f"i{k}" for k in range(start, start + n)], "label": label, "pred": pred,
            "confidence": np.linspace(0.1, 0.9, n, dtype=np.float32)}


def part_files(w: RunWriter) -> list[str]:
    return sorted(p.name for p in w.samples_dir.iterdir() if p.name != ".lock")


def test_parts_append_and_resume_counts(tmp_path):
    w = RunWriter(tmp_path, CONFIG)
    assert w.rows_done() == 0 and not w.samples_dir.exists()  # a probe creates nothing
    assert w.write_part(0, cols(0, 10)) == 10
    assert w.write_part(10, cols(10, 7)) == 17
    assert RunWriter(tmp_path, CONFIG).rows_done() == 17  # a new writer (a resumed trial) sees the same
    assert part_files(w) == ["part-000000000.parquet", "part-000000010.parquet"]
    table = pq.read_table(w.samples_dir / "part-000000010.parquet")
    assert table.column("sample_idx").to_pylist() == list(range(10, 17))
    assert table.schema == schema.SAMPLE_ARROW_SCHEMA.with_metadata(table.schema.metadata)
    assert set(table.column("run_id").to_pylist()) == {w.run_id}


@pytest.mark.parametrize("start, message", [
    (0, r"rows 0\.\.4 overlap rows 0\.\.9 already written"),
    (5, r"rows 5\.\.9 overlap rows 0\.\.9"),
    (12, r"would leave rows 10\.\.11 missing"),
])
def test_overlapping_duplicate_and_gapped_parts_are_refused(tmp_path, start, message):
    w = RunWriter(tmp_path, CONFIG)
    w.write_part(0, cols(0, 10))
    with pytest.raises(ValueError, match=message):
        w.write_part(start, cols(start, 5))
    assert w.rows_done() == 10 and part_files(w) == ["part-000000000.parquet"]


def test_temp_files_are_ignored_and_cleaned(tmp_path):
    w = RunWriter(tmp_path, CONFIG)
    w.write_part(0, cols(0, 10))
    leftover = w.samples_dir / schema.temp_name("part-000000010.parquet", "999.dead")
    leftover.write_bytes(b"PAR1 half a file")
    assert w.rows_done() == 10
    assert not leftover.exists()


def test_bad_part_ends_the_resume_prefix_and_is_replaced(tmp_path):
    w = RunWriter(tmp_path, CONFIG)
    for start in (0, 10, 20):
        w.write_part(start, cols(start, 10))
    middle = w.samples_dir / "part-000000010.parquet"
    middle.write_bytes(middle.read_bytes()[:50])  # damage from outside the writer
    assert w.rows_done() == 10
    assert w.write_part(10, cols(10, 10)) == 20  # the resumed stream rewrites from there
    assert part_files(w) == ["part-000000000.parquet", "part-000000010.parquet"]
    assert pq.read_table(middle).num_rows == 10


def test_failed_write_leaves_no_file_and_earlier_parts_intact(tmp_path, monkeypatch):
    w = RunWriter(tmp_path, CONFIG)
    w.write_part(0, cols(0, 10))
    real_write = pq.write_table

    def half_then_disk_full(table, where, **kw):
        real_write(table, where, **kw)
        Path(where).write_bytes(Path(where).read_bytes()[:40])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", half_then_disk_full)
    with pytest.raises(ResultsWriteError) as info:
        w.write_part(10, cols(10, 10))
    assert isinstance(info.value, OSError) and info.value.errno == 28
    assert "part-000000010.parquet" in str(info.value) and "No space left on device" in str(info.value)
    assert part_files(w) == ["part-000000000.parquet"]
    monkeypatch.undo()
    assert w.rows_done() == 10 and pq.read_table(w.samples_dir / "part-000000000.parquet").num_rows == 10


def test_file_size_limit_gives_clear_error_in_a_real_process(tmp_path):
    """The OS refuses the write (RLIMIT_FSIZE, like a full disk): a clear error naming the file, nothing half-written."""
    script = textwrap.dedent(f"""
        import resource, signal, sys, numpy as np
        sys.path.insert(0, {str(REPO)!r})
        from orchestrator.results.writer import RunWriter
        from orchestrator.results.atomic import ResultsWriteError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        w = RunWriter({str(tmp_path)!r}, {CONFIG!r})
        small = dict(image_id=['a'] * 10, label=np.zeros(10, int), pred=np.zeros(10, int), confidence=np.ones(10))
        w.write_part(0, small)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
        rng = np.random.default_rng(0)
        big = dict(image_id=[str(x) for x in rng.random(20000)], label=rng.integers(0, 9, 20000),
                   pred=rng.integers(0, 9, 20000), confidence=rng.random(20000))
        try:
            w.write_part(10, big)
        except ResultsWriteError as e:
            print("ERROR", e)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ERROR cannot write results part" in out.stdout and "part-000000010.parquet" in out.stdout
    w = RunWriter(tmp_path, CONFIG)
    assert part_files(w) == ["part-000000000.parquet"] and w.rows_done() == 10


def test_real_full_disk_when_a_tmpfs_can_be_mounted(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root; the RLIMIT_FSIZE test covers the error path")
    try:
        w = RunWriter(mnt, CONFIG)
        done = w.write_part(0, cols(0, 10))
        rng = np.random.default_rng(0)
        with pytest.raises(ResultsWriteError, match="No space left on device") as info:
            while True:  # grow parts until the disk is full
                n = 20000
                done = w.write_part(done, {"image_id": [str(x) for x in rng.random(n)],
                                           "label": rng.integers(0, 9, n), "pred": rng.integers(0, 9, n),
                                           "confidence": rng.random(n)})
        assert "part-" in str(info.value)
        assert w.rows_done() == done
        assert not [p for p in w.samples_dir.iterdir() if schema.is_temp_name(p.name)]
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_row_write_killed_midway_leaves_no_temp_file_after_the_next(tmp_path):
    """A writer killed while rewriting the row (a trial's progress update when its sweep is SIGKILLed) leaves its
    temp file; the next mark of the run, holding the row's lock, removes it, and the row is the new one."""
    w = RunWriter(tmp_path, CONFIG)
    w.mark("running", n_samples=5)
    stale = w.run_path.parent / schema.temp_name(w.run_path.name, "4242.deadbeef")
    stale.write_bytes(b"half a parquet file")
    w.mark("running", n_samples=5)
    assert sorted(p.name for p in w.run_path.parent.iterdir()) == [w.run_path.name]
    assert w.read_row()["status"] == "running"


def test_unwritable_results_dir_names_the_path(tmp_path):
    blocker = tmp_path / "results"
    blocker.write_text("a file where the results dir should be")
    w = RunWriter(blocker, CONFIG)
    with pytest.raises(ResultsWriteError, match=f"cannot write directory for run {w.run_id} {blocker}"):
        w.write_part(0, cols(0, 5))
    with pytest.raises(ResultsWriteError, match="runs-table row"):
        w.mark("running", n_samples=5)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_results_dir(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(ResultsWriteError, match=str(tmp_path)):
            RunWriter(tmp_path, CONFIG).write_part(0, cols(0, 5))
    finally:
        tmp_path.chmod(0o700)


def test_every_file_carries_the_full_config(tmp_path):
    w = RunWriter(tmp_path, CONFIG)
    w.mark("running", n_samples=5)
    w.write_part(0, cols(0, 5))
    for path in (w.samples_dir / "part-000000000.parquet", w.run_path):
        meta = pq.read_schema(path).metadata
        assert json.loads(meta[schema.META_RUN_CONFIG]) == schema.normalize_config(CONFIG)
        assert meta[schema.META_RUN_ID].decode() == w.run_id == schema.config_hash(CONFIG)


def test_status_changes_rewrite_one_row(tmp_path):
    w = RunWriter(tmp_path, CONFIG)
    assert w.status() is None
    w.mark("running", n_samples=10)
    first = read_run(tmp_path, "s", w.run_id)
    assert first["status"] == "running" and first["n_samples"] == 10 and first["tau"] == 0.3 and first["n1"] == 30000
    assert first["group_id"] == schema.group_id(CONFIG) and json.loads(first["versions"])["python"]
    w.write_part(0, cols(0, 4))
    with pytest.raises(ValueError, match="has 4 complete rows but n_samples = 10"):
        w.mark("finished", accuracy=50.0)
    with pytest.raises(ValueError, match="pass error="):
        w.mark("failed")
    w.mark("failed", error="boom", accuracy=1.0)
    assert w.status() == "failed" and w.read_row()["error"] == "boom"
    w.mark("running")  # a new attempt: error and metrics cleared, n_samples and started_at kept
    row = w.read_row()
    assert row["error"] is None and row["accuracy"] is None and row["n_samples"] == 10
    assert row["started_at"] == first["started_at"] and row["finished_at"] is None
    w.write_part(4, cols(4, 6))
    w.mark("finished", accuracy=100.0, samples_per_s=np.float64(5.0))
    row = w.read_row()
    assert row["status"] == "finished" and row["accuracy"] == 100.0 and row["finished_at"] >= row["started_at"]
    assert [p.name for p in w.run_path.parent.iterdir()] == [w.run_path.name]  # no temp left beside it
    with pytest.raises(ValueError, match="unknown field"):
        w.mark("finished", acc=1)
    with pytest.raises(ValueError, match="status must be one of"):
        w.mark("done")


def test_save_and_load_state(tmp_path):
    w = RunWriter(tmp_path, CONFIG)
    v = torch.eye(3)
    path = w.save_state({"V": v, "C1": np.array([1.0, 2.0, 3.0]), "class_ids": np.arange(3)})
    assert path == w.state_path and path.exists()
    state = load_state(tmp_path, w.run_id)
    assert set(state) == {"V", "C1", "class_ids"} and np.array_equal(state["V"], np.eye(3))
    with pytest.raises(ValueError, match="not a valid array name"):
        w.save_state({"bad name": np.zeros(1)})
    with pytest.raises(ValueError, match="must be numeric"):
        w.save_state({"V": np.array(["a"])})


@pytest.mark.parametrize("change, message", [
    ({"label": None}, "missing required column 'label'"),
    ({"extra": [1]}, r"unknown column\(s\) \['extra'\]"),
    ({"pred": np.zeros(3, int)}, "same non-zero length"),
    ({"label": np.zeros(5)}, "'label': expected integers"),
    ({"gated": np.zeros(5, int)}, "'gated': expected booleans"),
    ({"confidence": np.array([0.1, np.nan, 0, 0, 0])}, "confidence must be finite"),
    ({"sample_idx": np.arange(1, 6)}, r"sample_idx must be 0\.\.4"),
    ({"correct": np.zeros(5, bool)}, "disagrees with label == pred"),
    ({"label": np.full(5, 2**40)}, "do not fit int32"),
])
def test_bad_columns_are_refused(tmp_path, change, message):
    c = {**cols(0, 5), **change}
    c = {k: v for k, v in c.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        RunWriter(tmp_path, CONFIG).write_part(0, c)


def test_two_processes_writing_one_run_leave_exact_rows(tmp_path):
    """A retried trial beside a zombie: both write the same run from rows_done(); the lock keeps rows exact."""
    script = textwrap.dedent(f"""
        import sys, numpy as np
        sys.path.insert(0, {str(REPO)!r})
        from orchestrator.results.writer import RunWriter
        w = RunWriter({str(tmp_path)!r}, {CONFIG!r})
        while (done := w.rows_done()) < 60:
            n = min(7, 60 - done)
            try:
                w.write_part(done, dict(image_id=['x'] * n, label=np.zeros(n, int), pred=np.zeros(n, int),
                                        confidence=np.ones(n)))
            except ValueError:
                pass  # the other process wrote this range first
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    w = RunWriter(tmp_path, CONFIG)
    idx = pq.read_table(w.samples_dir).column("sample_idx").to_pylist()
    assert sorted(idx) == list(range(60))


def test_shard_writers_fill_their_own_ranges_into_the_contiguous_parts(tmp_path):
    """Two shards of one run write at once, each its own range and out of order: rows_done counts only the
    contiguous parts from 0 until the gap between them is filled, and nothing is removed as stray meanwhile."""
    first, second = RunWriter(tmp_path, CONFIG), RunWriter(tmp_path, CONFIG)
    assert first.missing(0, 30) == [(0, 30)]
    second.fill_part(20, cols(20, 10))
    first.fill_part(0, cols(0, 10))
    assert first.rows_done() == 10 and first.missing(0, 30) == [(10, 20)] and first.missing(20, 30) == []
    assert first.missing(5, 25) == [(10, 20)]
    first.fill_part(10, cols(10, 10))
    assert second.rows_done() == 30 and second.missing(0, 30) == []
    assert part_files(first) == ["part-000000000.parquet", "part-000000010.parquet", "part-000000020.parquet"]
    assert first.read_columns(["sample_idx"]).column("sample_idx").to_pylist() == list(range(30))


def test_filling_rows_a_part_holds_is_refused_and_a_damaged_part_is_replaced(tmp_path):
    w = RunWriter(tmp_path, CONFIG)
    w.fill_part(10, cols(10, 10))
    with pytest.raises(ValueError, match=r"fill_part: rows 5\.\.14 overlap rows 10\.\.19 already written"):
        w.fill_part(5, cols(5, 10))
    damaged = w.samples_dir / "part-000000022.parquet"
    damaged.write_bytes(b"PAR1 half a file")
    w.fill_part(0, cols(0, 10))  # the damaged part lies in another range: left to its shard
    assert damaged.exists() and w.missing(0, 30) == [(20, 30)]
    w.fill_part(20, cols(20, 5))  # it starts in this part's rows: replaced
    assert not damaged.exists() and w.missing(0, 30) == [(25, 30)] and w.rows_done() == 25
