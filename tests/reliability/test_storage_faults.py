"""Storage faults without Ray (issue 7, item 2): a results dir that is or becomes unwritable, and damaged files
placed in the results, read by `bca query`, the dashboard (its query layer and the app) and `bca verify`.

Covered next door (tests/test_results_writer.py): ENOSPC raised mid-write, RLIMIT_FSIZE in a real process, a
real full tmpfs under the writer, a file in place of the results dir, two processes writing one run; the disk
filling up during a real sweep is in test_sweep_faults.py. Here the results dir is made read-only the way root
cannot bypass (a read-only tmpfs mount; chmod does not stop root), falling back to a path under a file where
mounting is not permitted.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.results import schema
from orchestrator.results.atomic import ResultsWriteError
from orchestrator.results.db import ResultsDB
from orchestrator.results.testing import make_fake_results, write_fake_run
from orchestrator.results.verify import verify_results
from orchestrator.results.writer import RunWriter
from orchestrator.sweep.command import sweep_command

from .conftest import mount_tmpfs, unmount, write_spec

CONFIG = {"sweep": "s", "backbone": "RN50", "dataset": "dtd", "method": "clip", "seed": 1}


def _cols(start: int, n: int) -> dict:
    import numpy as np

    return {"image_id": [f"img{i}" for i in range(start, start + n)], "label": np.arange(n) % 3,
            "pred": np.zeros(n, int), "confidence": np.full(n, 0.5)}


def _remount(where: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(where)], check=True, capture_output=True, timeout=30)


def test_results_dir_that_becomes_read_only_mid_run(tmp_path, ledger):
    """Parts written, then the filesystem turns read-only (a remount, an NFS server's quota): every write is
    refused with the path and the reason, nothing half-written appears, earlier parts stay intact and
    readable; once writable again the run continues to exactly n rows."""
    results = tmp_path / "results"
    if not mount_tmpfs(results, "16m"):
        pytest.skip("mounting a tmpfs is not permitted here; the read-only results dir is covered by "
                    "test_results_dir_under_a_file_for_bca_sweep")
    try:
        w = RunWriter(results, CONFIG)
        w.mark("running", n_samples=30)
        w.write_part(0, _cols(0, 10))
        w.write_part(10, _cols(10, 10))
        _remount(results, "ro")
        with pytest.raises(ResultsWriteError, match="Read-only file system") as info:
            w.write_part(20, _cols(20, 10))
        assert str(w.samples_dir) in str(info.value)
        with pytest.raises(ResultsWriteError, match="runs-table row .*Read-only file system"):
            w.mark("failed", error="read-only")
        with pytest.raises(ResultsWriteError, match="state artifact .*Read-only file system"):
            w.save_state({"V": [[1.0]]})
        problems = verify_results(results).problems
        assert [(p.kind, p.detail) for p in problems] == [("missing_rows", "running: 20 of 30 rows present")]
        _remount(results, "rw")
        assert not [p for p in w.samples_dir.iterdir() if schema.is_temp_name(p.name)]
        assert w.rows_done() == 20
        assert w.write_part(20, _cols(20, 10)) == 30
        w.mark("finished", n_samples=30)
        assert pq.read_table(w.samples_dir).column("sample_idx").to_pylist() == list(range(30))
        assert verify_results(results).ok
    finally:
        unmount(results)
    ledger.fault("results dir turned read-only mid-run (remounted tmpfs)")
    ledger.rows("read-only then writable again", 30, 30, 0)


def test_read_only_results_dir_for_bca_sweep(tmp_path, capsys, ledger):
    results = tmp_path / "ro"
    if not mount_tmpfs(results, "1m", read_only=True):
        pytest.skip("mounting a tmpfs is not permitted here; see test_results_dir_under_a_file_for_bca_sweep")
    try:
        code = sweep_command(write_spec(tmp_path, results=results / "results"))
    finally:
        unmount(results)
    err = capsys.readouterr().err
    assert code == 1 and "Read-only file system" in err and str(results / "results") in err, err
    assert "Traceback" not in err
    ledger.fault("bca sweep into a read-only results dir (read-only tmpfs)")


def test_results_dir_under_a_file_for_bca_sweep(tmp_path, capsys, ledger):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory should be")
    code = sweep_command(write_spec(tmp_path, results=blocker / "results"))
    err = capsys.readouterr().err
    # refused at validation, naming the field and the file in the way
    assert code == 2 and f"results_dir: {blocker / 'results'} lies under {blocker}, which is a file" in err, err
    assert "Traceback" not in err
    ledger.fault("bca sweep into a results dir whose parent is a file")


# ---------------------------------------------------------------------------------- damaged results files

def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _zero(path: Path) -> None:
    path.write_bytes(b"")


def _garbage(path: Path) -> None:
    path.write_bytes(b"not parquet at all\n" * 50)


def _foreign_schema(path: Path) -> None:
    pq.write_table(pa.table({"x": [1, 2, 3]}), path)


def _flipped_bytes(path: Path) -> None:
    """Damage in the middle of the data pages, footer intact: only a full read finds it."""
    data = bytearray(path.read_bytes())
    for i in range(40, min(len(data) - 200, 400)):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGE = {"truncated": _truncate, "zero-byte": _zero, "not parquet": _garbage, "foreign schema": _foreign_schema,
          "flipped data bytes": _flipped_bytes}


@pytest.fixture
def damaged_results(tmp_path):
    """Four finished runs of 80 rows in two parts; the second part of one run damaged per kind, plus one run
    whose runs-table file is truncated and one that stopped half-way (a killed sweep not resumed)."""
    runs = make_fake_results(tmp_path, methods={"clip": {}, "bca": {"tau": 0.3}}, seeds=(1, 2), n=80, part_size=40)
    write_fake_run(tmp_path, {**CONFIG, "seed": 9}, n=80, rows=40, status="running")
    return tmp_path, runs


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_part_is_named_and_skipped_by_every_reader(damaged_results, kind, ledger):
    root, runs = damaged_results
    victim = runs[0].run_id
    part = next((root / "samples").rglob(f"run_id={victim}/part-000000040.parquet"))
    DAMAGE[kind](part)
    run_file = next((root / "runs").rglob(f"run_id={runs[1].run_id}.parquet"))
    _truncate(run_file)

    # bca query: goes on without the bad files and names them on stderr; the run whose runs-table row is unreadable
    # is named as lost, and the exit code says the result stands on a damaged store
    # (reading the columns, not just counting: a count is answered from footers, which page damage leaves intact)
    r = CliRunner().invoke(app, ["query", "SELECT run_id, count(*) AS n, sum(sample_idx) AS s, sum(label) AS l "
                                 "FROM samples GROUP BY run_id", "--results", str(root), "--json"])
    assert r.exit_code == 1, r.output
    assert "1 run(s) with rows but no runs-table row" in r.stderr and runs[1].run_id in r.stderr
    counts = {row["run_id"]: row["n"] for row in json.loads(r.stdout)}
    assert counts[victim] == 40 and all(n in (40, 80) for n in counts.values())
    assert f"warning: skipped bad file {part}" in r.stderr
    assert f"warning: skipped bad file {run_file}" in r.stderr

    # the dashboard's query layer: every run listed but the one without a readable row, bad files reported
    from dashboard import queries

    with ResultsDB(root) as db:
        listing = queries.run_table(db)
        per_run = queries.accuracy_runs(db)
        bad = {str(b.path) for b in db.bad_files}
    assert str(part) in bad and str(run_file) in bad
    assert victim in set(per_run["run_id"]) and runs[1].run_id not in set(listing["run_id"])
    assert not per_run.loc[per_run["run_id"] == victim, "complete"].item()

    # bca verify: lists the bad part and the runs with missing rows, exit code 1
    v = CliRunner().invoke(app, ["verify", str(root)])
    out = v.stdout.replace("\n", "")
    assert v.exit_code == 1, v.output
    assert f"bad_part: {part}" in out and f"bad_run_file: {run_file}" in out
    assert f"missing_rows: {victim}: finished: 40 of 80 rows present" in out
    assert "running: 40 of 80 rows present" in out
    ledger.bad_input(f"results part: {kind}", "skipped and named")


def test_dashboard_app_names_bad_files_and_shows_the_rest(damaged_results, monkeypatch, ledger):
    from streamlit.testing.v1 import AppTest

    from dashboard import APP_PATH, RESULTS_ENV

    root, runs = damaged_results
    bad = []
    for run, damage in zip(runs, (_truncate, _zero, _garbage)):
        part = next((root / "samples").rglob(f"run_id={run.run_id}/part-000000040.parquet"))
        damage(part)
        bad.append(part)
    monkeypatch.setenv(RESULTS_ENV, str(root))
    at = AppTest.from_file(str(APP_PATH), default_timeout=120).run()
    assert not at.exception, [e.value for e in at.exception]
    warnings = " ".join(w.value for w in at.warning)
    assert all(str(p) in warnings for p in bad), warnings
    assert "Left out 3 unreadable or incomplete results file(s)" in warnings
    assert at.dataframe, "no table shown next to the warning"
    ledger.bad_input("dashboard over a results dir with 3 damaged parts", "skipped and named")


def test_unreadable_results_dir_for_readers(tmp_path, ledger):
    """A results path that is a file: `bca query` and `bca verify` say so instead of a traceback."""
    blocker = tmp_path / "results"
    blocker.write_text("not a directory")
    q = CliRunner().invoke(app, ["query", "SELECT count(*) AS n FROM samples", "--results", str(blocker), "--csv"])
    v = CliRunner().invoke(app, ["verify", str(blocker)])
    assert q.exception is None or isinstance(q.exception, SystemExit), q.exception
    assert q.exit_code == 2 and f"results dir {blocker} is a file, not a directory" in q.stderr
    assert v.exit_code == 2 and f"results dir {blocker} is a file, not a directory" in v.stderr
    ledger.bad_input("results path that is a file (query, verify)", "error")

