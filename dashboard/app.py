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

import os
from pathlib import Path

import streamlit as st

from dashboard import RESULTS_ENV, context, queries
from dashboard.components import URL, dataframe, load_comparison_tables, load_results, load_run_table, open_db
from dashboard.pages import compare_page, config_page, run_page
from dashboard.workbench import workbench
from orchestrator.results import schema

PAGES = ("Workbench", "Run", "Configuration", "Compare two runs")
# Seconds between checks for new result files while a run is running.
AUTO_REFRESH_S = 5


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
        load_results.clear()
        load_run_table.clear()
        load_comparison_tables.clear()

    if not Path(results_dir).is_dir():
        st.info(f"No results directory at `{results_dir}`. Run a sweep first (`bca sweep SPEC` writes to the "
                f"spec's `results_dir`) or open another one with `bca dashboard --results DIR`.")
        return
    stamp = context.results_fingerprint(results_dir)
    all_runs, bad, counts, total = load_results(results_dir, stamp)
    lost = open_db(results_dir).lost()
    if lost:
        st.error(f"The results are damaged: {sum(x.count for x in lost)} run(s) committed to this results dir are "
                 "not read, so every number below stands on fewer runs than were made (`bca verify "
                 f"{results_dir}` says more):\n\n" + "\n".join(f"- {x}" for x in lost))
    if bad:
        st.warning(f"Left out {len(bad)} unreadable or incomplete results file(s); everything else is shown:\n\n"
                   + "\n".join(f"- `{b}`" for b in bad))
    if not total and all_runs.empty:
        st.info(f"No runs in `{results_dir}` yet. Results appear here as a sweep writes them.")
        return
    st.caption(" · ".join(f"{counts.get(s, 0)} {s}" for s in schema.STATUSES) + f" runs in `{results_dir}`")
    running = counts.get("running", 0) > 0
    if running and st.sidebar.toggle("auto-refresh while runs are running", value=True, key="auto_refresh"):
        auto_refresh(results_dir, stamp)

    if all_runs.empty:
        st.info("The runs below have started but none has written samples yet; refresh in a moment.")
        dataframe(queries.runs_listing(load_run_table(results_dir, stamp), all_runs), "runs", "runs")
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
        run_page(results_dir, stamp, load_run_table(results_dir, stamp), all_runs, hparams, record_for)
    elif page == "Configuration":
        config_page(results_dir, stamp, all_runs, hparams)
    elif page == "Compare two runs":
        compare_page(results_dir, stamp, load_run_table(results_dir, stamp), all_runs, hparams, record_for)
    else:
        workbench(results_dir, stamp, db, all_runs, record_for)


main()
