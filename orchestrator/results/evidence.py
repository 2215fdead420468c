"""What each number of a table stands on, so that no number is read without its evidence.

A table cell pools the runs of one configuration on one dataset (its seeds x stream orders). Its evidence:

- n: the runs it stands on: finished, with all their rows (`usable`).
- expected: the runs it should stand on. A sweep runs every configuration on the same seeds and orders, so the
  (seed, order) pairs recorded for any run of the same sweep, backbone, dataset and stream are expected of every
  configuration there. A run that failed, was interrupted, lost a part, or never started leaves the cell at
  "n=2 of 3", never silently recomputed as if complete; `missing` says why per run.
- samples: what its runs streamed against what the dataset has: a run that skipped unreadable images stands on
  fewer samples ("30 of 40 samples"); only a complete dataset is set beside a published number.
- gains are paired: each run against zero-shot CLIP on the same setting, seed, order and samples (same stream
  length and data fingerprint), averaged over the pairs that exist, which are counted.
- protocol: the stream protocol of its runs; "best" compares cells of one protocol only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import pandas as pd

from orchestrator import registry
from orchestrator.data.streams import stream_label, stream_value

# The stream values under which a real-dataset run is the published protocol (a seeded i.i.d. permutation).
PAPER_STREAMS = (None, "iid")
# Most incomplete runs a table's notes list one by one (a sweep of 10^5 runs may have thousands).
MAX_LISTED = 10


def order_of(runs: pd.DataFrame) -> pd.Series:
    """Each run's stream order (0 where the configuration has a single one)."""
    if "order_index" not in runs:
        return pd.Series(0, index=runs.index)
    return runs["order_index"].fillna(0).astype(int)


def usable(runs: pd.DataFrame) -> pd.Series:
    """The runs a number may stand on: finished, with all their rows (the accuracy view's `complete`)."""
    complete = runs["complete"].astype("boolean").fillna(False).astype(bool) if "complete" in runs else False
    return (runs["status"] == "finished") & complete


def protocol(value: Any) -> str:
    """A stream's display name for captions and grouping: 'iid', 'dirichlet(gamma=0.01)', 'dataset order'."""
    value = stream_value(value)
    return "dataset order" if value is None else stream_label(value)


def why_unusable(run: pd.Series) -> str:
    """Why a recorded run is not counted: its status, rows and error, in a few words."""
    status = run.get("status")
    if status == "finished":
        rows, n = run.get("n_rows"), run.get("n_samples")
        if pd.notna(rows) and pd.notna(n):
            return f"finished but {int(rows)} of {int(n)} rows readable (a part lost or truncated)"
        return "finished but its rows are incomplete"
    if status == "running":
        return "still running"
    error = run.get("error")
    error = error.strip().splitlines()[-1][:80] if isinstance(error, str) and error.strip() else "no error recorded"
    return f"{status or 'unrecorded'} ({error})"


def _peers(runs: pd.DataFrame) -> pd.DataFrame:
    """Per run, what its peers share: sweep, backbone, dataset and stream (a sweep's runs there share seeds and
    orders)."""
    def text(column: str) -> pd.Series:  # None and NaN alike (a merge turns one into the other)
        values = runs[column] if column in runs else pd.Series(None, index=runs.index, dtype=object)
        if isinstance(values.dtype, pd.StringDtype):  # already text: no round trip through 10^5 Python strings
            return values.fillna("").astype(str)
        return values.astype(object).where(values.notna(), "").astype(str)

    return pd.DataFrame({"sweep": text("sweep"), "backbone": text("backbone_name" if "backbone_name" in runs
                                                                   else "backbone"),
                         "dataset": text("dataset"), "stream": text("stream")}, index=runs.index)


def prepare(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs with what the cells read, computed once for a whole table: `_order`, `_fit` (usable), `_peer`
    (sweep, backbone, dataset and stream, as one key), `_protocol` and `_paper_stream`."""
    if "_fit" in runs:
        return runs
    peers = _peers(runs)
    streams = runs["stream"] if "stream" in runs else pd.Series(None, index=runs.index, dtype=object)
    labels = {text: protocol(text or None) for text in peers["stream"].unique()}
    # once per distinct stream, not once per run (code -1: a missing stream, which stream_value reads as None)
    codes, uniques = pd.factorize(streams, use_na_sentinel=True)
    paper = np.array([stream_value(v) in PAPER_STREAMS for v in uniques] + [None in PAPER_STREAMS], dtype=bool)
    return runs.assign(_order=order_of(runs), _fit=usable(runs),
                       _peer=peers["sweep"] + "\x1f" + peers["backbone"] + "\x1f" + peers["dataset"] + "\x1f"
                       + peers["stream"],
                       _protocol=peers["stream"].map(labels),
                       _paper_stream=paper[codes])


def expected_keys(runs: pd.DataFrame) -> dict[str, set[tuple[int, int]]]:
    """Peer key (`prepare`) -> the (seed, order) pairs any run there was recorded with."""
    frame = prepare(runs)
    keys = pd.DataFrame({"peer": frame["_peer"], "seed": frame["seed"].astype(int), "order": frame["_order"]})
    out: dict[str, set[tuple[int, int]]] = {}
    for peer, seed, order in keys.drop_duplicates().itertuples(index=False, name=None):
        out.setdefault(peer, set()).add((seed, order))
    return out


@dataclass
class Cell:
    """The evidence of one cell: runs used and expected, why the others are missing, samples, protocol."""

    values: dict[tuple[int, int], float]  # the metric per (seed, order) it stands on
    expected: set[tuple[int, int]]
    missing: dict[tuple[int, int], str]
    samples: int | None = None        # fewest samples a used run streamed, when some skipped images
    total: int | None = None          # what the dataset has (streamed + skipped)
    protocols: frozenset[str] = frozenset()
    paper_ok: bool = False            # the published protocol on the complete published dataset

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def complete(self) -> bool:
        return self.n >= len(self.expected) and not self.missing

    @property
    def skipped(self) -> bool:
        return self.samples is not None

    def stats(self) -> tuple[float, float, int]:
        """(mean, std with ddof 1 (NaN for one run), n) over the runs it stands on; NaN mean for none."""
        values = np.fromiter(self.values.values(), float, len(self.values))
        if not len(values):
            return math.nan, math.nan, 0
        return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else math.nan, len(values)


# The run columns a cell reads, as arrays (`columns`).
_CELL_COLUMNS = ("seed", "_order", "_fit", "_peer", "_protocol", "_paper_stream", "dataset", "n_samples", "n_skipped")


def columns(runs: pd.DataFrame) -> dict[str, np.ndarray]:
    """A `prepare`d frame's cell columns as numpy arrays, taken once for a whole table (n_skipped as numbers,
    none as 0)."""
    out = {c: runs[c].to_numpy() for c in _CELL_COLUMNS if c in runs}
    if "n_skipped" in out:
        out["n_skipped"] = pd.to_numeric(runs["n_skipped"]).fillna(0).to_numpy(dtype=float)
    return out


def cell_at(runs: pd.DataFrame, arrays: dict[str, np.ndarray], values: np.ndarray, at: np.ndarray,
            peers: dict[str, set], no_value: str = "no value of the metric") -> Cell:
    """The cell of the runs at positions `at` of a `prepare`d frame (one configuration on one dataset, any status),
    with `values` the metric of every run of the frame; `no_value` says why a usable run without a value is left
    out. Plain Python over the cell's few runs: a table of 10^5 runs calls this once per cell."""
    seeds, orders = arrays["seed"][at].astype(int), arrays["_order"][at].astype(int)
    fit = arrays["_fit"][at].astype(bool)
    mine = values[at].astype(float)
    ok = fit & ~np.isnan(mine)
    by_key = np.lexsort((orders[ok], seeds[ok]))  # by (seed, order)
    used_seeds, used_orders, used = seeds[ok][by_key], orders[ok][by_key], mine[ok][by_key]
    if not ((np.diff(used_seeds) == 0) & (np.diff(used_orders) == 0)).any():
        # one run per (seed, order), the usual case: its value is its mean (sum([v]) / 1, i.e. v + 0.0)
        means = dict(zip(zip(used_seeds.tolist(), used_orders.tolist()), (used + 0.0).tolist()))
    else:  # several runs of one (seed, order) (several sweeps of one setting): their mean
        pooled: dict[tuple[int, int], list[float]] = {}
        for seed, order, value in zip(used_seeds.tolist(), used_orders.tolist(), used.tolist()):
            pooled.setdefault((seed, order), []).append(value)
        means = {k: sum(v) / len(v) for k, v in pooled.items()}
    expected: set[tuple[int, int]] = set()
    for peer in set(arrays["_peer"][at]):
        expected |= peers.get(peer, set())
    missing = {}
    for key in sorted(expected - set(means)):
        hit = np.flatnonzero((seeds == key[0]) & (orders == key[1]))
        if not len(hit):
            missing[key] = "never ran"
        else:
            missing[key] = no_value if fit[hit].any() else why_unusable(runs.iloc[int(at[hit[0]])])
    samples = total = None
    if ok.any() and "n_skipped" in arrays:
        skipped = arrays["n_skipped"][at][ok]
        if (skipped > 0).any():
            worst = int(np.argmax(skipped))
            streamed = int(arrays["n_samples"][at][ok][worst])
            samples, total = streamed, streamed + int(skipped[worst])
    key = registry.dataset_key(str(arrays["dataset"][at[0]])) if len(at) else None
    card = registry.DATASETS[key] if key else None
    paper_ok = (card is not None and bool(ok.any()) and samples is None
                and bool(arrays["_paper_stream"][at][ok].all()) and "n_samples" in arrays
                and bool((arrays["n_samples"][at][ok] == card.test_images).all()))
    cell = Cell(means, expected, missing, samples, total, frozenset(arrays["_protocol"][at]), paper_ok)
    cell.paper_ok = cell.paper_ok and cell.complete
    return cell


def dataset_cell(cell_runs: pd.DataFrame, peers: dict[str, set], metric: str,
                 no_value: str = "no value of the metric") -> Cell:
    """The cell of one configuration on one dataset from its recorded runs (any status; `cell_at` for many)."""
    frame = prepare(cell_runs)
    values = pd.to_numeric(frame[metric], errors="coerce").to_numpy(dtype=float)
    return cell_at(frame, columns(frame), values, np.arange(len(frame)), peers, no_value)


def average_cell(parts: list[Cell]) -> Cell | None:
    """The cell of an average over datasets: per (seed, order), the mean over datasets, where every dataset has
    that run; incomplete or short of samples when any of its datasets is."""
    if not parts:
        return None
    keys = sorted(set.intersection(*(set(p.values) for p in parts)))
    values = {k: sum(p.values[k] for p in parts) / len(parts) for k in keys}
    expected = set().union(*(p.expected for p in parts))
    missing = {k: "a dataset's run is missing" for k in expected - set(values)}
    short = [p for p in parts if p.skipped]
    return Cell(values, expected, missing, short[0].samples if short else None, short[0].total if short else None,
                frozenset().union(*(p.protocols for p in parts)), all(p.paper_ok for p in parts))


def paired_gain(values: Any, baseline: Any) -> tuple[float, int]:
    """Mean difference to the baseline over the keys both have ((seed, order), or (setting, seed, order)), and how
    many: a gain on the same runs, never one mean over 2 seeds minus another over 3."""
    mine = dict(values.items())
    theirs = dict(baseline.items())
    both = [k for k in mine if k in theirs and not math.isnan(mine[k]) and not math.isnan(theirs[k])]
    if not both:
        return math.nan, 0
    return sum(mine[k] - theirs[k] for k in both) / len(both), len(both)


def cell_text(mean: float, std: float, n: int, expected: int | None = None, samples: int | None = None,
              total: int | None = None, worst: float | None = None) -> str:
    """'50.71 ± 1.70 (n=3)'; 'n=2 of 3' when runs are missing; '30 of 40 samples' when images were skipped;
    '— (n=0 of 3)' when nothing is left. `worst`: OGA's worst-10% mean, in brackets."""
    evidence = f"n={n}" + (f" of {expected}" if expected is not None and expected > n else "")
    if samples is not None and total is not None:
        evidence += f"; {samples:,} of {total:,} samples"
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return f"— ({evidence})" if expected else "—"
    value = f"{mean:.2f}"
    if n > 1 and std is not None and not (isinstance(std, float) and math.isnan(std)):
        value += f" ± {std:.2f}"
        if worst is not None and not (isinstance(worst, float) and math.isnan(worst)):
            value += f" [{worst:.2f}]"
    return f"{value} ({evidence})"


def gain_text(gain: float, cell: Cell | None) -> str:
    """'+4.98 (n=2)': a paired gain and the (seed, order) pairs it stands on; 'n=2 of 3' where the method's or
    CLIP's run of a pair is missing or incomplete."""
    if gain is None or (isinstance(gain, float) and math.isnan(gain)) or cell is None:
        return "—"
    return f"{gain:+.2f} (n={cell.n}" + (f" of {len(cell.expected)})" if len(cell.expected) > cell.n else ")")


def spread_over(cells: Iterable[Cell]) -> str:
    """What a table's ± is over: 'seeds', 'stream orders' or 'seeds x stream orders' (the runs its cells pool)."""
    seeds = orders = 1
    for cell in cells:
        keys = list(cell.values)
        if keys:
            seeds = max(seeds, len({k[0] for k in keys}))
            orders = max(orders, len({k[1] for k in keys}))
    if orders > 1 and seeds > 1:
        return "seeds x stream orders"
    return "stream orders (one seed)" if orders > 1 else "seeds"


def missing_lines(missing: list[tuple[str, tuple[int, int], str]]) -> list[str]:
    """Notes naming each missing run (at most MAX_LISTED, then a count): 'RN50 · BCA · ImageNet-A: seed 3,
    order 0: failed (KeyboardInterrupt)'."""
    lines = [f"  {where}: seed {seed}, order {order}: {why}" for where, (seed, order), why in missing[:MAX_LISTED]]
    if len(missing) > MAX_LISTED:
        lines.append(f"  ... and {len(missing) - MAX_LISTED} more")
    return lines
