"""A plain reference for a configuration's gain across runs (orchestrator.results.stats.across_runs), written from
docs/statistics.md over the runs' per-sample paired differences with numpy and scipy's distributions, sharing no
code with the module it checks (but the point, NORMAL_DF, from which it takes the normal for Student's t)."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps

from orchestrator.results import stats


def two_level(diffs, replicate=None, test_set=None, confidence=0.95):
    """(mean, low, high, p, df) from each paired run's per-sample differences d in {-1, 0, +1}: replicate (seed,
    order; each run its own by default) and test set (one by default) per run."""
    m = len(diffs)
    replicate = list(range(m)) if replicate is None else list(replicate)
    test_set = [0] * m if test_set is None else list(test_set)
    reps = list(dict.fromkeys(replicate))
    k = len(reps)
    weight = np.zeros(m)
    replicate_gains = []
    for r in reps:
        mine = [i for i in range(m) if replicate[i] == r]
        sets = list(dict.fromkeys(test_set[i] for i in mine))
        per_set = []
        for s in sets:
            runs = [i for i in mine if test_set[i] == s]
            per_set.append(np.mean([np.mean(diffs[i]) for i in runs]))
            weight[runs] = 1.0 / (k * len(sets) * len(runs))
        replicate_gains.append(np.mean(per_set))
    mean = float(np.mean(replicate_gains))
    between = float(np.var(replicate_gains, ddof=1)) / k if k > 1 else 0.0  # one replicate: no spread
    # each run's McNemar standard error sqrt(mean(d^2) / n); fully correlated within a test set, independent across
    sample_var, delta = 0.0, math.inf
    for s in dict.fromkeys(test_set):
        runs = [i for i in range(m) if test_set[i] == s]
        sample_var += sum(weight[i] * math.sqrt(np.mean(np.square(diffs[i])) / len(diffs[i])) for i in runs) ** 2
        delta = min(delta, sum(weight[i] / len(diffs[i]) for i in runs))
    variance = between + sample_var
    if variance == 0:
        return mean, mean - delta, mean + delta, 1.0, math.inf
    df = math.inf if between == 0 else (k - 1) * (variance / between) ** 2
    dist = sps.norm if math.isinf(df) else sps.t(df)
    se = math.sqrt(variance)
    half = dist.ppf(1 - (1 - confidence) / 2) * se + delta
    return mean, mean - half, mean + half, float(2 * dist.sf(max(0.0, abs(mean) - delta) / se)), df


def rel_tolerance(df: float, t: float = 6.0) -> float:
    """Relative agreement to expect with the module: float64 rounding, plus, where the module takes the normal for
    a t of df >= its NORMAL_DF, the two distributions' relative difference there, at most about
    (1 + t^2)^2 / (4 df) for a p-value at t (a margin of 4 here)."""
    return 1e-9 + (0.0 if math.isinf(df) or df < stats.NORMAL_DF else (1 + t * t) ** 2 / df)
