"""A stopped run's record tells the truth (issue 24 item 12): a trial ended by the sweep's own stop is recorded
as interrupted with how far it got (not as failed with "SystemExit: 0"), SIGTERM (`ray job stop`) leaves no run
"running", `bca verify` names every run that is not finished, and "Reproduce this run" runs exactly that run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dashboard.context import reproduce_spec
from orchestrator.cli import app
from orchestrator.results.testing import write_fake_run
from orchestrator.results.writer import RunWriter, read_run
from orchestrator.sweep.load import load_spec, validate_spec
from orchestrator.sweep.plan import expand, make_trials
from orchestrator.sweep.record import write_sweep_record
from orchestrator.sweep.runner import _mark_failed, _record_interrupted
from orchestrator.sweep.pieces import FAILPOINT_ENV, settings_of

REPO = Path(__file__).resolve().parents[1]


def write_spec(directory: Path, **overrides) -> Path:
    # pack: 1: the stall fault stops one run after its first part, and the test follows each run
    spec = {"name": "st", "results_dir": "results", "part_rows": 50, "pack": 1,
            "datasets": [{"synthetic": "label_shift", "n": 200, "num_classes": 4, "dim": 16}],
            "methods": [{"method": "clip"}, {"method": "bca", "tau": [0.2, 0.4], "n1": 50}], "seeds": [1, 2],
            **overrides}
    path = directory / "st.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_trial_ended_by_the_stop_is_recorded_as_interrupted_with_its_rows(tmp_path):
    spec = load_spec(write_spec(tmp_path))
    trial = make_trials(expand(spec), 1)[0]
    (run,) = trial.runs
    write_fake_run(spec.results_dir, run.config, n=200, status="running")  # every row written, not yet finished
    _mark_failed(settings_of(spec), "bca sweep st.yaml", print)(trial, "SystemExit: 0")
    row = read_run(spec.results_dir, spec.name, run.run_id)
    assert row["status"] == "failed"
    assert row["error"] == ("interrupted after all 200 rows (not yet recorded finished); resume with "
                            "bca sweep st.yaml --resume")
    assert row["progress"] == "stopped at 200/200 rows"


def test_a_run_stopped_while_its_trial_still_wrote_is_recorded_at_its_rows_on_disk(tmp_path):
    """Recorded interrupted while its trial was still stopping (on SIGTERM, or by the failure callback), the trial
    then wrote one more part: the sweep's end counts the run again, so its record says what is on disk."""
    from orchestrator.sweep.runner import _record_interrupted

    spec = load_spec(write_spec(tmp_path))
    run = expand(spec)[0]
    write_fake_run(spec.results_dir, run.config, n=200, rows=50, part_size=50, status="running")
    _record_interrupted(spec, [run], "bca sweep st.yaml", print)  # on SIGTERM, the trial still running
    assert read_run(spec.results_dir, spec.name, run.run_id)["progress"] == "stopped at 50/200 rows"
    writer = RunWriter(spec.results_dir, run.config)
    writer.write_part(50, {"image_id": [f"i{i}" for i in range(50, 100)], "label": [0] * 50, "pred": [0] * 50,
                           "confidence": [0.9] * 50})  # the part it was writing when stopped
    assert _record_interrupted(spec, [run], "bca sweep st.yaml", print) == [run.run_id]  # after Tune returned
    row = read_run(spec.results_dir, spec.name, run.run_id)
    assert row["error"].startswith("interrupted after 100 complete rows (of 200)")
    assert row["progress"] == "stopped at 100/200 rows" and writer.rows_done() == 100


def test_a_stop_the_trial_recorded_as_its_own_failure_is_recorded_as_interrupted(tmp_path):
    """Ctrl-C in a terminal reaches the workers too: a trial may record "SystemExit: 0" after the callback's
    record of the stop. Once Tune returned, such a run counts as interrupted (exit 130), not failed (exit 1)."""
    spec = load_spec(write_spec(tmp_path))
    (run,) = make_trials(expand(spec), 1)[0].runs
    write_fake_run(spec.results_dir, run.config, n=100, status="running")
    RunWriter(spec.results_dir, run.config).mark("failed", error="SystemExit: 0")  # the trial's own record
    assert _record_interrupted(spec, [run], "bca sweep st.yaml", print) == [run.run_id]
    row = read_run(spec.results_dir, spec.name, run.run_id)
    assert row["status"] == "failed" and row["error"] == ("interrupted after all 100 rows (not yet recorded "
                                                          "finished); resume with bca sweep st.yaml --resume")


def test_verify_names_every_run_that_is_not_finished(tmp_path):
    spec = load_spec(write_spec(tmp_path))
    runs = expand(spec)
    for run in runs:
        write_fake_run(spec.results_dir, run.config, n=200)
    RunWriter(spec.results_dir, runs[0].config).mark("failed", error="SystemExit: 0")  # all its rows, failed
    RunWriter(spec.results_dir, runs[1].config).mark("running")
    r = CliRunner().invoke(app, ["verify", spec.results_dir], env={"COLUMNS": "240"})
    assert r.exit_code == 1, r.output
    assert runs[0].run_id in r.output and "failed: SystemExit: 0" in r.output
    assert runs[1].run_id in r.output and "running" in r.output
    assert not any(run.run_id in r.output for run in runs[2:])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_records_the_running_runs_as_interrupted(tmp_path):
    """What `ray job stop` does to the driver: SIGTERM (then SIGKILL within seconds)."""
    spec_path = write_spec(tmp_path, resources={"cpus": 1})
    flag = tmp_path / "stalled"
    env = {**os.environ, FAILPOINT_ENV: f"stall:1:{flag}", "PYTHONPATH": str(REPO)}
    driver = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "sweep", str(spec_path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    while not flag.exists():
        assert driver.poll() is None, driver.stdout.read()
        assert time.monotonic() < deadline, "no trial reached its first part"
        time.sleep(0.2)
    driver.send_signal(signal.SIGTERM)
    output, _ = driver.communicate(timeout=60)
    assert driver.returncode == 130, output
    spec = load_spec(spec_path)
    rows = [read_run(spec.results_dir, spec.name, run.run_id) for run in expand(spec)]
    statuses = [row["status"] for row in rows if row is not None]
    assert "running" not in statuses, statuses
    stopped = [(run, row) for run, row in zip(expand(spec), rows) if row is not None and row["status"] == "failed"]
    # the stalled run stopped after its first part; a trial running beside it (2 CPUs) stopped wherever it was,
    # and its record says so: the count it gives is the rows it has on disk
    assert any(row["error"].startswith("interrupted after 50 complete rows (of 200)") for _, row in stopped), stopped
    for run, row in stopped:
        done = RunWriter(spec.results_dir, run.config).rows_done()
        assert row["error"].startswith(f"interrupted after {done} complete rows (of 200)" if done < 200 else
                                       "interrupted after all 200 rows"), (done, row["error"])


def test_reproduce_this_run_runs_exactly_that_run(tmp_path):
    spec = load_spec(write_spec(tmp_path, stream=["iid", {"dirichlet": {"gamma": 0.5}}], orders=2))
    runs = expand(spec)
    assert len(runs) == 3 * 2 * 2 * 2
    write_sweep_record(spec, runs)
    record = json.loads(next((Path(spec.results_dir) / "sweeps").glob("st.json")).read_text())
    for run in (runs[0], runs[-1], runs[len(runs) // 2 + 1]):
        again = validate_spec(reproduce_spec(record, run.config, run.run_id), base_dir=tmp_path)
        assert [r.run_id for r in expand(again)] == [run.run_id], run.label
