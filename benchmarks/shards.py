"""The sharded run's speedup: one episodic run's stream split over 1, 2 and 4 Ray actors (`shards: N`).

`python -m benchmarks.shards` (on a CPU: each actor 1 core) or `python -m benchmarks.shards --gpu` (on a Ray
node with at least 4 GPUs: each actor one GPU, the stream on it). Four actors each build the same synthetic
multi-view stream (K classes, d dims, V views per sample; `--n` samples) and run one warm-up run; then, for 1, 2
and 4 of them, each runs its shard through `orchestrator.sweep.shard.execute_shard`, the code a sweep's shard
trial runs: the method on its parts, the parts written through the run's writer, the last shard finishing the
run from its rows. Per actor count it prints the wall time from launch to the finished run (the shards' work
and their coordination; not Ray Tune's per-trial start, nor loading the stream), the speedup over one actor,
the summed shard seconds, and whether the run's rows equal the one-actor run's (they must: exit status 1 if
not).

On a machine with fewer free cores than actors the shards queue or share cores, so the speedup can only show
the overhead of sharding (the log says how many cores the machine had and its load).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ACTORS = (1, 2, 4)


def _run(method: str):
    """The benchmark's run: `method` at its defaults on the synthetic view stream."""
    from orchestrator import registry
    from orchestrator.results.schema import config_hash, normalize_config
    from orchestrator.sweep.plan import DataSource, Run, _Group

    hparams = registry.method_card(method).resolve({})
    config = normalize_config({"sweep": "bench-shards", "backbone": "synthetic", "dataset": "views",
                               "method": method, "seed": 1, "views": "crops", "hparams": hparams})
    base = {k: v for k, v in config.items() if k != "hparams"}
    names = tuple(sorted(hparams))
    return Run(config_hash(config), DataSource("views", 1), _Group(base, names), tuple(hparams[k] for k in names))


def _stream(n: int, classes: int, dim: int, views: int):
    """The synthetic benchmark's features as view 0 and noisy copies as the other views, on this actor's device."""
    from orchestrator.data.synthetic import make_synthetic
    from orchestrator.device import auto_device
    from orchestrator.sweep.pieces import Stream

    bench = make_synthetic("iid", num_classes=classes, dim=dim, n=n, seed=1)
    noise = torch.randn(n, views - 1, dim, generator=torch.Generator().manual_seed(2)) * (0.3 / dim ** 0.5)
    augmented = torch.nn.functional.normalize(bench.features[:, None] + noise, dim=-1)
    device = auto_device()
    all_views = torch.cat([bench.features[:, None], augmented], dim=1).to(device)
    return Stream(features=all_views[:, 0], view_features=all_views, labels=bench.labels,
                  image_ids=[f"img{i}" for i in range(n)], order=torch.arange(n),
                  source_index=torch.zeros(n, dtype=torch.int64), is_ood=torch.zeros(n, dtype=torch.bool),
                  sources=["views"] * n, class_embeddings=bench.class_embeddings.to(device),
                  class_ids=bench.class_ids.to(device), num_classes=bench.num_classes,
                  class_names=[f"class{c}" for c in range(bench.num_classes)], encode_s=0.0, skipped=[])


class _ShardActor:
    """One actor: builds the stream once (not timed), then runs shards of the run as a sweep's shard trial does."""

    def __init__(self, args: dict) -> None:
        torch.set_num_threads(args["threads"])
        self.args = args
        self.stream = _stream(args["n"], args["classes"], args["dim"], args["views"])

    def run(self, index: int, count: int, results_dir: str) -> dict:
        from orchestrator.sweep.plan import Shard
        from orchestrator.sweep.shard import execute_shard
        from orchestrator.sweep.pieces import Settings

        settings = Settings(results_dir=results_dir, cache_dir=None, data_root=None, part_rows=self.args["part_rows"])
        began = time.perf_counter()
        done = execute_shard(_run(self.args["method"]), Shard(index, count), self.stream, settings)
        return {"shard_s": time.perf_counter() - began, "finished": done["finished"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="one GPU per actor (a node with >= 4 GPUs)")
    parser.add_argument("--method", default="zero", help="an episodic method (zero, mta, tps)")
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--classes", type=int, default=200)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--views", type=int, default=16)
    parser.add_argument("--part-rows", type=int, default=250)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per actor on a CPU")
    args = parser.parse_args(argv)
    import ray

    from orchestrator.methods.episodic import order_free
    from orchestrator.results.writer import RunWriter

    if not order_free(args.method):
        parser.error(f"--method {args.method}: expected an episodic (order-free) method")
    options = vars(args)
    print(f"machine: {os.cpu_count()} cpus, {torch.cuda.device_count()} gpus; load average at start "
          f"{os.getloadavg()[0]:.1f}; each actor {'1 GPU' if args.gpu else f'{args.threads} CPU thread(s)'}")
    print(f"stream: {args.method}, K = {args.classes}, d = {args.dim}, V = {args.views} views, n = {args.n}, "
          f"parts of {args.part_rows}")
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, max(ACTORS)), include_dashboard=False,
             logging_level="WARNING")  # a Ray of its own, also where a `ray start` cluster runs here
    actor = ray.remote(num_gpus=1, num_cpus=1)(_ShardActor) if args.gpu else ray.remote(num_cpus=1)(_ShardActor)
    actors = [actor.remote(options) for _ in range(max(ACTORS))]
    rows, failures, base = None, 0, None
    print("| actors | wall s | speedup | summed shard s | rows as 1 actor |")
    print("|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as tmp:
        # streams built, numba and torch warmed up on every actor before anything is timed
        ray.get([a.run.remote(0, 1, str(Path(tmp) / f"warmup{i}")) for i, a in enumerate(actors)])
        for count in ACTORS:
            results = str(Path(tmp) / f"actors{count}")
            launched = time.perf_counter()
            done = ray.get([actors[k].run.remote(k, count, results) for k in range(count)])
            wall = time.perf_counter() - launched
            base = base or wall
            table = RunWriter(results, _run(args.method).config).read_columns(["sample_idx", "pred", "confidence",
                                                                               "top5", "prob_true"])
            same = rows is None or table.equals(rows)
            rows = rows if rows is not None else table
            failures += not same or sum(d["finished"] for d in done) != 1 or table.num_rows != args.n
            print(f"| {count} | {wall:.2f} | {base / wall:.2f}x | {sum(d['shard_s'] for d in done):.2f} | "
                  f"{'yes' if same else 'NO'} |")
    ray.shutdown()
    slots = torch.cuda.device_count() if args.gpu else (os.cpu_count() or 1) // args.threads
    if slots < max(ACTORS):
        print(f"{slots} {'GPUs' if args.gpu else 'cores'} for {max(ACTORS)} actors: the shards share them, so the table "
              f"shows what sharding costs, not what it gains")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
