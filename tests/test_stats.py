"""The statistics of orchestrator.results.stats against scipy, on hand cases and random ones, in numpy and SQL."""

import math

import duckdb
import numpy as np
import pytest
from scipy import stats as sps

from orchestrator.results import stats
from stats_reference import rel_tolerance, two_level


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
        df = float(rng.uniform(1, 400))  # Satterthwaite's degrees of freedom are any real
        t = float(rng.normal(0, 4))
        assert stats.t_two_sided_p(t, df) == pytest.approx(2 * sps.t.sf(abs(t), df), rel=1e-9, abs=1e-300)
    for df in (1, 1.3, 2, 4, 9, 29.5, 1000, 1e5):
        assert stats.t_quantile(0.975, df) == pytest.approx(sps.t.ppf(0.975, df), rel=1e-10)
    # from NORMAL_DF on, the normal: within the two distributions' difference there
    for df in (stats.NORMAL_DF, 1e9, math.inf):
        for t in (0.5, 2.0, 4.0):
            ref = 2 * sps.t.sf(t, df)
            assert stats.t_two_sided_p(t, df) == pytest.approx(ref, rel=rel_tolerance(df, t))
        assert stats.t_quantile(0.975, df) == pytest.approx(sps.t.ppf(0.975, df), rel=rel_tolerance(df, 2.0))


def _runs(helped, hurt, n):
    """Per-sample paired differences of runs with these counts (their order within a run does not matter)."""
    return [np.array([1] * b + [-1] * c + [0] * (m - b - c), dtype=float) for b, c, m in zip(helped, hurt, n)]


def test_identical_runs_of_a_few_discordant_samples_are_not_significant():
    # the demo's CLIP+LA: three orders, each losing one sample out of 4,000 (helped/hurt 6/7, 6/7, 5/6); and three
    # identical runs that each gain 5 samples. A t-test across the runs saw zero spread: p = 0, a zero-width interval
    for helped, hurt in (([6, 6, 5], [7, 7, 6]), ([5, 5, 5], [0, 0, 0])):
        got = stats.across_runs(helped, hurt, [4000] * 3)
        assert got.test == stats.TWO_LEVEL and got.p > 0.05 and got.ci_low < 0 < got.ci_high
        assert got.ci_high - got.ci_low > 2 / 4000  # wider than one sample changing sides
    # zero spread: the samples' noise alone, which is the continuity-corrected McNemar test of one run (Edwards)
    for b, c in ((5, 0), (6, 7), (20, 8), (130, 90)):
        got = stats.across_runs([b] * 3, [c] * 3, [4000] * 3)
        chi2 = max(0, abs(b - c) - 1) ** 2 / (b + c)
        assert got.p == pytest.approx(sps.chi2.sf(chi2, 1), rel=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_across_runs_is_the_reference_computed_from_the_rows(seed):
    rng = np.random.default_rng(seed)
    k, sets = int(rng.integers(2, 7)), int(rng.integers(1, 4))
    replicate, test_set, diffs = [], [], []
    for r in range(k):
        for s in range(sets):
            for _ in range(int(rng.integers(1, 3))):  # now and then two runs of one (seed, order): two sweeps
                n = int(rng.integers(50, 3000))
                p_help, p_hurt = rng.uniform(0, 0.2, 2)
                diffs.append(rng.choice([1.0, -1.0, 0.0], size=n, p=[p_help, p_hurt, 1 - p_help - p_hurt]))
                replicate.append(("seed", r))
                test_set.append(f"dataset {s}")
    helped = [int((d > 0).sum()) for d in diffs]
    hurt = [int((d < 0).sum()) for d in diffs]
    got = stats.across_runs(helped, hurt, [len(d) for d in diffs], replicate, test_set)
    mean, low, high, p, df = two_level(diffs, replicate, test_set)
    tol = rel_tolerance(df)
    assert got.runs == k and got.test == stats.TWO_LEVEL
    assert (got.mean, got.ci_low, got.ci_high) == pytest.approx((mean, low, high), rel=tol, abs=1e-15)
    assert got.p == pytest.approx(p, rel=tol, abs=1e-300)


def _coverage(order_share: float, configurations: int, seed: int) -> tuple[float, float]:
    """How often the 95% intervals of configurations of 3 orders on one test set of 300 samples cover the mean
    gain over test sets and orders: across_runs, and the t interval across the runs alone. A sample is helped
    (5%), hurt (3%), or (order_share of them) helped with a probability that depends on the order (Uniform(0,
    0.2)) and hurt with 0.1 in each order; else tied. The population's gain is 0.05 - 0.03."""
    rng = np.random.default_rng(seed)
    n, k, truth = 300, 3, 0.02
    t_975 = sps.t.ppf(0.975, k - 1)
    ours = t_only = 0
    for _ in range(configurations):
        kind = rng.choice(3, size=n, p=[0.05, 0.03, 0.92])
        stable = np.where(kind == 0, 1, np.where(kind == 1, -1, 0))
        unstable = rng.random(n) < order_share
        runs = []
        for _ in range(k):
            u = rng.random(n)
            theta = rng.uniform(0, 0.2)
            runs.append(np.where(unstable, np.where(u < theta, 1, np.where(u > 0.9, -1, 0)), stable).astype(float))
        got = stats.across_runs([int((d > 0).sum()) for d in runs], [int((d < 0).sum()) for d in runs], [n] * k)
        ours += got.ci_low <= truth <= got.ci_high
        gains = np.array([d.mean() for d in runs])
        half = t_975 * gains.std(ddof=1) / math.sqrt(k)
        t_only += abs(gains.mean() - truth) <= half
    return ours / configurations, t_only / configurations


@pytest.mark.parametrize("order_share", [0.0, 0.3])
def test_the_interval_covers_the_gain_over_test_samples_and_orders(order_share):
    # the runs share their test samples: a t interval across 3 orders misses the samples' noise (all of it for a
    # method that does not depend on the order); the two-level interval covers at least its 95%
    configurations = 600
    ours, t_only = _coverage(order_share, configurations, seed=int(order_share * 10))
    mc = 3 * math.sqrt(0.95 * 0.05 / configurations)  # three Monte Carlo standard errors
    assert ours >= 0.95 - mc
    assert t_only < 0.95 - mc


def test_one_run_falls_back_to_its_exact_mcnemar():
    got = stats.across_runs([30], [10], [1000])
    assert got.test == stats.POOLED_MCNEMAR and got.runs == 1
    assert got.p == pytest.approx(sps.binomtest(30, 40).pvalue, rel=1e-9)
    assert (got.ci_low, got.ci_high) == stats.bootstrap_gain_ci(30, 10, 1000)


def test_one_run_over_datasets_of_unequal_size_stands_around_its_mean():
    # an Average cell of one (seed, order): the mean over the datasets, which counts pooled over them (weighted by
    # each dataset's size) would not stand around; the samples' noise alone, as the reference computes it
    rng = np.random.default_rng(3)
    diffs = [rng.choice([1.0, -1.0, 0.0], size=n, p=p) for n, p in ((200, [0.2, 0.0, 0.8]), (5000, [0.0, 0.0, 1.0]))]
    helped, hurt = [int((d > 0).sum()) for d in diffs], [int((d < 0).sum()) for d in diffs]
    got = stats.across_runs(helped, hurt, [len(d) for d in diffs], [(1, 0), (1, 0)], ["a", "b"])
    mean, low, high, p, df = two_level(diffs, [(1, 0), (1, 0)], ["a", "b"])
    assert got.runs == 1 and got.ci_low < got.mean < got.ci_high
    assert (got.mean, got.ci_low, got.ci_high, got.p) == pytest.approx((mean, low, high, p), rel=1e-9)
    pooled_low, pooled_high = stats.bootstrap_gain_ci(sum(helped), sum(hurt), sum(len(d) for d in diffs))
    assert not pooled_low <= got.mean <= pooled_high  # what the pooled interval showed: one excluding its mean


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
    got = con.execute("SELECT bca_gain_halfwidth(0.3, 0.2, 5, 0.1, 0.01), bca_gain_p(0.3, 0.2, 5, 0.1, 0.01), "
                      "bca_gain_p(0.3, NULL, 5, 0.1, 0.01)").fetchone()
    assert got == (*stats.two_level(0.3, 0.2, 5, 0.1, 0.01), None)


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
