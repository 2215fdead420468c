"""The sweep record: <results>/sweeps/<name>.json, the run_ids a sweep name stands for in a results dir.

A name is reused only to resume the same configuration; `check_sweep_record` says what differs otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.results.atomic import atomic_write
from orchestrator.sweep.plan import Run
from orchestrator.sweep.spec import SweepSpec, spec_fingerprint


def sweep_record_path(results_dir: str | Path, name: str) -> Path:
    """<results>/sweeps/<name>.json: the run_ids a sweep name stands for in this results dir."""
    return Path(results_dir) / "sweeps" / f"{name}.json"


def check_sweep_record(spec: SweepSpec, runs: list[Run]) -> str | None:
    """None when the results dir has no sweep of this name or the same runs; else what differs."""
    path = sweep_record_path(spec.results_dir, spec.name)
    try:
        recorded = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return f"cannot read the sweep record {path}: {exc}; expected the JSON this tool writes"
    old, new = set(recorded.get("run_ids", [])), {r.run_id for r in runs}
    if old == new:
        return None
    return (f"sweep {spec.name!r} already exists in {spec.results_dir} with a different configuration "
            f"({len(old - new)} recorded runs not in this spec, {len(new - old)} runs new in it); expected the "
            f"same configuration (to resume) or a new `name` (or remove {path} and that sweep's results)")


def write_sweep_record(spec: SweepSpec, runs: list[Run]) -> Path:
    path = sweep_record_path(spec.results_dir, spec.name)
    body = {"name": spec.name, "run_ids": sorted(r.run_id for r in runs), "spec": json.loads(spec_fingerprint(spec))}
    # ResultsWriteError names the path and the OS reason when the results dir cannot be written
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(body, indent=1, sort_keys=True)), "sweep record")
    return path
