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
order), the mean gain varies with two things: the stream (seed and order: the spread of the runs' gains) and
the test samples (the runs are measured on one sample of images, the same one for every order, so their
sample noise does not average out over orders). `two_level` adds the two: the runs' spread over k and a bound
on the samples' variance from each run's McNemar standard error, with Satterthwaite's degrees of freedom and
Edwards' continuity correction (`across_runs`). Identical runs (zero spread) give the continuity-corrected
McNemar test of one run, never p = 0. One run has no spread: its exact McNemar and bootstrap interval, on the
counts pooled over its test sets.

Many cells tested at once: Holm's step-down correction (`holm`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Any, Sequence

import numpy as np

CONFIDENCE = 0.95
ALPHA = 0.05                  # significance level of the report's markers and the leaderboard
BOOTSTRAP_RESAMPLES = 10_000  # draws of the paired bootstrap (per run, and pooled)
BOOTSTRAP_SEED = 0
MIN_RUNS_FOR_SPREAD = 2       # one paired run has no spread across runs: its exact McNemar and bootstrap
NORMAL_DF = 1e7               # Student's t from here on is the normal (`t_two_sided_p`)
TWO_LEVEL = "runs+samples"    # names of the test behind a configuration's p-value (summary's gain_test)
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
    """P(|T| >= |t|) for Student's t with df > 0 (any real, inf too) degrees of freedom. From NORMAL_DF on, the
    normal's: the two differ by at most about (1 + t^2)^2 / (4 df) relatively there (2 x 10^-5 at |t| = 5), and
    lgamma of such large arguments costs the beta function about as much."""
    if math.isnan(t):
        return math.nan
    if df >= NORMAL_DF:
        return math.erfc(abs(t) / math.sqrt(2.0))
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def _t_pdf(t: float, df: float) -> float:
    return math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
                    - (df + 1) / 2 * math.log1p(t * t / df))


@lru_cache(maxsize=4096)
def t_quantile(q: float, df: float) -> float:
    """The q quantile (q > 1/2) of Student's t (the normal's from NORMAL_DF on). Newton's method on the log of the
    two-sided tail, which is convex and decreasing in t, from the normal quantile, which lies below: every step
    stays below the root and approaches it (a handful of steps at any df). Close to it (a step under 1e-6 of t)
    each exact step is far smaller than the last, so one that is not is the tail's own rounding (at a large df
    lgamma's large terms leave the tail about 1e-10 relative): it stops there, where more steps would only wander
    in that noise (they did, to the limit of 100 steps: most of a big report's time)."""
    z = NormalDist().inv_cdf(q)
    if df >= NORMAL_DF:
        return z
    target, t, last = math.log(2 * (1 - q)), z, math.inf
    for _ in range(100):
        tail = t_two_sided_p(t, df)
        step = (math.log(tail) - target) * tail / (2 * _t_pdf(t, df))
        if abs(last) < 1e-6 * t and abs(step) >= abs(last):
            break
        t += step
        if abs(step) <= 1e-13 * t:
            break
        last = step
    return t


def two_level(mean: float, spread: float, k: int, sample_se: float, delta: float,
              confidence: float = CONFIDENCE) -> tuple[float, float]:
    """(half-width of the interval, two-sided p) of a mean gain over k runs: `spread` the sample std of the
    runs' gains (0 for one run), `sample_se` the test samples' standard error of the mean and `delta` its continuity correction
    (`across_runs`). Variance spread^2 / k + sample_se^2 with Satterthwaite's degrees of freedom
    (k - 1) (variance / (spread^2 / k))^2: k - 1 where the runs' spread dominates, the normal where the samples'
    noise does. No discordant sample in any run and no spread (variance 0) means a gain of 0: p = 1."""
    between = spread * spread / k
    variance = between + sample_se * sample_se
    if variance == 0:
        return delta, 1.0
    df = math.inf if between == 0 else (k - 1) * (variance / between) ** 2
    se = math.sqrt(variance)
    half = t_quantile(1 - (1 - confidence) / 2, df) * se + delta
    return half, t_two_sided_p(max(0.0, abs(mean) - delta) / se, df)


@dataclass(frozen=True)
class GainSummary:
    """A configuration's gain over its baseline across its paired runs (gains as fractions)."""

    runs: int
    mean: float
    ci_low: float
    ci_high: float
    p: float
    test: str  # TWO_LEVEL or POOLED_MCNEMAR


def _codes(labels: Sequence[Any] | None, size: int, default: np.ndarray) -> np.ndarray:
    """0..m-1 per distinct label (`default` when None)."""
    if labels is None:
        return default
    if len(labels) != size:
        raise ValueError(f"expected one label per paired run ({size}), got {len(labels)}")
    first: dict[Any, int] = {}
    return np.array([first.setdefault(v, len(first)) for v in labels], dtype=np.int64)


def across_runs(helped: Sequence[int], hurt: Sequence[int], n: Sequence[int], replicate: Sequence[Any] | None = None,
                test_set: Sequence[Any] | None = None) -> GainSummary:
    """The mean gain of a configuration over its baseline, its 95% interval and p-value, from its paired runs'
    counts (docs/statistics.md). One entry per paired run: `replicate` names its independent repetition (seed and
    order; each run its own by default), `test_set` the test samples it ran on (one set by default: runs on the
    same set may get the very same samples right and wrong). A replicate's gain is the mean over its test sets of
    the mean of its runs there; the configuration's is the mean over the k replicates.

    k >= MIN_RUNS_FOR_SPREAD: `two_level`, from the replicates' spread and the test samples' noise. The samples'
    standard error of the mean is at most sqrt(sum over test sets of (sum of w se)^2) for runs of weight w whose
    gains have standard errors se = sqrt(helped + hurt) / n (McNemar's), whatever their correlation within a set
    (reached when they are identical) and independent across sets; continuity correction: half the change in the
    mean when one sample of a set changes sides in all its runs (min over sets of sum w / n), Edwards' for
    McNemar's test. One replicate has no spread: on one test set, exact McNemar and the bootstrap interval of the
    counts pooled over its runs; over several test sets (an average over datasets), the samples' noise alone (the
    normal), since pooled counts weigh the sets by their size and would not stand around the mean shown."""
    b, c, total = (np.asarray(v, dtype=np.int64).reshape(-1) for v in (helped, hurt, n))
    size = len(b)
    if size == 0:
        raise ValueError("a gain across runs needs at least one paired run")
    if not len(c) == len(total) == size:
        raise ValueError(f"helped, hurt and n must have one count per paired run, got {size}, {len(c)}, {len(total)}")
    if (b < 0).any() or (c < 0).any() or (b + c > total).any() or (total <= 0).any():
        raise ValueError("each paired run needs counts with 0 <= helped, hurt and helped + hurt <= n, n > 0")
    rep, sets = _codes(replicate, size, np.arange(size)), _codes(test_set, size, np.zeros(size, np.int64))
    k, n_sets = int(rep.max()) + 1, int(sets.max()) + 1
    # weight of each run in the mean: 1/k per replicate, split evenly over its test sets, then over its runs there
    cell = rep * n_sets + sets
    cells, cell_of, runs_in_cell = np.unique(cell, return_inverse=True, return_counts=True)
    sets_per_rep = np.bincount(cells // n_sets, minlength=k)
    weight = 1.0 / (k * sets_per_rep[rep] * runs_in_cell[cell_of])
    gains = (b - c) / total
    mean = float(np.sum(weight * gains))
    if k < MIN_RUNS_FOR_SPREAD and n_sets == 1:
        bb, cc, nn = int(b.sum()), int(c.sum()), int(total.sum())
        lo, hi = bootstrap_gain_ci(bb, cc, nn)
        return GainSummary(k, mean, lo, hi, mcnemar_p(bb, cc), POOLED_MCNEMAR)
    replicate_gains = k * np.bincount(rep, weights=weight * gains, minlength=k)
    sample_se = math.sqrt(float(np.sum(np.bincount(sets, weights=weight * np.sqrt(b + c) / total) ** 2)))
    delta = float(np.bincount(sets, weights=weight / total).min())
    spread = float(replicate_gains.std(ddof=1)) if k > 1 else 0.0
    half, p = two_level(mean, spread, k, sample_se, delta)
    return GainSummary(k, mean, mean - half, mean + half, p, TWO_LEVEL)


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


SQL_FUNCTIONS = {
    # name: (numpy function of the row's values, argument types)
    "bca_mcnemar_p": (mcnemar_p, ["BIGINT", "BIGINT"]),
    "bca_gain_ci_low": (lambda b, c, n: bootstrap_gain_ci(b, c, n)[0] if n else None, ["BIGINT", "BIGINT", "BIGINT"]),
    "bca_gain_ci_high": (lambda b, c, n: bootstrap_gain_ci(b, c, n)[1] if n else None, ["BIGINT", "BIGINT", "BIGINT"]),
    # a configuration's mean gain m over k >= 2 runs: the runs' std sd, the samples' standard error se, the
    # continuity correction delta (all in the same unit; `two_level`)
    "bca_gain_halfwidth": (lambda m, sd, k, se, delta: two_level(m, sd, k, se, delta)[0],
                           ["DOUBLE", "DOUBLE", "BIGINT", "DOUBLE", "DOUBLE"]),
    "bca_gain_p": (lambda m, sd, k, se, delta: two_level(m, sd, k, se, delta)[1],
                   ["DOUBLE", "DOUBLE", "BIGINT", "DOUBLE", "DOUBLE"]),
}


def _udf(fn, arity: int):
    """fn over Arrow columns, with exactly `arity` parameters: DuckDB reads the arity from the signature."""
    if arity == 2:
        return lambda a, b: _vectorised(fn, a, b)
    if arity == 3:
        return lambda a, b, c: _vectorised(fn, a, b, c)
    return lambda a, b, c, d, e: _vectorised(fn, a, b, c, d, e)


def register(con: Any) -> None:
    """Make the SQL_FUNCTIONS callable in a DuckDB connection's SQL (NULL in, NULL out)."""
    for name, (fn, types) in SQL_FUNCTIONS.items():
        con.create_function(name, _udf(fn, len(types)), types, "DOUBLE", type="arrow", null_handling="special",
                            side_effects=False)
