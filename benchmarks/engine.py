"""Throughput of the blocked BCA engine against the naive per-sample loop: `python -m benchmarks.engine`.

For each K in {10, 100, 1000} and d in {512, 768} (M = K class embeddings) it builds one synthetic
stream and, on those same features in the same process, measures:

- naive: samples/s of the per-sample torch loop (`reference.bca_family_reference`, the paper's
  implementation style) on the first --naive-n samples;
- engine: samples/s of `engine.run_bca_blocked` on all --n samples, and engine / naive;
- products alone: samples/s of the engine's block products (F Uᵀ, exp, E V) with no walk, an upper
  bound for any exact blocked pass on this machine (`block_products`);
- agree: whether the engine's predictions, selections and gates on the naive prefix are identical to the
  naive loop's, with the largest posterior difference;
- G=1/4/16: config-samples/s of the multi-config path (`run_bca_blocked_many`, G BCA configs that
  differ in tau / n1 / n2, as a sweep packs them) on the first --multi-n samples;
- peak MB: the row's peak resident memory (each row runs in its own process), or peak CUDA memory.

The config is BCA at the paper's OOD settings (tau 0.3, n1 30000, n2 10, logit_scale 100). Every timed call
follows an untimed warm-up of the same call (a sweep worker is long-lived: the walk is compiled and the
output memory mapped once; on a VM the first touch of fresh memory alone costs ~15 us per 4 KB posterior
row). Timings are wall-clock; on a shared machine they are noisy, so compare the ratios within a row. The load average at
start and end is printed with the table.

`--repeat R` adds the spread: the single-config engine run R times at each product thread count (1, 2),
with `--load` while a competing process keeps one core busy, reported as median, min and max samples/s
(the engine's default is one product thread: intra-op threads wait at barriers when a core is taken).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import resource
import time
from dataclasses import dataclass

from benchmarks.tables import markdown_table

QUICK = {"n": 3000, "naive_n": 300, "multi_n": 1000, "groups": (1, 4)}
FULL = {"n": 50_000, "naive_n": 5000, "multi_n": 10_000, "groups": (1, 4, 16)}
BCA_OOD = {"tau": 0.3, "n1": 30000, "n2": 10}


@dataclass
class Row:
    K: int
    d: int
    n: int
    naive: float
    engine: float
    products: float
    agree: str
    multi: dict[int, float]
    peak_mb: float


def block_products(features, U, V, scale: float) -> None:
    """The engine's per-block products alone (`engine._Products.compute`: F Uᵀ, row max, exp, row sums, E V)
    against a fixed state, no walk: the arithmetic every exact blocked pass does, so its rate bounds the
    engine's on this machine."""
    import torch

    from orchestrator.methods.engine import DEFAULT_BLOCK, _Products

    products = _Products.allocate(DEFAULT_BLOCK, U.shape[0], V.shape[1], 1, U.device)
    for a in range(0, features.shape[0], DEFAULT_BLOCK):
        products.compute(features[a:a + DEFAULT_BLOCK], U, scale, [V], None)
    if U.device.type == "cuda":
        torch.cuda.synchronize()


def sweep_configs(g: int) -> list[dict]:
    """G BCA grid points around the paper's OOD setting (tau x n1 x n2)."""
    taus, n1s, n2s = (0.3, 0.2, 0.4, 0.5), (30000, 10000), (10, 50)
    grid = [{"tau": t, "n1": a, "n2": b} for a in n1s for b in n2s for t in taus]
    return [grid[i % len(grid)] for i in range(g)]


def measure(K: int, d: int, n: int, naive_n: int, multi_n: int, groups: tuple[int, ...], device: str,
            threads: int | None) -> Row:
    import torch

    from orchestrator.data.synthetic import make_synthetic
    from orchestrator.methods import make_method
    from orchestrator.methods.engine import run_bca_blocked, run_bca_blocked_many
    from orchestrator.methods.bca.reference import bca_family_reference

    if threads:
        torch.set_num_threads(threads)
    bench = make_synthetic("iid", num_classes=K, dim=d, n=n, seed=0)
    feats = bench.features.to(device)
    emb, ids = bench.class_embeddings.to(device), bench.class_ids.to(device)

    def setup(hp: dict) -> tuple[dict, object]:
        m = make_method("bca", emb, ids, K, **hp)
        return m.state, m.config

    def timed(fn):
        fn()  # untimed warm-up: compiles / loads the walk and maps the output memory, as in a long-lived worker
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return out, time.perf_counter() - t0

    state, cfg = setup(BCA_OOD)
    naive, t_naive = timed(lambda: bca_family_reference(feats[:naive_n], state, ids, K, cfg))
    fast, t_engine = timed(lambda: run_bca_blocked(feats, state, ids, K, cfg))
    same = all(torch.equal(getattr(naive, a), getattr(fast, a)[:naive_n])
               for a in ("selected", "gated", "gated_prior")) and \
        torch.equal(naive.predictions, fast.predictions[:naive_n])
    diff = float((naive.posteriors - fast.posteriors[:naive_n]).abs().max())
    _, t_products = timed(lambda: block_products(feats, state["U"].float(), state["V"].float(), cfg.logit_scale))
    multi = {}
    for g in groups:
        states, cfgs = zip(*(setup(hp) for hp in sweep_configs(g)))
        _, t = timed(lambda: run_bca_blocked_many(feats[:multi_n], list(states), ids, K, list(cfgs)))
        multi[g] = g * multi_n / t
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    return Row(K, d, n, naive_n / t_naive, n / t_engine, n / t_products, f"{'yes' if same else 'NO'} {diff:.0e}",
               multi, peak)


def _busy() -> None:
    """A competing load: one core kept busy with float work until terminated."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((256, 256))
    while True:
        a = np.tanh(a @ a.T / 256)


def spread(K: int, d: int, n: int, repeat: int, device: str) -> dict[int, list[float]]:
    """samples/s of R single-config engine runs per product thread count (each after one warm-up)."""

    from orchestrator.data.synthetic import make_synthetic
    from orchestrator.methods import make_method
    from orchestrator.methods.engine import run_bca_blocked

    bench = make_synthetic("iid", num_classes=K, dim=d, n=n, seed=0)
    feats, emb, ids = (t.to(device) for t in (bench.features, bench.class_embeddings, bench.class_ids))
    method = make_method("bca", emb, ids, K, **BCA_OOD)
    out = {}
    for threads in (1, 2):
        run_bca_blocked(feats, method.state, ids, K, method.config, product_threads=threads)
        rates = []
        for _ in range(repeat):
            start = time.perf_counter()
            run_bca_blocked(feats, method.state, ids, K, method.config, product_threads=threads)
            rates.append(n / (time.perf_counter() - start))
        out[threads] = rates
    return out


def format_spread(rates: dict[int, list[float]]) -> str:
    lines = ["| product threads | median /s | min /s | max /s | max / min |", "|---:|---:|---:|---:|---:|"]
    for threads, r in rates.items():
        r = sorted(r)
        lines.append(f"| {threads} | {r[len(r) // 2]:,.0f} | {r[0]:,.0f} | {r[-1]:,.0f} | {r[-1] / r[0]:.1f} |")
    return "\n".join(lines)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.machine()


def format_table(rows: list[Row], groups: tuple[int, ...]) -> str:
    head = ["K", "d", "naive/s", "engine/s", "speedup", "products alone/s", "agree, max dpost"] + \
        [f"G={g} cfg-samples/s" for g in groups] + ["peak MB"]
    lines = [head]
    for r in rows:
        lines.append([str(r.K), str(r.d), f"{r.naive:,.0f}", f"{r.engine:,.0f}", f"{r.engine / r.naive:.1f}x",
                      f"{r.products:,.0f}", r.agree] + [f"{r.multi[g]:,.0f}" for g in groups] + [f"{r.peak_mb:,.0f}"])
    return markdown_table(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: few samples, G in {1, 4}")
    parser.add_argument("--n", type=int, help="engine stream length (default 50000; quick 3000)")
    parser.add_argument("--naive-n", type=int, help="samples timed for the naive loop (default 5000)")
    parser.add_argument("--multi-n", type=int, help="samples per config for the multi-config path (10000)")
    parser.add_argument("--K", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--d", type=int, nargs="+", default=[512, 768])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--repeat", type=int, default=0,
                        help="also run the single-config engine this many times per product thread count "
                             "(K and d: the first of --K / --d) and print the spread")
    parser.add_argument("--load", action="store_true", help="keep one core busy during the --repeat runs")
    args = parser.parse_args(argv)
    preset = QUICK if args.quick else FULL
    n = args.n or preset["n"]
    naive_n = min(args.naive_n or preset["naive_n"], n)
    multi_n = min(args.multi_n or preset["multi_n"], n)
    groups = preset["groups"]

    print(f"machine: {cpu_name()}, {os.cpu_count()} cpus, device {args.device}, "
          f"torch threads {args.threads or 'default'}; load average at start {os.getloadavg()[0]:.1f}")
    print(f"config: bca {BCA_OOD}, logit_scale 100, M = K; engine n={n}, naive n={naive_n}, "
          f"multi-config n={multi_n} per config")
    rows = []
    # Each row in a fresh process, so that its peak memory is its own.
    ctx = multiprocessing.get_context("spawn")
    for K in args.K:
        for d in args.d:
            with ctx.Pool(1) as pool:
                rows.append(pool.apply(measure, (K, d, n, naive_n, multi_n, groups, args.device, args.threads)))
            print(f"  done K={K} d={d}", flush=True)
    print(format_table(rows, groups))
    if args.repeat:
        ctx_load = ctx.Process(target=_busy, daemon=True) if args.load else None
        if ctx_load is not None:
            ctx_load.start()
        try:
            with ctx.Pool(1) as pool:
                rates = pool.apply(spread, (args.K[0], args.d[0], n, args.repeat, args.device))
        finally:
            if ctx_load is not None:
                ctx_load.terminate()
                ctx_load.join()
        print(f"spread of {args.repeat} single-config engine runs, K={args.K[0]} d={args.d[0]} n={n}"
              f"{', one core kept busy by a competing process' if args.load else ''}:")
        print(format_spread(rates))
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
