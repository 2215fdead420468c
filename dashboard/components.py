"""What the dashboard's pages share: the cached readers of the results, the table and chart widgets with their
exports, URL-kept selections, and the learned-prior view (on the workbench and on a run's page).

Every reader is keyed by the results files' fingerprint (context.results_fingerprint), so nothing is read again
until a sweep writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable
from urllib.parse import urlencode

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import charts, export, importance, prior, queries
from orchestrator import registry
from orchestrator.results import report, schema, tuning
from orchestrator.results.db import ResultsDB
from orchestrator.results.writer import load_state

URL = "query-params"
# Rows of a run's stream listed on its page (the rest is in its Parquet parts and `bca query`).
STREAM_ROWS = 500


# ------------------------------------------------------------------------------------------ data access
@st.cache_resource(show_spinner=False)
def open_db(results_dir: str) -> ResultsDB:
    """One in-memory DuckDB per results dir for the whole server; each query takes its own cursor."""
    return ResultsDB(results_dir)


@st.cache_resource(show_spinner=False, max_entries=4)
def load_results(results_dir: str, fingerprint: tuple) -> tuple[pd.DataFrame, list[str], dict[str, int], int]:
    """(per-run rows with metrics, bad files, runs per status, runs in the runs table); keyed by the files'
    fingerprint, so it is read again only when a file was written (and then ResultsDB rebuilds only what changed).
    Shared, not copied, by every rerun and session (a study's 10^5-run frame costs seconds to pickle and unpickle):
    the pages only read it."""
    db = open_db(results_dir)
    db.refresh()
    counts, total = queries.status_counts(db)
    return queries.accuracy_runs(db), [str(b) for b in db.bad_files], counts, total


@st.cache_resource(show_spinner=False, max_entries=4)
def load_run_table(results_dir: str, fingerprint: tuple) -> pd.DataFrame:
    """The runs table (every run, also those with no samples yet), read only by the views that list runs (the
    first page does not), shared as load_results is."""
    return queries.run_table(open_db(results_dir))


def comparison_key(filters: queries.Filters) -> tuple:
    """The runs the report's tables stand on, as load_comparison_tables' key: the filters' chosen values, CLIP let
    through as the gain's baseline, every status (a cell counts its finished, complete runs and is marked by the
    others)."""
    return tuple(sorted(filters.with_clip().chosen.items()))


@st.cache_resource(show_spinner=False, max_entries=8)
def load_comparison_tables(results_dir: str, fingerprint: tuple, key: tuple, paper: bool,
                           tuned: tuple[str, str] | None = None) -> list[report.ReportTable]:
    """The report's tables over the runs of `key` (comparison_key), built once per filter setting until a sweep
    writes and shared, as load_results is, by the first screen's gains, the Evidence and the Paper tables panels.
    tuned: (predicate, metric) of honest tuning (load_tuning): the tables then stand on the chosen
    configurations' other runs only."""
    runs = queries.Filters((), **dict(key)).apply(load_results(results_dir, fingerprint)[0])
    if tuned is not None:
        runs = load_tuning(results_dir, fingerprint, *tuned).evaluation(runs)
    return queries.comparison_tables(open_db(results_dir), runs, paper)


@st.cache_data(show_spinner=False, max_entries=16)
def load_tuning(results_dir: str, fingerprint: tuple, predicate: str, metric: str) -> tuning.Tuning:
    """The tuning split of `predicate` (orchestrator.results.tuning; TuneOnError for a bad one)."""
    return tuning.tune(open_db(results_dir), predicate, metric)


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
    """CSV (the numbers), Markdown and LaTeX (the text as shown, best in bold) downloads of one table, each
    written only when clicked (a page has several tables: writing all their files on every run costs seconds)."""
    row = st.container(horizontal=True)
    row.download_button("CSV", lambda: numbers.to_csv(index=False).encode("utf-8"), file_name=f"{name}.csv",
                            mime="text/csv", key=f"csv_{key}", on_click="ignore")
    row.download_button("Markdown", lambda: export.to_markdown(text, best).encode("utf-8"), file_name=f"{name}.md",
                            mime="text/markdown", key=f"md_{key}", on_click="ignore")
    row.download_button("LaTeX", lambda: export.to_latex(text, best, caption).encode("utf-8"),
                            file_name=f"{name}.tex", mime="text/x-tex", key=f"tex_{key}", on_click="ignore",
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
    learned = registry.method_card(run["method"]).prior
    count = learned.count if learned else None
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
