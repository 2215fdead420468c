"""The statistics of orchestrator.results.stats against scipy, on hand cases and random ones, in numpy and SQL."""

import math

import duckdb
import numpy as np
import pytest
from scipy import stats as sps

from orchestrator.results import stats


@pytest.mark.parametrize(("helped", "hurt", "expected"), [
    (0, 0, 1.0),        # no discordant sample: no evidence either way
    (5, 5, 1.0),
    (3, 0, 0.25),       # 2 * 0.5**3
    (0, 6, 0.03125),    # 2 * 0.5**6
    (10, 2, 2 * sum(math.comb(12, i) for i in range(3)) / 2 ** 12),
])
def test_mcnemar_by_hand(helped, hurt, expected):
    assert stats.mcnemar_p(helped, hurt) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_is_scipys_binomial_test_on_random_counts():
    rng = np.random.default_rng(0)
    for _ in range(300):
        m = int(rng.integers(1, 5000))
        b = int(rng.binomial(m, rng.uniform(0.3, 0.7)))
        assert stats.mcnemar_p(b, m - b) == pytest.approx(sps.binomtest(b, m, 0.5).pvalue, rel=1e-9, abs=1e-300)


def test_t_distribution_matches_scipy():
    rng = np.random.default_rng(1)
    for _ in range(200):
        df = float(rng.integers(1, 400))
        t = float(rng.normal(0, 4))
        assert stats.t_two_sided_p(t, df) == pytest.approx(2 * sps.t.sf(abs(t), df), rel=1e-9, abs=1e-300)
    for df in (1, 2, 4, 9, 29, 1000):
        assert stats.t_quantile(0.975, df) == pytest.approx(sps.t.ppf(0.975, df), rel=1e-10)


def test_t_test_and_interval_across_runs_match_scipy():
    rng = np.random.default_rng(2)
    for k in (3, 5, 20):
        gains = rng.normal(0.01, 0.02, k)
        got = stats.across_runs(gains, [0] * k, [0] * k, [1] * k)
        ref = sps.ttest_1samp(gains, 0.0)
        ci = ref.confidence_interval(0.95)
        assert got.test == stats.T_TEST and got.runs == k
        assert got.p == pytest.approx(ref.pvalue, rel=1e-9)
        assert (got.ci_low, got.ci_high) == pytest.approx((ci.low, ci.high), rel=1e-9)


def test_too_few_runs_fall_back_to_pooled_mcnemar():
    got = stats.across_runs([0.02, 0.04], [30, 50], [10, 10], [1000, 1000])
    assert got.test == stats.POOLED_MCNEMAR
    assert got.p == pytest.approx(sps.binomtest(80, 100).pvalue, rel=1e-9)
    assert (got.ci_low, got.ci_high) == stats.bootstrap_gain_ci(80, 20, 2000)


def test_holm_by_hand_and_against_the_definition():
    # sorted 0.01, 0.02, 0.04 with m = 3: 0.03, 0.04, max(0.04, 0.04) -> in the original order
    assert stats.holm([0.04, 0.01, math.nan, 0.02]).tolist()[:2] == pytest.approx([0.04, 0.03])
    adjusted = stats.holm([0.04, 0.01, math.nan, 0.02])
    assert math.isnan(adjusted[2]) and adjusted[3] == pytest.approx(0.04)
    assert stats.holm([0.5, 0.9]).tolist() == [1.0, 1.0]


def _row_bootstrap(diff, resamples, seed):
    """The plain reference: resample the rows' paired differences with replacement."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diff), size=(resamples, len(diff)))
    return diff[idx].mean(axis=1)


def test_count_bootstrap_has_the_row_bootstraps_distribution():
    # n = 6 rows, 2 helped, 1 hurt: the resampled gain (H - U) / 6 with (H, U, rest) ~ Multinomial(6, (2, 1, 3)/6);
    # its exact distribution, from enumeration, against both bootstraps' frequencies.
    n, b, c = 6, 2, 1
    exact: dict[int, float] = {}
    for h in range(n + 1):
        for u in range(n + 1 - h):
            pmf = math.factorial(n) / (math.factorial(h) * math.factorial(u) * math.factorial(n - h - u)) \
                * (b / n) ** h * (c / n) ** u * ((n - b - c) / n) ** (n - h - u)
            exact[h - u] = exact.get(h - u, 0.0) + pmf
    resamples = 200_000
    rows = np.array([1, 1, -1, 0, 0, 0], dtype=np.float64)
    row_draws = np.round(_row_bootstrap(rows, resamples, 3) * n).astype(int)
    rng = np.random.default_rng([stats.BOOTSTRAP_SEED, b, c, n])
    counts = rng.multinomial(n, [b / n, c / n, (n - b - c) / n], size=resamples)
    count_draws = counts[:, 0] - counts[:, 1]
    for draws in (row_draws, count_draws):
        for value, p in exact.items():
            freq = float((draws == value).mean())
            assert abs(freq - p) <= 5 * math.sqrt(p * (1 - p) / resamples) + 1e-12, (value, freq, p)


@pytest.mark.parametrize("seed", range(4))
def test_bootstrap_interval_matches_the_row_bootstrap_and_scipy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(200, 800))
    diff = rng.choice([-1.0, 0.0, 1.0], size=n, p=[0.1, 0.75, 0.15])
    b, c = int((diff > 0).sum()), int((diff < 0).sum())
    lo, hi = stats.bootstrap_gain_ci(b, c, n)
    row = np.percentile(_row_bootstrap(diff, stats.BOOTSTRAP_RESAMPLES, seed + 10), [2.5, 97.5])
    ref = sps.bootstrap((diff,), np.mean, n_resamples=stats.BOOTSTRAP_RESAMPLES, method="percentile",
                        rng=np.random.default_rng(seed + 20)).confidence_interval
    # three Monte Carlo estimates of the same percentiles: they agree within a few of the draws' standard errors
    se = diff.std() / math.sqrt(n) * 0.05
    for other in (row, (ref.low, ref.high)):
        assert abs(lo - other[0]) < 4 * se + 1 / n and abs(hi - other[1]) < 4 * se + 1 / n
    assert lo < (b - c) / n < hi
    assert stats.bootstrap_gain_ci(b, c, n) == (lo, hi)  # seeded: reproducible


def test_sql_functions_are_the_numpy_ones():
    con = duckdb.connect(":memory:")
    stats.register(con)
    rows = [(12, 3, 400), (0, 0, 10), (7, 7, 50), (250, 190, 5000)]
    con.execute("CREATE TABLE t (helped BIGINT, hurt BIGINT, n BIGINT)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", rows + [(None, 1, 3)])
    got = con.execute("SELECT bca_mcnemar_p(helped, hurt), bca_gain_ci_low(helped, hurt, n), "
                      "bca_gain_ci_high(helped, hurt, n) FROM t").fetchall()
    for (b, c, n), (p, lo, hi) in zip(rows, got):
        assert p == stats.mcnemar_p(b, c)
        assert (lo, hi) == stats.bootstrap_gain_ci(b, c, n)
    assert got[-1] == (None, None, None)
    t = con.execute("SELECT bca_t_test_p(0.01, 0.02, 5), bca_t_halfwidth(0.02, 5), bca_t_test_p(0.01, NULL, 5), "
                    "bca_t_halfwidth(0.02, 1)").fetchone()
    assert t[:2] == (stats.t_test_p(0.01, 0.02, 5), stats.t_halfwidth(0.02, 5)) and t[2:] == (None, None)


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="helped must be a count"):
        stats.mcnemar_p(-1, 3)
    with pytest.raises(ValueError, match=r"helped \+ hurt \(5 \+ 6\) must be at most n = 10"):
        stats.gain(5, 6, 10)


def test_stats_benchmark_quick_run_prints_agreeing_rows(capsys):
    from benchmarks import stats as benchmark

    benchmark.main(["--quick"])
    rows = [line.strip("|").split("|") for line in capsys.readouterr().out.splitlines()
            if line.startswith("|") and line.split("|")[1].strip()[:1].isdigit()]
    assert [r[0].strip() for r in rows] == ["200", "400"]
    for n, *cells in rows:
        gap, step, se = float(cells[3]), 100 / int(n.replace(",", "")), float(cells[4])
        assert gap <= step + 4 * se, (n, cells)  # one grid step of the discrete gain plus Monte Carlo error
