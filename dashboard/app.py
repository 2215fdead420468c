"""Streamlit dashboard over a results dir: `bca dashboard [--results DIR]` (or `streamlit run dashboard/app.py`
with BCA_RESULTS_DIR set).

Reads only through orchestrator.results (DuckDB views over the Parquet files). Query results are cached for a
few seconds, so a page open while a sweep writes shows new rows on the next interaction or refresh.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import RESULTS_ENV, charts, prior, queries
from dashboard.queries import Filters
from orchestrator import registry
from orchestrator.results import report, schema
from orchestrator.results.db import ResultsDB
from orchestrator.results.writer import load_state

# Seconds a query result is reused: short, because sweeps keep writing while the page is open.
TTL_S = 10


# ------------------------------------------------------------------------------------------ data access
@st.cache_resource(show_spinner=False)
def open_db(results_dir: str) -> ResultsDB:
    """One in-memory DuckDB per results dir for the whole server; each query takes its own cursor."""
    return ResultsDB(results_dir)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_results(results_dir: str) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(runs table, accuracy rows, bad files) for all runs; filters apply to these frames in pandas."""
    db = open_db(results_dir)
    table = queries.run_table(db)
    runs = queries.accuracy_runs(db)
    return table, runs, [str(b) for b in db.bad_files]


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_curves(results_dir: str, run_ids: tuple[str, ...], backbone: str, dataset: str,
                window: int) -> pd.DataFrame:
    return queries.online_curves(open_db(results_dir), run_ids, backbone, dataset, window)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_per_class(results_dir: str, run_ids: tuple[str, ...], backbone: str, dataset: str) -> pd.DataFrame:
    return queries.per_class(open_db(results_dir), run_ids, backbone, dataset)


@st.cache_data(show_spinner=False, max_entries=32)
def load_run_state(results_dir: str, run_id: str, mtime_ns: int) -> dict:
    """A run's state.npz; keyed by its mtime so a rewritten artifact is read again."""
    return load_state(results_dir, run_id)


# -------------------------------------------------------------------------------------------- widgets
def download(frame: pd.DataFrame, name: str, key: str) -> None:
    st.download_button("Download CSV", frame.to_csv(index=False).encode("utf-8"), file_name=f"{name}.csv",
                       mime="text/csv", key=f"csv_{key}", on_click="ignore")


def table_with_csv(frame: pd.DataFrame, name: str, key: str) -> None:
    st.dataframe(frame, hide_index=True, width="stretch")
    download(frame, name, key)


def sidebar_filters(columns: dict[str, str], options: dict[str, list]) -> Filters:
    st.sidebar.header("Filters")
    st.sidebar.caption("Empty means all. Runs a hyperparameter does not apply to (CLIP has no tau) always pass.")
    chosen = {}
    for col, label in columns.items():
        values = options.get(col, [])
        if values:
            chosen[col] = tuple(st.sidebar.multiselect(label, values, key=f"filter_{col}"))
    status = st.sidebar.multiselect("run status", list(schema.STATUSES), default=["finished", "running"],
                                    key="filter_status",
                                    help="The comparison, sensitivity and cost views use finished runs only.")
    return Filters(**chosen, status=tuple(status))


# ------------------------------------------------------------------------------------------- sections
def comparison_section(db: ResultsDB, all_runs: pd.DataFrame, filters: Filters) -> None:
    st.subheader("Comparison")
    paper = st.toggle("Show the paper's numbers (Tables 1 and 2) beside the measured ones", key="paper_rows")
    tables = queries.comparison_tables(db, filters.with_clip().apply(all_runs), paper)
    if not tables:
        st.info("No finished runs match the filters yet: the comparison needs finished runs.")
        return
    for i, table in enumerate(tables):
        text, numbers, best = queries.comparison_frames(table, filters)
        st.markdown(f"**{table.title}** — mean ± std over seeds; Δ CLIP: gain over zero-shot CLIP; best in bold")
        styled = text.style.apply(lambda _: best.map(lambda b: "font-weight: bold" if b else ""), axis=None)
        st.table(styled)
        for note in table.notes:
            st.caption(note)
        download(numbers, f"comparison_{i + 1}", f"comparison_{i}")


def online_section(results_dir: str, focus: tuple[str, str], focus_runs: pd.DataFrame, labels: pd.Series) -> None:
    backbone, dataset = focus
    max_rows = int(focus_runs["n_rows"].max())
    window = st.number_input("window (samples)", min_value=1, value=queries.default_window(max_rows),
                             key="window", help="Windowed accuracy is over each window alone; cumulative over "
                                                "everything seen so far. Curves are means over seeds.")
    curves = load_curves(results_dir, tuple(focus_runs["run_id"]), backbone, dataset, int(window))
    if curves.empty:
        st.info("No samples for these runs yet.")
        return
    mean = queries.mean_curves(curves, labels)
    st.altair_chart(charts.online_accuracy(mean), width="stretch")
    download(mean, f"online_accuracy_{backbone}_{dataset}", "online")


def sensitivity_section(runs: pd.DataFrame, hparams: list[str]) -> None:
    others = [*hparams, "num_templates", "templates", "views", "pretrained"]
    missing = []
    for param in queries.sensitivity_params(runs[runs["status"] == "finished"], hparams):
        points, held = queries.sensitivity_points(runs, param, others)
        if points.empty:
            missing.append(param)
            continue
        st.altair_chart(charts.sensitivity(points, param), width="stretch")
        if held:
            st.caption("other settings held at " + ", ".join(f"{k}={v}" for k, v in held.items()))
        download(points, f"sensitivity_{param}", f"sens_{param}")
    if missing or not queries.sensitivity_params(runs[runs["status"] == "finished"], hparams):
        st.info(f"No finished configuration of one method was run with several values of "
                f"{', '.join(missing) or 'a hyperparameter'}: sweep them to see how accuracy depends on them "
                "(the paper's Fig. 3).")


def prior_section(results_dir: str, runs: pd.DataFrame, labels: pd.Series, focus: tuple[str, str]) -> None:
    backbone, dataset = focus
    prior_methods = [c.name for c in registry.method_cards() if c.prior]
    mask = (runs["method"].isin(prior_methods) & (runs["backbone"] == backbone) & (runs["dataset"] == dataset))
    candidates = runs[mask]
    paths = {r: schema.state_file(Path(results_dir), r) for r in candidates["run_id"]}
    candidates = candidates[[paths[r].is_file() for r in candidates["run_id"]]]
    if candidates.empty:
        st.info(f"No saved prior (artifacts/<run_id>/state.npz of a {', '.join(prior_methods)} run) "
                f"for {backbone} / {dataset} among the runs shown.")
        return
    names = {r: f"{labels[i]} · seed {s} · {r}" for i, r, s in
             zip(candidates.index, candidates["run_id"], candidates["seed"])}
    run_id = st.selectbox("run", list(names), format_func=names.get, key="prior_run")
    state = load_run_state(results_dir, run_id, paths[run_id].stat().st_mtime_ns)
    problem = prior.check_state(state)
    if problem:
        st.warning(f"Cannot show the prior of run {run_id}: {problem}.")
        return
    k = state["V"].shape[1]
    top = st.slider("top classes (most prior updates)", 1, min(50, k), min(20, k), key="prior_top")
    chosen = candidates.loc[candidates["run_id"] == run_id].iloc[0]
    n2 = chosen[registry.method_card(chosen["method"]).prior_count]  # the counter C2 starts from this hparam
    classes = prior.top_classes(state, None if pd.isna(n2) else float(n2), top)
    learned, clip = prior.heatmap_frames(state, classes)
    left, right = st.columns(2)
    left.altair_chart(charts.prior_heatmap(learned, "learned prior (mean over each class's embeddings)"),
                      width="stretch")
    right.altair_chart(charts.prior_heatmap(clip, "CLIP's prior (one-hot)"), width="stretch")
    summary = prior.prior_summary(state, None if pd.isna(n2) else float(n2), classes)
    table_with_csv(summary, f"prior_{run_id}", "prior")


def per_class_section(results_dir: str, focus: tuple[str, str], focus_runs: pd.DataFrame,
                      labels: pd.Series) -> None:
    backbone, dataset = focus
    counts = load_per_class(results_dir, tuple(focus_runs["run_id"]), backbone, dataset)
    if counts.empty:
        st.info("No samples for these runs yet.")
        return
    table = queries.per_class_by_series(counts, labels)
    num_classes = table["label"].nunique()
    top = st.slider("classes shown (largest differences between configurations)", 1, num_classes,
                    min(20, num_classes), key="per_class_top")
    shown = table[table["label"].isin(queries.most_different_classes(table, top))]
    st.altair_chart(charts.per_class_accuracy(shown.assign(**{"class": "class " + shown["label"].astype(str)})),
                    width="stretch")
    wide = table.pivot(index="label", columns="series", values="accuracy").round(2).reset_index()
    table_with_csv(wide, f"per_class_{backbone}_{dataset}", "per_class")


def hyperparameter_section(runs: pd.DataFrame, hparams: list[str]) -> None:
    finished = runs[runs["status"] == "finished"]
    dims = queries.varying_numeric(finished, [*hparams, "num_templates"])
    if not dims:
        st.info("No numeric hyperparameter varies among the finished runs shown.")
        return
    st.altair_chart(charts.parallel_coordinates(finished, dims), width="stretch")
    table_with_csv(finished[["run_id", "method", "backbone", "dataset", "seed", *dims, "accuracy"]],
                   "hyperparameters", "hparams")


def cost_section(runs: pd.DataFrame, labels: pd.Series, focus: tuple[str, str]) -> None:
    """Charts for the focused backbone / dataset (costs differ between datasets), the table for all runs."""
    in_focus = (runs["backbone"] == focus[0]) & (runs["dataset"] == focus[1])
    timing = queries.stage_times(runs[in_focus], labels[in_focus])
    finished = runs[in_focus & (runs["status"] == "finished")].assign(series=labels)
    memory = finished.groupby("series", as_index=False)["peak_mem_mb"].mean().dropna()
    if timing.empty and memory.empty:
        st.info("No finished runs with timings among the runs shown.")
        return
    left, right = st.columns(2)
    if not timing.empty:
        left.altair_chart(charts.stage_times(timing), width="stretch")
    if not memory.empty:
        right.altair_chart(charts.peak_memory(memory), width="stretch")
    table_with_csv(queries.cost_table(runs, labels), "cost", "cost")


# ----------------------------------------------------------------------------------------------- page
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
    table, all_runs, bad = load_results(results_dir)
    if bad:
        st.warning(f"Left out {len(bad)} unreadable or incomplete results file(s); everything else is shown:\n\n"
                   + "\n".join(f"- `{b}`" for b in bad))
    if table.empty and all_runs.empty:
        st.info(f"No runs in `{results_dir}` yet. Results appear here as a sweep writes them.")
        return
    counts = queries.status_counts(table)
    st.caption(" · ".join(f"{counts.get(s, 0)} {s}" for s in schema.STATUSES) + f" runs in `{results_dir}`")

    if all_runs.empty:
        st.info("The runs below have started but none has written samples yet; refresh in a moment.")
        table_with_csv(queries.runs_listing(table, all_runs), "runs", "runs")
        return

    db = open_db(results_dir)
    filter_columns = queries.filter_columns(all_runs, queries.hparam_columns(db))
    filters = sidebar_filters(filter_columns, queries.filter_options(all_runs, filter_columns))
    runs = filters.apply(all_runs)
    if runs.empty:
        st.info("No runs with samples match the filters.")
        return
    hparams = queries.hparam_columns(db)
    labels = queries.series_labels(runs, hparams)
    run_labels = pd.Series(labels.values, index=runs["run_id"].values)

    comparison_section(db, all_runs, filters)

    pairs = sorted({(b, d) for b, d in zip(runs["backbone"], runs["dataset"])})
    focus = st.selectbox("backbone / dataset for the stream, prior and per-class views", pairs,
                         format_func=lambda p: f"{report.backbone_label(p[0])} / {registry.dataset_title(p[1])}",
                         key="focus")
    focus_runs = runs[(runs["backbone"] == focus[0]) & (runs["dataset"] == focus[1])]
    tabs = st.tabs(["Online accuracy", "Sensitivity", "Prior", "Per class", "Hyperparameters", "Cost", "Runs"])
    with tabs[0]:
        online_section(results_dir, focus, focus_runs, run_labels)
    with tabs[1]:
        sensitivity_section(runs, hparams)
    with tabs[2]:
        prior_section(results_dir, runs, labels, focus)
    with tabs[3]:
        per_class_section(results_dir, focus, focus_runs, run_labels)
    with tabs[4]:
        hyperparameter_section(runs, hparams)
    with tabs[5]:
        cost_section(runs, labels, focus)
    with tabs[6]:
        table_with_csv(queries.runs_listing(filters.apply(table), runs), "runs", "runs")


main()
