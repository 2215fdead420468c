"""The trial body and progress reporting without Ray: resume from the last complete part is exact, a pack
equals its runs done one by one, failures are recorded, and progress lines and error summaries read well."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest

from orchestrator.results.writer import RunWriter, read_run
from orchestrator.sweep.load import validate_spec
from orchestrator.sweep.plan import expand, make_trials
from orchestrator.sweep.progress import ProgressCallback, format_seconds, summarise_error
from orchestrator.sweep.runner import settings_of
from orchestrator.sweep.trial import execute_trial, parse_failpoint

N, PART = 450, 100
SPEC = {
    "name": "trial",
    "results_dir": "results",
    "datasets": [{"synthetic": "temporal", "n": N, "num_classes": 5, "dim": 16}],
    "methods": [{"method": "clip"}, {"method": "bca", "tau": [0.3, 0.6], "n1": 20}, {"method": "tda"}],
    "seeds": [3],
    "part_rows": PART,
}


def spec_in(directory: Path, **overrides):
    return validate_spec({**copy.deepcopy(SPEC), **overrides}, base_dir=directory)


def rows(results_dir: str) -> dict[str, list[dict]]:
    """run_id -> its per-sample rows in stream order."""
    out: dict[str, list[dict]] = {}
    for part in Path(results_dir).glob("samples/*/*/*/*/*/part-*.parquet"):
        for row in pq.read_table(part).to_pylist():
            out.setdefault(row["run_id"], []).append(row)
    return {k: sorted(v, key=lambda r: r["sample_idx"]) for k, v in out.items()}


def run_all(spec, pack: int = 1, failpoint: str | None = None) -> list[dict]:
    settings = settings_of(spec)
    settings = type(settings)(**{**settings.__dict__, "failpoint": failpoint})
    out = []
    for trial in make_trials(expand(spec), pack):
        out += execute_trial(trial, settings)
    return out


def test_a_run_stopped_mid_stream_resumes_exactly(tmp_path):
    reference = spec_in(tmp_path / "ref")
    run_all(reference)
    spec = spec_in(tmp_path / "faulted")
    with pytest.raises(RuntimeError, match="failpoint"):
        run_all(spec, failpoint=f"raise:2:{tmp_path / 'flag'}")
    first = expand(spec)[0]
    row = read_run(spec.results_dir, spec.name, first.run_id)
    assert row["status"] == "failed" and "failpoint" in row["error"]
    assert RunWriter(spec.results_dir, first.config).rows_done() == 2 * PART
    results = run_all(spec)
    assert results[0]["resumed_from"] == 2 * PART and results[0]["rows_written"] == N - 2 * PART
    assert rows(spec.results_dir) == rows(reference.results_dir)
    assert run_all(spec) == []  # everything finished: nothing runs again


def test_a_pack_writes_what_its_runs_write_one_by_one(tmp_path):
    single, packed = spec_in(tmp_path / "single"), spec_in(tmp_path / "packed", pack=4)
    run_all(single)
    results = run_all(packed, pack=4)
    assert len(results) == len(expand(packed)) == 4
    a, b = rows(single.results_dir), rows(packed.results_dir)
    assert a.keys() == b.keys()
    for run_id in a:  # identical rows; confidences within the engine's float tolerance (other block edges)
        conf_a = np.array([r.pop("confidence") for r in a[run_id]])
        conf_b = np.array([r.pop("confidence") for r in b[run_id]])
        assert a[run_id] == b[run_id]
        assert np.allclose(conf_a, conf_b, atol=1e-5)


def test_failpoint_strings_are_checked():
    assert parse_failpoint(None) is None
    assert parse_failpoint("sigkill:2:/tmp/flag") == "sigkill:2:/tmp/flag"
    with pytest.raises(ValueError, match="expected '<sigkill|raise|stall>:<parts>:<flag file>'"):
        parse_failpoint("explode:2:/tmp/flag")


ACTOR_DIED = """Failure # 1 (occurred at 2026-11-25_22-05-21)
The actor died unexpectedly before finishing this task.
\tclass_name: ImplicitFunc
The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker \
unexpectedly exits with a connection error code 2. End of file. Some common causes include: (1) the process was killed
"""
TRACEBACK = """Failure # 2 (occurred at 2026-11-25_22-05-21)
ray.exceptions.RayTaskError(ValueError): ray::ImplicitFunc.train() (pid=1, ip=1)
  File "x.py", line 1, in f
ValueError: bca: hparam 'tau' must be a number
"""


def test_errors_are_summarised_in_one_line():
    died = summarise_error(ACTOR_DIED)
    assert died.startswith("worker process died") and "SYSTEM_ERROR" in died and "common causes" not in died
    assert summarise_error(TRACEBACK) == "ValueError: bca: hparam 'tau' must be a number"
    assert summarise_error(None) == "unknown error"
    assert format_seconds(75) == "1:15" and format_seconds(3725) == "1:02:05" and format_seconds(float("inf")) == "?"


def test_progress_lines_count_runs_and_report_retries_and_failures(tmp_path):
    spec = spec_in(tmp_path, pack=2)
    runs = expand(spec)
    trials = make_trials(runs, 2)
    lines: list[str] = []
    failed: list[tuple] = []
    callback = ProgressCallback(trials, runs, already_done=0, out=lines.append,
                                on_failed=lambda trial, error: failed.append((trial.key, error)))
    error_file = tmp_path / "error.txt"
    error_file.write_text(ACTOR_DIED)

    def tune_trial(plan, **result):
        return SimpleNamespace(config={"trial": plan.key}, last_result=result, error_file=str(error_file),
                               get_error=lambda: None)

    callback.on_trial_start(0, [], tune_trial(trials[0]))
    callback.on_trial_complete(0, [], tune_trial(trials[0], accuracy=81.5, samples_per_s=1234.0, n_runs=2,
                                                 resumed_from=200))
    callback.on_trial_recover(0, [], tune_trial(trials[1]))
    callback.on_trial_error(0, [], tune_trial(trials[1]))
    assert lines[0].startswith(f"[2/{len(runs)}]") and "acc 81.50% (mean)" in lines[0] and "resumed at row 200" in lines[0]
    assert "ETA" in lines[0]
    assert lines[1].startswith("retry:") and "worker process died" in lines[1]
    assert lines[2].startswith(f"[4/{len(runs)}] FAILED") and failed == [(trials[1].key, summarise_error(ACTOR_DIED))]
