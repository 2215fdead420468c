"""Where each run of a plan stands in the results dir: the runs-table rows that exist, which finished runs are
complete (every row on disk), and which were made on another version of their dataset's image list.

Read-only and Ray-free, so the dry run and the sweep ask the same questions.
"""

from __future__ import annotations

from typing import Any

from orchestrator.results import store
from orchestrator.results.schema import partition_value, runs_root
from orchestrator.results.writer import RunWriter, read_run_file
from orchestrator.sweep.plan import Run
from orchestrator.sweep.spec import SweepSpec

INCOMPLETE = "incomplete"  # run_status of a 'finished' run whose rows are not all on disk


def recorded_rows(spec: SweepSpec, runs: list[Run]) -> dict[str, dict[str, Any]]:
    """run_id -> runs-table row of the runs that have one: compacted runs' from their segments (one read per
    segment), live runs' from their files (only existing files are read: a big grid's runs mostly have none)."""
    wanted = {run.run_id for run in runs}
    rows = store.load_catalog(spec.results_dir).run_rows(wanted)
    folder = runs_root(spec.results_dir) / f"sweep={partition_value(spec.name)}"
    for path in folder.glob("run_id=*.parquet"):
        run_id = path.name[len("run_id="):-len(".parquet")]
        if run_id in wanted and run_id not in rows and (row := read_run_file(path, run_id)) is not None:
            rows[run_id] = row
    return rows


def run_status(spec: SweepSpec, runs: list[Run]) -> dict[str, str | None]:
    """run_id -> running | finished | failed | incomplete (finished, rows missing since) | None (never marked)."""
    rows = recorded_rows(spec, runs)
    compacted = store.load_catalog(spec.results_dir).compacted()
    status: dict[str, str | None] = {}
    for run in runs:
        row = rows.get(run.run_id, {})
        state = row.get("status")
        if run.run_id in compacted:
            pass  # complete when compacted (`bca verify` checks the segments)
        elif state == "finished" and RunWriter(spec.results_dir, run.config).rows_done() != row.get("n_samples"):
            state = INCOMPLETE
        status[run.run_id] = state
    return status


def changed_data(spec: SweepSpec, runs: list[Run], status: dict[str, str | None]) -> dict[str, list[Run]]:
    """Dataset -> its finished runs recorded on another version of its image list than the data root holds now."""
    from orchestrator.sweep.catalog import listing_fingerprint

    rows = recorded_rows(spec, [r for r in runs if status[r.run_id] == "finished" and not r.source.is_synthetic])
    changed: dict[str, list[Run]] = {}
    current: dict[str, str] = {}  # dataset -> its fingerprint now (hashing a listing once per dataset)
    for run in runs:
        recorded = rows.get(run.run_id, {}).get("data_fingerprint")
        if not recorded:
            continue
        dataset = run.source.dataset
        if dataset not in current:
            current[dataset] = listing_fingerprint(dataset, spec.data_root)
        if recorded != current[dataset]:
            changed.setdefault(dataset, []).append(run)
    return changed
