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

from dashboard import APP_PATH, RESULTS_ENV, charts, queries, significance
from orchestrator.results.db import ResultsDB
from orchestrator.results.testing import make_fake_results

GAIN_HEADER = "gain over CLIP [95% interval]"


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    root = tmp_path_factory.mktemp("sig")
    runs = make_fake_results(root, datasets=("dtd", "eurosat"), methods={"clip": {}, "bca": {"tau": 0.3}, "tda": {}},
                             seeds=(1, 2, 3, 4), n=1500, part_size=1500)
    return root, runs


def _expected(runs, method, dataset):
    def acc(m):
        return np.array([r.accuracy for r in sorted(runs, key=lambda r: r.config["seed"])
                         if r.config["method"] == m and r.config["dataset"] == dataset])
    return sps.ttest_rel(acc(method), acc("clip")), (acc(method) - acc("clip")).mean()


def test_gain_summary_is_scipys_paired_test_with_holm(fake):
    root, runs = fake
    with ResultsDB(root) as db:
        acc = queries.accuracy_runs(db)
        gains = significance.gain_summary(db, acc, queries.series_labels(acc, db.hparam_names))
    assert len(gains) == 4 and set(gains["test"]) == {"t"}  # bca, tda x two datasets; CLIP is the baseline
    raw = []
    for _, row in gains.iterrows():
        ref, mean = _expected(runs, row["method"], row["dataset"])
        ci = ref.confidence_interval(0.95)
        assert (row["gain"], row["low"], row["high"]) == pytest.approx((mean, ci.low, ci.high), rel=1e-9)
        assert row["p"] == pytest.approx(ref.pvalue, rel=1e-9)
        raw.append(ref.pvalue)
    order = np.argsort(raw)
    holm = np.maximum.accumulate([min(1.0, (len(raw) - i) * raw[j]) for i, j in enumerate(order)])
    expected = np.empty(len(raw))
    expected[order] = holm
    assert gains["p_holm"].to_numpy() == pytest.approx(expected, rel=1e-9)
    assert (gains["significant"] == (gains["p_holm"] <= 0.05)).all()
    text = significance.gain_text(gains)
    assert text[GAIN_HEADER].iloc[0] == f"{gains['gain'][0]:+.2f} [{gains['low'][0]:+.2f}, {gains['high'][0]:+.2f}]"
    assert set(text["significant at 0.05"]) <= {"✓", ""}

    chart = significance.gain_intervals(gains[gains["dataset"] == "dtd"],
                                        charts.family_colours({s: m for s, m in zip(gains["series"], gains["method"])}))
    spec = chart.to_dict()
    data = next(pd.DataFrame(d) for d in spec["datasets"].values() if "gain" in d[0])
    assert {"low", "high", "gain", "significant"} <= set(data.columns) and len(data) == 2
    assert data["low"].tolist() == gains[gains["dataset"] == "dtd"]["low"].tolist()
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


def test_workbench_shows_the_gain_table_and_interval_chart(fake, monkeypatch):
    root, _ = fake
    at = _app(root, monkeypatch, panel="Evidence")
    assert not at.exception, [e.value for e in at.exception]
    tables = [t.value for t in at.table if GAIN_HEADER in t.value.columns]
    assert len(tables) == 1 and len(tables[0]) == 4 and "significant at 0.05" in tables[0].columns
    specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    assert any(layer.get("mark", {}).get("type") == "errorbar" and "low" in json.dumps(layer)
               for spec in specs for layer in spec.get("layer", [])
               if "gain over CLIP" in json.dumps(layer))


def test_two_run_page_shows_mcnemar(fake, monkeypatch):
    root, runs = fake
    a = next(r for r in runs if r.config["method"] == "bca" and r.config["dataset"] == "dtd" and r.config["seed"] == 1)
    b = next(r for r in runs if r.config["method"] == "clip" and r.config["dataset"] == "dtd" and r.config["seed"] == 1)
    at = _app(root, monkeypatch, page="Compare two runs", run_a=a.run_id, run_b=b.run_id)
    assert not at.exception, [e.value for e in at.exception]
    only_a, only_b = int((a.correct & ~b.correct).sum()), int((~a.correct & b.correct).sum())
    p = sps.binomtest(only_a, only_a + only_b).pvalue
    text = " ".join(m.value for m in at.markdown)
    assert f"McNemar's test** (exact, on the {only_a + only_b} samples only one run gets right): p = {p:.3g}" in text
    table = next(t.value for t in at.table if "B right" in t.value.columns)
    assert table.at["A right", "B wrong"] == only_a and table.at["A wrong", "B right"] == only_b
