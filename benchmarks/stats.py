"""The paired bootstrap from counts against the plain row bootstrap it replaces: time per run and the intervals'
agreement, measured in one run (`python -m benchmarks.stats`; `--quick` for a smoke run).

The row bootstrap draws n row indices per resample; the count bootstrap draws one multinomial of three counts per
resample (orchestrator.results.stats), so its cost does not grow with the run's length.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from benchmarks.tables import markdown_table
from orchestrator.results import stats


def _row_bootstrap(diff: np.ndarray, resamples: int, rng: np.random.Generator, chunk: int = 200) -> tuple[float, float]:
    """The plain reference: mean of the paired differences over resampled rows (in chunks, to bound memory)."""
    means = np.concatenate([diff[rng.integers(0, len(diff), size=(min(chunk, resamples - start), len(diff)))]
                            .mean(axis=1) for start in range(0, resamples, chunk)])
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, nargs="+", default=[1_000, 10_000, 50_000], help="samples per run")
    parser.add_argument("--resamples", type=int, default=stats.BOOTSTRAP_RESAMPLES)
    parser.add_argument("--quick", action="store_true", help="a smoke run: short streams, few resamples")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.resamples = [200, 400], 500
    print(f"machine: {os.cpu_count()} cpus; load average at start {os.getloadavg()[0]:.1f}; "
          f"resamples {args.resamples}")
    lines = [["n", "row bootstrap ms", "count bootstrap ms", "speed-up", "max interval difference (points)",
              "Monte Carlo s.e. (points)"]]
    rng = np.random.default_rng(0)
    for n in args.n:
        diff = rng.choice([-1.0, 0.0, 1.0], size=n, p=[0.08, 0.8, 0.12])
        b, c = int((diff > 0).sum()), int((diff < 0).sum())
        start = time.perf_counter()
        row = _row_bootstrap(diff, args.resamples, np.random.default_rng(1))
        row_s = time.perf_counter() - start
        stats.bootstrap_gain_ci.cache_clear()
        start = time.perf_counter()
        count = stats.bootstrap_gain_ci(b, c, n, resamples=args.resamples)
        count_s = time.perf_counter() - start
        gap = 100 * max(abs(row[0] - count[0]), abs(row[1] - count[1]))
        # the s.e. of a 2.5% percentile of R draws of a mean with sd s / sqrt(n), roughly
        se = 100 * diff.std() / np.sqrt(n) * np.sqrt(0.025 * 0.975 / args.resamples) / 0.058
        lines.append([f"{n:,}", f"{1e3 * row_s:,.1f}", f"{1e3 * count_s:,.2f}", f"{row_s / count_s:,.0f}x",
                      f"{gap:.3f}", f"{se:.3f}"])
    print(markdown_table(lines))


if __name__ == "__main__":
    main()
