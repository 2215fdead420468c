"""Faults during a real local sweep (issue 7, items 1-3), each followed by a resume that must leave exactly n rows
per run, no duplicate (run_id, sample_idx), and the rows of an uninterrupted run of the same spec and seed.

Covered next door, not repeated here (tests/test_sweep_ray.py): a trial's worker killing itself between parts
and being retried, a failed trial recorded then resumed, the driver SIGKILLed then `bca sweep --resume`, and
two runs of one spec giving identical rows with the stored stream order replaying a run. This module adds the
faults that land *inside* a part write (hooks/sitecustomize.py pauses a worker in the rename that publishes a
part): a worker SIGKILLed from outside with its part half on disk, Ctrl-C of the driver mid-write, the disk
filling up mid-sweep, an unwritable results dir, and two sweeps plus readers sharing one results dir.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.results import schema
from orchestrator.results.db import ResultsDB
from orchestrator.results.verify import verify_results
from orchestrator.results.writer import RunWriter, read_run
from orchestrator.sweep.load import load_spec
from orchestrator.sweep.plan import expand
from orchestrator.sweep.runner import run_sweep

from .conftest import (
    PART,
    ROW_COLUMNS,
    N,
    assert_exact,
    fill_disk,
    finish,
    mount_tmpfs,
    reference_rows,
    sample_rows,
    start_bca,
    unmount,
    write_spec,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _run(spec_path: Path, method: str):
    return next(r for r in expand(load_spec(spec_path)) if r.config["method"] == method)


def _part_match(run, start: int) -> list[str]:
    return [f"run_id={run.run_id}/", schema.part_name(start)]


def _kill_when_fired(faults, name: str) -> threading.Thread:
    """SIGKILL the worker that fires `name`, from a thread, while the driver blocks in this one."""
    def kill() -> None:
        fired = faults.wait(name)
        os.kill(fired["pid"], signal.SIGKILL)
    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def test_worker_sigkilled_with_a_part_half_written_then_resume(ray_session, faults, tmp_path, ledger):
    spec_path = write_spec(tmp_path)
    reference = reference_rows(spec_path, tmp_path)
    bca = _run(spec_path, "bca")
    faults.arm("torn", "tear", _part_match(bca, 3 * PART))
    killer = _kill_when_fired(faults, "torn")
    outcome = run_sweep(load_spec(spec_path), out=lambda line: None)
    killer.join(timeout=60)
    spec = load_spec(spec_path)

    # The killed run is recorded as failed; the other runs finished; the torn temp file is invisible to readers.
    assert list(outcome.failed) == [bca.run_id] and outcome.finished == outcome.total - 1
    assert read_run(spec.results_dir, spec.name, bca.run_id)["status"] == "failed"
    writer = RunWriter(spec.results_dir, bca.config)
    torn = [p for p in writer.samples_dir.iterdir() if schema.is_temp_name(p.name)]
    assert len(torn) == 1 and schema.part_name(3 * PART) in torn[0].name
    with ResultsDB(spec.results_dir) as db:
        count = db.sql("SELECT count(*) AS n FROM samples WHERE run_id = ?", [bca.run_id]).to_pylist()
        assert count == [{"n": 3 * PART}] and db.bad_files == []
    problems = {(p.kind, p.where) for p in verify_results(spec.results_dir, temp_grace_s=0).problems}
    assert problems == {("temp_file", str(torn[0])), ("missing_rows", bca.run_id)}

    resumed = run_sweep(load_spec(spec_path), resume=True, out=lambda line: None)
    assert resumed.ok and resumed.skipped == resumed.total - 1
    assert_exact(spec.results_dir, spec_path, reference, ledger, "worker SIGKILL mid part write")
    assert verify_results(spec.results_dir).ok
    ledger.fault("trial worker SIGKILLed with a part half written", resumed="run_sweep(resume=True)")


def _stored_rows(results_dir: Path, run_ids: list[str]) -> dict[str, list[dict]]:
    """run_id -> its rows as the store holds them (segments included), in stream order."""
    cols = ", ".join(ROW_COLUMNS)
    with ResultsDB(results_dir) as db:
        rows = db.sql(f"SELECT {cols} FROM samples WHERE run_id IN ({', '.join('?' * len(run_ids))}) "
                      f"ORDER BY run_id, sample_idx", run_ids).to_pylist()
    out: dict[str, list[dict]] = {}
    for row in rows:
        out.setdefault(row["run_id"], []).append(row)
    return out


def test_worker_sigkilled_mid_pack_commit_then_resume(ray_session, faults, tmp_path, ledger):
    """A pack of fresh runs commits them together as one segment: a worker SIGKILLed while that segment's file
    is on its way leaves no run of the pack finished and no row visible; the resume commits each run once, with
    the rows of one trial per run (up to float32 rounding), and `bca verify` finds nothing (the killed commit's temp file removed)."""
    methods = [{"method": "bca", "tau": [0.2, 0.3, 0.4, 0.5], "n1": 50}]
    reference = reference_rows(write_spec(tmp_path / "ref", name="packed", pack=1, methods=methods), tmp_path)
    spec_path = write_spec(tmp_path, name="packed", pack=4, methods=methods)
    spec = load_spec(spec_path)
    runs = expand(spec)
    faults.arm("torn-pack", "pause", ["segments", ".samples.parquet"])
    killer = _kill_when_fired(faults, "torn-pack")
    outcome = run_sweep(spec, out=lambda line: None)
    killer.join(timeout=60)

    assert outcome.finished == 0 and sorted(outcome.failed) == sorted(r.run_id for r in runs)
    assert _stored_rows(spec.results_dir, [r.run_id for r in runs]) == {}
    problems = {p.kind for p in verify_results(spec.results_dir, temp_grace_s=0).problems}
    assert problems == {"temp_file", "missing_rows"}, problems

    resumed = run_sweep(load_spec(spec_path), resume=True, out=lambda line: None)
    assert resumed.ok and resumed.skipped == 0
    stored = _stored_rows(spec.results_dir, [r.run_id for r in runs])
    for run in runs:
        got = stored[run.run_id]
        assert [r["sample_idx"] for r in got] == list(range(N)), run.label
        want = reference[run.run_id]
        # the pack's multi-config pass is exact per run up to float32 rounding of the posteriors
        floats = ("confidence", "prob_true")
        assert [{k: v for k, v in r.items() if k not in floats} for r in got] == \
            [{k: v for k, v in r.items() if k not in floats} for r in want], f"{run.label}: rows differ"
        assert max(abs(a[k] - b[k]) for a, b in zip(got, want) for k in floats) < 1e-5, run.label
        assert read_run(spec.results_dir, spec.name, run.run_id)["status"] == "finished"
        ledger.rows(f"worker SIGKILL mid pack commit: {run.label}", N, N, 0)
    assert verify_results(spec.results_dir, temp_grace_s=0).ok
    ledger.fault("trial worker SIGKILLed mid pack commit (its segment file on its way)",
                 resumed="run_sweep(resume=True)")


def _driver_lines(output: str) -> str:
    """The driver's own output, without the lines Ray forwards from workers (a worker killed while it sleeps in
    a hook may print Python's "Exception ignored" notice on its way out)."""
    return "\n".join(line for line in output.splitlines() if "pid=" not in line.split(")")[0])


def _verify_cli(results_dir: Path):
    return CliRunner().invoke(app, ["verify", str(results_dir)])


def test_ctrl_c_while_a_part_is_being_written_then_resume(ray_session, faults, tmp_path, ledger):
    address, _ = ray_session
    spec_path = write_spec(tmp_path)
    reference = reference_rows(spec_path, tmp_path)
    bca = _run(spec_path, "bca")
    faults.arm("ctrl-c", "pause", _part_match(bca, 2 * PART))
    driver = start_bca("sweep", str(spec_path), "--address", address)
    faults.wait("ctrl-c", driver)
    driver.send_signal(signal.SIGINT)
    output = finish(driver)
    spec = load_spec(spec_path)

    # Exit 130, no traceback, a resume hint; the run stopped mid-write is recorded with how far it got.
    assert driver.returncode == 130, output
    assert "Traceback" not in _driver_lines(output) and f"bca sweep {spec_path} --resume" in output, output
    row = read_run(spec.results_dir, spec.name, bca.run_id)
    assert row["status"] == "failed" and f"interrupted after {2 * PART} complete rows" in row["error"], row
    # Everything written is queryable: whole parts only, no bad file; verify names the unfinished runs.
    with ResultsDB(spec.results_dir) as db:
        counts = db.sql("SELECT run_id, count(*) AS n, count(DISTINCT sample_idx) AS d FROM samples "
                        "GROUP BY run_id").to_pylist()
        assert db.bad_files == []
    assert all(c["n"] == c["d"] and c["n"] % PART == 0 for c in counts), counts
    assert {"run_id": bca.run_id, "n": 2 * PART, "d": 2 * PART} in counts
    checked = _verify_cli(spec.results_dir)
    assert checked.exit_code == 1 and f"missing_rows: {bca.run_id}: failed: {2 * PART} of {N}" in checked.stdout
    assert "bad_part" not in checked.stdout

    resumed = run_sweep(load_spec(spec_path), resume=True, out=lambda line: None)
    assert resumed.ok
    assert_exact(spec.results_dir, spec_path, reference, ledger, "Ctrl-C mid part write")
    assert _verify_cli(spec.results_dir).exit_code == 0
    ledger.fault("driver interrupted (SIGINT) while a worker was writing a part", exit_code=130)


def test_disk_full_mid_sweep_then_resume(ray_session, faults, tmp_path, ledger):
    address, _ = ray_session
    results = tmp_path / "small-disk"
    mounted = mount_tmpfs(results, "32m")
    try:
        spec_path = write_spec(tmp_path, results=results)
        reference = reference_rows(spec_path, tmp_path)
        bca = _run(spec_path, "bca")
        # With a real small disk: pause bca's part at row 200 in its rename, fill the disk, let it go on. Where
        # no tmpfs can be mounted the hook raises ENOSPC for that part instead (the writer's error path).
        faults.arm("full", "pause" if mounted else "enospc", _part_match(bca, 2 * PART))
        driver = start_bca("sweep", str(spec_path), "--address", address)
        faults.wait("full", driver)
        filler = fill_disk(results) if mounted else None
        faults.release("full")
        output = finish(driver)

        assert driver.returncode == 1, output
        assert "Traceback" not in _driver_lines(output) and "No space left on device" in output, output
        # Nothing half-written is visible and the parts written before the disk filled are intact.
        assert not [p for p in results.rglob("*") if schema.is_temp_name(p.name) and "samples" in p.parts]
        problems = verify_results(results).problems
        # a run whose trial was still going when the disk filled cannot record its stop either: its record stays
        # 'running', which verify names as not finished (CI caught clip's trial there under load)
        assert {p.kind for p in problems} <= {"missing_rows", "not_finished"}, problems
        done = RunWriter(results, bca.config).rows_done()
        assert done in (2 * PART, 3 * PART) and len(sample_rows(results)[bca.run_id]) == done
        assert sample_rows(results)[bca.run_id] == reference[bca.run_id][:done]

        if filler is not None:
            filler.unlink()
        assert run_sweep(load_spec(spec_path), resume=True, out=lambda line: None).ok
        assert_exact(results, spec_path, reference, ledger, "disk full mid sweep")
        ledger.fault("disk full mid sweep" + (" (32 MB tmpfs filled)" if mounted else " (simulated ENOSPC)"),
                     mounted=mounted)
    finally:
        if mounted:
            unmount(results)


def test_two_sweeps_and_readers_share_one_results_dir(ray_session, faults, tmp_path, ledger):
    from streamlit.testing.v1 import AppTest

    from dashboard import APP_PATH, RESULTS_ENV, queries

    address, _ = ray_session
    results = tmp_path / "shared-results"
    spec_a = write_spec(tmp_path / "a", name="a", results=results)
    spec_b = write_spec(tmp_path / "b", name="b", results=results, seeds=[2],
                        methods=[{"method": "bca", "tau": [0.2, 0.4], "n1": 50}])
    refs = {spec: reference_rows(spec, tmp_path) for spec in (spec_a, spec_b)}
    # Hold each sweep in the rename of one of its parts, so the readers below run while both are mid-write.
    faults.arm("a", "pause", ["sweep=a/", "method=bca", schema.part_name(2 * PART)])
    faults.arm("b", "pause", ["sweep=b/", schema.part_name(3 * PART)])
    drivers = [start_bca("sweep", str(spec), "--address", address) for spec in (spec_a, spec_b)]
    try:
        for name in ("a", "b"):
            faults.wait(name, *drivers)

        with ResultsDB(results) as db:
            counts = db.sql("SELECT sweep, run_id, count(*) AS n, count(DISTINCT sample_idx) AS d, "
                            "max(sample_idx) AS last FROM samples GROUP BY ALL").to_pylist()
            assert db.bad_files == []
            listing = queries.run_table(db)
            per_run = queries.accuracy_runs(db)
        assert {c["sweep"] for c in counts} == {"a", "b"}
        assert all(c["n"] == c["d"] == c["last"] + 1 and c["n"] % PART == 0 for c in counts), counts
        assert set(listing["sweep"]) == {"a", "b"} and "running" in set(listing["status"])
        assert set(per_run["run_id"]) == {c["run_id"] for c in counts}
        # and the app itself, over the same half-written results
        at = AppTest.from_file(str(APP_PATH), default_timeout=120)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(RESULTS_ENV, str(results))
            at.run()
        assert not at.exception and not at.warning, [e.value for e in (*at.exception, *at.warning)]
        assert at.dataframe
        query = CliRunner().invoke(app, ["query", "SELECT sweep, count(*) AS n FROM samples GROUP BY sweep",
                                         "--results", str(results), "--csv"])
        assert query.exit_code == 0 and "warning" not in query.stderr, query.output
        assert sorted(line.split(",")[0] for line in query.stdout.split()[1:]) == ["a", "b"]
    finally:
        faults.release("a")
        faults.release("b")
        outputs = [finish(d) for d in drivers]
    assert [d.returncode for d in drivers] == [0, 0], outputs
    for spec in (spec_a, spec_b):
        assert_exact(results, spec, refs[spec], ledger, f"concurrent sweep {spec.stem}")
    assert verify_results(results).ok
    ledger.fault("two sweeps writing one results dir, read by bca query and the dashboard mid-write")
