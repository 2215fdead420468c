"""A sweep compacts its results as it goes (orchestrator.results.compaction): once enough runs finished since the
last compaction, a background thread of the driver moves them into a segment, and the sweep's end compacts what is
left. Below COMPACT_MIN_RUNS finished live runs nothing is compacted: a few hundred runs' files open quickly, and
`bca compact` compacts them whenever asked.

Any number of drivers (sweeps of one results dir, on any node of shared storage) may do this at once: compactions
take turns under the catalog lock, and trials keep writing their live files meanwhile.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

from orchestrator.results.compaction import CompactReport, compact

log = logging.getLogger(__name__)

COMPACT_MIN_RUNS_ENV = "BCA_COMPACT_MIN_RUNS"
COMPACT_MIN_RUNS = 200


def min_runs() -> int:
    """Finished live runs that make a compaction worth its rewrite (BCA_COMPACT_MIN_RUNS overrides, e.g. in tests
    that compact a small sweep)."""
    text = os.environ.get(COMPACT_MIN_RUNS_ENV)
    if text is None:
        return COMPACT_MIN_RUNS
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{COMPACT_MIN_RUNS_ENV}={text!r}: expected a positive integer") from None
    if value < 1:
        raise ValueError(f"{COMPACT_MIN_RUNS_ENV}={text!r}: expected a positive integer")
    return value


class Compactor:
    """Counts runs as their trials end and compacts in a background thread once `threshold` finished since the last
    compaction; `finish()` waits for it and compacts what is left (at least `threshold` runs)."""

    def __init__(self, results_dir: str, out: Callable[[str], None], threshold: int | None = None) -> None:
        self.results_dir, self.out = results_dir, out
        self.threshold = min_runs() if threshold is None else threshold
        self.pending = 0
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.done = CompactReport()  # what this sweep's compactions did, added up
        self._lock = threading.Lock()

    def runs_ended(self, n: int) -> None:
        with self._lock:
            self.pending += n
            if self.pending < self.threshold or (self.thread is not None and self.thread.is_alive()):
                return
            self.pending = 0
            self.thread = threading.Thread(target=self._compact, name="bca-compact", daemon=True)
            self.thread.start()

    def _compact(self) -> None:
        try:
            self._add(compact(self.results_dir, min_runs=self.threshold))
        except BaseException as exc:  # reported by finish(); the live files stay as they were
            self.error = exc

    def _add(self, report: CompactReport) -> None:
        self.done.runs += report.runs
        self.done.rows += report.rows
        self.done.segments += report.segments

    def finish(self) -> CompactReport | None:
        _ACTIVE.pop(id(self), None)
        if self.thread is not None:
            self.thread.join()
        try:
            if self.error is not None:
                raise self.error
            self._add(compact(self.results_dir, min_runs=self.threshold))
        except (OSError, ValueError) as exc:
            # The runs are finished and readable in their live files; only the compaction is missing.
            self.out(f"warning: could not compact {self.results_dir} ({exc}); its runs stay in their own files, "
                     f"readable as they are: run `bca compact {self.results_dir}` later")
            return None
        if self.done.runs:
            self.out(f"compacted {self.done.runs} run(s) ({self.done.rows:,} rows) into segments")
        return self.done


_ACTIVE: dict[int, Compactor] = {}  # Tune pickles its callbacks with its state: they name their compactor by id


def tune_callback(compactor: Compactor) -> Any:
    """A Ray Tune callback that tells the compactor how many runs each ended trial held."""
    from ray.tune import Callback

    _ACTIVE[id(compactor)] = compactor

    class _CompactCallback(Callback):
        def __init__(self, key: int) -> None:
            self.key = key

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            from orchestrator.sweep import compaction  # by name: this class is pickled by value, the registry not

            target = compaction._ACTIVE.get(self.key)
            if target is not None:
                target.runs_ended(max(1, int((trial.last_result or {}).get("n_runs", 1))))

    return _CompactCallback(id(compactor))
