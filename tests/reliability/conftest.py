"""Shared pieces of the fault-injection and bad-input suite (issue 7).

- `ledger`: what each test injected or tried and how many rows it checked, written as JSON to the path in
  BCA_RELIABILITY_LEDGER (set by `python -m benchmarks.reliability`, which prints docs/reliability.md's counts).
  Tests record an entry only after its assertions passed, so the counts are of faults survived.
- Small synthetic sweep specs, reading every row back, and exactness against a reference computed by a plain
  loop over `execute_trial` (no Ray), the same code a trial runs.
- `ray_session`: one local Ray for the package, started with the fault hooks of hooks/sitecustomize.py in
  every worker; `faults` arms, awaits and releases them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pyarrow.parquet as pq
import pytest
import torch
import yaml

from orchestrator.results import schema, store
from orchestrator.results.writer import read_run
from orchestrator.sweep.load import load_spec
from orchestrator.sweep.plan import expand, make_trials
from orchestrator.sweep.pieces import Settings
from orchestrator.sweep.trial import execute_trial
from ray_cluster import own_ray

REPO = Path(__file__).resolve().parents[2]
HOOKS_DIR = Path(__file__).resolve().parent / "hooks"
LEDGER_ENV = "BCA_RELIABILITY_LEDGER"
HOOKS_ENV = "BCA_RELIABILITY_HOOKS"

N = 600          # rows per run
PART = 100       # rows per part
ROW_COLUMNS = [c.name for c in schema.SAMPLE_COLUMNS]


# ------------------------------------------------------------------------------------------------ ledger

@dataclass
class Ledger:
    entries: list[dict[str, Any]] = field(default_factory=list)

    def fault(self, name: str, **detail: Any) -> None:
        """A fault injected and survived (the test's assertions passed)."""
        self.entries.append({"kind": "fault", "name": name, **detail})

    def bad_input(self, name: str, outcome: str, **detail: Any) -> None:
        """A bad input tried and handled as documented: outcome is 'error', 'skip', 'encoded' or 'refused'."""
        self.entries.append({"kind": "bad_input", "name": name, "outcome": outcome, **detail})

    def determinism(self, name: str, **detail: Any) -> None:
        """A run reproduced exactly (from its spec and seed, or from its recorded stream order)."""
        self.entries.append({"kind": "determinism", "name": name, **detail})

    def rows(self, where: str, expected: int, distinct: int, duplicates: int) -> None:
        """Rows checked against what an uninterrupted run writes."""
        self.entries.append({"kind": "rows", "name": where, "expected": expected, "distinct": distinct,
                             "duplicates": duplicates})


@pytest.fixture(scope="session")
def ledger():
    book = Ledger()
    yield book
    target = os.environ.get(LEDGER_ENV)
    if target:
        Path(target).write_text(json.dumps(book.entries, indent=1))


# ------------------------------------------------------------------------------------------------ specs

def write_spec(directory: Path, *, name: str = "rel", results: str | Path = "results", **overrides: Any) -> Path:
    """A small synthetic sweep: 2 runs (clip, bca: one wave on 2 CPUs) of N rows in parts of PART, one seed."""
    spec = {
        "name": name,
        "results_dir": str(results),
        "datasets": [{"synthetic": "label_shift", "n": N, "num_classes": 6, "dim": 32}],
        "methods": [{"method": "clip"}, {"method": "bca", "tau": 0.3, "n1": 50}],
        "seeds": [1],
        "resources": {"cpus": 1},
        "part_rows": PART,
        "max_failures": 0,
        "pack": 1,  # one trial per run: these tests follow each run through faults and resumes
        **overrides,
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def sample_rows(results_dir: str | Path) -> dict[str, list[dict]]:
    """run_id -> every row of its complete parts and of the segments (a pack of fresh runs is committed straight
    into one), in stream order (duplicates kept, so they can be counted)."""
    rows: dict[str, list[dict]] = {}
    segments = store.load_catalog(results_dir).paths("samples")
    for part in sorted(Path(results_dir).glob(schema.SAMPLES_GLOB)) + segments:
        for row in pq.read_table(part, columns=ROW_COLUMNS).to_pylist():
            rows.setdefault(row["run_id"], []).append(row)
    return {rid: sorted(r, key=lambda x: x["sample_idx"]) for rid, r in rows.items()}


_REFERENCES: dict[str, dict[str, list[dict]]] = {}


def reference_rows(spec_path: Path, scratch: Path) -> dict[str, list[dict]]:
    """The rows an uninterrupted run of the spec writes: every trial through execute_trial in this process."""
    spec = load_spec(spec_path)
    runs = expand(spec)
    key = ",".join(sorted(r.run_id for r in runs))
    if key not in _REFERENCES:
        out = scratch / f"reference-{spec.name}"
        shutil.rmtree(out, ignore_errors=True)
        settings = Settings(results_dir=str(out), cache_dir=spec.cache_dir, data_root=spec.data_root,
                            part_rows=spec.part_rows)
        # Ray gives a trial with `cpus` CPUs that many torch threads, and the engine's float rounding depends on
        # the thread count (its blocks are pipelined when there are several), so the reference uses the same.
        threads = torch.get_num_threads()
        torch.set_num_threads(max(1, int(spec.resources.cpus)))
        try:
            for trial in make_trials(runs, spec.pack):
                execute_trial(trial, settings)
        finally:
            torch.set_num_threads(threads)
        _REFERENCES[key] = sample_rows(out)
    return _REFERENCES[key]


def assert_exact(results_dir: Path, spec_path: Path, reference: dict[str, list[dict]], ledger: Ledger,
                 where: str) -> None:
    """Every run of the spec finished with exactly its n rows, no duplicate (run_id, sample_idx), no temp file
    left, and every row (predictions, confidences, gates) equal to the uninterrupted reference."""
    spec = load_spec(spec_path)
    runs = expand(spec)
    rows = sample_rows(results_dir)
    missing = [r.label for r in runs if r.run_id not in rows]
    assert not missing, f"runs without rows: {missing}"
    for run in runs:
        got = rows[run.run_id]
        idx = [r["sample_idx"] for r in got]
        ledger_args = (f"{where}: {run.label}", N, len(set(idx)), len(idx) - len(set(idx)))
        assert idx == list(range(N)), f"{run.label}: rows {len(idx)}, distinct {len(set(idx))}"
        assert got == reference[run.run_id], f"{run.label}: rows differ from the uninterrupted run"
        assert read_run(results_dir, spec.name, run.run_id)["status"] == "finished"
        ledger.rows(*ledger_args)
    left = [p for p in Path(results_dir).rglob("*") if schema.is_temp_name(p.name) and "samples" in p.parts]
    assert not left, f"temp files left behind: {left}"


# ------------------------------------------------------------------------------------------------ processes

def bca_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("bca")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "orchestrator.cli"]


def start_bca(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`bca ARGS` in its own session (so a kill reaches only it), output captured."""
    return subprocess.Popen([*bca_cmd(), *args], env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=REPO)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{proc.args} did not finish in {timeout} s:\n{out}")
    return out


# ------------------------------------------------------------------------------------------------ Ray + faults

@dataclass
class Faults:
    """Arms the hooks of hooks/sitecustomize.py in the session's workers (see its docstring)."""

    control: Path

    def arm(self, name: str, action: str, match: Iterable[str]) -> None:
        for stale in self.control.glob(f"*-{name}"):
            stale.unlink()
        tmp = self.control / f".armed-{name}"
        tmp.write_text(json.dumps({"action": action, "match": list(match)}))
        tmp.rename(self.control / f"armed-{name}")

    def wait(self, name: str, *watch: subprocess.Popen, timeout: float = 300) -> dict[str, Any]:
        """Block until the fault fired; fails early with its output if a watched process ends first."""
        fired = self.control / f"fired-{name}"
        deadline = time.monotonic() + timeout
        while not fired.exists():
            for proc in watch:
                if proc.poll() is not None:
                    raise AssertionError(f"{proc.args} ended before fault {name!r} fired:\n{proc.stdout.read()}")
            assert time.monotonic() < deadline, f"fault {name!r} never fired"
            time.sleep(0.1)
        return json.loads(fired.read_text())

    def release(self, name: str) -> None:
        (self.control / f"release-{name}").touch()

    def clear(self) -> None:
        for path in self.control.iterdir():
            path.unlink()

    def release_all(self) -> None:
        """Let every paused worker go on (after a failed test, so none waits out its timeout)."""
        for claimed in self.control.glob("claimed-*"):
            self.release(claimed.name[len("claimed-"):])


@pytest.fixture(scope="package")
def ray_session(tmp_path_factory):
    """One local Ray (2 CPUs) for the package, every worker carrying the fault hooks."""
    pytest.importorskip("ray")
    control = tmp_path_factory.mktemp("fault-control")
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", HOOKS_ENV)}
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOKS_DIR), saved["PYTHONPATH"]) if p)
    os.environ[HOOKS_ENV] = str(control)
    try:
        with own_ray(num_cpus=2) as address:  # its workers start with the hooks on their path
            yield address, Faults(control)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def faults(ray_session):
    _, f = ray_session
    f.clear()
    yield f
    f.release_all()


# ------------------------------------------------------------------------------------------------ storage

def mount_tmpfs(where: Path, size: str, read_only: bool = False) -> bool:
    """Mount a size-limited (or read-only) tmpfs at `where`; False where mounting is not permitted."""
    where.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def unmount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def fill_disk(directory: Path) -> Path:
    """Write a filler file until the filesystem holding `directory` refuses more bytes."""
    filler = directory / "filler.bin"
    chunk = b"\0" * (1 << 16)
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass
    return filler
