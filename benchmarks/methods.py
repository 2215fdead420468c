"""Every method's throughput, single-stream and as lockstep streams: `python -m benchmarks.methods`.

On one synthetic stream (K classes, M = K class embeddings, dimension d; view methods get V views per sample,
view 0 the feature, the others the feature plus noise), in one process and the same run:

- single /s: samples/s of `make_method(m, ...).run(features)` at the card's defaults and official batch size (the
  BCA family runs on the blocked engine here: its multi-config path is `benchmarks.engine`);
- official /s: TDA only, the public code's per-sample algorithm (`orchestrator.methods.tda.reference`:
  caches as Python lists, the cache keys stacked and multiplied per sample), in float32 on this device;
- G=1 / 8 / 32: config-samples/s of the lockstep runner its card names (`orchestrator.methods.lockstep`) over G configs
  that differ in every float hparam but logit_scale (config 0 the defaults), each with its ratio to the
  single-stream loop, and G=32's ratio to the public loop where there is one;
- agree: the lockstep trace of config 0 against the single-stream run: predictions identical, and the
  largest posterior difference.

Every timed call runs once on a few samples first (allocation, first-call work), and the method objects are
built before the clock starts, for the single-stream and the lockstep runs alike (a pack builds its G objects
too: TDA's caches cost ~20 ms each at K = 1000, DMN-ZS's memory ~50 ms). Timings are wall-clock on a
shared machine: compare ratios within one run, which sees one load; the load average is printed. `--repeat R`
times every column R times, interleaved (single, official, G = 1, 8, 32, then again), and prints the medians.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from dataclasses import dataclass

import torch

from benchmarks.tables import markdown_table

QUICK = {"K": 20, "d": 16, "n": 40, "view_n": 10, "views": 4, "groups": (1, 4)}
FULL = {"K": 1000, "d": 512, "n": 300, "view_n": 50, "views": 8, "groups": (1, 8, 32)}


@dataclass
class Row:
    method: str
    single: float
    official: float | None
    lockstep: dict[int, float]
    agree: str


def make_stream(K: int, d: int, n: int, views: int, device: str, seed: int = 0):
    """(features [n, d], view features [n, V, d], class embeddings [K, d], class ids [K])."""
    from orchestrator.data.synthetic import make_synthetic

    bench = make_synthetic("iid", num_classes=K, dim=d, n=n, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    noisy = bench.features[:, None] + 0.3 / math.sqrt(d) * torch.randn(n, views, d, generator=gen)
    noisy[:, 0] = bench.features
    view_feats = torch.nn.functional.normalize(noisy, dim=-1)
    return (bench.features.to(device), view_feats.to(device), bench.class_embeddings.to(device),
            bench.class_ids.to(device))


def differing_configs(card, g: int, n: int) -> list[dict]:
    """G configs: config 0 the card's defaults, config i scales every float hparam but logit_scale by
    1 + 0.07 i (within the hparam's bounds), so every stream's adaptive state evolves differently."""
    configs = []
    for i in range(g):
        hp = card.defaults()
        for p in card.hparams:
            if p.kind == "float" and p.name != "logit_scale" and isinstance(hp[p.name], float) and hp[p.name] > 0:
                value = hp[p.name] * (1.0 + 0.07 * i)
                hp[p.name] = min(value, p.high) if p.high is not None else value
        if card.stream_length is not None:
            hp[card.stream_length] = n
        configs.append(hp)
    return configs


def _timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - start


def measure(card, stream, preset: dict, repeat: int = 1) -> Row:
    from orchestrator.methods import make_method
    from orchestrator.methods.lockstep import run_lockstep

    feats, view_feats, emb, ids = stream
    K = emb.shape[0]
    n = preset["view_n"] if card.takes_views else preset["n"]
    x = (view_feats if card.takes_views else feats)[:n]
    configs = differing_configs(card, max(preset["groups"]), n)
    warm = x[:3]

    def build(config, data):
        length = {card.stream_length: data.shape[0]} if card.stream_length else {}
        # a batch method at its official batch size, the one its card's samples_per_s is for
        return make_method(card.name, emb, ids, K, batch_size=card.batch_size or 1, **dict(config, **length))

    def single(config, data):
        method = build(config, data)         # built outside the timed call, as the lockstep's methods are
        return _timed(method.run, data)

    official_tda = None
    if card.name == "tda":
        from orchestrator.methods.tda.reference import official_tda
    lockstep_groups = preset["groups"] if card.lockstep_runner(x.ndim == 3) is not None else ()

    def lock(g, data):
        return _timed(run_lockstep, [build(c, data) for c in configs[:g]], data)

    single(configs[0], warm)
    if official_tda:
        official_tda(warm[:, None], emb, configs[0])
    for g in lockstep_groups:
        lock(g, warm)
    # Interleaved repeats, so that a change in the machine's load falls on every column alike; medians.
    seconds = {"single": [], "official": [], **{g: [] for g in lockstep_groups}}
    for _ in range(repeat):
        reference, t = single(configs[0], x)
        seconds["single"].append(t)
        if official_tda:
            seconds["official"].append(_timed(official_tda, x[:, None], emb, configs[0])[1])
        for g in lockstep_groups:
            traces, t = lock(g, x)
            seconds[g].append(t)
    official = n / statistics.median(seconds["official"]) if official_tda else None
    lockstep = {g: g * n / statistics.median(seconds[g]) for g in lockstep_groups}
    agree = "-"
    if lockstep_groups:
        same = torch.equal(traces[0].predictions, reference.predictions)
        diff = float((traces[0].posteriors - reference.posteriors).abs().max())
        agree = f"{'yes' if same else 'NO'} {diff:.0e}"
    n_single = n / statistics.median(seconds["single"])
    return Row(card.label, n_single, official, lockstep, agree)


def format_table(rows: list[Row], groups: tuple[int, ...]) -> str:
    top = max(groups)
    head = ["method", "single /s", "official /s"] + [f"G={g} cfg-samples/s (/ single)" for g in groups] + \
        [f"G={top} / official", "agree, max dpost"]
    lines = [head]
    for r in rows:
        versus = f"{r.lockstep[top] / r.official:.1f}x" if r.official and top in r.lockstep else "-"
        lines.append([r.method, f"{r.single:,.0f}", "-" if r.official is None else f"{r.official:,.0f}"]
                     + [f"{r.lockstep[g]:,.0f} ({r.lockstep[g] / r.single:.1f}x)" if g in r.lockstep else "-"
                        for g in groups] + [versus, r.agree])
    return markdown_table(lines, left_columns=1)


def main(argv: list[str] | None = None) -> None:
    from orchestrator.registry import method_cards

    parser = argparse.ArgumentParser(prog="python -m benchmarks.methods", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: K 20, d 16, a few samples, G in {1, 4}")
    parser.add_argument("--n", type=int, help="samples per single-feature method (default 300; quick 40)")
    parser.add_argument("--view-n", type=int, help="samples per view method (default 50; quick 10)")
    parser.add_argument("--methods", nargs="+", help="method names (default: every registered method but the "
                                                     "prompt-tuning ones: `python -m benchmarks.prompt`)")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="timed runs per column, interleaved across the columns; medians (default 1)")
    args = parser.parse_args(argv)
    preset = dict(QUICK if args.quick else FULL)
    if args.n:
        preset["n"] = args.n
    if args.view_n:
        preset["view_n"] = args.view_n
    torch.set_num_threads(args.threads)
    # Prompt tuning runs a text tower, which this synthetic stream has not: benchmarks.prompt measures it.
    cards = [c for c in method_cards() if (args.methods is None or c.name in args.methods) and c.text_encoder is None]
    print(f"machine: {os.cpu_count()} cpus, device {args.device}, torch threads {args.threads}; "
          f"load average at start {os.getloadavg()[0]:.1f}")
    print(f"stream: K = M = {preset['K']}, d = {preset['d']}, n = {preset['n']} (view methods: "
          f"{preset['view_n']} samples of {preset['views']} views)")
    stream = make_stream(preset["K"], preset["d"], max(preset["n"], preset["view_n"]), preset["views"], args.device)
    rows = []
    for card in cards:
        rows.append(measure(card, stream, preset, args.repeat))
        print(f"  done {card.name}", flush=True)
    print(format_table(rows, preset["groups"]))
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
