"""The dashboard's questions to the results, over the results module's views (runs, samples, accuracy).

Per-run data is read once per refresh for all runs (the accuracy view, one row per run) and filtered in
pandas, so moving a filter costs no scan of the samples. Everything per sample is aggregated inside DuckDB
(stream curves, per-class accuracy) over the chosen runs only, reading just the backbone/dataset partitions.

Filter semantics: an empty selection means "all"; a run whose column is NULL passes a filter on that column
(the hyperparameter does not apply to it: CLIP has no tau), so filtering BCA's tau keeps the CLIP baseline.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from orchestrator import registry
from orchestrator.results import report
from orchestrator.results.db import ResultsDB
from orchestrator.stages import STAGE_COLUMNS, STAGES, stage_column

# Filters on the run's identity, in display order: runs-table column -> label. Every hyperparameter that takes
# several values among the runs is a filter too (`filter_columns`), labelled by its name.
IDENTITY_FILTERS = {
    "sweep": "sweep",
    "backbone": "backbone",
    "dataset": "dataset",
    "method": "method",
    "num_templates": "templates per class",
}
# Identity columns: every run has one, so a filter on them never lets NULL through.
_IDENTITY = ("sweep", "backbone", "dataset", "method", "seed", "status")
# Settings that may tell two configurations of one method apart, besides the hparams.
SETTING_COLUMNS = ("sweep", "pretrained", "templates", "num_templates", "views")
# Metrics of the runs table the accuracy view does not carry.
RUN_METRICS = ("samples_per_s", *STAGE_COLUMNS, "peak_mem_mb", "error", "updated_at")
LISTING_COLUMNS = ("run_id", "sweep", "backbone", "dataset", "method", "seed", "num_templates", "status",
                   "n_samples", "samples_per_s", "error", "updated_at")


class Filters:
    """Chosen values per runs-table column (empty = no restriction) and run statuses to include:
    `Filters(method=("bca",), tau=(0.3,), status=("finished",))`."""

    def __init__(self, status: tuple = (), **chosen: tuple) -> None:
        self.status = tuple(status)
        self.chosen = {column: tuple(values) for column, values in chosen.items() if values}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Filters) and (self.status, self.chosen) == (other.status, other.chosen)

    def __hash__(self) -> int:
        return hash((self.status, tuple(sorted(self.chosen.items()))))

    @property
    def method(self) -> tuple:
        return self.chosen.get("method", ())

    def mask(self, runs: pd.DataFrame) -> pd.Series:
        """Which rows of a frame with the runs columns pass these filters."""
        keep = pd.Series(True, index=runs.index)
        for column, values in [*self.chosen.items(), ("status", self.status)]:
            if not values:
                continue
            hit = runs[column].isin(list(values))
            keep &= hit if column in _IDENTITY else (hit | runs[column].isna())
        return keep

    def apply(self, runs: pd.DataFrame) -> pd.DataFrame:
        return runs[self.mask(runs)]

    def with_clip(self) -> "Filters":
        """These filters letting CLIP's runs through: the comparison's gain needs CLIP as its baseline even when
        the method filter leaves CLIP out (its rows are dropped from the display again)."""
        baseline = registry.baseline_method()
        if not self.method or baseline in self.method:
            return self
        return Filters(self.status, **{**self.chosen, "method": (*self.method, baseline)})


def _clean(value: Any) -> Any:
    """numpy/pandas scalars to plain Python, so values hash stably and bind as DuckDB parameters."""
    return value.item() if hasattr(value, "item") else value


def run_table(db: ResultsDB) -> pd.DataFrame:
    """Every run of the runs table (also those with no samples yet): the listing's columns and every hparam."""
    columns = ", ".join(f'"{c}"' for c in (*LISTING_COLUMNS, *db.hparam_names))
    return db.df(f"SELECT {columns} FROM runs ORDER BY updated_at DESC NULLS LAST, run_id")


def filter_columns(runs: pd.DataFrame, hparams: Sequence[str]) -> dict[str, str]:
    """Filter column -> label: the identity filters, every hparam with several values among `runs`, the seed."""
    varying = {h: h for h in hparams if h in runs.columns and runs[h].nunique(dropna=True) > 1}
    return {**IDENTITY_FILTERS, **varying, "seed": "seed"}


def filter_options(runs: pd.DataFrame, columns: Sequence[str]) -> dict[str, list]:
    """Distinct non-null values of each filter column, sorted."""
    return {c: sorted(_clean(v) for v in runs[c].dropna().unique()) for c in columns if c in runs.columns}


def status_counts(runs: pd.DataFrame) -> dict[str, int]:
    return {str(k): int(v) for k, v in runs["status"].value_counts().items()}


def accuracy_runs(db: ResultsDB) -> pd.DataFrame:
    """One row per run that has samples: the accuracy view plus the run's cost metrics from the runs view."""
    extra = ", ".join(f"r.{c}" for c in RUN_METRICS)
    return db.df(f"SELECT a.*, {extra} FROM accuracy a LEFT JOIN runs r USING (run_id) "
                 "ORDER BY a.backbone, a.dataset, a.method, a.run_id")


def runs_listing(table: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """The runs-table rows passing the filters (`table`, filtered) with rows written and accuracy from the
    accuracy rows (`runs`); runs with no samples yet show empty progress."""
    progress = runs[["run_id", "n_rows", "accuracy", "last50_accuracy"]].rename(columns={"n_rows": "rows_written"})
    listing = table.merge(progress.round({"accuracy": 2, "last50_accuracy": 2}), on="run_id", how="left")
    head = list(LISTING_COLUMNS[:LISTING_COLUMNS.index("status")])
    tail = list(LISTING_COLUMNS[LISTING_COLUMNS.index("n_samples") + 1:])
    hparams = [c for c in table.columns if c not in LISTING_COLUMNS and table[c].nunique(dropna=True) > 1]
    return listing[[*head, *hparams, "status", "rows_written", "n_samples", "accuracy", "last50_accuracy", *tail]]


def hparam_columns(db: ResultsDB) -> list[str]:
    return db.hparam_names


def series_labels(runs: pd.DataFrame, hparams: Sequence[str]) -> pd.Series:
    """A display label per run naming its configuration apart from the seed, as the report's rows do
    (e.g. "BCA (tau=0.3)"): one labelling rule for tables and charts."""
    return report.row_labels(runs, hparams)


# ------------------------------------------------------------------------------------------- comparison
def comparison_tables(db: ResultsDB, runs: pd.DataFrame, paper: bool) -> list[report.ReportTable]:
    """The report's tables (mean ± std over seeds, gain over CLIP, optional paper rows) for the finished runs
    shown: Table 1 / Table 2 where their datasets are present, a method x dataset table for the others."""
    return report.report_tables(db, paper=paper, runs=runs[runs["status"] == "finished"], include_empty=False)


def _is_clip_row(label: str) -> bool:
    clip = registry.method_label(registry.baseline_method())
    return label == clip or label.startswith(clip + " (")


def comparison_frames(table: report.ReportTable,
                      filters: Filters) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(display text, numbers, best-cell mask) of a report table with its index as columns, CLIP's rows left
    out when the method filter leaves CLIP out (they were only queried as the gain's baseline)."""
    text, numbers = table.formatted(), table.to_frame()
    best = table.best.reindex(columns=text.columns, fill_value=False)
    if filters.method and registry.baseline_method() not in filters.method:
        keep = [not _is_clip_row(r) for r in text.index.get_level_values("method")]
        text, numbers, best = text[keep], numbers[keep], best[keep]
    text, numbers = text.reset_index(), numbers.reset_index()
    best = best.reset_index(drop=True).reindex(columns=text.columns, fill_value=False).astype(bool)
    return text, numbers, best


# -------------------------------------------------------------------------------------- stream curves
def online_curves(db: ResultsDB, run_ids: Sequence[str], backbone: str, dataset: str, window: int) -> pd.DataFrame:
    """Accuracy against stream position per run, in windows of `window` samples: cumulative (all samples so
    far) and windowed (the window alone), both in %. One row per (run, window); aggregated in DuckDB, reading
    the backbone/dataset partitions only."""
    params = {"runs": list(run_ids), "backbone": backbone, "dataset": dataset, "window": int(window)}
    return db.df("""
WITH win AS (
    SELECT run_id, sample_idx // $window AS win, count(*) AS n, sum(correct::INTEGER) AS k
    FROM samples
    WHERE backbone = $backbone AND dataset = $dataset AND list_contains($runs, run_id)
    GROUP BY ALL
)
SELECT run_id, win,
       sum(n) OVER w AS position,
       100.0 * sum(k) OVER w / sum(n) OVER w AS cumulative,
       100.0 * k / n AS windowed
FROM win
WINDOW w AS (PARTITION BY run_id ORDER BY win ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
ORDER BY run_id, win
""", params)


def mean_curves(curves: pd.DataFrame, labels: pd.Series) -> pd.DataFrame:
    """Average the per-run curves over the runs of one configuration (the seeds): columns series, win,
    position, cumulative, windowed. `labels` maps run_id -> series label; runs are few, rows per run few."""
    frame = curves.assign(series=curves["run_id"].map(labels))
    return (frame.groupby(["series", "win"], as_index=False)
            .agg(position=("position", "mean"), cumulative=("cumulative", "mean"), windowed=("windowed", "mean")))


def default_window(max_rows: int, points: int = 25) -> int:
    """A window giving about `points` points per curve."""
    return max(1, int(np.ceil(max_rows / points)))


# ---------------------------------------------------------------------------------------- per class
def per_class(db: ResultsDB, run_ids: Sequence[str], backbone: str, dataset: str) -> pd.DataFrame:
    """Samples and correct predictions per true class and run: columns run_id, label, n, correct (DuckDB)."""
    params = {"runs": list(run_ids), "backbone": backbone, "dataset": dataset}
    return db.df("""
SELECT run_id, label, count(*) AS n, sum(correct::INTEGER) AS correct
FROM samples
WHERE backbone = $backbone AND dataset = $dataset AND list_contains($runs, run_id)
GROUP BY ALL ORDER BY run_id, label
""", params)


def per_class_by_series(counts: pd.DataFrame, labels: pd.Series) -> pd.DataFrame:
    """Per-class accuracy per configuration (pooled over its seeds): columns series, label, n, accuracy."""
    frame = counts.assign(series=counts["run_id"].map(labels))
    out = frame.groupby(["series", "label"], as_index=False)[["n", "correct"]].sum()
    out["accuracy"] = 100.0 * out["correct"] / out["n"]
    return out.drop(columns="correct")


def most_different_classes(table: pd.DataFrame, top: int) -> list[int]:
    """The classes whose accuracy differs most between configurations (max - min), for a readable chart."""
    spread = table.groupby("label")["accuracy"].agg(lambda a: a.max() - a.min())
    return [int(c) for c in spread.sort_values(ascending=False, kind="stable").index[:top]]


# ------------------------------------------------------------------------------- hyperparameter views
def sensitivity_params(runs: pd.DataFrame, hparams: Sequence[str]) -> list[str]:
    """The numeric hyperparameters a sensitivity curve can be drawn for: those with several values among `runs`."""
    return varying_numeric(runs, hparams)


def varying_numeric(runs: pd.DataFrame, columns: Sequence[str]) -> list[str]:
    """Numeric columns that take more than one value among `runs` (parallel coordinates' axes)."""
    out = []
    for c in columns:
        if c in runs.columns and pd.api.types.is_numeric_dtype(runs[c]) and runs[c].nunique(dropna=True) > 1:
            out.append(c)
    return out


def sensitivity_points(runs: pd.DataFrame, param: str, others: Sequence[str]) -> tuple[pd.DataFrame, dict]:
    """Mean ± std accuracy over seeds against one hyperparameter, the paper's one-at-a-time Fig. 3.

    Runs vary in several hparams at once in a grid; to show the effect of `param` alone the other
    hparams in `others` are held at their most common value among the runs that have `param` (ties: the
    smallest). Only (method, backbone, dataset) series with at least two values of `param` are kept.
    Returns (points with columns series, method, backbone, dataset, value, mean, std, n; the held values).
    """
    columns = ["series", "method", "backbone", "dataset", "value", "mean", "std", "n"]
    finished = runs[(runs["status"] == "finished") & runs[param].notna()]
    held = {}
    for other in others:
        if other == param or other not in finished.columns or finished[other].nunique(dropna=True) < 2:
            continue
        counts = finished[other].value_counts()
        value = _clean(min(counts.index[counts == counts.max()]))
        held[other] = value
        finished = finished[finished[other] == value]
    keys = ["method", "backbone", "dataset"]
    finished = finished[finished.groupby(keys)[param].transform("nunique") >= 2]
    if finished.empty:
        return pd.DataFrame(columns=columns), held
    points = (finished.groupby([*keys, param], as_index=False)["accuracy"]
              .agg(mean="mean", std="std", n="count")
              .rename(columns={param: "value"}))
    points["value"] = points["value"].astype(float)
    several_backbones = points["backbone"].nunique() > 1
    points["series"] = [
        " · ".join([registry.method_label(m), *([report.backbone_label(b)] if several_backbones else []),
                    registry.dataset_title(d)])
        for m, b, d in zip(points["method"], points["backbone"], points["dataset"])]
    return points[columns], held


def stage_times(runs: pd.DataFrame, labels: pd.Series) -> pd.DataFrame:
    """Mean seconds per stage per configuration (finished runs): columns series, stage, seconds."""
    finished = runs[runs["status"] == "finished"].assign(series=labels)
    cols = {stage_column(s): s for s in STAGES}
    means = finished.groupby("series")[list(cols)].mean().rename(columns=cols)
    return means.reset_index().melt(id_vars="series", var_name="stage", value_name="seconds").dropna()


def cost_table(runs: pd.DataFrame, labels: pd.Series) -> pd.DataFrame:
    """Per configuration: runs, samples/s, seconds per stage and peak memory, means over finished runs."""
    finished = runs[runs["status"] == "finished"].assign(series=labels)
    cols = ["samples_per_s", *STAGE_COLUMNS, "peak_mem_mb"]
    out = finished.groupby(["backbone", "dataset", "series"])[cols].mean().round(4)
    out.insert(0, "runs", finished.groupby(["backbone", "dataset", "series"]).size())
    return out.reset_index()
