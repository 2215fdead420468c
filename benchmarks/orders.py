"""G stream orders in one lockstep pass against each order in turn: `python -m benchmarks.orders`.

A sweep's `orders: N` runs one configuration over N orders of one cached feature set; the paper's study has one
configuration per method and dataset, so a runner that steps one order at a time gets G = 1 streams a pass. For
every lockstep runner that steps orders together on one feature per sample (`lockstep.steps_orders`; a view
method gets one view a sample, as on a single-view dataset), on one synthetic stream (K = M classes, dimension
d, n samples) and G random orders of it, each stream at the card's defaults:

- together /s: config-samples/s of `run_over_orders(runner, ...)`, the G orders in one pass;
- each order /s: the same runner over each order in turn (`each_order`, G = 1 a pass), as a runner that does
  not step orders together runs them;
- ratio: together over each order, measured in one run (the two alternate `--repeat` times; medians);
- agree: the two paths' predictions identical, and their largest posterior difference.

Every timed call runs once on a few samples first, and the methods are built before the clock starts. Timings
are wall-clock: compare ratios within one run; the load average is printed. `--quick`: a tiny smoke run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks.methods import make_stream
from benchmarks.tables import markdown_table

QUICK = {"K": 20, "d": 16, "n": 40, "orders": 4}
FULL = {"K": 1000, "d": 512, "n": 200, "orders": 16}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def order_runners() -> list:
    """The cards whose lockstep runner steps orders together on one feature per sample (order-free methods
    are computed once for all their orders and prompt tuning needs a text tower: neither is here)."""
    from orchestrator.methods.episodic import order_free
    from orchestrator.methods.lockstep import steps_orders
    from orchestrator.registry import method_cards

    return [c for c in method_cards() if c.text_encoder is None and c.image_encoder is None and not order_free(c.name)
            and steps_orders(c.lockstep_runner(c.takes_views), False)]


def measure(card, feats, emb, ids, orders: torch.Tensor, repeat: int, device: str) -> list[str]:
    from orchestrator.methods import make_method
    from orchestrator.methods.lockstep import each_order, run_over_orders

    runner = card.lockstep_runner(card.takes_views)
    x = feats[:, None] if card.takes_views else feats
    K = emb.shape[0]
    hp = card.defaults()
    if card.stream_length is not None:
        hp[card.stream_length] = orders.shape[1]

    def build():
        return [make_method(card.name, emb, ids, K, **hp) for _ in range(orders.shape[0])]

    def timed(path):
        methods = build()
        _sync(device)
        start = time.perf_counter()
        traces = path(runner, methods, x, orders)
        _sync(device)
        return traces, time.perf_counter() - start

    warm = orders[:, :3]
    run_over_orders(runner, build(), x, warm)
    each_order(runner, build(), x, warm)
    together, alone = [], []
    for _ in range(repeat):
        lock, seconds = timed(run_over_orders)
        together.append(seconds)
        single, seconds = timed(each_order)
        alone.append(seconds)
    samples = orders.numel()
    same = all(torch.equal(a.predictions, b.predictions) for a, b in zip(lock, single))
    worst = max(float((a.posteriors - b.posteriors).abs().max()) for a, b in zip(lock, single))
    t, e = statistics.median(together), statistics.median(alone)
    return [card.label, f"{samples / t:,.0f}", f"{samples / e:,.0f}", f"{e / t:.2f}x",
            f"{'identical' if same else 'DIFFER'}, {worst:.1e}"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.orders", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: K 20, d 16, 40 samples, 4 orders")
    parser.add_argument("--orders", type=int, help="G, the orders in a pass (default 16; quick 4)")
    parser.add_argument("--n", type=int, help="samples per order (default 200; quick 40)")
    parser.add_argument("--methods", nargs="+", help="method names (default: every runner that steps orders "
                                                     "together on one feature per sample)")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs of each path, alternated (medians)")
    args = parser.parse_args(argv)
    preset = dict(QUICK if args.quick else FULL)
    if args.orders:
        preset["orders"] = args.orders
    if args.n:
        preset["n"] = args.n
    torch.set_num_threads(args.threads)
    cards = [c for c in order_runners() if args.methods is None or c.name in args.methods]
    print(f"machine: {os.cpu_count()} cpus, device {args.device}, torch threads {args.threads}; "
          f"load average at start {os.getloadavg()[0]:.1f}")
    print(f"stream: K = M = {preset['K']}, d = {preset['d']}, n = {preset['n']} samples a stream, "
          f"G = {preset['orders']} orders of it (view methods: one view a sample), the card's defaults")
    feats, _, emb, ids = make_stream(preset["K"], preset["d"], preset["n"], 1, args.device)
    gen = torch.Generator().manual_seed(7)
    orders = torch.stack([torch.randperm(preset["n"], generator=gen)
                          for _ in range(preset["orders"])]).to(args.device)
    rows = [["method", "together /s", "each order /s", "ratio", "agree"]]
    for card in cards:
        rows.append(measure(card, feats, emb, ids, orders, args.repeat, args.device))
        print(f"  done {card.name}", flush=True)
    print(markdown_table(rows, left_columns=1))
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
