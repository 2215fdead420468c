"""The workbench page: filters, metric, grouping, chosen and pinned series; a first screen with the comparison
table and its gain over CLIP with evidence; then a panel per view (stream, evidence, the paper's tables,
sensitivity, prior, per class, which settings matter, cost, runs), only the open one drawn."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, NamedTuple

import pandas as pd
import streamlit as st

from dashboard import charts, context, importance, metrics, queries, significance
from dashboard.components import (URL, chart, comparison_key, dataframe, id_selectbox, link, load_comparison_tables,
                                  load_curves, load_importance, load_per_class, load_run_table, load_tuning,
                                  prior_view, table_exports)
from dashboard.queries import Filters
from orchestrator import registry
from orchestrator.results import report, schema, tuning
from orchestrator.results.db import ResultsDB

PANELS = ("Stream", "Evidence", "Paper tables", "Sensitivity", "Prior", "Per class", "Which settings matter", "Cost",
          "Runs")


class Tuned(NamedTuple):
    """Honest tuning as the sidebar sets it: (predicate, metric) for load_comparison_tables (None: untuned) and
    the captions saying what was tuned on what."""

    key: tuple[str, str] | None = None
    notes: tuple[str, ...] = ()


def sidebar_filters(columns: dict[str, str], options: dict[str, list]) -> Filters:
    st.sidebar.header("Filters")
    st.sidebar.caption("Empty means all. Runs a hyperparameter does not apply to (CLIP has no tau) always pass.")
    chosen = {}
    for col, label in columns.items():
        values = options.get(col, [])
        if values:
            chosen[col] = tuple(st.sidebar.multiselect(label, values, key=f"filter_{col}", bind=URL))
    status = st.sidebar.multiselect("run status", list(schema.STATUSES), default=["finished", "running"],
                                    key="filter_status", bind=URL,
                                    help="Tables and sensitivity use finished runs only.")
    return Filters(**chosen, status=tuple(status))


# ------------------------------------------------------------------------------------------ workbench
class View:
    """What the workbench shows: the filtered runs, their series labels (configuration or chosen grouping), the
    metric, the pinned series, the focus (backbone, dataset)."""

    def __init__(self, runs: pd.DataFrame, labels: pd.Series, hparams: list[str], metric: str, pinned: str | None,
                 focus: tuple[str, str]) -> None:
        self.runs, self.labels, self.hparams, self.metric, self.pinned = runs, labels, hparams, metric, pinned
        self.focus = focus
        in_focus = (runs["backbone"] == focus[0]) & (runs["dataset"] == focus[1])
        self.focus_runs = runs[in_focus]
        self.focus_labels = labels[in_focus]
        self.series_methods = queries.series_methods(runs, labels)

    @property
    def run_labels(self) -> pd.Series:
        return pd.Series(self.labels.values, index=self.runs["run_id"].values)

    @property
    def metric_label(self) -> str:
        return metrics.label(self.metric)


def comparison_section(view: View, summary: pd.DataFrame, tables: list[report.ReportTable]) -> None:
    """The first screen: the comparison table (`summary`: queries.metric_summary) and, row for row of the report's
    tables (`tables`), each configuration's gain over CLIP with the evidence for it, the tables' own tested cells
    and Holm families; the charts, the tests' details and the paper's tables are panels below."""
    st.subheader(f"Comparison: {view.metric_label}")
    if summary.empty:
        st.info(f"No finished runs with {view.metric_label} match the filters yet.")
    else:
        text, numbers, best = queries.metric_table(summary, view.metric, view.pinned)
        better = "higher" if metrics.metric(view.metric).higher_is_better else "lower"
        st.caption(f"mean ± std [mean of the worst 10%] over the runs of each row (seeds, orders, and whatever "
                   f"the grouping pools); n: the runs a cell stands on (finished, all rows), 'n=2 of 3' where "
                   f"runs are missing or incomplete, 'k of m samples' where images were skipped; "
                   f"best ({better}) in bold among complete cells of one stream protocol"
                   + (f"; Δ: paired difference to the pinned {view.pinned} on the same setting, seed and order "
                      "(n: pairs)" if view.pinned else ""))
        styled = text.style.apply(lambda _: best.map(lambda b: "font-weight: bold" if b else ""), axis=None)
        st.table(styled)
        table_exports(text, numbers, best, f"comparison_{view.metric}", "comparison",
                      f"{view.metric_label} by configuration and dataset")
    tested = [t for t in tables if t.gain_evidence is not None and len(t.gain_evidence)]
    if tested:
        st.markdown("**Gain over CLIP, with evidence** (top-1 accuracy points) — each run paired with CLIP on the "
                    "same samples in the same order; [95% interval] over runs and test samples; ✓: significant at "
                    f"{significance.stats.ALPHA:g} after Holm's correction over each table's cells, where the "
                    "paper's tables star them (docs/statistics.md). The tests, p-values and the intervals as a "
                    "chart: the Evidence panel; the tables themselves: the Paper tables panel.")
    for table in tested:
        if len(tested) > 1:
            st.caption(table.title)
        st.table(gain_overview(table.gain_evidence))


def gain_overview(evidence: pd.DataFrame) -> pd.DataFrame:
    """One report table's tested cells (ReportTable.gain_evidence) as its configuration x column layout, in the
    table's row and column order: '+1.23 [+0.50, +1.96] ✓'."""
    cells = evidence.assign(cell=[significance.interval_text(g, lo, hi) + (" ✓" if s else "") for g, lo, hi, s in
                                  zip(evidence["gain"], evidence["low"], evidence["high"], evidence["significant"])])
    wide = cells.pivot(index=["backbone", "series"], columns="column", values="cell")
    rows = list(dict.fromkeys(zip(evidence["backbone"], evidence["series"])))
    wide = wide.reindex(index=rows, columns=list(dict.fromkeys(evidence["column"]))).fillna("—")
    return wide.rename_axis(["backbone", "configuration"]).rename_axis(columns=None).reset_index()


def evidence_panel(view: View, summary: pd.DataFrame, gains: pd.DataFrame) -> None:
    """The gain table with each test and p-value (dashboard.significance), and the comparison as charts on the
    focused dataset: the gain over CLIP with its interval, the metric's mean ± std."""
    if gains.empty:
        st.info("No finished run paired with CLIP on the same samples among the runs shown: no gain to test.")
    else:
        st.markdown("**Gain over CLIP, with evidence** — the tested cells of the paper's tables: each run paired "
                    "with CLIP on the same samples in the same order; 95% interval over runs and test samples; "
                    f"significance at {significance.stats.ALPHA:g} after Holm's correction over each table's "
                    "cells, as the tables' stars (docs/statistics.md)")
        text = significance.gain_text(gains)
        st.table(text)
        table_exports(text, gains, None, "gain_over_clip", "gains", "gain over CLIP")
        in_focus = gains[gains["dataset"] == view.focus[1]]
        if not in_focus.empty:
            chart(significance.gain_intervals(in_focus, charts.family_colours(dict(zip(in_focus["series"],
                                                                                       in_focus["method"])))),
                  f"gain_{view.focus[1]}", "gain_intervals")
    in_focus = summary.loc[summary["dataset"] == view.focus[1], ["series", "mean", "std", "n"]]
    if not in_focus.empty:
        chart(charts.metric_bars(in_focus, view.series_methods, view.metric_label,
                                 registry.dataset_title(view.focus[1])),
              f"{view.metric}_{view.focus[1]}", "metric_bars")


def paper_panel(results_dir: str, stamp: tuple, filters: Filters, tuned: Tuned) -> None:
    paper = st.toggle("Show the paper's numbers beside the measured ones", key="paper_rows", bind=URL)
    tables = load_comparison_tables(results_dir, stamp, comparison_key(filters), paper, tuned.key)
    for note in tuned.notes:
        st.caption(note)
    if not tables:
        st.info("No finished runs match the filters yet: the comparison needs finished runs.")
    for i, table in enumerate(tables):
        text, numbers, best = queries.comparison_frames(table, filters)
        st.markdown(f"**{table.title}** — Δ CLIP: paired gain over zero-shot CLIP; what each cell stands on "
                    "below the table")
        styled = text.style.apply(lambda _: best.map(lambda b: "font-weight: bold" if b else ""), axis=None)
        st.table(styled)
        for note in table.notes:
            st.caption(note)
        table_exports(text, numbers, best, f"paper_table_{i + 1}", f"paper_{i}", table.title)


def stream_panel(results_dir: str, stamp: tuple, view: View) -> None:
    backbone, dataset = view.focus
    runs = view.focus_runs
    left, right = st.columns(2)
    window = left.number_input("window (samples)", min_value=1,
                               value=queries.default_window(int(runs["n_rows"].max())), key="window", bind=URL,
                               help="Windowed accuracy is over each window alone; cumulative over everything "
                                    "seen so far.")
    kind = right.segmented_control("curve", ["cumulative", "windowed"], default="cumulative", key="curve",
                                   bind=URL, required=True)
    curves = load_curves(results_dir, stamp, tuple(runs["run_id"]), backbone, dataset, int(window))
    if curves.empty:
        st.info("No samples for these runs yet.")
        return
    bands = queries.curve_bands(curves, view.run_labels)
    st.caption("Lines: mean over the runs of each series; bands: ± one std over them (seeds, orders).")
    chart(charts.online_accuracy(bands, queries.series_methods(runs, view.focus_labels), kind),
          f"online_{kind}_{dataset}", "online")
    with st.expander("the curves' numbers"):
        dataframe(bands, f"online_accuracy_{backbone}_{dataset}", "online_table")


def sensitivity_panel(view: View) -> None:
    runs = view.focus_runs
    finished = runs[runs["status"] == "finished"]
    others = [*view.hparams, "num_templates", "templates", "views", "pretrained"]
    params = queries.sensitivity_params(finished, view.hparams)
    baseline_runs = finished[finished["method"] == registry.baseline_method()]
    # CLIP's reference per stream protocol, as the curves are
    clip = baseline_runs.groupby(queries.stream_protocols(baseline_runs))[view.metric].mean()
    baseline_label = registry.method_label(registry.baseline_method())
    shown = 0
    for param in params:
        points, held = queries.sensitivity_points(runs, param, others, view.metric)
        if points.empty:
            continue
        shown += 1
        methods = dict(zip(points["series"], points["method"]))
        protocols = list(dict.fromkeys(points["protocol"]))
        # protocols where CLIP scores the same (it does not adapt: the same samples in another order) share a line
        same: dict[float, list[str]] = {}
        for p in protocols:
            if pd.notna(clip.get(p)):
                same.setdefault(round(float(clip[p]), 9), []).append(p)
        baselines = {baseline_label if len(protocols) == 1 else f"{baseline_label} · {', '.join(ps)}":
                     float(clip[ps[0]]) for ps in same.values()}
        chart(charts.sensitivity(points, param, methods, view.metric_label, baselines), f"sensitivity_{param}",
              f"sens_{param}")
        notes = ([f"one curve per stream protocol ({', '.join(protocols)}): their runs are not pooled"]
                 if len(protocols) > 1 else [f"stream protocol: {protocols[0]}"])
        if held:
            notes.append("other settings held at " + ", ".join(f"{k}={v}" for k, v in held.items()))
        st.caption("; ".join(notes))
    if not shown:
        st.info("No finished configuration of one method was run with several values of a hyperparameter on "
                f"{registry.dataset_title(view.focus[1])}: sweep one to see how {view.metric_label} depends on it "
                "(the paper's Fig. 3).")


def prior_panel(results_dir: str, view: View, names: Callable[[int], str]) -> None:
    prior_methods = [c.name for c in registry.method_cards() if c.prior]
    candidates = view.focus_runs[view.focus_runs["method"].isin(prior_methods)]
    candidates = candidates[[schema.state_file(Path(results_dir), r).is_file() for r in candidates["run_id"]]]
    if candidates.empty:
        st.info(f"No saved prior (artifacts/<run_id>/state.npz of a {', '.join(prior_methods)} run) for "
                f"{view.focus[0]} / {view.focus[1]} among the runs shown.")
        return
    labels = view.focus_labels[candidates.index]
    options = {r: f"{labels[i]} · seed {s} · {r}" for i, r, s in
               zip(candidates.index, candidates["run_id"], candidates["seed"])}
    run_id = id_selectbox("run", options, "prior_run")
    prior_view(results_dir, candidates[candidates["run_id"] == run_id].iloc[0], names, "prior")


def per_class_panel(results_dir: str, stamp: tuple, view: View, names: Callable[[int], str],
                    names_known: bool) -> None:
    backbone, dataset = view.focus
    counts = load_per_class(results_dir, stamp, tuple(view.focus_runs["run_id"]), backbone, dataset)
    if counts.empty:
        st.info("No samples for these runs yet.")
        return
    if not names_known:
        st.caption("Classes are numbered: synthetic data has no class names (real datasets show the names their "
                   "feature cache lists).")
    table = queries.per_class_by_series(counts, view.run_labels)
    num_classes = table["label"].nunique()
    top = st.slider("classes shown (largest differences between series)", 1, num_classes, min(25, num_classes),
                    key="per_class_top", bind=URL)
    shown = table[table["label"].isin(queries.most_different_classes(table, top))]
    chart(charts.per_class_accuracy(shown.assign(**{"class": shown["label"].map(names)}),
                                    queries.series_methods(view.focus_runs, view.focus_labels)),
          f"per_class_{dataset}", "per_class")
    wide = table.pivot(index="label", columns="series", values="accuracy").round(2).reset_index()
    wide.insert(1, "class", wide["label"].map(names))
    dataframe(wide, f"per_class_{backbone}_{dataset}", "per_class_table")


def settings_panel(view: View) -> None:
    finished = view.runs[view.runs["status"] == "finished"]
    st.markdown(f"**Importance of each setting for {view.metric_label}, per method** (scikit-learn: a random "
                "forest over the method's finished runs, permutation importance)")
    methods = [m for m in sorted(finished["method"].unique(), key=registry.method_rank)
               if importance.varying(finished[finished["method"] == m], view.hparams)]
    if not methods:
        st.info("No method was run with several values of a hyperparameter among the runs shown.")
    else:
        method = st.selectbox("method", methods, format_func=registry.method_label, key="importance_method",
                              bind=URL)
        own = finished[finished["method"] == method]
        scores = load_importance(own, tuple(view.hparams), view.metric)
        if scores.empty:
            st.info(f"{registry.method_label(method)}: {len(own)} finished runs; importance needs at least "
                    f"{importance.MIN_RUNS}.")
        else:
            st.caption(f"from {len(own)} runs; with few runs these are rough")
            chart(charts.importance(scores, view.metric_label), f"importance_{method}", "importance")
    st.markdown(f"**Parallel coordinates on {registry.dataset_title(view.focus[1])}** (one line per run, only the "
                "settings that vary; log axes where a setting spans decades)")
    in_focus = finished[finished["dataset"] == view.focus[1]]
    dims = queries.varying_numeric(in_focus, [*view.hparams, "num_templates"])
    if not dims:
        st.info("No numeric hyperparameter varies among the finished runs on this dataset.")
        return
    chart(charts.parallel_coordinates(in_focus, dims, view.metric, view.metric_label),
          f"parallel_{view.focus[1]}", "parallel")
    dataframe(in_focus[["run_id", "method", "backbone", "dataset", "seed", *dims, view.metric]],
              "hyperparameters", "hparams")


def cost_panel(view: View) -> None:
    """Charts for the focused backbone / dataset (costs differ between datasets), the table for all runs."""
    runs, labels = view.focus_runs, view.focus_labels
    timing = queries.stage_times(runs, labels)
    finished = runs[runs["status"] == "finished"].assign(series=labels)
    memory = finished.groupby("series", as_index=False)["peak_mem_mb"].mean().dropna()
    if timing.empty and memory.empty:
        st.info("No finished runs with timings among the runs shown.")
        return
    if not timing.empty:
        st.caption("Stage times and samples/s leave out the warm-up: the first call of a method's code in a "
                   "worker process (numba compilation, lazy set-up) runs on throwaway state and is measured apart "
                   "(`warmup_s`, in the table below).")
        chart(charts.stage_times(timing), "stage_times", "stage_times")
    if not memory.empty:
        st.caption("Peak memory is the trial's own: the GPU allocator's peak, or on a CPU the growth of the "
                   "process's resident size over the trial (a pack's runs share their trial's).")
        chart(charts.peak_memory(memory), "peak_memory", "peak_memory")
    points = queries.cost_points(runs, labels, view.metric)
    if not points.empty:
        st.caption(f"{view.metric_label} against each configuration's own cost, as the BCA paper's Table 3 sets "
                   "them: latency per sample of the method alone (warm-up apart; in a pack, its share of its own "
                   "method's pass) and its memory above what was allocated when it began (its share in a pack).")
        # one above the other, full width: a legend of whole configuration labels leaves a half-width column no plot
        for cost, title in (("latency_ms", "latency (ms per sample)"), ("method_mem_mb", "method memory (MB)")):
            if cost not in points or not (points[cost] > 0).any():  # stored before costs were measured; no growth
                st.caption(f"No run shown has a measured {title}.")
                continue
            chart(charts.cost_tradeoff(points, view.series_methods, view.metric_label, cost, title),
                  f"{view.metric}_{cost}", f"tradeoff_{cost}")
    dataframe(queries.cost_table(view.runs, view.labels), "cost", "cost")


def runs_panel(table: pd.DataFrame, filters: Filters, runs: pd.DataFrame) -> None:
    st.caption("Every run passing the filters, with those not yet written; `open` goes to a run's own page.")
    listing = queries.runs_listing(filters.apply(table), runs)
    listing.insert(0, "page", [link("Run", run=r) for r in listing["run_id"]])
    st.dataframe(listing, hide_index=True, width="stretch",
                 column_config={"page": st.column_config.LinkColumn("page", display_text="open")})
    table_exports(listing.drop(columns="page"), listing.drop(columns="page"), None, "runs", "runs")


def tune_on(results_dir: str, stamp: tuple, metric: str, runs: pd.DataFrame, all_runs: pd.DataFrame,
            hparams: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, Tuned]:
    """Honest tuning (orchestrator.results.tuning): with a predicate in the sidebar, the runs and every run narrowed
    to each method's configuration chosen on the matching runs, shown on the other runs; and what was tuned."""
    predicate = st.sidebar.text_input(
        "tune on (SQL over the runs view)", key="tune_on", bind=URL, placeholder="e.g. seed = 1",
        help="Per method, backbone, dataset and stream, the configuration with the best mean of the metric on the "
             "runs this predicate matches is chosen, and shown on the other runs only.").strip()
    if not predicate:
        return runs, all_runs, Tuned()
    on = metric if metric in report.METRICS else "accuracy"  # a cost metric is not what a configuration is chosen by
    try:
        split = load_tuning(results_dir, stamp, predicate, on)
    except tuning.TuneOnError as e:
        st.sidebar.error(str(e))
        return runs, all_runs, Tuned()
    return split.evaluation(runs), split.evaluation(all_runs), Tuned((predicate, on),
                                                                      tuple(split.notes(all_runs, hparams)))


def workbench(results_dir: str, stamp: tuple, db: ResultsDB, all_runs: pd.DataFrame,
              record_for: Callable[[str], dict | None]) -> None:
    hparams = queries.hparam_columns(db)
    filter_columns = queries.filter_columns(all_runs, hparams)
    filters = sidebar_filters(filter_columns, queries.filter_options(all_runs, filter_columns))
    runs = filters.apply(all_runs)
    if runs.empty:
        st.info("No runs with samples match the filters.")
        return
    st.sidebar.header("Compare")
    metric_options = metrics.metric_columns(runs, hparams)
    # the URL keeps the column name (?metric=ece); a link that names the display label still opens it
    by_label = {metrics.label(m): m for m in metric_options}
    if st.query_params.get("metric") in by_label:
        st.query_params["metric"] = by_label[st.query_params["metric"]]
    metric = id_selectbox("metric", {m: metrics.label(m) for m in metric_options}, "metric", st.sidebar)
    runs, all_runs, tuned = tune_on(results_dir, stamp, metric, runs, all_runs, hparams)
    if runs.empty:
        st.info("No runs of the tuned configurations outside the tuning runs match the filters.")
        return
    group_options = ["method", "dataset", "backbone", "sweep", "seed", "num_templates", "views", "stream",
                     "batch_size", "order_index",
                     *queries.varying_numeric(all_runs, hparams),
                     *[h for h in hparams if h in all_runs and all_runs[h].nunique() > 1
                       and not pd.api.types.is_numeric_dtype(all_runs[h])]]
    group_by = st.sidebar.multiselect("group by (empty: each configuration)", group_options, key="group",
                                      bind=URL, help="Runs with equal values of these columns form one series; "
                                                     "tables and curves show mean ± std over its runs.")
    labels = queries.group_labels(runs, group_by, hparams)
    # ranked once per method, not once per run (10^5 runs, a few methods)
    series = list(dict.fromkeys(labels[runs.sort_values("method", key=lambda m: report.per_value(
        m, registry.method_rank)).index]))
    chosen = st.sidebar.multiselect("show only these series (empty: all)", series, key="show", bind=URL)
    if chosen:
        keep = labels.isin(chosen)
        runs, labels = runs[keep], labels[keep]
    pinned = st.sidebar.selectbox("pin a baseline series (Δ columns)", [None, *series],
                                  format_func=lambda s: "none" if s is None else s, key="pin", bind=URL)

    first_screen = st.container()  # the comparison, filled once the view is known, above the panels' controls
    pairs = sorted(runs[["backbone", "dataset"]].drop_duplicates().itertuples(index=False, name=None))
    keys = [f"{b}/{d}" for b, d in pairs]
    focus_key = st.selectbox("backbone / dataset of the panels' charts",
                             keys, key="focus", bind=URL,
                             format_func=lambda k: " / ".join([report.backbone_label(k.split("/", 1)[0]),
                                                               registry.dataset_title(k.split("/", 1)[1])]))
    focus = pairs[keys.index(focus_key)]
    view = View(runs, labels, hparams, metric, pinned if pinned in set(labels) else None, focus)
    summary = queries.metric_summary(view.runs, view.labels, view.metric, all_runs)
    # the report's tables carry the gains' evidence: one Holm family per table, as the report stars its cells;
    # tuned, they stand on the chosen configurations' other runs only
    tables = load_comparison_tables(results_dir, stamp, comparison_key(filters), False, tuned.key)
    gains = significance.gain_summary(tables)
    with first_screen:
        for note in tuned.notes:
            st.caption(note)
        comparison_section(view, summary, tables)

    first = view.focus_runs.iloc[0]
    record = record_for(first["sweep"]) or {}
    spec = record.get("spec") or {}
    names = context.class_names(spec.get("cache_dir"), focus[1], focus[0])
    namer = context.class_namer(names)
    tabs = st.tabs(list(PANELS), key="panel", bind=URL)
    panels = (
        lambda: stream_panel(results_dir, stamp, view),
        lambda: evidence_panel(view, summary, gains),
        lambda: paper_panel(results_dir, stamp, filters, tuned),
        lambda: sensitivity_panel(view),
        lambda: prior_panel(results_dir, view, namer),
        lambda: per_class_panel(results_dir, stamp, view, namer, bool(names)),
        lambda: settings_panel(view),
        lambda: cost_panel(view),
        lambda: runs_panel(load_run_table(results_dir, stamp), filters, runs),
    )
    for tab, draw in zip(tabs, panels):
        if tab.open:
            with tab:
                draw()
