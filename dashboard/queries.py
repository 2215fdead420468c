"""The dashboard's questions to the results, over the results module's views (runs, samples, accuracy).

Per-run data is read once per refresh for all runs (the accuracy view, one row per run) and filtered in
pandas, so moving a filter costs no scan of the samples. Everything per sample is aggregated inside DuckDB
(stream curves, per-class accuracy) over the chosen runs only, reading just the backbone/dataset partitions.

Filter semantics: an empty selection means "all"; a run whose column is NULL passes a filter on that column
(the hyperparameter does not apply to it: CLIP has no tau), so filtering BCA's tau keeps the CLIP baseline.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from orchestrator import registry
from orchestrator.results import evidence, report
from orchestrator.results.db import ResultsDB
from orchestrator.results.sql import CURVE_POINTS, curve_points_sql, curve_window, window_counts_sql
from orchestrator.results.metrics import worst_count
from orchestrator.stages import STAGE_COLUMNS, STAGES, stage_column

# Filters on the run's identity, in display order: runs-table column -> label. Every hyperparameter that takes
# several values among the runs is a filter too (`filter_columns`), labelled by its name.
IDENTITY_FILTERS = {
    "sweep": "sweep",
    "backbone": "backbone",
    "dataset": "dataset",
    "method": "method",
    "num_templates": "templates per class",
    "stream": "stream protocol",
}
# Settings that are a filter only where the runs differ in them: column -> label.
_VARYING_FILTERS = {"batch_size": "batch size"}
# Identity columns: every run has one, so a filter on them never lets NULL through.
_IDENTITY = ("sweep", "backbone", "dataset", "method", "seed", "status")
# Settings that may tell two configurations of one method apart, besides the hparams.
SETTING_COLUMNS = ("sweep", "pretrained", "templates", "num_templates", "views")
# Runs-view columns left out of the per-run frame: long JSON read only on a run's own page.
_HEAVY = ("config_json", "versions")
LISTING_COLUMNS = ("run_id", "sweep", "backbone", "dataset", "method", "stream", "batch_size", "seed", "order_index",
                   "num_templates", "status",
                   "n_samples", "progress", "n_skipped", "samples_per_s", "error", "updated_at")


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
    columns = ", ".join(f'"{c}"' for c in (*LISTING_COLUMNS, *hparam_columns(db)))
    return db.df(f"SELECT {columns} FROM runs ORDER BY updated_at DESC NULLS LAST, run_id")


def filter_columns(runs: pd.DataFrame, hparams: Sequence[str]) -> dict[str, str]:
    """Filter column -> label: the identity filters, every hparam with several values among `runs`, the seed."""
    varying = {h: h for h in (*_VARYING_FILTERS, *hparams) if h in runs.columns and runs[h].nunique(dropna=True) > 1}
    return {**IDENTITY_FILTERS, **{c: _VARYING_FILTERS.get(c, c) for c in varying}, "seed": "seed"}


def filter_options(runs: pd.DataFrame, columns: Sequence[str]) -> dict[str, list]:
    """Distinct non-null values of each filter column, sorted."""
    return {c: sorted(_clean(v) for v in runs[c].dropna().unique()) for c in columns if c in runs.columns}


def status_counts(db: ResultsDB) -> tuple[dict[str, int], int]:
    """(runs per status, every run of the runs table), counted in DuckDB rather than over a frame of every run."""
    rows = db.sql("SELECT status, count(*) AS n FROM runs GROUP BY status").to_pylist()
    return {str(r["status"]): int(r["n"]) for r in rows if r["status"] is not None}, sum(int(r["n"]) for r in rows)


def accuracy_runs(db: ResultsDB) -> pd.DataFrame:
    """One row per run that has samples: the accuracy view plus every runs-view column it does not carry (costs,
    error, and any metric column added to the runs table), so new metric columns reach the dashboard as they are
    added to either view."""
    carried = set(db.columns("accuracy"))
    used = set(hparam_columns(db))
    unused = [h for h in db.hparam_names if h not in used and h in carried]
    extra = [c for c in db.columns("runs")
             if c not in carried and c not in _HEAVY and c not in unused]
    columns = "".join(f', r."{c}"' for c in extra)
    exclude = f" EXCLUDE ({', '.join(map(_quoted, unused))})" if unused else ""
    # rows whose runs-table row is gone (a damaged store) have no seed or setting to be shown under: the page's
    # banner names them (ResultsDB.lost)
    return db.df(f"SELECT a.*{exclude}{columns}, p.helped, p.hurt FROM accuracy a LEFT JOIN runs r USING (run_id) "
                 "LEFT JOIN paired p USING (run_id) WHERE a.status IS NOT NULL "
                 "ORDER BY a.backbone, a.dataset, a.method, a.run_id")


def runs_listing(table: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """The runs-table rows passing the filters (`table`, filtered) with rows written and accuracy from the
    accuracy rows (`runs`); runs with no samples yet show empty progress."""
    progress = runs[["run_id", "n_rows", "accuracy", "last50_accuracy"]].rename(columns={"n_rows": "rows_written"})
    listing = table.merge(progress.round({"accuracy": 2, "last50_accuracy": 2}), on="run_id", how="left")
    listing["stream"] = listing["stream"].map(evidence.protocol)
    head = list(LISTING_COLUMNS[:LISTING_COLUMNS.index("status")])
    tail = [c for c in LISTING_COLUMNS[LISTING_COLUMNS.index("n_samples") + 1:] if c != "progress"]
    hparams = [c for c in table.columns if c not in LISTING_COLUMNS and table[c].nunique(dropna=True) > 1]
    return listing[[*head, *hparams, "status", "progress", "rows_written", "n_samples", "accuracy", "last50_accuracy",
                    *tail]]


def hparam_columns(db: ResultsDB) -> list[str]:
    """The hyperparameters some run has a value of (the frames above carry only these)."""
    return db.used_hparam_names


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def series_labels(runs: pd.DataFrame, hparams: Sequence[str]) -> pd.Series:
    """A display label per run naming its configuration apart from the seed, as the report's rows do
    (e.g. "BCA (tau=0.3)"): one labelling rule for tables and charts."""
    return report.row_labels(runs, hparams)


# ------------------------------------------------------------------------------------------- comparison
def comparison_tables(db: ResultsDB, runs: pd.DataFrame, paper: bool) -> list[report.ReportTable]:
    """The report's tables (mean ± std, paired gain over CLIP, optional paper rows) over the runs shown, whatever
    their status (a cell stands on the finished, complete ones and is marked by the others): Table 1 / Table 2
    where their datasets are present, a method x dataset table for the others."""
    return report.report_tables(db, paper=paper, runs=runs, include_empty=False)


def comparison_frames(table: report.ReportTable,
                      filters: Filters) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(display text, numbers, best-cell mask) of a report table with its index as columns, CLIP's rows left
    out when the method filter leaves CLIP out (they were only queried as the gain's baseline): told by the
    rows' method ids, not their labels."""
    text, numbers = table.formatted(), table.to_frame()
    best = table.best.reindex(columns=text.columns, fill_value=False)
    if filters.method and registry.baseline_method() not in filters.method:
        keep = (table.methods.reindex(text.index) != registry.baseline_method()).to_numpy()
        text, numbers, best = text[keep], numbers[keep], best[keep]
    text, numbers = text.reset_index(), numbers.reset_index()
    best = best.reset_index(drop=True).reindex(columns=text.columns, fill_value=False).astype(bool)
    return text, numbers, best


def _runs_filter(run_ids: Sequence[str]) -> str:
    """`run_id IN (...)` with the ids as literals: a constant filter DuckDB checks against each row group's run_id
    range, so only the shown runs' row groups of the large compacted files are read (a list parameter is not
    pushed into the scan)."""
    ids = ["'" + str(r).replace("'", "''") + "'" for r in run_ids]
    return f"run_id IN ({', '.join(ids)})" if ids else "false"


# -------------------------------------------------------------------------------------- stream curves
def online_curves(db: ResultsDB, run_ids: Sequence[str], backbone: str, dataset: str, window: int) -> pd.DataFrame:
    """Accuracy against stream position per run, in windows of `window` samples: cumulative (all samples so
    far) and windowed (the window alone), both in %. One row per (run, window); aggregated in DuckDB. When every
    run is compacted and `window` is the one its curve was materialised at (the default for runs of one length),
    read from those few points per run; else from the rows of these runs only (the same SQL over the same counts,
    tests/test_results_store.py)."""
    params = {"backbone": backbone, "dataset": dataset, "window": int(window)}
    ids = sorted(set(run_ids))
    # the shown runs as a table joined in (a literal list of a dataset's thousands of runs takes long to bind)
    shown = {"shown_runs": pa.table({"run_id": pa.array(ids, pa.string())})}
    curves = db.df(curve_points_sql(
        "SELECT run_id, unnest(curve_win) AS win, unnest(curve_n) AS n, unnest(curve_k) AS k FROM run_curves "
        "WHERE s_backbone = $backbone AND s_dataset = $dataset AND curve_window = $window "
        "AND run_id IN (SELECT run_id FROM shown_runs)"), params, shown)
    if ids and curves["run_id"].nunique() == len(ids):
        return curves
    rows = f"(SELECT * FROM samples WHERE backbone = $backbone AND dataset = $dataset AND {_runs_filter(ids)})"
    return db.df(curve_points_sql(window_counts_sql(rows, "$window")), params)


def default_window(max_rows: int, points: int = CURVE_POINTS) -> int:
    """A window giving about `points` points per curve (at the default, the window compaction materialises)."""
    return curve_window(max_rows) if points == CURVE_POINTS else max(1, int(np.ceil(max_rows / points)))


# ---------------------------------------------------------------------------------------- per class
def per_class(db: ResultsDB, run_ids: Sequence[str], backbone: str, dataset: str) -> pd.DataFrame:
    """Samples and correct predictions per true class and run: columns run_id, label, n, correct (DuckDB). OOD
    samples have no class (label -1): left out, as every accuracy leaves them out."""
    params = {"backbone": backbone, "dataset": dataset}
    return db.df(f"""
SELECT run_id, label, count(*) AS n, sum(correct::INTEGER) AS correct
FROM samples
WHERE backbone = $backbone AND dataset = $dataset AND {_runs_filter(run_ids)} AND is_ood IS NOT TRUE
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
    """The numeric hyperparameters a sensitivity curve can be drawn for: those with several values among `runs`,
    less any that equals an earlier one in every run (a gate left null follows tau: one curve, tau's)."""
    out: list[str] = []
    for h in varying_numeric(runs, hparams):
        if not any(_follows(runs, h, p) for p in out):
            out.append(h)
    return out


def _follows(runs: pd.DataFrame, column: str, param: str) -> bool:
    """Whether `column` equals `param` in every run that has both: it varies with it, not on its own."""
    both = runs[[column, param]].dropna()
    return not both.empty and bool((both[column] == both[param]).all())


def varying_numeric(runs: pd.DataFrame, columns: Sequence[str]) -> list[str]:
    """Numeric columns that take more than one value among `runs` (parallel coordinates' axes)."""
    out = []
    for c in columns:
        if c in runs.columns and pd.api.types.is_numeric_dtype(runs[c]) and runs[c].nunique(dropna=True) > 1:
            out.append(c)
    return out


def stream_protocols(runs: pd.DataFrame) -> pd.Series:
    """Each run's stream protocol as shown ('iid', 'contaminated(rate=0.2)', 'dataset order')."""
    streams = runs["stream"] if "stream" in runs else pd.Series(None, index=runs.index, dtype=object)
    return report.per_value(streams, evidence.protocol)


def sensitivity_points(runs: pd.DataFrame, param: str, others: Sequence[str],
                       metric: str = "accuracy") -> tuple[pd.DataFrame, dict]:
    """Mean ± std of a metric over seeds and orders against one hyperparameter, the paper's one-at-a-time Fig. 3.

    Runs vary in several hparams at once in a grid; to show the effect of `param` alone the other
    hparams in `others` are held at their most common value among the runs that have `param` (ties: the
    smallest). One series per method, backbone, dataset and stream protocol (a contaminated stream's accuracy is
    not pooled with an i.i.d. one's), kept where it has at least two values of `param`; the protocol is named in
    the series where several are shown. Returns (points with columns series, method, backbone, dataset,
    protocol, value, mean, std, n; the held values).
    """
    columns = ["series", "method", "backbone", "dataset", "protocol", "value", "mean", "std", "n"]
    finished = runs[evidence.usable(runs) & runs[param].notna()]
    held = {}
    for other in others:
        if other == param or other not in finished.columns or finished[other].nunique(dropna=True) < 2 \
                or _follows(finished, other, param):
            continue
        counts = finished[other].value_counts()
        value = _clean(min(counts.index[counts == counts.max()]))
        held[other] = value
        finished = finished[finished[other] == value]
    finished = finished.assign(protocol=stream_protocols(finished))
    keys = ["method", "backbone", "dataset", "protocol"]
    finished = finished[finished.groupby(keys)[param].transform("nunique") >= 2]
    if finished.empty:
        return pd.DataFrame(columns=columns), held
    points = (finished.groupby([*keys, param], as_index=False)[metric]
              .agg(mean="mean", std="std", n="count")
              .rename(columns={param: "value"}))
    points["value"] = points["value"].astype(float)
    several_backbones = points["backbone"].nunique() > 1
    several_protocols = points["protocol"].nunique() > 1
    points["series"] = [
        " · ".join([registry.method_label(m), *([report.backbone_label(b)] if several_backbones else []),
                    registry.dataset_title(d), *([p] if several_protocols else [])])
        for m, b, d, p in zip(points["method"], points["backbone"], points["dataset"], points["protocol"])]
    return points[columns], held


def stage_times(runs: pd.DataFrame, labels: pd.Series) -> pd.DataFrame:
    """Mean seconds per stage per configuration (finished runs): columns series, stage, seconds."""
    finished = runs[runs["status"] == "finished"].assign(series=labels)
    cols = {stage_column(s): s for s in STAGES}
    means = finished.groupby("series")[list(cols)].mean().rename(columns=cols)
    return means.reset_index().melt(id_vars="series", var_name="stage", value_name="seconds").dropna()


def cost_table(runs: pd.DataFrame, labels: pd.Series) -> pd.DataFrame:
    """Per configuration: runs, samples/s, seconds per stage and peak memory, means over finished runs; and the
    warm-up its runs paid apart (the first call in a process: compilation), which none of the others include."""
    finished = runs[runs["status"] == "finished"].assign(series=labels)
    cols = ["samples_per_s", *(c for c in report.COST_COLUMNS if c in runs), *STAGE_COLUMNS, "peak_mem_mb",
            *(["warmup_s"] if "warmup_s" in runs else [])]
    out = finished.groupby(["backbone", "dataset", "series"])[cols].mean().round(4)
    out.insert(0, "runs", finished.groupby(["backbone", "dataset", "series"]).size())
    return out.reset_index()


def cost_points(runs: pd.DataFrame, labels: pd.Series, metric: str) -> pd.DataFrame:
    """Per series: the metric's mean and n and the mean latency and method memory (report.COST_COLUMNS) over its
    finished, complete runs; empty where the runs carry no such costs (results written before they were measured)."""
    costs = [c for c in report.COST_COLUMNS if c in runs]
    done = runs[(runs["status"] == "finished") & runs["complete"].fillna(False).astype(bool)].assign(series=labels)
    if not costs or done.empty or done[costs].isna().all().all():
        return pd.DataFrame(columns=["series", "mean", "n", *report.COST_COLUMNS])
    grouped = done.groupby("series")
    return pd.DataFrame({"mean": grouped[metric].mean(), "n": grouped[metric].count(),
                         **{c: grouped[c].mean() for c in costs}}).reset_index()


# ------------------------------------------------------------------------------------ choose, group, pin
def group_labels(runs: pd.DataFrame, group_by: Sequence[str], hparams: Sequence[str]) -> pd.Series:
    """A series label per run: its configuration (as the report names it) when `group_by` is empty, else the
    values of the chosen columns ("method=BCA · n2=5"), so runs differing only elsewhere are pooled."""
    if not group_by:
        return series_labels(runs, hparams)

    def show(column: str, value: Any) -> str:
        if column == "stream":  # by protocol, as the tables name it, not its JSON
            return f"stream={evidence.protocol(value)}"
        if pd.isna(value):
            return f"{column}=—"
        if column == "method":
            return registry.method_label(value)
        if column == "dataset":
            return registry.dataset_title(value)
        if column == "backbone":
            return report.backbone_label(value)
        return f"{column}={_clean(value)}"

    return pd.Series([" · ".join(show(c, runs.at[i, c]) for c in group_by) for i in runs.index], index=runs.index)


def series_methods(runs: pd.DataFrame, labels: pd.Series) -> dict[str, str]:
    """Series label -> the method of its runs (the last, for a group pooling several), in the order the series
    first appear: the colour family. Per series, not per run (a study's page has 10^5 runs, hundreds of series)."""
    codes, series = pd.factorize(labels.to_numpy(dtype=object))  # series in the order they first appear
    _, first_from_end = np.unique(codes[::-1], return_index=True)
    methods = runs["method"].to_numpy(dtype=object)[len(codes) - 1 - first_from_end]  # each series' last run's
    return dict(zip(series.tolist(), methods.tolist()))


def metric_summary(runs: pd.DataFrame, labels: pd.Series, metric: str,
                   recorded: pd.DataFrame | None = None) -> pd.DataFrame:
    """Mean, std, count and worst-10% mean of `metric` per series and dataset over the runs a number may stand on
    (finished, all rows), with their evidence (`orchestrator.results.evidence`): the runs expected (the seeds and
    orders recorded for their sweep, backbone, dataset and stream among `recorded`, default `runs`), the fewest
    samples a run streamed where images were skipped, the stream protocols, and per (setting, seed, order) the
    values a pinned series is paired on. OGA's worst 10%: the mean of the ceil(n / 10) worst runs. Columns series,
    method, dataset, mean, std, n, worst10, expected, samples, total, protocols, values."""
    from dashboard import metrics

    columns = ["series", "method", "dataset", "mean", "std", "n", "worst10", "expected", "samples", "total",
               "protocols", "values"]
    labelled = runs.assign(series=labels)
    finished = labelled[evidence.usable(labelled) & labelled[metric].notna()]
    if labelled.empty or labelled[metric].isna().all():
        return pd.DataFrame(columns=columns)
    ascending = metrics.metric(metric).higher_is_better  # the worst come first
    peers = evidence.expected_keys(runs if recorded is None else recorded)

    def worst10(values: np.ndarray) -> float:
        # the mean of the worst ceil(n / 10), as Series.sort_values(ascending).head(k).mean() gives it (the
        # sorted values, summed in that order, over k), over an array rather than a Series per group
        ranked = np.sort(values) if ascending else np.sort(values)[::-1]
        k = worst_count(len(values))
        return float(np.ascontiguousarray(ranked[:k]).sum() / k)

    # every series with a run, so one whose runs are all incomplete still shows, as '— (n=0 of 1)'
    out = labelled.groupby(["series", "dataset"], as_index=False).agg(method=("method", "first"))
    grouped = finished.groupby(["series", "dataset"], as_index=False)
    stats = grouped.agg(mean=(metric, "mean"), std=(metric, "std"), n=(metric, "count"))
    at = grouped.indices
    metric_values = finished[metric].to_numpy(dtype=float)
    stats["worst10"] = [worst10(metric_values[at[key]]) for key in zip(stats["series"], stats["dataset"])]
    out = out.merge(stats, on=["series", "dataset"], how="left").fillna({"n": 0})
    prepared = evidence.prepare(labelled.reset_index(drop=True))
    arrays, values = evidence.columns(prepared), pd.to_numeric(prepared[metric], errors="coerce").to_numpy(float)
    config = prepared["group_id"].fillna(prepared["run_id"]) if "group_id" in prepared else prepared["run_id"]
    configs_of: dict[tuple, list] = {}
    # a series may pool several configurations: each expects its own seeds x orders
    for (series, dataset, _), at in prepared.groupby(["series", "dataset", config]).indices.items():
        configs_of.setdefault((series, dataset), []).append(evidence.cell_at(prepared, arrays, values, at, peers))
    usable_rows = prepared[prepared["_fit"] & prepared[metric].notna()]
    setting = usable_rows["setting_id"] if "setting_id" in usable_rows else usable_rows["dataset"]
    paired = usable_rows.groupby([usable_rows["series"], usable_rows["dataset"], setting, usable_rows["seed"],
                                  usable_rows["_order"]])[metric].mean()
    # per (series, dataset): {(setting, seed, order): value}, sliced from the sorted index (a Series per group
    # costs a study's page seconds)
    levels = [paired.index.get_level_values(i).tolist() for i in range(paired.index.nlevels)]
    heads, keys, means = list(zip(*levels[:2])), list(zip(*levels[2:])), paired.tolist()
    paired_by: dict[tuple, dict[tuple, float]] = {}
    start = 0
    for i in range(1, len(heads) + 1):
        if i == len(heads) or heads[i] != heads[start]:  # the groupby sorted the rows: each group is one stretch
            paired_by[heads[start]] = dict(zip(keys[start:i], means[start:i]))
            start = i
    extra = []
    for (series, dataset), configs in configs_of.items():
        short = [c for c in configs if c.skipped]
        own = paired_by.get((series, dataset), {})
        extra.append({"series": series, "dataset": dataset, "expected": sum(len(c.expected) for c in configs),
                      "samples": short[0].samples if short else None, "total": short[0].total if short else None,
                      "protocols": frozenset().union(*(c.protocols for c in configs)), "values": own})
    out = out.merge(pd.DataFrame(extra), on=["series", "dataset"], how="left")
    out["rank"] = out["method"].map(lambda m: registry.method_rank(m))
    out = out.sort_values(["rank", "series", "dataset"], kind="stable").drop(columns="rank").reset_index(drop=True)
    return out[columns]


def metric_table(summary: pd.DataFrame, metric: str, pinned: str | None = None
                 ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(display text, numbers, best mask) of a series x dataset table of one metric: 'mean ± std [worst 10%] (n=3)'
    cells (the mean alone for one run; 'n=2 of 3' where runs are missing or incomplete; '30 of 40 samples' where
    images were skipped), an Average column over datasets, and paired 'Δ <pinned>' columns (n: the (setting, seed,
    order) pairs) when a series is pinned. Best: among complete cells of one stream protocol."""

    frames = {name: summary.pivot(index="series", columns="dataset", values=name)
              for name in ("mean", "std", "n", "worst10", "expected", "samples", "total", "protocols", "values")}
    order = list(dict.fromkeys(summary["series"]))
    datasets = sorted(frames["mean"].columns, key=lambda d: (registry.dataset_key(d) is None, d))
    frames = {name: frame.reindex(order)[datasets] for name, frame in frames.items()}
    mean, std, n, worst, expected = (frames[k] for k in ("mean", "std", "n", "worst10", "expected"))
    titles = {d: registry.dataset_title(d) for d in datasets}
    if len(datasets) > 1:
        mean["Average"] = mean[datasets].mean(axis=1, skipna=False)
        titles["Average"] = "Average"
    text = pd.DataFrame(index=mean.index)
    numbers = pd.DataFrame(index=mean.index)
    best = pd.DataFrame(index=mean.index)
    for column in mean.columns:
        values = mean[column]
        # the cells' inputs as lists by row position (a label lookup per cell costs a study's page a second)
        if column == "Average":  # the mean of the datasets' cells: it stands on the fewest runs any has
            fewest, most = n[datasets].min(axis=1).tolist(), expected[datasets].max(axis=1).tolist()
            cells = [evidence.cell_text(v, math.nan, _int_or_none(f) or 0, _int_or_none(m))
                     for v, f, m in zip(values.tolist(), fewest, most)]
        else:
            cells = [evidence.cell_text(v, sd, 0 if pd.isna(count) else int(count),
                                        None if pd.isna(exp) else int(exp), _int_or_none(samples),
                                        _int_or_none(total), w)
                     for v, sd, count, exp, samples, total, w in zip(
                         *(frame[column].tolist() for frame in (mean, std, n, expected, frames["samples"],
                                                                frames["total"], worst)))]
        text[titles[column]] = cells
        numbers[titles[column]] = values
        if column in std.columns:
            numbers[f"{titles[column]} std"] = std[column]
            numbers[f"{titles[column]} worst10"] = worst[column]
            numbers[f"{titles[column]} n"] = n[column]
            numbers[f"{titles[column]} n expected"] = expected[column]
        if column == "Average":  # complete where every dataset's cell is; of the protocols its cells are of
            complete = (n[datasets] >= expected[datasets]).all(axis=1)
            protocols = frames["protocols"][datasets].apply(
                lambda row: frozenset().union(*(p for p in row if isinstance(p, frozenset))), axis=1)
        else:
            complete, protocols = n[column] >= expected[column], frames["protocols"][column]
        best[titles[column]] = _best_per_protocol(values, complete, protocols, metric)
    if pinned is not None and pinned in mean.index:
        deltas = {}
        for column in datasets:
            deltas[column] = [evidence.paired_gain(frames["values"][column][s], frames["values"][column][pinned])
                              if isinstance(frames["values"][column][s], dict)
                              and isinstance(frames["values"][column][pinned], dict) else (np.nan, 0)
                              for s in mean.index]
        if len(datasets) > 1:  # the mean of the datasets' paired differences, on the fewest pairs any has
            deltas["Average"] = [(float(np.mean([deltas[c][i][0] for c in datasets])),
                                  min(deltas[c][i][1] for c in datasets)) for i in range(len(mean.index))]
        for column, delta in deltas.items():
            name = f"Δ {pinned} ({titles[column]})"
            text[name] = ["—" if pd.isna(v) else f"{v:+.2f} (n={k})" for v, k in delta]
            numbers[name] = [v for v, _ in delta]
    text.index.name = numbers.index.name = "configuration"
    best = best.reindex(columns=text.columns, fill_value=False).reset_index(drop=True)
    best.insert(0, "configuration", False)
    return text.reset_index(), numbers.reset_index(), best


def _int_or_none(value: Any) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


def _best_per_protocol(values: pd.Series, complete: pd.Series, protocols: pd.Series, metric: str) -> pd.Series:
    """Best among the complete cells of each stream protocol: a contaminated stream's number is not compared with
    an i.i.d. one's."""
    from dashboard import metrics

    out = pd.Series(False, index=values.index)
    complete = complete.fillna(False).astype(bool)
    protocols = protocols.map(lambda p: tuple(sorted(p)) if isinstance(p, frozenset) else ())
    for _, members in values[complete].groupby(protocols[complete]):
        out[members.index] = metrics.best_index(members, metric)
    return out


def _signed(value: Any) -> str:
    return "—" if pd.isna(value) else f"{value:+.2f}"


def curve_bands(curves: pd.DataFrame, labels: pd.Series) -> pd.DataFrame:
    """Mean and std over the runs of each series (seeds, orders, pooled settings) of the per-run curves:
    columns series, win, position, cumulative, cumulative_std, windowed, windowed_std, runs."""
    frame = curves.assign(series=curves["run_id"].map(labels))
    out = (frame.groupby(["series", "win"], as_index=False)
           .agg(position=("position", "mean"), cumulative=("cumulative", "mean"), cumulative_std=("cumulative", "std"),
                windowed=("windowed", "mean"), windowed_std=("windowed", "std"), runs=("run_id", "nunique")))
    return out.fillna({"cumulative_std": 0.0, "windowed_std": 0.0})


# ------------------------------------------------------------------------------------- one run, two runs
def run_detail(db: ResultsDB, run_id: str) -> pd.DataFrame:
    """Every column of the runs table for one run (one row; empty when unknown)."""
    return db.df("SELECT * FROM runs WHERE run_id = $run", {"run": run_id})


def stream_rows(db: ResultsDB, run_id: str, limit: int) -> pd.DataFrame:
    """The first `limit` samples of a run's stream in order: sample_idx, image_id, label, pred, correct,
    confidence, gated, gated_prior."""
    return db.df("""
SELECT sample_idx, image_id, label, pred, correct, confidence, gated, gated_prior
FROM samples WHERE run_id = $run ORDER BY sample_idx LIMIT $limit
""", {"run": run_id, "limit": int(limit)})


def aligned_pair(db: ResultsDB, run_a: str, run_b: str) -> pd.DataFrame:
    """Two runs' rows side by side at the same stream position: sample_idx, image_id (A's), same_image, is_ood
    (in either run), label, pred_a, pred_b, correct_a, correct_b, confidence_a, confidence_b. Positions only one
    run has are left out."""
    return db.df("""
SELECT a.sample_idx, a.image_id, a.image_id IS NOT DISTINCT FROM b.image_id AS same_image,
       coalesce(a.is_ood, false) OR coalesce(b.is_ood, false) AS is_ood, a.label,
       a.pred AS pred_a, b.pred AS pred_b, a.correct AS correct_a, b.correct AS correct_b,
       a.confidence AS confidence_a, b.confidence AS confidence_b
FROM (SELECT * FROM samples WHERE run_id = $a) a JOIN (SELECT * FROM samples WHERE run_id = $b) b USING (sample_idx)
ORDER BY a.sample_idx
""", {"a": run_a, "b": run_b})


def disagreements(pair: pd.DataFrame) -> pd.DataFrame:
    """The aligned samples exactly one run gets right: `pair` rows with a column `winner` ('A' or 'B')."""
    only = pair[pair["correct_a"] != pair["correct_b"]]
    return only.assign(winner=np.where(only["correct_a"], "A", "B"))


def disagreements_by_class(diff: pd.DataFrame) -> pd.DataFrame:
    """Per true class: samples only A gets right, only B gets right, and B - A. Columns label, A, B, net."""
    counts = diff.groupby(["label", "winner"]).size().unstack(fill_value=0)
    counts = counts.reindex(columns=["A", "B"], fill_value=0).reset_index()
    counts["net"] = counts["B"] - counts["A"]
    return counts.sort_values("net", key=abs, ascending=False, kind="stable").reset_index(drop=True)


def disagreements_over_stream(diff: pd.DataFrame, window: int, length: int) -> pd.DataFrame:
    """Per window of a stream of `length` positions: how many samples only A / only B gets right (0 where none).
    Columns position (end of the window), winner, n."""
    ends = np.minimum(np.arange(window, length + window, window), length)
    grid = pd.MultiIndex.from_product([ends, ["A", "B"]], names=["position", "winner"])
    binned = diff.assign(position=np.minimum((diff["sample_idx"] // window + 1) * window, length))
    counts = binned.groupby(["position", "winner"]).size().reindex(grid, fill_value=0)
    return counts.rename("n").reset_index()
