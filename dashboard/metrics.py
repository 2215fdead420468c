"""The metrics the dashboard can show: display names and which way is better, in one place.

Tables and charts take any numeric metric column the runs / accuracy views carry (`metric_columns`). A column
named here gets its display name and direction; a new numeric column of the views that is not named here
still appears, under its own name, higher taken as better, until a line is added below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pandas as pd

from orchestrator.results import schema
from orchestrator.stages import STAGE_COLUMNS


@dataclass(frozen=True)
class Metric:
    column: str
    label: str
    higher_is_better: bool = True
    percent: bool = False


# Display order: accuracy first (the paper's metric), then the protocol issue's metrics, then costs.
METRICS: tuple[Metric, ...] = (
    Metric("accuracy", "accuracy (%)", percent=True),
    Metric("last50_accuracy", "accuracy, last half of the stream (%)", percent=True),
    Metric("top5_accuracy", "top-5 accuracy (%)", percent=True),
    Metric("ece", "expected calibration error (%)", higher_is_better=False, percent=True),
    Metric("nll", "negative log-likelihood", higher_is_better=False),
    Metric("ood_auroc", "OOD AUROC (%)", percent=True),
    Metric("helped", "samples right where CLIP is wrong (same samples, same order)"),
    Metric("hurt", "samples wrong where CLIP is right (same samples, same order)", higher_is_better=False),
    Metric("samples_per_s", "samples / s"),
    Metric("warmup_s", "warm-up s (first call in its process: compilation; not in the costs)", higher_is_better=False),
    *(Metric(c, c.replace("_", " "), higher_is_better=False) for c in STAGE_COLUMNS),
    Metric("peak_mem_mb", "peak memory (MB)", higher_is_better=False),
)
_BY_COLUMN = {m.column: m for m in METRICS}

# Numeric columns of the views that describe a run rather than measure it.
NOT_METRICS = frozenset({"seed", "num_templates", "n_samples", "n_rows", "n_distinct", "n_skipped", "n_ood", "win",
                         "position", *(c.name for c in schema.HEAD_COLUMNS)})


def metric(column: str) -> Metric:
    """The metric of a column: its registered entry, or one named after the column (higher is better)."""
    return _BY_COLUMN.get(column, Metric(column, column))


def label(column: str) -> str:
    return metric(column).label


def metric_columns(runs: pd.DataFrame, hparams: Sequence[str]) -> list[str]:
    """The numeric metric columns of a runs frame with at least one value: registered ones in their order,
    then any other numeric column (not an hparam or an identity count) by name."""
    def usable(c: str) -> bool:
        return (c in runs.columns and pd.api.types.is_numeric_dtype(runs[c]) and not pd.api.types.is_bool_dtype(runs[c])
                and runs[c].notna().any())

    known = [m.column for m in METRICS if usable(m.column)]
    skip = {*known, *hparams, *NOT_METRICS}
    return known + sorted(c for c in runs.columns if c not in skip and usable(c))


def best_index(values: pd.Series, column: str) -> pd.Series:
    """True where a value is the best of `values` for this metric (ties all best; NaN never)."""
    target = values.max() if metric(column).higher_is_better else values.min()
    return values.notna() & (values == target)
