"""A page per run, a page per configuration (its seeds together) and the sample-aligned comparison of two runs."""

from __future__ import annotations

import json
from typing import Callable

import pandas as pd
import streamlit as st

from dashboard import charts, context, metrics, queries, significance
from dashboard.components import (STREAM_ROWS, chart, dataframe, id_selectbox, link, load_curves, load_pair,
                                  load_run, prior_view)
from orchestrator import registry
from orchestrator.results import evidence, report

THUMBNAILS = 12


# ------------------------------------------------------------------------------------- run and config
def run_options(table: pd.DataFrame, hparams: list[str]) -> dict[str, str]:
    """run_id -> "BCA (tau=0.2) · synthetic-continual · iid · seed 1 · order 2 · 0560bcc9" for every run in the runs
    table: the stream and order tell apart runs whose settings are otherwise the same."""
    labels = queries.series_labels(table, hparams)
    streams = table["stream"] if "stream" in table else pd.Series(None, index=table.index)
    orders = evidence.order_of(table)
    return {r: " · ".join([labels[i], registry.dataset_title(d), evidence.protocol(st_), f"seed {s}",
                           f"order {o}", r[:8]])
            for i, r, d, st_, s, o in zip(table.index, table["run_id"], table["dataset"], streams, table["seed"],
                                          orders)}


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
    own = all_runs[all_runs["run_id"] == run_id]
    if status == "finished" and not evidence.usable(own).any():
        st.warning("This run is finished but its rows are not all readable (a part lost or truncated): every table "
                   "leaves it out and marks its cell 'n=k of m'; `bca verify` names the file, `bca sweep --resume` "
                   "writes it again.")
    left, right = st.columns(2)
    with left:
        st.markdown("**Configuration**")
        st.json(config, expanded=2)
    with right:
        st.markdown("**Metrics**")
        values = all_runs[all_runs["run_id"] == run_id]
        metric_cols = metrics.metric_columns(values, hparams) if not values.empty else []
        # a static table: every metric and value shown whole at any width (a scrolling grid cut them off)
        st.table(pd.DataFrame({"metric": [metrics.label(c) for c in metric_cols],
                               "value": [_number(values.iloc[0][c]) for c in metric_cols]}).set_index("metric"))
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


def _number(value: float) -> str:
    """A metric as the run page shows it: four significant digits, thousands whole ('2,863', '63.12', '0.0012')."""
    if pd.isna(value):
        return "—"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


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
    runs = runs.assign(complete=evidence.usable(runs), order_index=evidence.order_of(runs))
    per_run = runs[["run_id", "seed", "order_index", "status", "complete", *cols]].sort_values(["seed", "order_index"])
    per_run.insert(0, "page", [link("Run", run=r) for r in per_run["run_id"]])
    st.markdown(f"**Its runs** ({len(runs)}: one per seed / order)")
    st.dataframe(per_run, hide_index=True, width="stretch",
                 column_config={"page": st.column_config.LinkColumn("page", display_text="open")})
    finished = runs[runs["complete"]]
    summary = pd.DataFrame({"metric": [metrics.label(c) for c in cols], "mean": [finished[c].mean() for c in cols],
                            "std": [finished[c].std() for c in cols],
                            "worst run": [(finished[c].min() if metrics.metric(c).higher_is_better
                                           else finished[c].max()) for c in cols],
                            "runs": [int(finished[c].notna().sum()) for c in cols]})
    left_out = len(runs) - len(finished)
    st.markdown(f"**Over its finished runs with all their rows** ({len(finished)} of {len(runs)}"
                + (f"; {left_out} left out: not finished, or rows lost" if left_out else "") + ")")
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
    # the runs that saw A's very stream first (same data setting, seed and order), then those on its dataset
    frame, own = same_stream.loc[ids], same_stream.loc[run_a]
    same = pd.Series(True, index=frame.index)
    for key in ("setting_id", "seed", "order_index"):
        same &= (frame[key] == own[key]).fillna(False) | (frame[key].isna() & pd.isna(own[key]))
    rank = (~same).astype(int) * 2 + (frame["dataset"] != own["dataset"]).astype(int)
    partners = [r for r in rank.sort_values(kind="stable").index if r != run_a]
    if not partners:
        st.info("Only one run has samples: a comparison needs two.")
        return
    run_b = id_selectbox("run B (those on the same stream in the same order first)", {r: options[r] for r in partners},
                         "run_b", right)
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
    # an OOD sample has no right answer: neither right nor wrong, counted apart (as every accuracy leaves it out)
    ood = int(pair["is_ood"].sum())
    pair = pair[~pair["is_ood"]]
    both = int((pair["correct_a"] & pair["correct_b"]).sum())
    only_a = int((pair["correct_a"] & ~pair["correct_b"]).sum())
    only_b = int((~pair["correct_a"] & pair["correct_b"]).sum())
    neither = len(pair) - both - only_a - only_b
    counts = [("both right", both), ("only A right", only_a), ("only B right", only_b), ("both wrong", neither)]
    if ood:
        counts.append(("OOD, not scored", ood))
    for col, (name, value) in zip(st.columns(len(counts)), counts):
        col.metric(name, value)
    if ood:
        st.caption(f"{ood} OOD samples (a contaminated stream's held-out classes) have no right answer: they are "
                   f"left out of the counts, the test and the tables below, as every accuracy leaves them out.")
    table, p_value = significance.mcnemar(pair["correct_a"], pair["correct_b"])
    st.markdown(f"**McNemar's test** (exact, on the {only_a + only_b} samples only one run gets right): "
                f"p = {p_value:.3g}" + (f", significant at {significance.stats.ALPHA:g}"
                                        if p_value <= significance.stats.ALPHA else ", not significant"))
    st.table(table)
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
                        pred_b=diff["pred_b"].map(namer)).drop(columns=["same_image", "is_ood"])
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
