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

# Category axes name every row, in full: Vega would otherwise thin out labels it deems too close, and cut long
# ones (labelLimit 0: no limit), until two configurations that differ at the end of their labels read the same.
_ALL_LABELS = alt.Axis(labelOverlap=False, labelLimit=0)
# Height per legend entry / category row, so a chart grows with what it shows instead of squeezing the plot.
ROW_PX = 20
# One base colour per method (tableau20's strong shades first, readable on light and dark backgrounds), in the
# registry's display order of the methods shown; configurations of one method get shades of it.
_BASE_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#eeca3b", "#9d755d", "#ff9da6",
                "#bab0ac", "#393b79", "#637939", "#8c6d31", "#843c39")


def _mix(hex_colour: str, towards: int, amount: float) -> str:
    rgb = [int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (towards - c) * amount):02x}" for c in rgb)


def family_colours(series_methods: dict[str, str]) -> alt.Scale:
    """A colour scale over the series: each method its own hue (CLIP+LA, CLIP+PA and BCA share a family but are
    three methods to tell apart), the configurations of one method shades of it from darker to lighter
    (readable on light and dark themes), in display order."""
    ordered = sorted(series_methods, key=lambda s: (registry.method_rank(series_methods[s]), s))
    methods = list(dict.fromkeys(series_methods[s] for s in ordered))
    by_method: dict[str, list[str]] = {}
    for s in ordered:
        by_method.setdefault(series_methods[s], []).append(s)
    colours = {}
    for m, members in by_method.items():
        base = _BASE_COLOURS[methods.index(m) % len(_BASE_COLOURS)]
        for i, s in enumerate(members):
            t = i / max(1, len(members) - 1) if len(members) > 1 else 0.5
            # from 25% towards black to 45% towards white: distinct shades, none vanishing on either theme
            colours[s] = _mix(base, 0, 0.25 * (1 - 2 * t)) if t < 0.5 else _mix(base, 255, 0.45 * (2 * t - 1))
    return alt.Scale(domain=ordered, range=[colours[s] for s in ordered])


def _series_colour(series_methods: dict[str, str], title: str | None = "configuration") -> alt.Color:
    return alt.Color("series:N", title=title, scale=family_colours(series_methods),
                     legend=alt.Legend(labelLimit=0, symbolLimit=0, orient="right",
                                       symbolOpacity=1, symbolType="stroke", symbolStrokeWidth=3))


def for_page(chart: alt.TopLevelMixin) -> alt.TopLevelMixin:
    """Ask Streamlit's Vega embed for SVG instead of canvas: the plot area is then a DOM element a browser test
    can measure, and the charts stay sharp when zoomed."""
    return chart.properties(usermeta={"embedOptions": {"renderer": "svg"}})


def _legend_height(n_series: int, minimum: int = 300) -> int:
    return max(minimum, 60 + ROW_PX * n_series)


def _method_color(methods: pd.Series) -> alt.Color:
    """Methods in the registry's display order, so each keeps one colour across every chart of the page."""
    methods_present = {registry.method_label(m): m for m in set(methods)}
    scale = family_colours(methods_present)
    return alt.Color("method_label:N", title="method", scale=scale)


def online_accuracy(curve: pd.DataFrame, series_methods: dict[str, str], kind: str = "cumulative") -> alt.LayerChart:
    """Accuracy against stream position, one line per series with a mean ± std band over its runs.

    curve columns: series, position (samples seen), <kind> and <kind>_std (accuracy in %), runs. kind is
    'cumulative' (everything seen so far) or 'windowed' (each window alone).
    """
    # an accuracy is in [0, 100]: a band of ± one std is cut there rather than drawn past it
    data = curve.assign(value=curve[kind], lo=(curve[kind] - curve[f"{kind}_std"]).clip(lower=0.0),
                        hi=(curve[kind] + curve[f"{kind}_std"]).clip(upper=100.0))
    colour = _series_colour(series_methods)
    x = alt.X("position:Q", title="stream position (samples seen)")
    tooltip = ["series:N", "position:Q", alt.Tooltip("value:Q", title=f"{kind} accuracy (%)", format=".2f"),
               alt.Tooltip(f"{kind}_std:Q", title="std over runs", format=".2f"), "runs:Q"]
    band = alt.Chart(data).mark_area(opacity=0.15).encode(x=x, y=alt.Y("lo:Q", title=f"{kind} accuracy (%)"),
                                                          y2="hi:Q", color=colour)
    line = alt.Chart(data).mark_line().encode(
        x=x, y=alt.Y("value:Q", title=f"{kind} accuracy (%)", scale=alt.Scale(zero=False)), color=colour,
        tooltip=tooltip)
    return alt.layer(line, band).properties(height=_legend_height(len(series_methods)))


def sensitivity(points: pd.DataFrame, param: str, series_methods: dict[str, str], metric_label: str = "accuracy (%)",
                baselines: dict[str, float] | None = None) -> alt.LayerChart:
    """Mean metric (± std over seeds and orders) against one hyperparameter, one line per series; the zero-shot
    baseline as a dashed reference line per label in `baselines` (one per stream protocol shown), as the paper's
    Fig. 3.

    points columns: series, value, mean, std, n. Hyperparameters whose card marks them `log` get a log axis.
    """
    data = points.assign(lo=points["mean"] - points["std"].fillna(0.0), hi=points["mean"] + points["std"].fillna(0.0))
    log_axis = registry.hparam_is_log(param) and bool((data["value"] > 0).all())
    x = alt.X("value:Q", title=param + (" (log scale)" if log_axis else ""),
              scale=alt.Scale(type="log" if log_axis else "linear", zero=False))
    colour = _series_colour(series_methods)
    base = alt.Chart(data).encode(x=x, color=colour)
    line = base.mark_line(point=True).encode(
        y=alt.Y("mean:Q", title=metric_label, scale=alt.Scale(zero=False)),
        tooltip=["series:N", alt.Tooltip("value:Q", title=param), alt.Tooltip("mean:Q", format=".2f"),
                 alt.Tooltip("std:Q", format=".2f"), "n:Q"],
    )
    band = base.mark_errorbar().encode(y=alt.Y("lo:Q", title=metric_label), y2="hi:Q")
    layers = [band, line]
    shown = {label: value for label, value in (baselines or {}).items() if value is not None and np.isfinite(value)}
    if shown:
        rule = pd.DataFrame({"baseline": list(shown.values()), "label": list(shown)})
        layers.append(alt.Chart(rule).mark_rule(strokeDash=[6, 4], color="gray").encode(
            y="baseline:Q", tooltip=[alt.Tooltip("label:N", title="reference"),
                                     alt.Tooltip("baseline:Q", format=".2f")]))
        layers.append(alt.Chart(rule).mark_text(align="left", dx=4, dy=-6, color="gray").encode(
            y="baseline:Q", x=alt.value(0), text="label:N"))
    return alt.layer(*layers).properties(height=_legend_height(len(series_methods), 280),
                                         title=f"sensitivity to {param}")


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


def per_class_accuracy(per_class: pd.DataFrame, series_methods: dict[str, str]) -> alt.Chart:
    """Per-class accuracy as a heat-map: one row per configuration, one column per class (named), so 20
    configurations stay as readable as 2.

    per_class columns: class (label text), series, accuracy (%), n.
    """
    n_series = int(per_class["series"].nunique())
    return (
        alt.Chart(per_class)
        .mark_rect()
        .encode(
            x=alt.X("class:N", title="true class", sort=None,
                    axis=alt.Axis(labelAngle=-45, labelLimit=160, labelOverlap=False)),
            y=alt.Y("series:N", title=None, sort=family_colours(series_methods).domain, axis=_ALL_LABELS),
            color=alt.Color("accuracy:Q", title="accuracy (%)", scale=alt.Scale(domain=[0, 100], scheme="viridis")),
            tooltip=["class:N", "series:N", alt.Tooltip("accuracy:Q", format=".2f"), "n:Q"],
        )
        .properties(height=120 + ROW_PX * n_series)
    )


def parallel_coordinates(runs: pd.DataFrame, dims: list[str], metric: str, metric_label: str) -> alt.Chart:
    """One line per run across the hyperparameters that vary and a metric. Each axis is scaled to [0, 1] over its
    own range, logarithmically where the card says the hparam spans decades (n2 from 1 to 1000 stays spread);
    each axis is labelled with its low and high values.

    runs columns: run_id, method, the dims (numeric) and the metric.
    """
    axes = [*dims, metric]
    frame = runs[["run_id", "method", *axes]].astype({a: float for a in axes})
    long = frame.melt(id_vars=["run_id", "method"], value_vars=axes, var_name="axis", value_name="value")
    long = long[long["value"].notna()]  # an hparam a method does not have (CLIP's tau): no point on that axis
    log_axes = {a for a in dims if registry.hparam_is_log(a) and (long.loc[long["axis"] == a, "value"] > 0).all()}
    long["t"] = np.where(long["axis"].isin(log_axes), np.log10(long["value"].clip(lower=1e-300)), long["value"])
    span = long.groupby("axis")["t"].agg(["min", "max"])
    width = long["axis"].map(span["max"] - span["min"]).replace(0, np.nan)
    long["scaled"] = ((long["t"] - long["axis"].map(span["min"])) / width).fillna(0.5)
    long["method_label"] = long["method"].map(registry.method_label)
    names = {a: (metric_label if a == metric else a + (" (log)" if a in log_axes else "")) for a in axes}
    long["axis_name"] = long["axis"].map(names)
    ends = long.groupby("axis_name").agg(lo=("value", "min"), hi=("value", "max")).reset_index()
    ends = pd.concat([ends.assign(scaled=0.0, text=ends["lo"].map("{:.4g}".format)),
                      ends.assign(scaled=1.0, text=ends["hi"].map("{:.4g}".format))])
    order = [names[a] for a in axes]
    x = alt.X("axis_name:N", sort=order, title=None, axis=alt.Axis(labelAngle=0, labelLimit=200))
    lines = alt.Chart(long).mark_line(opacity=0.7, point=True).encode(
        x=x, y=alt.Y("scaled:Q", title=None, axis=None),
        color=_method_color(long["method"]), detail="run_id:N",
        tooltip=["run_id:N", "method_label:N", "axis_name:N", alt.Tooltip("value:Q", format=".4g")])
    labels = alt.Chart(ends).mark_text(dy=alt.expr("datum.scaled > 0.5 ? -8 : 10"), color="gray").encode(
        x=x, y="scaled:Q", text="text:N")
    return alt.layer(lines, labels).properties(height=340)


def importance(scores: pd.DataFrame, metric_label: str) -> alt.LayerChart:
    """Permutation importance per setting (bars) with ± std over repeats. scores columns: setting, importance,
    std."""
    data = scores.assign(lo=scores["importance"] - scores["std"], hi=scores["importance"] + scores["std"])
    y = alt.Y("setting:N", sort=None, title=None, axis=_ALL_LABELS)
    x_title = f"drop in R² of {metric_label} when shuffled (± std over repeats)"
    bars = alt.Chart(data).mark_bar(color=_BASE_COLOURS[0]).encode(
        y=y, x=alt.X("importance:Q", title=x_title),
        tooltip=["setting:N", alt.Tooltip("importance:Q", format=".3f"), alt.Tooltip("std:Q", format=".3f")])
    bars_err = alt.Chart(data).mark_errorbar(color="gray", thickness=2).encode(y=y, x=alt.X("lo:Q", title=x_title),
                                                                               x2="hi:Q")
    return alt.layer(bars, bars_err).properties(height=60 + 26 * len(scores))


def metric_bars(summary: pd.DataFrame, series_methods: dict[str, str], metric_label: str,
                dataset: str = "") -> alt.LayerChart:
    """Mean ± std of a metric per configuration on one dataset, named in the title (a dot and its error bar per
    row, coloured by method; dots rather than bars so that the axis can zoom to the differences). summary
    columns: series, mean, std, n."""
    data = summary.assign(lo=summary["mean"] - summary["std"].fillna(0), hi=summary["mean"] + summary["std"].fillna(0))
    y = alt.Y("series:N", sort=list(summary["series"]), title=None, axis=_ALL_LABELS)
    x_title = f"{metric_label} (mean ± std)"
    dots = alt.Chart(data).mark_point(filled=True, size=80).encode(
        y=y, x=alt.X("mean:Q", title=x_title, scale=alt.Scale(zero=False)),
        color=alt.Color("series:N", scale=family_colours(series_methods), legend=None),
        tooltip=["series:N", alt.Tooltip("mean:Q", format=".2f"), alt.Tooltip("std:Q", format=".2f"), "n:Q"])
    err = alt.Chart(data).mark_errorbar(thickness=2).encode(
        y=y, x=alt.X("lo:Q", title=x_title), x2="hi:Q",
        color=alt.Color("series:N", scale=family_colours(series_methods), legend=None))
    chart = alt.layer(err, dots).properties(height=60 + ROW_PX * len(summary))
    return chart.properties(title=f"{metric_label} on {dataset}") if dataset else chart


def disagreement_classes(by_class: pd.DataFrame, label_a: str, label_b: str) -> alt.Chart:
    """Per class, the samples only A gets right (left, negative) and only B (right). by_class columns: class,
    A, B."""
    long = pd.concat([by_class.assign(run=label_a, n=-by_class["A"]), by_class.assign(run=label_b, n=by_class["B"])])
    return (
        alt.Chart(long).mark_bar().encode(
            y=alt.Y("class:N", sort=list(by_class["class"]), title=None, axis=_ALL_LABELS),
            x=alt.X("n:Q", title=f"← only {label_a} right · only {label_b} right → (samples)",
                    axis=alt.Axis(labelExpr="abs(datum.value)", tickMinStep=1, format="d")),
            color=alt.Color("run:N", title=None, scale=alt.Scale(domain=[label_a, label_b],
                                                                  range=[_BASE_COLOURS[0], _BASE_COLOURS[1]]),
                            legend=alt.Legend(orient="top", labelLimit=0, columns=1)),
            tooltip=["class:N", "run:N", alt.Tooltip("n:Q", title="samples")])
        .properties(height=140 + 28 * len(by_class))
    )


def disagreement_stream(over: pd.DataFrame, label_a: str, label_b: str) -> alt.Chart:
    """Samples only A / only B gets right per window of the stream. over columns: position, winner, n."""
    data = over.assign(run=over["winner"].map({"A": label_a, "B": label_b}))
    return (
        alt.Chart(data).mark_line(point=True).encode(
            x=alt.X("position:Q", title="stream position (end of window)", axis=alt.Axis(format="d")),
            y=alt.Y("n:Q", title="samples only this run gets right", axis=alt.Axis(tickMinStep=1, format="d")),
            color=alt.Color("run:N", title=None, scale=alt.Scale(domain=[label_a, label_b],
                                                                  range=[_BASE_COLOURS[0], _BASE_COLOURS[1]]),
                            legend=alt.Legend(orient="top", labelLimit=0, columns=1)),
            tooltip=["run:N", "position:Q", "n:Q"])
        .properties(height=260)
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
        .properties(height=90 + ROW_PX * int(timing["series"].nunique()), title="time per stage")
    )


def peak_memory(memory: pd.DataFrame) -> alt.Chart:
    """Peak memory per configuration. memory columns: series, peak_mem_mb."""
    return (
        alt.Chart(memory)
        .mark_bar()
        .encode(
            y=alt.Y("series:N", title=None, axis=_ALL_LABELS),
            x=alt.X("peak_mem_mb:Q", title="the trial's own peak memory (MB, mean over runs)"),
            tooltip=["series:N", alt.Tooltip("peak_mem_mb:Q", format=".1f")],
        )
        .properties(height=90 + ROW_PX * int(memory["series"].nunique()), title="peak memory")
    )


def cost_tradeoff(points: pd.DataFrame, series_methods: dict[str, str], metric_label: str, cost: str,
                  cost_title: str) -> alt.Chart:
    """The metric against one cost per configuration (the BCA paper's Table 3 as a chart): a dot per series at its
    mean cost (log axis: costs span decades) and mean metric. points columns: series, mean, n and `cost`."""
    data = points.dropna(subset=[cost])
    data = data[data[cost] > 0]
    return (
        alt.Chart(data).mark_point(filled=True, size=90).encode(
            x=alt.X(f"{cost}:Q", title=cost_title, scale=alt.Scale(type="log")),
            y=alt.Y("mean:Q", title=metric_label, scale=alt.Scale(zero=False)),
            color=alt.Color("series:N", title="configuration", scale=family_colours(series_methods),
                            legend=alt.Legend(orient="right", labelLimit=0, symbolLimit=0)),
            tooltip=["series:N", alt.Tooltip("mean:Q", format=".2f"), alt.Tooltip(f"{cost}:Q", format=".4g"), "n:Q"])
        .properties(height=_legend_height(data["series"].nunique()), title=f"{metric_label} against {cost_title}")
    )
