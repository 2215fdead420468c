"""The dashboard's gains with evidence: the table's numbers and significance column, the interval chart's data,
and the two-run page's McNemar table, against scipy on the same runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from streamlit.testing.v1 import AppTest

from dashboard import APP_PATH, RESULTS_ENV, charts, significance
from orchestrator.results import report, stats
from orchestrator.results.db import ResultsDB
from orchestrator.results.testing import make_fake_results
from stats_reference import rel_tolerance, two_level

GAIN_HEADER = "gain over CLIP [95% interval]"


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    """Two datasets outside the paper's tables: one method x dataset table with an Average column, so a table's
    Holm family holds its dataset and its average cells."""
    root = tmp_path_factory.mktemp("sig")
    runs = make_fake_results(root, datasets=("scene-a", "scene-b"),
                             methods={"clip": {}, "la": {}, "bca": {"tau": 0.3}, "tda": {}}, seeds=(1, 2, 3, 4), n=1500,
                             part_size=1500)
    return root, runs


def _diffs(runs, method, datasets):
    """Each run's per-sample difference to CLIP on the same seed and dataset, its seed and dataset."""
    out = []
    for r in runs:
        if r.config["method"] == method and r.config["dataset"] in datasets:
            clip = next(c for c in runs if c.config["method"] == "clip" and c.config["seed"] == r.config["seed"]
                        and c.config["dataset"] == r.config["dataset"])
            out.append((r.correct.astype(float) - clip.correct.astype(float), r.config["seed"], r.config["dataset"]))
    return out


def test_gain_summary_is_the_reference_with_holm_over_the_table(fake):
    root, runs = fake
    with ResultsDB(root) as db:
        tables = report.report_tables(db)
    gains = significance.gain_summary(tables)
    # la, bca and tda x (two datasets and their average), in the table's order; CLIP is the baseline
    assert len(gains) == 9 and set(gains["test"]) == {stats.TWO_LEVEL}
    assert list(dict.fromkeys(gains["series"])) == ["CLIP+LA", "BCA", "TDA"]
    assert list(gains["column"][:3]) == ["scene-a", "scene-b", "Average"]
    raw = []
    for _, row in gains.iterrows():
        datasets = ("scene-a", "scene-b") if row["column"] == "Average" else (row["column"],)
        d = _diffs(runs, row["method"], datasets)
        mean, low, high, p, df = two_level([x for x, _, _ in d], [s for _, s, _ in d], [ds for _, _, ds in d])
        tol = rel_tolerance(df)
        assert (row["gain"], row["low"], row["high"]) == pytest.approx((100 * mean, 100 * low, 100 * high), rel=tol)
        assert row["p"] == pytest.approx(p, rel=tol)
        raw.append(p)
    order = np.argsort(raw)
    holm = np.maximum.accumulate([min(1.0, (len(raw) - i) * raw[j]) for i, j in enumerate(order)])
    expected = np.empty(len(raw))
    expected[order] = holm
    assert gains["p_holm"].to_numpy() == pytest.approx(expected, rel=1e-6)
    assert (gains["significant"] == (gains["p_holm"] <= 0.05)).all()
    text = significance.gain_text(gains)
    assert text[GAIN_HEADER].iloc[0] == f"{gains['gain'][0]:+.2f} [{gains['low'][0]:+.2f}, {gains['high'][0]:+.2f}]"
    assert set(text["significant at 0.05"]) <= {"✓", ""}

    focus = gains[gains["dataset"] == "scene-a"]
    chart = significance.gain_intervals(focus, charts.family_colours(dict(zip(focus["series"], focus["method"]))))
    spec = chart.to_dict()
    data = next(pd.DataFrame(d) for d in spec["datasets"].values() if "gain" in d[0])
    assert {"low", "high", "gain", "significant"} <= set(data.columns)
    assert len(data) == 3 and data["low"].tolist() == focus["low"].tolist()
    assert [layer["mark"]["type"] for layer in spec["layer"]] == ["rule", "errorbar", "point"]


def test_mcnemar_table_by_hand():
    a = pd.Series([True, True, False, False, True, False, True])
    b = pd.Series([True, False, True, False, False, False, False])
    table, p = significance.mcnemar(a, b)
    assert table.values.tolist() == [[1, 3], [1, 2]]
    assert p == pytest.approx(sps.binomtest(3, 4).pvalue)


def _app(root: Path, monkeypatch, **params) -> AppTest:
    monkeypatch.setenv(RESULTS_ENV, str(root))
    at = AppTest.from_file(str(APP_PATH), default_timeout=180)
    for key, value in params.items():
        at.query_params[key] = value
    return at.run()


def _starred(text: pd.DataFrame, columns) -> set[tuple[str, str]]:
    return {(row["method"], col) for _, row in text.iterrows() for col in columns
            if isinstance(row.get(col), str) and row[col].endswith(report.SIGNIFICANT)}


def test_workbench_evidence_stars_the_cells_the_report_stars(fake, monkeypatch):
    """The first screen's ✓, the Evidence panel's ✓ and the Paper tables panel's stars are the report's stars: one
    Holm family per table, the averages included."""
    root, _ = fake
    with ResultsDB(root) as db:
        (table,) = report.report_tables(db)
    reported = _starred(table.formatted().reset_index(), table.columns)
    assert 0 < len(reported) < 9  # some cells are significant, not all

    first = _app(root, monkeypatch)
    assert not first.exception, [e.value for e in first.exception]
    overview = first.table[1].value  # under the comparison
    assert list(overview.columns) == ["backbone", "configuration", *table.columns]
    assert {(r["configuration"], c) for _, r in overview.iterrows() for c in table.columns
            if r[c].endswith("✓")} == reported

    at = _app(root, monkeypatch, panel="Evidence")
    assert not at.exception, [e.value for e in at.exception]
    evidence = [t.value for t in at.table if GAIN_HEADER in t.value.columns]
    assert len(evidence) == 1 and "significant at 0.05" in evidence[0].columns and len(evidence[0]) == 9
    shown = {(r["series"], r["dataset"]) for _, r in evidence[0].iterrows() if r["significant at 0.05"] == "✓"}
    assert shown == reported
    specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    assert any(layer.get("mark", {}).get("type") == "errorbar" and "low" in json.dumps(layer)
               for spec in specs for layer in spec.get("layer", [])
               if "gain over CLIP" in json.dumps(layer))

    papers = _app(root, monkeypatch, panel="Paper tables")
    assert not papers.exception, [e.value for e in papers.exception]
    legend = next(c.value for c in papers.caption if c.value.startswith(report.SIGNIFICANT))
    assert f"over this table's {len(evidence[0])} tested cells" in legend
    paper = next(t.value for t in papers.table if "Δ CLIP (Average)" in t.value.columns)
    assert _starred(paper, table.columns) == reported


def test_two_run_page_shows_mcnemar(fake, monkeypatch):
    root, runs = fake
    a, b = (next(r for r in runs if r.config["method"] == m and r.config["dataset"] == "scene-a"
                 and r.config["seed"] == 1) for m in ("bca", "clip"))
    at = _app(root, monkeypatch, page="Compare two runs", run_a=a.run_id, run_b=b.run_id)
    assert not at.exception, [e.value for e in at.exception]
    only_a, only_b = int((a.correct & ~b.correct).sum()), int((~a.correct & b.correct).sum())
    p = sps.binomtest(only_a, only_a + only_b).pvalue
    text = " ".join(m.value for m in at.markdown)
    assert f"McNemar's test** (exact, on the {only_a + only_b} samples only one run gets right): p = {p:.3g}" in text
    table = next(t.value for t in at.table if "B right" in t.value.columns)
    assert table.at["A right", "B wrong"] == only_a and table.at["A wrong", "B right"] == only_b
