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
import subprocess
import threading
from pathlib import Path

import pytest

from orchestrator.results import schema
from orchestrator.results.db import ResultsDB
from orchestrator.results.verify import verify_results
from orchestrator.results.writer import RunWriter, read_run
from orchestrator.sweep.plan import expand
from orchestrator.sweep.runner import run_sweep
from orchestrator.sweep.spec import load_spec

from .conftest import N, PART, assert_exact, finish, reference_rows, sample_rows, start_bca, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _run(spec_path: Path, method: str):
    return next(r for r in expand(load_spec(spec_path, check_existing=False)) if r.config["method"] == method)


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
