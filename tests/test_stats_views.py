"""The statistics in the views, as a user reads them through `bca query`, against scipy on the same rows."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.results import stats
from orchestrator.results.db import ResultsDB
from orchestrator.results.testing import make_fake_results
from stats_reference import rel_tolerance, two_level

runner = CliRunner()


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    runs = make_fake_results(root, datasets=("imagenet", "dtd"),
                             methods={"clip": {}, "bca": {"tau": 0.3}, "tda": {}}, seeds=(1, 2, 3), n=400)
    return root, runs


def _query(root, sql):
    out = runner.invoke(app, ["query", sql, "--json", "--results", str(root)], env={"NO_COLOR": "1"})
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


def _pair(runs, run, baseline="clip"):
    return next(r for r in runs if r.config["method"] == baseline and r.config["seed"] == run.config["seed"]
                and r.config["dataset"] == run.config["dataset"])


def test_paired_view_equals_scipy_on_the_same_rows(fake):
    root, runs = fake
    rows = _query(root, "SELECT run_id, helped, hurt, p_mcnemar, gain_ci_low, gain_ci_high FROM paired")
    by_id = {r.run_id: r for r in runs}
    assert len(rows) == 2 * 2 * 3  # bca and tda, two datasets, three seeds
    for row in rows:
        run = by_id[row["run_id"]]
        clip = _pair(runs, run)
        diff = run.correct.astype(float) - clip.correct.astype(float)
        helped, hurt = int((diff > 0).sum()), int((diff < 0).sum())
        assert (row["helped"], row["hurt"]) == (helped, hurt)
        assert row["p_mcnemar"] == pytest.approx(sps.binomtest(helped, helped + hurt, 0.5).pvalue, rel=1e-12)
        # the count bootstrap is exactly the numpy definition, and scipy's row bootstrap on the rows agrees with
        # it within the Monte Carlo error of BOOTSTRAP_RESAMPLES draws
        lo, hi = stats.bootstrap_gain_ci(helped, hurt, len(diff))
        assert (row["gain_ci_low"], row["gain_ci_high"]) == pytest.approx((100 * lo, 100 * hi), rel=1e-12)
        ref = sps.bootstrap((diff,), np.mean, n_resamples=stats.BOOTSTRAP_RESAMPLES, method="percentile",
                            rng=np.random.default_rng(0)).confidence_interval
        tol = 100 * (4 * 0.05 * diff.std() / math.sqrt(len(diff)) + 1 / len(diff))
        assert abs(row["gain_ci_low"] - 100 * ref.low) < tol and abs(row["gain_ci_high"] - 100 * ref.high) < tol


def _diffs(runs, mine, baseline="clip"):
    return [r.correct.astype(float) - _pair(runs, r, baseline).correct.astype(float) for r in mine]


def test_summary_gain_across_runs_is_the_reference_on_the_same_rows(fake):
    root, runs = fake
    rows = _query(root, "SELECT method, dataset, gain_runs, paired_gain, gain_ci_low, gain_ci_high, gain_p, gain_test "
                        "FROM summary WHERE method <> 'clip'")
    assert len(rows) == 4
    for row in rows:
        mine = [r for r in runs if r.config["method"] == row["method"] and r.config["dataset"] == row["dataset"]]
        mean, low, high, p, df = two_level(_diffs(runs, mine))
        tol = rel_tolerance(df)
        assert (row["gain_runs"], row["gain_test"]) == (3, stats.TWO_LEVEL)
        assert row["paired_gain"] == pytest.approx(100 * mean, rel=1e-12)
        assert row["gain_p"] == pytest.approx(p, rel=tol)
        assert (row["gain_ci_low"], row["gain_ci_high"]) == pytest.approx((100 * low, 100 * high), rel=tol)


def test_gains_against_any_baseline_and_the_one_run_fallback(fake, tmp_path):
    root, runs = fake
    rows = _query(root, "SELECT s.method, s.dataset, g.* FROM summary s JOIN gains_against('tda') g USING (group_id)")
    assert {(r["method"], r["baseline"]) for r in rows} == {("bca", "tda"), ("clip", "tda")}
    for row in rows:
        mine = [r for r in runs if r.config["method"] == row["method"] and r.config["dataset"] == row["dataset"]]
        _, _, _, p, df = two_level(_diffs(runs, mine, "tda"))
        assert row["gain_p"] == pytest.approx(p, rel=rel_tolerance(df))
    # one seed has no spread across runs: that run's exact McNemar and bootstrap interval
    one = make_fake_results(tmp_path, methods={"clip": {}, "bca": {"tau": 0.3}}, seeds=(1,), n=300)
    with ResultsDB(tmp_path) as db:
        got = db.df("SELECT gain_runs, gain_p, gain_test, gain_ci_low, gain_ci_high FROM summary "
                    "WHERE method = 'bca'").iloc[0]
    bca = next(r for r in one if r.config["method"] == "bca")
    helped = int((bca.correct & ~_pair(one, bca).correct).sum())
    hurt = int((~bca.correct & _pair(one, bca).correct).sum())
    assert (got["gain_runs"], got["gain_test"]) == (1, stats.POOLED_MCNEMAR)
    assert got["gain_p"] == pytest.approx(sps.binomtest(helped, helped + hurt).pvalue, rel=1e-12)
    lo, hi = stats.bootstrap_gain_ci(helped, hurt, 300)
    assert (got["gain_ci_low"], got["gain_ci_high"]) == pytest.approx((100 * lo, 100 * hi))


def test_misaligned_runs_get_no_statistics(tmp_path):
    from orchestrator.results.writer import RunWriter

    base = {"sweep": "s", "backbone": "RN50", "pretrained": None, "dataset": "dtd", "seed": 1,
            "templates": "ensemble7", "num_templates": 1, "views": "1"}
    for method, ids in (("clip", ["a", "b", "c"]), ("bca", ["a", "c", "b"])):
        writer = RunWriter(tmp_path, {**base, "method": method, "hparams": {"tau": 0.3} if method == "bca" else {}})
        writer.mark("running", n_samples=3)
        writer.write_part(0, {"image_id": ids, "label": [0, 0, 0], "pred": [0, 1, 0], "confidence": [0.9] * 3})
        writer.mark("finished", n_samples=3)
    with ResultsDB(tmp_path) as db:
        row = db.df("SELECT misaligned, gain, gain_ci_low, p_mcnemar FROM paired").iloc[0]
    assert row["misaligned"] == 2 and all(math.isnan(row[c]) for c in ("gain", "gain_ci_low", "p_mcnemar"))


def _holm(p):
    """Holm by its definition: the i-th smallest of m p-values times (m - i), kept non-decreasing, capped at 1."""
    order = np.argsort(p)
    out, running = np.empty(len(p)), 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (len(p) - i) * p[j]))
        out[j] = running
    return out


@pytest.fixture(scope="module")
def strong(tmp_path_factory):
    """Longer streams and five seeds: gains of a few points are significant here."""
    root = tmp_path_factory.mktemp("strong")
    runs = make_fake_results(root, datasets=("imagenet", "dtd"), methods={"clip": {}, "bca": {"tau": 0.3}, "tda": {}},
                             seeds=(1, 2, 3, 4, 5), n=3000, part_size=3000)
    return root, runs


def test_report_marks_cells_significant_after_holm_with_a_legend_and_intervals(strong):
    from dashboard import export
    from orchestrator.results import report

    root, runs = strong
    with ResultsDB(root) as db:
        tables = report.report_tables(db)
    tested = [(t, key, col) for t in tables for key in t.mean.index for col in t.columns
              if key[1] != "CLIP" and t.n.at[key, col] > 0 and col in ("ImageNet", "DTD")]
    assert len(tested) == 4
    raw = {}
    for t, key, col in tested:
        dataset = {"ImageNet": "imagenet", "DTD": "dtd"}[col]
        mine = [r for r in runs if r.config["dataset"] == dataset and report.registry.method_label(r.config["method"])
                == key[1]]
        raw[(id(t), key, col)] = two_level(_diffs(runs, mine))
    for t in tables:
        cells = [(key, col) for tt, key, col in tested if tt is t]
        expected = _holm(np.array([raw[(id(t), k, c)][3] for k, c in cells]))
        text, numbers = t.formatted(), t.to_frame()
        for (key, col), p in zip(cells, expected):
            _, low, high, _, df = raw[(id(t), key, col)]
            assert t.p_holm.at[key, col] == pytest.approx(p, rel=rel_tolerance(df))
            assert text.at[key, col].endswith(report.SIGNIFICANT) == (p <= 0.05)
            assert (numbers.at[key, f"Δ CLIP ({col}) low"], numbers.at[key, f"Δ CLIP ({col}) high"]) == \
                pytest.approx((100 * low, 100 * high), rel=rel_tolerance(df))
        legend = [n for n in t.notes if n.startswith(report.SIGNIFICANT)]
        assert legend == [f"* gain over CLIP significant at 0.05 after Holm's correction over this table's "
                          f"{len(t.gain_evidence)} tested cells; [low, high]: its 95% interval over runs and test "
                          "samples (docs/statistics.md)"]
    assert any(t.p_holm.le(0.05).any().any() for t in tables)  # the fake methods differ: some cell is marked
    # the interval goes into the Markdown and LaTeX exports with the text
    generic = report.method_dataset_table(root)
    text = generic.formatted()
    assert any("[" in cell and "]" in cell for cell in text["Δ CLIP (Average)"])
    assert "[" in export.to_markdown(text) and "[" in export.to_latex(text)


def test_bca_report_prints_the_marker_legend(strong):
    out = runner.invoke(app, ["report", "--results", str(strong[0])], env={"NO_COLOR": "1", "COLUMNS": "300"})
    assert out.exit_code == 0, out.output
    assert "* gain over CLIP significant at 0.05 after Holm's correction" in out.output
    assert "[low, high]: its 95% interval" in out.output
    assert re.search(r"\d\.\d\d( ± \d+\.\d\d)?( \(n=[^)]*\))?\*", out.output)  # a marked cell (after its evidence)


def test_the_statistics_docs_queries_run_as_written(fake):
    root, _ = fake
    doc = (Path(__file__).resolve().parents[1] / "docs" / "statistics.md").read_text()
    queries = [line for block in re.findall(r"```sql\n(.*?)```", doc, re.S) for line in block.splitlines() if line]
    assert len(queries) == 4
    for sql in queries:
        assert _query(root, sql), sql  # each returns rows on these results


def test_the_statistics_docs_compare_dry_run_runs(tmp_path):
    out = runner.invoke(app, ["compare", "bca", "--dry-run", "--results", str(tmp_path / "r")])
    assert out.exit_code == 0 and "sweep compare-bca (dry run: nothing is run or written)" in out.output, out.output


def test_report_does_not_star_identical_runs_of_a_few_discordant_samples(tmp_path):
    # three seeds on which BCA gets the same 5 of 200 samples right that CLIP gets wrong, and no other difference:
    # zero spread across the runs (a t-test across them: p = 0 and [+2.50, +2.50]), a gain of 5 samples
    from orchestrator.results.writer import RunWriter

    n = 200
    clip = np.arange(n) % 2 == 0
    method = clip.copy()
    method[[1, 3, 5, 7, 9]] = True
    for seed in (1, 2, 3):
        for name, correct in (("clip", clip), ("bca", method)):
            config = {"sweep": "s", "backbone": "RN50", "pretrained": None, "dataset": "scene", "seed": seed,
                      "templates": "ensemble7", "num_templates": 1, "views": "1", "method": name,
                      "hparams": {"tau": 0.3} if name == "bca" else {}}
            writer = RunWriter(tmp_path, config)
            writer.mark("running", n_samples=n)
            writer.write_part(0, {"image_id": [f"img{i}" for i in range(n)], "label": [0] * n,
                                  "pred": np.where(correct, 0, 1).tolist(), "confidence": [0.9] * n})
            writer.mark("finished", n_samples=n)
    out = runner.invoke(app, ["report", "--results", str(tmp_path)], env={"NO_COLOR": "1", "COLUMNS": "300"})
    assert out.exit_code == 0, out.output
    row = next(line for line in out.output.splitlines() if "BCA" in line)
    assert "*" not in row
    low, high = map(float, re.search(r"\+2\.50 \(n=3\) \[([-+]\d+\.\d+), ([-+]\d+\.\d+)\]", row).groups())
    # the continuity-corrected McNemar test of one run: (5 - 1) / sqrt(5) = 1.79 standard errors, p = 0.07
    se, delta = 100 * math.sqrt(5) / n, 100 / n
    assert (low, high) == pytest.approx((2.5 - 1.96 * se - delta, 2.5 + 1.96 * se + delta), abs=0.006)
    assert low < 0 < high
