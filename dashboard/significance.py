"""Gains with evidence on the dashboard: each series' gain over CLIP with its 95% interval and a Holm-corrected
significance column, as a table and an interval chart, and the two-run page's McNemar table.

The numbers come from the `paired` view (each run against CLIP on the same samples in the same order) and
orchestrator.results.stats, the definitions the report and `bca query` use (docs/statistics.md).
"""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from orchestrator import registry
from orchestrator.results import stats
from orchestrator.results.db import ResultsDB

GAIN_COLUMNS = ["series", "method", "dataset", "runs", "gain", "low", "high", "test", "p", "p_holm", "significant"]


def gain_summary(db: ResultsDB, runs: pd.DataFrame, labels: pd.Series) -> pd.DataFrame:
    """Per series and dataset of the finished runs shown: runs paired with CLIP (both finished and complete),
    mean gain over CLIP in points, its 95% interval, the test and its p-value, Holm-adjusted over the rows, and
    whether that is significant at stats.ALPHA."""
    done = runs.assign(series=labels.values)
    done = done[(done["status"] == "finished") & done["complete"].fillna(False).astype(bool)]
    pairs = db.paired_gains()
    finished = set(db.sql("SELECT run_id FROM accuracy WHERE status = 'finished' AND complete")["run_id"]
                   .to_pylist())
    # a set lookup per pair: Series.isin over 10^5 Arrow strings costs seconds
    pairs = pairs[np.array([b in finished for b in pairs["baseline_run"].to_numpy(dtype=object)], dtype=bool)]
    paired = done[["run_id", "series", "method", "dataset"]].merge(pairs, on="run_id")
    rows = []
    # arrays taken once, each group's runs by position (a frame per group costs a study's page a second); the
    # rows are sorted below on keys that tell every row apart, so the groups' order does not matter
    gain, helped, hurt, n = (paired[c].to_numpy() for c in ("gain", "helped", "hurt", "n"))
    methods = paired["method"].to_numpy(dtype=object)
    for (series, dataset), at in paired.groupby(["series", "dataset"], sort=False).indices.items():
        s = stats.across_runs(gain[at] / 100, helped[at], hurt[at], n[at])
        rows.append({"series": series, "method": methods[at[0]], "dataset": dataset, "runs": s.runs,
                     "gain": 100 * s.mean, "low": 100 * s.ci_low, "high": 100 * s.ci_high, "test": s.test, "p": s.p})
    out = pd.DataFrame(rows, columns=GAIN_COLUMNS)
    if not out.empty:
        rank = out["method"].map(registry.method_rank)
        out = out.assign(rank=rank).sort_values(["rank", "series", "dataset"], kind="stable").drop(columns="rank")
        out = out.reset_index(drop=True)
        out["p_holm"] = stats.holm(out["p"].to_numpy())
        out["significant"] = out["p_holm"] <= stats.ALPHA
    return out


def interval_text(gain: float, low: float, high: float) -> str:
    """A gain with its 95% interval as the tables show it: '+1.23 [+0.50, +1.96]'."""
    return f"{gain:+.2f} [{low:+.2f}, {high:+.2f}]"


def gain_text(summary: pd.DataFrame) -> pd.DataFrame:
    """The table as shown: gain [low, high], the test, p and Holm's p, and a ✓ where significant."""
    return pd.DataFrame({
        "series": summary["series"], "dataset": summary["dataset"], "runs": summary["runs"],
        "gain over CLIP [95% interval]": [interval_text(g, lo, hi)
                                          for g, lo, hi in zip(summary["gain"], summary["low"], summary["high"])],
        "test": summary["test"].map({stats.T_TEST: "t across runs", stats.POOLED_MCNEMAR: "pooled McNemar"}),
        "p": summary["p"].map(lambda v: f"{v:.3g}"), "p (Holm)": summary["p_holm"].map(lambda v: f"{v:.3g}"),
        f"significant at {stats.ALPHA:g}": summary["significant"].map(lambda b: "✓" if b else ""),
    })


def gain_intervals(summary: pd.DataFrame, colours: alt.Scale) -> alt.LayerChart:
    """Each series' gain over CLIP on one dataset: a dot at the mean and a bar over its 95% interval, filled when
    significant after Holm, against a rule at 0 (CLIP)."""
    data = summary.assign(verdict=summary["significant"].map({True: "significant", False: "not significant"}))
    y = alt.Y("series:N", sort=list(summary["series"]), title=None, axis=alt.Axis(labelLimit=0))
    x_title = "gain over CLIP, accuracy points (95% interval)"
    tooltip = ["series:N", alt.Tooltip("gain:Q", format="+.2f"), alt.Tooltip("low:Q", format="+.2f"),
               alt.Tooltip("high:Q", format="+.2f"), "test:N", alt.Tooltip("p_holm:Q", format=".3g"), "verdict:N"]
    bars = alt.Chart(data).mark_errorbar(thickness=2).encode(
        y=y, x=alt.X("low:Q", title=x_title), x2="high:Q", color=alt.Color("series:N", scale=colours, legend=None))
    dots = alt.Chart(data).mark_point(size=90).encode(
        y=y, x=alt.X("gain:Q", title=x_title, scale=alt.Scale(zero=False)),
        color=alt.Color("series:N", scale=colours, legend=None),
        fill=alt.condition("datum.significant", alt.Color("series:N", scale=colours, legend=None),
                           alt.value("white")),
        tooltip=tooltip)
    zero = alt.Chart(pd.DataFrame({"x": [0.0]})).mark_rule(strokeDash=[4, 4], color="gray").encode(x="x:Q")
    return alt.layer(zero, bars, dots).properties(height=60 + 26 * len(summary))


def mcnemar(correct_a: pd.Series, correct_b: pd.Series) -> tuple[pd.DataFrame, float]:
    """The 2x2 table of two runs on the same samples (rows: A right / wrong, columns: B right / wrong) and the
    exact McNemar p-value of its discordant cells."""
    a, b = correct_a.astype(bool), correct_b.astype(bool)
    table = pd.DataFrame({"B right": [int((a & b).sum()), int((~a & b).sum())],
                          "B wrong": [int((a & ~b).sum()), int((~a & ~b).sum())]}, index=["A right", "A wrong"])
    return table, stats.mcnemar_p(int(table.at["A right", "B wrong"]), int(table.at["A wrong", "B right"]))
