"""The metrics the dashboard can show: display names and which way is better, from the metric registry
(orchestrator.results.metrics).

Tables and charts take any numeric metric column the runs / accuracy views carry (`metric_columns`). A column
named here gets its display name and direction; a new numeric column of the views that is not named here
still appears, under its own name, higher taken as better, until the registry names it.
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from orchestrator.results import schema
from orchestrator.results.metrics import COST_METRICS, METRICS as REGISTERED, RUN_METRICS, Metric


# Display order: the registry's per-run metrics (accuracy first, the paper's metric), the paired counts
# against CLIP, then costs.
METRICS: tuple[Metric, ...] = (*RUN_METRICS, REGISTERED["helped"], REGISTERED["hurt"], *COST_METRICS)
_BY_COLUMN = {m.name: m for m in METRICS}

# Numeric columns of the views that describe a run rather than measure it: its identity (seed, order_index,
# batch_size, ...) and its counts.
NOT_METRICS = frozenset({"n_samples", "n_rows", "n_distinct", "n_skipped", "n_ood", "win", "position",
                         *(c.name for c in (*schema.HEAD_COLUMNS, *schema.IDENTITY_COLUMNS))})


def metric(column: str) -> Metric:
    """The metric of a column: its registered entry, or one named after the column (higher is better)."""
    return _BY_COLUMN.get(column, Metric(column, column, "", True))


def label(column: str) -> str:
    return metric(column).label


def metric_columns(runs: pd.DataFrame, hparams: Sequence[str]) -> list[str]:
    """The numeric metric columns of a runs frame with at least one value: registered ones in their order,
    then any other numeric column (not an hparam or an identity count) by name."""
    def usable(c: str) -> bool:
        return (c in runs.columns and pd.api.types.is_numeric_dtype(runs[c]) and not pd.api.types.is_bool_dtype(runs[c])
                and runs[c].notna().any())

    known = [m.name for m in METRICS if usable(m.name)]
    skip = {*known, *hparams, *NOT_METRICS}
    return known + sorted(c for c in runs.columns if c not in skip and usable(c))


def best_index(values: pd.Series, column: str) -> pd.Series:
    """True where a value is the best of `values` for this metric (ties all best; NaN never)."""
    target = values.max() if metric(column).higher_is_better else values.min()
    return values.notna() & (values == target)
