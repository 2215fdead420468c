"""Gains with evidence on the dashboard: each tested cell of the paper tables shown, its gain over CLIP with its 95%
interval and significance after Holm's correction, as a table and an interval chart, and the two-run page's
McNemar table.

The numbers are the report's (`ReportTable.gain_evidence`): the same cells, intervals and Holm family as the
tables' stars, from the `paired` view and orchestrator.results.stats (docs/statistics.md).
"""

from __future__ import annotations

from typing import Sequence

import altair as alt
import pandas as pd

from orchestrator.results import report, stats

GAIN_COLUMNS = report.EVIDENCE_COLUMNS
TEST_NAMES = {stats.TWO_LEVEL: "runs and samples", stats.POOLED_MCNEMAR: "one run: exact McNemar"}


def gain_summary(tables: Sequence[report.ReportTable]) -> pd.DataFrame:
    """The tested cells of the tables, one row each (report.EVIDENCE_COLUMNS): series (the table's row), column
    (a dataset or an average), dataset (None for an average), runs (paired replicates), the mean gain over CLIP in
    points, its 95% interval, the test, p, p adjusted by Holm over the cell's table, and whether that is
    significant at stats.ALPHA: a cell is significant here exactly where its table stars it."""
    parts = [t.gain_evidence for t in tables if t.gain_evidence is not None and len(t.gain_evidence)]
    if not parts:
        return pd.DataFrame(columns=GAIN_COLUMNS)
    return pd.concat(parts, ignore_index=True)


def interval_text(gain: float, low: float, high: float) -> str:
    """A gain with its 95% interval as the tables show it: '+1.23 [+0.50, +1.96]'."""
    return f"{gain:+.2f} [{low:+.2f}, {high:+.2f}]"


def gain_text(summary: pd.DataFrame) -> pd.DataFrame:
    """The table as shown: gain [low, high], the test, p and Holm's p, and a ✓ where significant."""
    return pd.DataFrame({
        "backbone": summary["backbone"], "series": summary["series"], "dataset": summary["column"],
        "runs": summary["runs"],
        "gain over CLIP [95% interval]": [interval_text(g, lo, hi)
                                          for g, lo, hi in zip(summary["gain"], summary["low"], summary["high"])],
        "test": summary["test"].map(TEST_NAMES),
        "p": summary["p"].map(lambda v: f"{v:.3g}"), "p (Holm, per table)": summary["p_holm"].map(lambda v: f"{v:.3g}"),
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
