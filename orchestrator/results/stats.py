"""Is a gain real? The statistics behind the `paired` and `summary` views, the report's markers and `bca compare`.

Defined once, here, in numpy; the views call the same functions as DuckDB scalar functions (`register`), so a
number in SQL is the number numpy gives (docs/statistics.md; tests/test_stats.py checks both against scipy).
scipy is not needed at run time: the two distributions used (binomial with p = 1/2, Student's t) are written
out below.

Per run, against its baseline on the very same samples in the very same order, with the per-sample paired
difference d = correct(method) - correct(baseline) in {-1, 0, +1}:
- helped = #{d = +1}, hurt = #{d = -1}, n = the in-distribution samples; gain = (helped - hurt) / n, which is
  the method's accuracy minus the baseline's on those samples.
- McNemar's exact test: under "neither is better" each of the helped + hurt discordant samples is helped
  with probability 1/2, so p = min(1, 2 P(X <= min(helped, hurt))), X ~ Binomial(helped + hurt, 1/2); 1 with
  no discordant sample (scipy.stats.binomtest(helped, helped + hurt).pvalue).
- The 95% paired bootstrap interval of the gain (percentile method): resampling the n rows with replacement
  only changes how many helped, hurt and tied rows are drawn, and those counts are Multinomial(n, (helped/n,
  hurt/n, rest/n)); so BOOTSTRAP_RESAMPLES draws of that multinomial are the row bootstrap, computed from the
  three counts without reading a row. The generator is seeded with (BOOTSTRAP_SEED, helped, hurt, n): the
  interval is a function of the counts, the same in every query and on every machine.

Per configuration, over its k paired runs (seeds x orders, each paired with the baseline on the same seed and
order): the mean gain, a t interval (mean +- t(0.975, k - 1) s / sqrt(k)) and the one-sample t-test of the
per-run gains against 0 (that is the paired t-test of the two methods' run accuracies). With fewer than
MIN_RUNS_FOR_T runs the interval is the bootstrap interval and the p-value McNemar's, both on the counts
pooled over the runs.

Many cells tested at once: Holm's step-down correction (`holm`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

CONFIDENCE = 0.95
ALPHA = 0.05                  # significance level of the report's markers and the leaderboard
BOOTSTRAP_RESAMPLES = 10_000  # draws of the paired bootstrap (per run, and pooled)
BOOTSTRAP_SEED = 0
MIN_RUNS_FOR_T = 3            # fewer paired runs: pooled McNemar and a pooled bootstrap interval
T_TEST = "t"                  # names of the test behind a configuration's p-value (summary's gain_test)
POOLED_MCNEMAR = "mcnemar"


def _count(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or int(value) != value or value < 0:
        raise ValueError(f"{name} must be a count (an integer >= 0), got {value!r}")
    return int(value)


# ------------------------------------------------------------------------------------------ per run
def binom_half_cdf(k: int, m: int) -> float:
    """P(X <= k) for X ~ Binomial(m, 1/2): the exact sum of the pmf, in log space (no overflow for any m)."""
    if k < 0:
        return 0.0
    if k >= m:
        return 1.0
    i = np.arange(1, k + 1, dtype=np.float64)
    # ln C(m, i) by the running product C(m, i) = C(m, i - 1) (m - i + 1) / i, from C(m, 0) = 1
    log_pmf = np.concatenate(([0.0], np.cumsum(np.log(m - i + 1) - np.log(i)))) - m * math.log(2.0)
    top = log_pmf.max()
    return float(min(1.0, math.exp(top) * np.exp(log_pmf - top).sum()))


def mcnemar_p(helped: int, hurt: int) -> float:
    """Exact two-sided McNemar p-value: the binomial test of helped against hurt (see the module docstring)."""
    b, c = _count(helped, "helped"), _count(hurt, "hurt")
    m = b + c
    if m == 0:
        return 1.0
    return min(1.0, 2.0 * binom_half_cdf(min(b, c), m))


def gain(helped: int, hurt: int, n: int) -> float:
    """Accuracy of the method minus its baseline's on the same n samples (a fraction)."""
    b, c, n = _count(helped, "helped"), _count(hurt, "hurt"), _count(n, "n")
    if b + c > n or n == 0:
        raise ValueError(f"helped + hurt ({b} + {c}) must be at most n = {n} > 0")
    return (b - c) / n


@lru_cache(maxsize=65536)
def bootstrap_gain_ci(helped: int, hurt: int, n: int, resamples: int = BOOTSTRAP_RESAMPLES,
                      confidence: float = CONFIDENCE, seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """The paired bootstrap percentile interval of `gain`, from the counts (see the module docstring)."""
    gain(helped, hurt, n)  # validates
    rng = np.random.default_rng([seed, helped, hurt, n])
    draws = rng.multinomial(n, [helped / n, hurt / n, (n - helped - hurt) / n], size=resamples)
    gains = (draws[:, 0] - draws[:, 1]) / n
    tail = (1 - confidence) / 2
    lo, hi = np.percentile(gains, [100 * tail, 100 * (1 - tail)])
    return float(lo), float(hi)


# -------------------------------------------------------------------------------------- across runs
def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (modified Lentz)."""
    if not (a > 0 and b > 0 and 0 <= x <= 1):
        raise ValueError(f"betainc needs a, b > 0 and 0 <= x <= 1, got {a}, {b}, {x}")
    if x in (0.0, 1.0):
        return x
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast on this side only
        return 1.0 - betainc(b, a, 1.0 - x)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 100_000):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            return math.exp(log_front) * f / a
    raise ArithmeticError(f"betainc({a}, {b}, {x}) did not converge")


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with df degrees of freedom."""
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


@lru_cache(maxsize=4096)
def t_quantile(q: float, df: float) -> float:
    """The q quantile (q > 1/2) of Student's t, by bisection on the two-sided tail (cached: a report asks for the
    same few (q, df) in every cell)."""
    target = 2 * (1 - q)
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > target:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_two_sided_p(mid, df) > target:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-14 * hi:
            break
    return (lo + hi) / 2


def t_halfwidth(std: float, k: int, confidence: float = CONFIDENCE) -> float:
    """Half the width of the t interval of a mean of k values with sample std `std`."""
    if k < 2 or math.isnan(std):
        return math.nan
    return t_quantile(1 - (1 - confidence) / 2, k - 1) * std / math.sqrt(k)


def t_test_p(mean: float, std: float, k: int) -> float:
    """Two-sided one-sample t-test of "the mean is 0" from k values' mean and sample std."""
    if k < 2 or math.isnan(std):
        return math.nan
    if std == 0:
        return 1.0 if mean == 0 else 0.0
    return t_two_sided_p(mean / (std / math.sqrt(k)), k - 1)


@dataclass(frozen=True)
class GainSummary:
    """A configuration's gain over its baseline across its paired runs (gains as fractions)."""

    runs: int
    mean: float
    ci_low: float
    ci_high: float
    p: float
    test: str  # T_TEST or POOLED_MCNEMAR


def across_runs(gains: Sequence[float], helped: Sequence[int], hurt: Sequence[int], n: Sequence[int]
                ) -> GainSummary:
    """The per-configuration statistics of the module docstring from its runs' paired counts."""
    g = np.asarray(gains, dtype=np.float64)
    k = len(g)
    if k == 0:
        raise ValueError("a gain across runs needs at least one paired run")
    mean = float(g.mean())
    if k >= MIN_RUNS_FOR_T:
        std = float(g.std(ddof=1))
        half = t_halfwidth(std, k)
        return GainSummary(k, mean, mean - half, mean + half, t_test_p(mean, std, k), T_TEST)
    b, c, total = int(np.sum(helped)), int(np.sum(hurt)), int(np.sum(n))
    lo, hi = bootstrap_gain_ci(b, c, total)
    return GainSummary(k, mean, lo, hi, mcnemar_p(b, c), POOLED_MCNEMAR)


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (NaN stays NaN and is not counted): reject where adjusted <= alpha."""
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    valid = np.flatnonzero(~np.isnan(p))
    m = len(valid)
    order = valid[np.argsort(p[valid], kind="stable")]
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


# -------------------------------------------------------------------------------------------- SQL
# The views' SQL calls these DuckDB scalar functions; each is the numpy function above, row by row.

def _vectorised(fn, *cols):
    import pyarrow as pa

    values = [c.to_pylist() for c in cols]
    out = [None if any(v is None for v in row) else fn(*row) for row in zip(*values)]
    return pa.array(out, type=pa.float64())


def _nan_to_none(value: float) -> float | None:
    return None if math.isnan(value) else value


SQL_FUNCTIONS = {
    # name: (numpy function of the row's values, argument types)
    "bca_mcnemar_p": (mcnemar_p, ["BIGINT", "BIGINT"]),
    "bca_gain_ci_low": (lambda b, c, n: bootstrap_gain_ci(b, c, n)[0] if n else None, ["BIGINT", "BIGINT", "BIGINT"]),
    "bca_gain_ci_high": (lambda b, c, n: bootstrap_gain_ci(b, c, n)[1] if n else None, ["BIGINT", "BIGINT", "BIGINT"]),
    "bca_t_halfwidth": (lambda s, k: _nan_to_none(t_halfwidth(s, k)), ["DOUBLE", "BIGINT"]),
    "bca_t_test_p": (lambda m, s, k: _nan_to_none(t_test_p(m, s, k)), ["DOUBLE", "DOUBLE", "BIGINT"]),
}


def _udf(fn, arity: int):
    """fn over Arrow columns, with exactly `arity` parameters: DuckDB reads the arity from the signature."""
    if arity == 2:
        return lambda a, b: _vectorised(fn, a, b)
    return lambda a, b, c: _vectorised(fn, a, b, c)


def register(con: Any) -> None:
    """Make the SQL_FUNCTIONS callable in a DuckDB connection's SQL (NULL in, NULL out)."""
    for name, (fn, types) in SQL_FUNCTIONS.items():
        con.create_function(name, _udf(fn, len(types)), types, "DOUBLE", type="arrow", null_handling="special",
                            side_effects=False)
