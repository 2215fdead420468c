"""Altair (vega-lite) charts for the dashboard: pure functions from small, already aggregated frames.

Every frame reaching here was reduced in SQL (a few hundred rows at most), so the charts embed
their data inline and stay light in the browser.
"""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from orchestrator import registry
from orchestrator.stages import STAGES

# Category axes name every row: Vega would otherwise thin out labels it deems too close.
_ALL_LABELS = alt.Axis(labelOverlap=False)

def _method_color(methods: pd.Series) -> alt.Color:
    """Methods in the registry's display order, so each keeps one colour across every chart of the page."""
    return alt.Color("method:N", title="method", sort=sorted(set(methods), key=registry.method_rank))


def online_accuracy(curve: pd.DataFrame) -> alt.Chart:
    """Accuracy against stream position, one line per series, cumulative solid and windowed dashed.

    curve columns: series (a configuration, averaged over its seeds), position (samples seen),
    cumulative, windowed (accuracy in %).
    """
    long = curve.melt(
        id_vars=["series", "position"],
        value_vars=["cumulative", "windowed"],
        var_name="kind",
        value_name="accuracy",
    )
    return (
        alt.Chart(long)
        .mark_line()
        .encode(
            x=alt.X("position:Q", title="stream position (samples seen)"),
            y=alt.Y("accuracy:Q", title="accuracy (%)", scale=alt.Scale(zero=False)),
            color=alt.Color("series:N", title="configuration"),
            strokeDash=alt.StrokeDash("kind:N", title="curve", sort=["cumulative", "windowed"]),
            tooltip=["series:N", "kind:N", "position:Q", alt.Tooltip("accuracy:Q", format=".2f")],
        )
        .properties(height=320)
    )


def sensitivity(points: pd.DataFrame, param: str) -> alt.LayerChart:
    """Mean accuracy (± std over seeds) against one hyperparameter, one line per method x backbone x dataset.

    points columns: series, value, mean, std (accuracy in %), n. Hyperparameters whose card marks them as
    spanning decades (the counters n1 and n2) get a logarithmic axis (the paper's Fig. 3 spaces them so too).
    """
    data = points.assign(lo=points["mean"] - points["std"].fillna(0.0), hi=points["mean"] + points["std"].fillna(0.0))
    log_axis = registry.hparam_is_log(param) and bool((data["value"] > 0).all())
    x = alt.X("value:Q", title=param, scale=alt.Scale(type="log" if log_axis else "linear", zero=False))
    base = alt.Chart(data).encode(x=x, color=alt.Color("series:N", title=None, legend=alt.Legend(orient="bottom",
                                                                                                 columns=2)))
    line = base.mark_line(point=True).encode(
        y=alt.Y("mean:Q", title="accuracy (%)", scale=alt.Scale(zero=False)),
        tooltip=[
            "series:N",
            alt.Tooltip("value:Q", title=param),
            alt.Tooltip("mean:Q", format=".2f"),
            alt.Tooltip("std:Q", format=".2f"),
            "n:Q",
        ],
    )
    band = base.mark_errorbar().encode(y=alt.Y("lo:Q", title="accuracy (%)"), y2="hi:Q")
    return (band + line).properties(height=240, title=f"sensitivity to {param}")


def prior_heatmap(matrix: pd.DataFrame, title: str) -> alt.Chart:
    """Heatmap of a prior restricted to the top classes.

    matrix columns: embedding_class (row: the class the embeddings were built for), class (column:
    the class the prior puts mass on), prior (the mass), rank_row/rank_col (display order).
    """
    return (
        alt.Chart(matrix)
        .mark_rect()
        .encode(
            x=alt.X("class:N", sort=alt.SortField("rank_col"), title="class Y", axis=_ALL_LABELS),
            y=alt.Y("embedding_class:N", sort=alt.SortField("rank_row"), title="class embeddings of",
                    axis=_ALL_LABELS),
            # square-root scale: the mass moved off the diagonal is small but is the point of the figure
            color=alt.Color("prior:Q", scale=alt.Scale(type="sqrt", domain=[0, 1], scheme="blues"), title="P(Y|μ)"),
            tooltip=["embedding_class:N", "class:N", alt.Tooltip("prior:Q", format=".3f")],
        )
        # Streamlit fits the whole chart (title and rotated labels included) into this height
        .properties(title=title, height=150 + 20 * int(matrix["rank_row"].nunique()))
    )


def per_class_accuracy(per_class: pd.DataFrame) -> alt.Chart:
    """Per-class accuracy bars, grouped by class, one bar per configuration.

    per_class columns: class (label text), series, accuracy (%), n.
    """
    return (
        alt.Chart(per_class)
        .mark_bar()
        .encode(
            x=alt.X("class:N", title="class", sort=None),
            xOffset=alt.XOffset("series:N"),
            y=alt.Y("accuracy:Q", title="accuracy (%)"),
            color=alt.Color("series:N", title="configuration"),
            tooltip=["class:N", "series:N", alt.Tooltip("accuracy:Q", format=".2f"), "n:Q"],
        )
        .properties(height=300)
    )


def parallel_coordinates(runs: pd.DataFrame, dims: list[str]) -> alt.Chart:
    """One line per run across the hyperparameters that vary and its accuracy, each axis min-max scaled.

    runs columns: run_id, method, accuracy, and each name in dims (numeric). Axes with a single value
    are dropped by the caller; scaling happens here so that axes with different units share one plot.
    """
    axes = [*dims, "accuracy"]
    frame = runs[["run_id", "method", *axes]].astype({a: float for a in axes})
    long = frame.melt(id_vars=["run_id", "method"], value_vars=axes, var_name="axis", value_name="value")
    span = long.groupby("axis")["value"].agg(["min", "max"])
    lo = long["axis"].map(span["min"])
    width = long["axis"].map(span["max"] - span["min"]).replace(0, np.nan)
    long["scaled"] = ((long["value"] - lo) / width).fillna(0.5)
    long = long[long["value"].notna()]  # an hparam a method does not have (CLIP's tau): no point on that axis
    return (
        alt.Chart(long)
        .mark_line(opacity=0.6)
        .encode(
            x=alt.X("axis:N", sort=axes, title=None),
            y=alt.Y("scaled:Q", title="min-max scaled", axis=alt.Axis(format=".1f")),
            color=_method_color(long["method"]),
            detail="run_id:N",
            tooltip=["run_id:N", "method:N", "axis:N", alt.Tooltip("value:Q", format=".4g")],
        )
        .properties(height=320)
    )


def stage_times(timing: pd.DataFrame) -> alt.Chart:
    """Stacked seconds per stage for each configuration (mean over its finished runs).

    timing columns: series, stage, seconds.
    """
    return (
        alt.Chart(timing)
        .mark_bar()
        .encode(
            y=alt.Y("series:N", title=None, axis=_ALL_LABELS),
            x=alt.X("seconds:Q", title="seconds per run (mean)"),
            color=alt.Color("stage:N", sort=list(STAGES), title="stage"),
            order=alt.Order("stage_rank:Q"),
            tooltip=["series:N", "stage:N", alt.Tooltip("seconds:Q", format=".3f")],
        )
        .transform_calculate(stage_rank=f"indexof({list(STAGES)!r}, datum.stage)")
        .properties(height=90 + 22 * int(timing["series"].nunique()), title="time per stage")
    )


def peak_memory(memory: pd.DataFrame) -> alt.Chart:
    """Peak memory per configuration. memory columns: series, peak_mem_mb."""
    return (
        alt.Chart(memory)
        .mark_bar()
        .encode(
            y=alt.Y("series:N", title=None, axis=_ALL_LABELS),
            x=alt.X("peak_mem_mb:Q", title="peak memory (MB, mean over runs)"),
            tooltip=["series:N", alt.Tooltip("peak_mem_mb:Q", format=".1f")],
        )
        .properties(height=90 + 22 * int(memory["series"].nunique()), title="peak memory")
    )
