"""What a run costs, and how `pack: auto` (the default) sizes trials by it.

A run's cost is its method's seconds per sample times its stream's length. Seconds per sample are measured, as
the ETA measures them (1 / samples_per_s of finished runs: in a pack, a run's share of the pass), from this
sweep's finished runs when there are any (a resumed sweep), else taken from the prior below. A trial then holds
the runs of one data source in stream order until they add up to TRIAL_TARGET_S of work, and never more than
TRIAL_MAX_S (a retried trial runs all of its runs again), so per-trial overhead (a Tune trial, a process
round trip, Tune's state) is a small share of the work and a lost trial costs at most about a minute.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any, Callable

from orchestrator.registry import find_method

if TYPE_CHECKING:
    from orchestrator.sweep.plan import Run

TRIAL_TARGET_S = 5.0
TRIAL_MAX_S = 60.0
# A method whose card has no samples_per_s (a plugin): as slow as the slowest known, one run a trial. The cards'
# rates are single-stream on one CPU core: slower than most real settings on a GPU, so trials start small.
UNKNOWN_SAMPLES_PER_S = 5.0
UNKNOWN_LENGTH = 50_000      # a real dataset the driver cannot list: ImageNet's size, so trials stay small


def measured_sample_seconds(rows: dict[str, dict[str, Any]]) -> dict[str, float]:
    """method -> median seconds per sample over the finished runs among runs-table `rows`."""
    seen: dict[str, list[float]] = {}
    for row in rows.values():
        rate = row.get("samples_per_s")
        if row.get("status") == "finished" and rate and rate > 0:
            seen.setdefault(row["method"], []).append(1.0 / rate)
    return {method: statistics.median(values) for method, values in seen.items()}


def cost_model(lengths: Callable[[Any], int], measured: dict[str, float] | None = None) -> Callable[[Run], float]:
    """Seconds a run is expected to take: measured (or prior) seconds per sample times `lengths(run.source)`."""
    measured = measured or {}
    memo: dict[Any, int] = {}

    def cost(run: Run) -> float:
        per_sample = measured.get(run.method)
        if per_sample is None:
            card = find_method(run.method)
            per_sample = 1.0 / ((card.samples_per_s if card else None) or UNKNOWN_SAMPLES_PER_S)
        if run.source not in memo:
            memo[run.source] = lengths(run.source)
        return per_sample * memo[run.source]

    return cost


def stream_length(spec: Any, source: Any) -> int:
    """A data source's stream length: a synthetic scenario's n, a real dataset's listing (UNKNOWN_LENGTH when
    the driver cannot list it, e.g. data only the workers mount)."""
    if source.is_synthetic:
        return int(source.params()["n"])
    from orchestrator.sweep.catalog import dataset_listing

    try:
        return len(dataset_listing(source.dataset, spec.data_root))
    except Exception:  # noqa: BLE001 - any listing failure only makes trials smaller; the trial reports it
        return UNKNOWN_LENGTH


def sweep_cost(spec: Any, rows: dict[str, dict[str, Any]] | None = None) -> Callable[[Run], float]:
    """The cost model of a sweep: measured from its finished runs' `rows` where there are any."""
    return cost_model(lambda source: stream_length(spec, source), measured_sample_seconds(rows or {}))


def chunk_by_cost(group: list[Run], cost: Callable[[Run], float]) -> list[tuple[Run, ...]]:
    """Consecutive runs of one group into trials of about TRIAL_TARGET_S and at most TRIAL_MAX_S of work (a run
    costing more is a trial of its own)."""
    trials: list[tuple[Run, ...]] = []
    members: list[Run] = []
    total = 0.0
    for run in group:
        c = cost(run)
        if members and (total >= TRIAL_TARGET_S or total + c > TRIAL_MAX_S):
            trials.append(tuple(members))
            members, total = [], 0.0
        members.append(run)
        total += c
    if members:
        trials.append(tuple(members))
    return trials
