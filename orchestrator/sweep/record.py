"""The sweep record: <results>/sweeps/<name>.json, the run_ids a sweep name stands for in a results dir.

A name is reused to resume the same configuration or to grow it: a spec whose runs include every recorded run
(more grid values, more seeds, more datasets) keeps the finished runs and runs only the new ones. A spec that
drops recorded runs (a changed setting alters runs already made) is refused, saying which settings changed.
The record also lists the runs the sweep's driver saw finished, so that a results dir that lost some (a deleted
manifest or segment file) says so instead of showing a smaller table (orchestrator.results.db.ResultsDB.lost).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from orchestrator.results import schema
from orchestrator.results.atomic import atomic_write
from orchestrator.sweep.plan import Run
from orchestrator.sweep.spec import SweepSpec, spec_fingerprint

# Spec fields that do not change any run's numbers (how runs are scheduled, described or chunked on disk).
_NOT_RESULTS = ("description", "resources", "pack", "part_rows", "max_failures")
_SHOWN_CHANGES = 5


def sweep_record_path(results_dir: str | Path, name: str) -> Path:
    """<results>/sweeps/<name>.json: the run_ids a sweep name stands for in this results dir."""
    return schema.sweeps_root(results_dir) / f"{name}.json"


def _changes(old: Any, new: Any, path: str = "") -> list[str]:
    """'path: old -> new' for each leaf that differs between two JSON documents."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            if path == "" and key in _NOT_RESULTS:
                continue
            sub = f"{path}.{key}" if path else str(key)
            out += _changes(old.get(key), new.get(key), sub)
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        if len(old) == 1:  # a scalar the spec stores as a one-point grid
            return _changes(old[0], new[0], path)
        return [c for i, (a, b) in enumerate(zip(old, new)) for c in _changes(a, b, f"{path}[{i}]")]
    return [] if old == new else [f"{path}: {json.dumps(old)} -> {json.dumps(new)}"]


def check_sweep_record(spec: SweepSpec, runs: list[Run]) -> str | None:
    """None when the results dir has no sweep of this name, or this spec's runs include all it recorded (the
    same sweep, or a grown one); else what changed."""
    path = sweep_record_path(spec.results_dir, spec.name)
    try:
        recorded = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return f"cannot read the sweep record {path}: {exc}; expected the JSON this tool writes"
    old = set(recorded.get("run_ids", []))
    dropped = old - {r.run_id for r in runs}
    if not dropped:
        return None
    changes = _changes(recorded.get("spec", {}), json.loads(spec_fingerprint(spec)))
    shown = "; ".join(changes[:_SHOWN_CHANGES]) + (f"; and {len(changes) - _SHOWN_CHANGES} more"
                                                    if len(changes) > _SHOWN_CHANGES else "")
    return (f"sweep {spec.name!r} already exists in {spec.results_dir}, and this spec leaves out {len(dropped)} of its "
            f"{len(old)} recorded runs (changed: {shown or 'the expansion of the same settings'}); expected the "
            f"recorded settings, with grid values, seeds or datasets only added (finished runs are kept, new ones "
            f"run), or a new `name` (or remove {path} and that sweep's results)")


def write_sweep_record(spec: SweepSpec, runs: list[Run], finished: Iterable[str] = ()) -> Path:
    """The record of the spec's runs and of those seen finished (`finished`): the store must hold those, and its
    readers say which it no longer does (ResultsDB.lost). Written by the sweep's driver, under its lock, when it
    starts and when it ends."""
    path = sweep_record_path(spec.results_dir, spec.name)
    body = {"name": spec.name, "run_ids": sorted(r.run_id for r in runs), "spec": json.loads(spec_fingerprint(spec)),
            "finished": sorted(set(finished))}
    # ResultsWriteError names the path and the OS reason when the results dir cannot be written
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(body, indent=1, sort_keys=True)), "sweep record")
    return path
