"""Validation and planning of a big grid: a 10^6-run spec validated, expanded, grouped into trials and dry-run.

    python -m benchmarks.plan [--runs-per-seed 100000] [--seeds 10] [--stream JSON]

The spec: one synthetic dataset, BCA over tau x n1 x n2 x tau_prior grids, and seeds, on the dataset's own order
or `--stream` (e.g. '{"realtime": {"base": "iid"}}': every run its own trial); it prints the seconds (wall and
this process's CPU) and the peak memory (RSS) of each step and of the process: validate, expand, trials, and the
dry run's whole plan (`bca sweep --dry-run` less the spec's loading and the printing). A benchmark, not a test:
numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from orchestrator.sweep.dryrun import dry_run
from orchestrator.sweep.load import validate_spec
from orchestrator.sweep.plan import expand, make_trials


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def big_spec(runs_per_seed: int, seeds: int, stream: object = None) -> dict:
    """BCA over a tau x n1 x n2 x tau_prior grid of about `runs_per_seed` points, on one synthetic stream (in the
    order `stream` gives, if any)."""
    side = max(1, round(runs_per_seed ** 0.25))
    taus = [round(0.05 + 0.9 * i / max(side - 1, 1), 6) for i in range(side)]
    return {
        "name": "big",
        "results_dir": "/tmp/bca-benchmark-plan",
        "datasets": [{"synthetic": "label_shift", "n": 1000, "num_classes": 10}],
        "methods": [{"method": "bca", "tau": taus, "tau_prior": taus, "n1": [100 * (i + 1) for i in range(side)],
                     "n2": [i + 1 for i in range(side)]}],
        "seeds": list(range(seeds)),
        **({"stream": stream} if stream is not None else {}),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-per-seed", type=int, default=100_000)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--stream", type=json.loads, default=None, help="the spec's stream, as JSON")
    args = parser.parse_args(argv)
    data = big_spec(args.runs_per_seed, args.seeds, args.stream)
    start_mb = _peak_mb()
    clocks = [(time.perf_counter(), time.process_time())]
    spec = validate_spec(data)
    clocks.append((time.perf_counter(), time.process_time()))
    runs = expand(spec)
    clocks.append((time.perf_counter(), time.process_time()))
    trials = make_trials(runs, spec.pack)
    clocks.append((time.perf_counter(), time.process_time()))
    lines = dry_run(spec, runs)
    clocks.append((time.perf_counter(), time.process_time()))
    print(f"{len(runs):,} runs, {len(trials):,} trials; stream {json.dumps(args.stream)}; the dry run's first line: "
          f"{lines[0]}")
    steps = ("validate", "expand", "trials", "dry run")
    print(", ".join(f"{name} {b[0] - a[0]:.2f} s ({b[1] - a[1]:.2f} s CPU)"
                    for name, a, b in zip(steps, clocks, clocks[1:]))
          + f", total {clocks[-1][0] - clocks[0][0]:.2f} s ({clocks[-1][1] - clocks[0][1]:.2f} s CPU)")
    print(f"peak RSS {_peak_mb():,.0f} MB (after imports {start_mb:,.0f} MB)")


if __name__ == "__main__":
    main()
