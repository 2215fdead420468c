"""Sweep overhead: a 64-run synthetic sweep on Ray Tune against the same runs in a plain loop in one process.

    python -m benchmarks.sweep [--n 4000] [--classes 100] [--dim 256]

Every variant does the same work: each of the 64 runs (clip / la / pa / bca over tau, n1 and n2 grids, two
seeds) replays the stream through its method and writes every per-sample row as Parquet through RunWriter.

1. loop: `execute_trial` for each run in one process (no Ray), one torch thread like each Ray trial.
2. sweep: `run_sweep` on a local Ray, one trial per run (the same code inside Tune trials); Ray's start-up
   is timed apart. Target: sweep / loop <= 1.5.
3. packed: the same sweep with `pack: 8`, eight grid points per trial through the multi-config engine.

The three must write identical predictions (checked); the script prints the times and ratios. A benchmark,
not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from orchestrator.sweep.load import validate_spec
from orchestrator.sweep.plan import expand, make_trials
from orchestrator.sweep.runner import run_sweep
from orchestrator.sweep.pieces import settings_of
from orchestrator.sweep.spec import SweepSpec
from orchestrator.sweep.trial import execute_trial


def bench_spec(results_dir: Path, n: int, classes: int, dim: int, pack: int) -> SweepSpec:
    """64 runs on one synthetic stream per seed: 2 seeds x 32 BCA-family configurations."""
    data = {
        "name": "bench",
        "results_dir": str(results_dir),
        "datasets": [{"synthetic": "label_shift", "n": n, "num_classes": classes, "dim": dim}],
        "methods": [
            {"method": "clip"},
            {"method": "la", "tau": [0.1, 0.2, 0.3, 0.4, 0.5], "n1": 30000},
            {"method": "pa", "tau": [0.1, 0.2, 0.3, 0.4, 0.5], "n2": 10},
            {"method": "bca", "tau": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], "n1": 30000, "n2": [5, 10, 20]},
        ],
        "seeds": [1, 2],
        "resources": {"cpus": 1},
        "part_rows": 10000,
        "pack": pack,
    }
    return validate_spec(data)


def predictions(results_dir: Path) -> dict[tuple[str, int], int]:
    out = {}
    for part in Path(results_dir).glob("samples/*/*/*/*/*/part-*.parquet"):
        table = pq.read_table(part, columns=["run_id", "sample_idx", "pred"]).to_pydict()
        out.update(zip(zip(table["run_id"], table["sample_idx"]), table["pred"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10000, help="stream length per run")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=512)
    args = parser.parse_args()

    import ray
    import torch

    # Ray runs each trial with OMP_NUM_THREADS=1 (its CPU share); the loop gets the same, which is also its
    # fastest setting here: two torch threads beside the engine's compiled walk oversubscribe 2 cores.
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="bca-bench-sweep-"))
    loop_spec = bench_spec(root / "loop", args.n, args.classes, args.dim, pack=1)
    runs = expand(loop_spec)
    assert len(runs) == 64, len(runs)
    print(f"{len(runs)} runs, stream n={args.n}, K={args.classes}, d={args.dim}, {os.cpu_count()} CPU cores; "
          f"results under {root}")

    # Warm-up outside the timings: imports and the engine's JIT compilation (numba caches it on disk, so Ray's
    # worker processes load it instead of compiling).
    warm = bench_spec(root / "warmup", 200, args.classes, args.dim, pack=1)
    for trial in make_trials(expand(warm), 1)[:4]:
        execute_trial(trial, settings_of(warm))

    settings = settings_of(loop_spec)
    began = time.perf_counter()
    for trial in make_trials(runs, 1):
        execute_trial(trial, settings)
    loop_s = time.perf_counter() - began
    print(f"loop   (one process, no Ray):        {loop_s:7.2f} s")

    began = time.perf_counter()
    # a Ray of its own, also where a `ray start` cluster runs here
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, logging_level="WARNING")
    ray_start_s = time.perf_counter() - began

    def timed_sweep(pack: int) -> tuple[float, Path]:
        spec = bench_spec(root / f"sweep_pack{pack}", args.n, args.classes, args.dim, pack=pack)
        began = time.perf_counter()
        outcome = run_sweep(spec, out=lambda line: None)
        assert outcome.ok, outcome.failed
        return time.perf_counter() - began, Path(spec.results_dir)

    sweep_s, sweep_dir = timed_sweep(1)
    print(f"sweep  (Ray Tune, 64 trials):        {sweep_s:7.2f} s   ratio to loop {sweep_s / loop_s:.2f}x "
          f"(target <= 1.5x); Ray start-up {ray_start_s:.1f} s more")
    packed_s, packed_dir = timed_sweep(8)
    print(f"packed (Ray Tune, 8 trials x G=8):   {packed_s:7.2f} s   ratio to loop {packed_s / loop_s:.2f}x")
    ray.shutdown()

    reference = predictions(loop_spec.results_dir)
    assert len(reference) == 64 * args.n
    for name, directory in (("sweep", sweep_dir), ("packed", packed_dir)):
        assert predictions(directory) == reference, f"{name} predictions differ from the loop's"
    print("predictions identical in all three")


if __name__ == "__main__":
    main()
