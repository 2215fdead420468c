"""Streamlit dashboard over a results dir: `bca dashboard [--results DIR]` (or `streamlit run dashboard/app.py`
with BCA_RESULTS_DIR set).

Four pages: the workbench (compare configurations on any metric: choose, group, pin; a panel per view), a page
per run, a page per configuration (a run's seeds together) and the sample-aligned comparison of two runs. Every
filter, selection, page and panel is bound to the URL (Streamlit's bind="query-params"), so a copied link opens
the same view. Reads only through orchestrator.results (DuckDB views over the Parquet files) and JSON files
(sweep records, feature-cache manifests). Results are re-read only when the files under the results dir
change; while runs are running the page checks for new files every few seconds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable
from urllib.parse import urlencode

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import RESULTS_ENV, charts, context, export, importance, metrics, prior, queries
from dashboard.queries import Filters
from orchestrator import registry
from orchestrator.results import report, schema
from orchestrator.results.db import ResultsDB
from orchestrator.results.writer import load_state

URL = "query-params"
PAGES = ("Workbench", "Run", "Configuration", "Compare two runs")
PANELS = ("Stream", "Sensitivity", "Prior", "Per class", "Which settings matter", "Cost", "Runs")
# Seconds between checks for new result files while a run is running.
AUTO_REFRESH_S = 5
# Rows of a run's stream listed on its page (the rest is in its Parquet parts and `bca query`).
STREAM_ROWS = 500
THUMBNAILS = 12


# ------------------------------------------------------------------------------------------ data access
@st.cache_resource(show_spinner=False)
def open_db(results_dir: str) -> ResultsDB:
    """One in-memory DuckDB per results dir for the whole server; each query takes its own cursor."""
    return ResultsDB(results_dir)


@st.cache_data(show_spinner=False, max_entries=4)
def load_results(results_dir: str, fingerprint: tuple) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(runs table, per-run rows with metrics, bad files); keyed by the files' fingerprint, so it is read again
    only when a file was written (and then ResultsDB rebuilds only what changed)."""
    db = open_db(results_dir)
    db.refresh()
    return queries.run_table(db), queries.accuracy_runs(db), [str(b) for b in db.bad_files]


@st.cache_data(show_spinner=False, max_entries=64)
def load_curves(results_dir: str, fingerprint: tuple, run_ids: tuple[str, ...], backbone: str, dataset: str,
                window: int) -> pd.DataFrame:
    return queries.online_curves(open_db(results_dir), run_ids, backbone, dataset, window)


@st.cache_data(show_spinner=False, max_entries=64)
def load_per_class(results_dir: str, fingerprint: tuple, run_ids: tuple[str, ...], backbone: str,
                   dataset: str) -> pd.DataFrame:
    return queries.per_class(open_db(results_dir), run_ids, backbone, dataset)


@st.cache_data(show_spinner=False, max_entries=32)
def load_pair(results_dir: str, fingerprint: tuple, run_a: str, run_b: str) -> pd.DataFrame:
    return queries.aligned_pair(open_db(results_dir), run_a, run_b)


@st.cache_data(show_spinner=False, max_entries=32)
def load_run(results_dir: str, fingerprint: tuple, run_id: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    db = open_db(results_dir)
    return queries.run_detail(db, run_id), queries.stream_rows(db, run_id, STREAM_ROWS)


@st.cache_data(show_spinner=False, max_entries=32)
def load_run_state(results_dir: str, run_id: str, mtime_ns: int) -> dict:
    """A run's state.npz; keyed by its mtime so a rewritten artifact is read again."""
    return load_state(results_dir, run_id)


@st.cache_data(show_spinner=False, max_entries=32)
def load_importance(runs: pd.DataFrame, hparams: tuple[str, ...], metric: str) -> pd.DataFrame:
    return importance.hparam_importance(runs, hparams, metric)


# -------------------------------------------------------------------------------------------- widgets
def table_exports(text: pd.DataFrame, numbers: pd.DataFrame, best: pd.DataFrame | None, name: str, key: str,
                  caption: str = "") -> None:
    """CSV (the numbers), Markdown and LaTeX (the text as shown, best in bold) downloads of one table."""
    row = st.container(horizontal=True)
    row.download_button("CSV", numbers.to_csv(index=False).encode("utf-8"), file_name=f"{name}.csv",
                            mime="text/csv", key=f"csv_{key}", on_click="ignore")
    row.download_button("Markdown", export.to_markdown(text, best).encode("utf-8"), file_name=f"{name}.md",
                            mime="text/markdown", key=f"md_{key}", on_click="ignore")
    row.download_button("LaTeX", export.to_latex(text, best, caption).encode("utf-8"), file_name=f"{name}.tex",
                            mime="text/x-tex", key=f"tex_{key}", on_click="ignore",
                            help="booktabs table (\\usepackage{booktabs}), best in bold")


def dataframe(frame: pd.DataFrame, name: str, key: str, **kwargs) -> None:
    st.dataframe(frame, hide_index=True, width="stretch", **kwargs)
    table_exports(frame, frame, None, name, key)


def chart(spec: alt.TopLevelMixin, name: str, key: str, container=st) -> None:
    """A chart with PNG and SVG downloads, rendered only when clicked (vl-convert)."""
    container.altair_chart(charts.for_page(spec), width="stretch", key=f"chart_{key}")
    row = container.container(horizontal=True)
    for fmt in ("png", "svg"):
        row.download_button(fmt.upper(), _renderer(spec, fmt), file_name=f"{name}.{fmt}",
                            mime="image/png" if fmt == "png" else "image/svg+xml", key=f"{fmt}_{key}",
                            on_click="ignore")


def _renderer(spec: alt.TopLevelMixin, fmt: str) -> Callable[[], bytes]:
    return lambda: export.chart_image(spec, fmt)


def link(page: str, **params: str) -> str:
    """A relative link to a page of this app with its selections in the query string."""
    return "?" + urlencode({"page": page, **params})


def id_selectbox(label: str, options: dict[str, str], param: str, container=st) -> str:
    """A selectbox over ids shown by their labels, its choice kept in the URL as the plain id (`param`), so links
    built from ids open it. (bind="query-params" would put the displayed label in the URL.)"""
    ids = list(options)
    wanted = st.query_params.get(param)
    index = ids.index(wanted) if wanted in ids else 0
    chosen = container.selectbox(label, ids, index=index, format_func=options.get, key=f"select_{param}")
    st.query_params[param] = chosen
    return chosen


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


def comparison_section(db: ResultsDB, all_runs: pd.DataFrame, filters: Filters, view: View) -> None:
    st.subheader(f"Comparison: {view.metric_label}")
    summary = queries.metric_summary(view.runs, view.labels, view.metric)
    if summary.empty:
        st.info(f"No finished runs with {view.metric_label} match the filters yet.")
    else:
        text, numbers, best = queries.metric_table(summary, view.metric, view.pinned)
        better = "higher" if metrics.metric(view.metric).higher_is_better else "lower"
        st.caption(f"mean ± std over the runs of each row (seeds, orders, and whatever the grouping pools); "
                   f"best ({better}) in bold" + (f"; Δ: difference to the pinned {view.pinned}" if view.pinned else ""))
        styled = text.style.apply(lambda _: best.map(lambda b: "font-weight: bold" if b else ""), axis=None)
        st.table(styled)
        table_exports(text, numbers, best, f"comparison_{view.metric}", "comparison",
                      f"{view.metric_label} by configuration and dataset")
        in_focus = summary[summary["dataset"] == view.focus[1]]
        if not in_focus.empty:
            chart(charts.metric_bars(in_focus, view.series_methods, view.metric_label),
                  f"{view.metric}_{view.focus[1]}", "metric_bars")
    with st.expander("The paper's tables (accuracy, Table 1 / Table 2 layout, gain over CLIP)",
                     expanded=view.metric == "accuracy"):
        paper = st.toggle("Show the paper's numbers beside the measured ones", key="paper_rows", bind=URL)
        tables = queries.comparison_tables(db, filters.with_clip().apply(all_runs), paper)
        if not tables:
            st.info("No finished runs match the filters yet: the comparison needs finished runs.")
        for i, table in enumerate(tables):
            text, numbers, best = queries.comparison_frames(table, filters)
            st.markdown(f"**{table.title}** — mean ± std over seeds; Δ CLIP: gain over zero-shot CLIP; best in bold")
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
    baseline = float(baseline_runs[view.metric].mean()) if not baseline_runs.empty else None
    baseline_label = registry.method_label(registry.baseline_method())
    shown = 0
    for param in params:
        points, held = queries.sensitivity_points(runs, param, others, view.metric)
        if points.empty:
            continue
        shown += 1
        methods = dict(zip(points["series"], points["method"]))
        chart(charts.sensitivity(points, param, methods, view.metric_label, baseline, baseline_label), f"sensitivity_{param}",
              f"sens_{param}")
        if held:
            st.caption("other settings held at " + ", ".join(f"{k}={v}" for k, v in held.items()))
    if not shown:
        st.info("No finished configuration of one method was run with several values of a hyperparameter on "
                f"{registry.dataset_title(view.focus[1])}: sweep one to see how {view.metric_label} depends on it "
                "(the paper's Fig. 3).")


def prior_view(results_dir: str, run: pd.Series, names: Callable[[int], str], key: str) -> None:
    """The learned prior of one run against CLIP's one-hot prior, on the classes it updated most."""
    path = schema.state_file(Path(results_dir), run["run_id"])
    if not path.is_file():
        st.info(f"Run {run['run_id']} saved no prior (artifacts/<run_id>/state.npz).")
        return
    state = load_run_state(results_dir, run["run_id"], path.stat().st_mtime_ns)
    problem = prior.check_state(state)
    if problem:
        st.warning(f"Cannot show the prior of run {run['run_id']}: {problem}.")
        return
    k = state["V"].shape[1]
    top = st.slider("top classes (most prior updates)", 1, min(50, k), min(15, k), key=f"{key}_top")
    count = registry.method_card(run["method"]).prior_count
    n2 = run.get(count) if count else None  # the counter C2 starts from this hparam
    n2 = None if n2 is None or pd.isna(n2) else float(n2)
    classes = prior.top_classes(state, n2, top)
    labels = {c: names(c) for c in range(k)}
    learned, clip = prior.heatmap_frames(state, classes, labels)
    left, right = st.columns(2)
    with left:
        chart(charts.prior_heatmap(learned, "learned prior (mean over each class's embeddings)"),
              f"prior_{run['run_id']}", f"{key}_learned")
    with right:
        chart(charts.prior_heatmap(clip, "CLIP's prior (one-hot)"), f"prior_clip_{run['run_id']}", f"{key}_clip")
    summary = prior.prior_summary(state, n2, classes)
    summary["class"] = summary["class"].map(names)
    summary["top other class"] = summary["top other class"].map(names)
    dataframe(summary, f"prior_{run['run_id']}", f"{key}_table")


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
        chart(charts.stage_times(timing), "stage_times", "stage_times")
    if not memory.empty:
        st.caption("Peak memory is the trial process's peak resident size: runs packed into one process share it.")
        chart(charts.peak_memory(memory), "peak_memory", "peak_memory")
    dataframe(queries.cost_table(view.runs, view.labels), "cost", "cost")


def runs_panel(table: pd.DataFrame, filters: Filters, runs: pd.DataFrame) -> None:
    st.caption("Every run passing the filters, with those not yet written; `open` goes to a run's own page.")
    listing = queries.runs_listing(filters.apply(table), runs)
    listing.insert(0, "page", [link("Run", run=r) for r in listing["run_id"]])
    st.dataframe(listing, hide_index=True, width="stretch",
                 column_config={"page": st.column_config.LinkColumn("page", display_text="open")})
    table_exports(listing.drop(columns="page"), listing.drop(columns="page"), None, "runs", "runs")


def workbench(results_dir: str, stamp: tuple, db: ResultsDB, table: pd.DataFrame, all_runs: pd.DataFrame,
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
    metric = st.sidebar.selectbox("metric", metric_options, format_func=metrics.label, key="metric", bind=URL)
    group_options = ["method", "dataset", "backbone", "sweep", "seed", "num_templates", "views",
                     *queries.varying_numeric(all_runs, hparams),
                     *[h for h in hparams if h in all_runs and all_runs[h].nunique() > 1
                       and not pd.api.types.is_numeric_dtype(all_runs[h])]]
    group_by = st.sidebar.multiselect("group by (empty: each configuration)", group_options, key="group",
                                      bind=URL, help="Runs with equal values of these columns form one series; "
                                                     "tables and curves show mean ± std over its runs.")
    labels = queries.group_labels(runs, group_by, hparams)
    series = list(dict.fromkeys(labels[runs.sort_values("method", key=lambda m: m.map(registry.method_rank))
                                      .index]))
    chosen = st.sidebar.multiselect("show only these series (empty: all)", series, key="show", bind=URL)
    if chosen:
        keep = labels.isin(chosen)
        runs, labels = runs[keep], labels[keep]
    pinned = st.sidebar.selectbox("pin a baseline series (Δ columns)", [None, *series],
                                  format_func=lambda s: "none" if s is None else s, key="pin", bind=URL)

    pairs = sorted({(b, d) for b, d in zip(runs["backbone"], runs["dataset"])})
    keys = [f"{b}/{d}" for b, d in pairs]
    focus_key = st.selectbox("backbone / dataset for the stream, sensitivity, prior, per-class and cost views",
                             keys, key="focus", bind=URL,
                             format_func=lambda k: " / ".join([report.backbone_label(k.split("/", 1)[0]),
                                                               registry.dataset_title(k.split("/", 1)[1])]))
    focus = pairs[keys.index(focus_key)]
    view = View(runs, labels, hparams, metric, pinned if pinned in set(labels) else None, focus)
    comparison_section(db, all_runs, filters, view)

    first = view.focus_runs.iloc[0]
    record = record_for(first["sweep"]) or {}
    spec = record.get("spec") or {}
    names = context.class_names(spec.get("cache_dir"), focus[1], focus[0])
    namer = context.class_namer(names)
    tabs = st.tabs(list(PANELS), key="panel", bind=URL)
    panels = (
        lambda: stream_panel(results_dir, stamp, view),
        lambda: sensitivity_panel(view),
        lambda: prior_panel(results_dir, view, namer),
        lambda: per_class_panel(results_dir, stamp, view, namer, bool(names)),
        lambda: settings_panel(view),
        lambda: cost_panel(view),
        lambda: runs_panel(table, filters, runs),
    )
    for tab, draw in zip(tabs, panels):
        if tab.open:
            with tab:
                draw()


# ------------------------------------------------------------------------------------- run and config
def run_options(table: pd.DataFrame, hparams: list[str]) -> dict[str, str]:
    """run_id -> "BCA (tau=0.2) · synthetic-continual · seed 1 · 0560bcc9" for every run in the runs table."""
    labels = queries.series_labels(table, hparams)
    return {r: f"{labels[i]} · {registry.dataset_title(d)} · seed {s} · {r[:8]}"
            for i, r, d, s in zip(table.index, table["run_id"], table["dataset"], table["seed"])}


def run_page(results_dir: str, stamp: tuple, table: pd.DataFrame, all_runs: pd.DataFrame, hparams: list[str],
             record_for: Callable[[str], dict | None]) -> None:
    options = run_options(table, hparams)
    run_id = id_selectbox("run", options, "run")
    detail, stream = load_run(results_dir, stamp, run_id)
    if detail.empty:
        st.info(f"Run {run_id} is not in the runs table.")
        return
    row = detail.iloc[0]
    config = json.loads(row["config_json"]) if isinstance(row.get("config_json"), str) else {}
    st.subheader(options[run_id])
    status = row["status"]
    st.markdown(f"**status:** {status} · rows written: {int(all_runs.set_index('run_id')['n_rows'].get(run_id, 0))}"
                f" of {row['n_samples'] if pd.notna(row['n_samples']) else '?'} · "
                f"[its configuration]({link('Configuration', config=row['group_id'])}) · "
                f"[compare with another run]({link('Compare two runs', run_a=run_id)})")
    if status == "failed" or (isinstance(row.get("error"), str) and row["error"]):
        st.error(f"error: {row['error']}")
    left, right = st.columns(2)
    with left:
        st.markdown("**Configuration**")
        st.json(config, expanded=2)
    with right:
        st.markdown("**Metrics**")
        values = all_runs[all_runs["run_id"] == run_id]
        metric_cols = metrics.metric_columns(values, hparams) if not values.empty else []
        st.dataframe(pd.DataFrame({"metric": [metrics.label(c) for c in metric_cols],
                                   "value": [values.iloc[0][c] for c in metric_cols]}),
                     hide_index=True, width="stretch")
    record = record_for(row["sweep"]) or {}
    spec = record.get("spec") or {}
    names = context.class_names(spec.get("cache_dir"), row["dataset"], row["backbone"])
    namer = context.class_namer(names)

    st.markdown(f"**Stream order** (first {STREAM_ROWS} samples; classes "
                f"{'named from the feature cache' if names else 'numbered: no class names for synthetic data'})")
    shown = stream.assign(label=stream["label"].map(namer), pred=stream["pred"].map(namer))
    dataframe(shown, f"stream_{run_id}", "stream")
    skipped = json.loads(row["skipped"]) if isinstance(row.get("skipped"), str) and row["skipped"] else []
    st.markdown(f"**Skipped images:** {len(skipped)}")
    if skipped:
        st.dataframe(pd.DataFrame(skipped), hide_index=True, width="stretch")
    if registry.find_method(row["method"]) and registry.method_card(row["method"]).prior:
        st.markdown("**Learned prior**")
        prior_view(results_dir, row, namer, "run_prior")
    st.markdown("**Feature cache**")
    if config.get("synthetic") is not None:
        st.caption("Synthetic data: features are generated from the scenario's parameters, no cache entry.")
    else:
        entries = context.cache_entries(spec.get("cache_dir"), row["dataset"], row["backbone"])
        if entries:
            st.dataframe(pd.DataFrame(entries).drop(columns="class_names"), hide_index=True, width="stretch")
        else:
            st.caption(f"No cache entry for {row['backbone']} / {row['dataset']} under "
                       f"{spec.get('cache_dir') or 'a known cache dir'}.")
    st.markdown("**Reproduce this run**")
    narrowed = context.reproduce_spec(record, config, run_id) if record else None
    if narrowed is None:
        st.caption(f"The sweep record results/sweeps/{row['sweep']}.json does not hold this run's spec.")
    else:
        text, command = context.reproduce_text(narrowed, run_id)
        st.caption(f"Save as reproduce-{run_id}.yaml and run (a one-run sweep with the same run id):")
        st.code(command, language="bash")
        st.code(text, language="yaml")
        st.download_button("spec YAML", text.encode("utf-8"), file_name=f"reproduce-{run_id}.yaml",
                           mime="application/x-yaml", key="reproduce", on_click="ignore")


def config_page(results_dir: str, stamp: tuple, all_runs: pd.DataFrame, hparams: list[str]) -> None:
    labels = queries.series_labels(all_runs, hparams)
    groups = all_runs.assign(series=labels).dropna(subset=["group_id"]).groupby("group_id", sort=False).first()
    options = {g: f"{r['series']} · {registry.dataset_title(r['dataset'])} · {report.backbone_label(r['backbone'])}"
               for g, r in groups.iterrows()}
    group = id_selectbox("configuration", options, "config")
    runs = all_runs[all_runs["group_id"] == group]
    st.subheader(options[group])
    first = runs.iloc[0]
    own = {h: first[h] for h in hparams if h in runs and pd.notna(first[h])}
    st.markdown("**Settings:** " + ", ".join(f"`{k}={v}`" for k, v in
                                              {"method": first["method"], "dataset": first["dataset"],
                                               "backbone": first["backbone"], **own}.items()))
    cols = metrics.metric_columns(runs, hparams)
    per_run = runs[["run_id", "seed", "status", *cols]].sort_values("seed")
    per_run.insert(0, "page", [link("Run", run=r) for r in per_run["run_id"]])
    st.markdown(f"**Its runs** ({len(runs)}: one per seed / order)")
    st.dataframe(per_run, hide_index=True, width="stretch",
                 column_config={"page": st.column_config.LinkColumn("page", display_text="open")})
    finished = runs[runs["status"] == "finished"]
    summary = pd.DataFrame({"metric": [metrics.label(c) for c in cols], "mean": [finished[c].mean() for c in cols],
                            "std": [finished[c].std() for c in cols],
                            "worst run": [(finished[c].min() if metrics.metric(c).higher_is_better
                                           else finished[c].max()) for c in cols]})
    st.markdown("**Over its finished runs**")
    dataframe(summary, f"config_{group}", "config_summary")
    curves = load_curves(results_dir, stamp, tuple(runs["run_id"]), first["backbone"], first["dataset"],
                         queries.default_window(int(runs["n_rows"].max())))
    if not curves.empty:
        one = pd.Series(options[group], index=runs["run_id"].values)
        bands = queries.curve_bands(curves, one)
        chart(charts.online_accuracy(bands, {options[group]: first["method"]}), f"config_{group}", "config_curve")


# --------------------------------------------------------------------------------------- two runs
def compare_page(results_dir: str, stamp: tuple, table: pd.DataFrame, all_runs: pd.DataFrame,
                 hparams: list[str], record_for: Callable[[str], dict | None]) -> None:
    options = {r: v for r, v in run_options(table, hparams).items() if r in set(all_runs["run_id"])}
    ids = list(options)
    left, right = st.columns(2)
    run_a = id_selectbox("run A", options, "run_a", left)
    same_stream = all_runs.set_index("run_id")
    partners = [r for r in ids if r != run_a and same_stream.at[r, "dataset"] == same_stream.at[run_a, "dataset"]
                and same_stream.at[r, "seed"] == same_stream.at[run_a, "seed"]] or [r for r in ids if r != run_a]
    if not partners:
        st.info("Only one run has samples: a comparison needs two.")
        return
    run_b = id_selectbox("run B (same dataset and seed first)", {r: options[r] for r in partners}, "run_b", right)
    pair = load_pair(results_dir, stamp, run_a, run_b)
    if pair.empty:
        st.info("The two runs share no stream positions.")
        return
    if not pair["same_image"].all():
        st.warning(f"{int((~pair['same_image']).sum())} of {len(pair)} positions hold different images in the two "
                   "runs: they did not see the same stream in the same order; only the positions with the same "
                   "image are compared.")
        pair = pair[pair["same_image"]]
    label_a, label_b = f"A: {options[run_a]}", f"B: {options[run_b]}"
    both = int((pair["correct_a"] & pair["correct_b"]).sum())
    only_a = int((pair["correct_a"] & ~pair["correct_b"]).sum())
    only_b = int((~pair["correct_a"] & pair["correct_b"]).sum())
    neither = len(pair) - both - only_a - only_b
    cols = st.columns(4)
    for col, (name, value) in zip(cols, [("both right", both), ("only A right", only_a), ("only B right", only_b),
                                         ("neither", neither)]):
        col.metric(name, value)
    diff = queries.disagreements(pair)
    if diff.empty:
        st.info("The two runs get the same samples right.")
        return
    dataset, backbone = same_stream.at[run_a, "dataset"], same_stream.at[run_a, "backbone"]
    record = record_for(same_stream.at[run_a, "sweep"]) or {}
    spec = record.get("spec") or {}
    namer = context.class_namer(context.class_names(spec.get("cache_dir"), dataset, backbone))
    by_class = queries.disagreements_by_class(diff).assign(**{"class": lambda f: f["label"].map(namer)})
    top = by_class.head(30)
    st.markdown("**By class** (the 30 classes with the largest difference)")
    chart(charts.disagreement_classes(top, "A", "B"), f"compare_classes_{run_a}_{run_b}", "cmp_classes")
    st.markdown("**Over the stream**")
    length = int(pair["sample_idx"].max()) + 1
    window = queries.default_window(length, points=20)
    chart(charts.disagreement_stream(queries.disagreements_over_stream(diff, window, length), "A", "B"),
          f"compare_stream_{run_a}_{run_b}", "cmp_stream")
    st.caption(f"{label_a}  \n{label_b}")
    shown = diff.assign(label=diff["label"].map(namer), pred_a=diff["pred_a"].map(namer),
                        pred_b=diff["pred_b"].map(namer)).drop(columns=["same_image"])
    st.markdown("**The samples only one of them gets right**, with both confidences")
    dataframe(shown, f"compare_{run_a}_{run_b}", "cmp_table")
    data_root = spec.get("data_root")
    paths = [(r, context.image_path(data_root, r.image_id)) for r in diff.head(200).itertuples()]
    paths = [(r, p) for r, p in paths if p is not None][:THUMBNAILS]
    if not paths:
        st.caption("No thumbnails: " + ("synthetic rows have no images." if not data_root else
                                        f"the images are not under the data root {data_root} on this machine."))
        return
    st.markdown("**Thumbnails**")
    grid = st.columns(6)
    for i, (r, p) in enumerate(paths):
        grid[i % 6].image(p.read_bytes(), width="stretch",
                          caption=f"#{r.sample_idx} {namer(r.label)}: A {r.confidence_a:.2f}, B {r.confidence_b:.2f}"
                                  f" → {r.winner} right")


# ----------------------------------------------------------------------------------------------- page
def auto_refresh(results_dir: str, stamp: tuple) -> None:
    """While runs are running, look for new result files every few seconds and rerun when there are."""
    @st.fragment(run_every=AUTO_REFRESH_S)
    def watch() -> None:
        if context.results_fingerprint(results_dir) != stamp:
            st.rerun(scope="app")

    watch()


def main() -> None:
    st.set_page_config(page_title="BCA results", layout="wide")
    results_dir = str(schema.resolve_results_dir(os.environ.get(RESULTS_ENV)))
    st.title("BCA: online test-time adaptation results")
    st.sidebar.caption(f"results: `{results_dir}`")
    if st.sidebar.button("Refresh now", key="refresh"):
        st.cache_data.clear()

    if not Path(results_dir).is_dir():
        st.info(f"No results directory at `{results_dir}`. Run a sweep first (`bca sweep SPEC` writes to the "
                f"spec's `results_dir`) or open another one with `bca dashboard --results DIR`.")
        return
    stamp = context.results_fingerprint(results_dir)
    table, all_runs, bad = load_results(results_dir, stamp)
    if bad:
        st.warning(f"Left out {len(bad)} unreadable or incomplete results file(s); everything else is shown:\n\n"
                   + "\n".join(f"- `{b}`" for b in bad))
    if table.empty and all_runs.empty:
        st.info(f"No runs in `{results_dir}` yet. Results appear here as a sweep writes them.")
        return
    counts = queries.status_counts(table)
    st.caption(" · ".join(f"{counts.get(s, 0)} {s}" for s in schema.STATUSES) + f" runs in `{results_dir}`")
    running = counts.get("running", 0) > 0
    if running and st.sidebar.toggle("auto-refresh while runs are running", value=True, key="auto_refresh"):
        auto_refresh(results_dir, stamp)

    if all_runs.empty:
        st.info("The runs below have started but none has written samples yet; refresh in a moment.")
        dataframe(queries.runs_listing(table, all_runs), "runs", "runs")
        return

    db = open_db(results_dir)
    hparams = queries.hparam_columns(db)
    records: dict[str, dict | None] = {}

    def record_for(sweep: str) -> dict | None:
        if sweep not in records:
            records[sweep] = context.sweep_record(results_dir, sweep)
        return records[sweep]

    page = st.segmented_control("page", list(PAGES), default=PAGES[0], key="page", bind=URL, required=True,
                                label_visibility="collapsed")
    if page == "Run":
        run_page(results_dir, stamp, table, all_runs, hparams, record_for)
    elif page == "Configuration":
        config_page(results_dir, stamp, all_runs, hparams)
    elif page == "Compare two runs":
        compare_page(results_dir, stamp, table, all_runs, hparams, record_for)
    else:
        workbench(results_dir, stamp, db, table, all_runs, record_for)


main()
