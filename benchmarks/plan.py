"""Validation and planning of a big grid: a 10^6-run spec validated, expanded and grouped into trials.

    python -m benchmarks.plan [--runs-per-seed 100000] [--seeds 10]

The spec: one synthetic dataset, BCA over tau x n1 x n2 x tau_prior grids, and seeds; it prints the seconds and
the peak memory (RSS) of each step and of the process. A benchmark, not a test: numbers depend on the machine
and its load.
"""

from __future__ import annotations

import argparse
import resource
import time

from orchestrator.sweep.load import validate_spec
from orchestrator.sweep.plan import expand, make_trials


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def big_spec(runs_per_seed: int, seeds: int) -> dict:
    """BCA over a tau x n1 x n2 x tau_prior grid of about `runs_per_seed` points, on one synthetic stream."""
    side = max(1, round(runs_per_seed ** 0.25))
    taus = [round(0.05 + 0.9 * i / max(side - 1, 1), 6) for i in range(side)]
    return {
        "name": "big",
        "results_dir": "/tmp/bca-benchmark-plan",
        "datasets": [{"synthetic": "label_shift", "n": 1000, "num_classes": 10}],
        "methods": [{"method": "bca", "tau": taus, "tau_prior": taus, "n1": [100 * (i + 1) for i in range(side)],
                     "n2": [i + 1 for i in range(side)]}],
        "seeds": list(range(seeds)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-per-seed", type=int, default=100_000)
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    data = big_spec(args.runs_per_seed, args.seeds)
    start_mb = _peak_mb()
    t0 = time.perf_counter()
    spec = validate_spec(data)
    t1 = time.perf_counter()
    runs = expand(spec)
    t2 = time.perf_counter()
    trials = make_trials(runs, spec.pack)
    t3 = time.perf_counter()
    print(f"{len(runs):,} runs, {len(trials):,} trials")
    print(f"validate {t1 - t0:.2f} s, expand {t2 - t1:.2f} s, trials {t3 - t2:.2f} s, total {t3 - t0:.2f} s")
    print(f"peak RSS {_peak_mb():,.0f} MB (after imports {start_mb:,.0f} MB)")


if __name__ == "__main__":
    main()
