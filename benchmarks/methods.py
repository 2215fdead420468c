"""Every method's throughput, single-stream and as lockstep streams: `python -m benchmarks.methods`.

On one synthetic stream (K classes, M = K class embeddings, dimension d; view methods get V views per sample,
view 0 the feature, the others the feature plus noise), in one process and the same run:

- single /s: samples/s of `make_method(m, ...).run(features)` at the card's defaults and official batch size (the
  BCA family runs on the blocked engine here: its multi-config path is `benchmarks.engine`);
- official /s: the public code's per-sample algorithm where the project transcribes it (`OFFICIAL`): TDA
  (`orchestrator.methods.tda.reference`: caches as Python lists, the cache keys stacked and multiplied per
  sample), on one feature and on views, and BCA's adaptive view selection (`orchestrator.methods.bca.reference.
  official_bca`), in float32 on this device;
- the "(V views)" rows: the methods whose own path takes a stream's views or one feature (TDA, BCA) on
  `--study-views` views a sample (default 64, the Table 1 protocol), as the study runs them;
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

QUICK = {"K": 20, "d": 16, "n": 40, "view_n": 10, "views": 4, "study_views": 10, "groups": (1, 4)}
FULL = {"K": 1000, "d": 512, "n": 300, "view_n": 50, "views": 8, "study_views": 64, "groups": (1, 8, 32)}


def _official_tda(x, emb, hp):
    from orchestrator.methods.tda.reference import official_tda

    return official_tda(x if x.ndim == 3 else x[:, None], emb, hp)


def _official_bca(x, emb, hp):
    from orchestrator.methods.bca.reference import official_bca

    tau_u = hp["tau"] if hp["tau_likelihood"] is None else hp["tau_likelihood"]
    tau_v = hp["tau"] if hp["tau_prior"] is None else hp["tau_prior"]
    return official_bca(x, emb, n1=hp["n1"], n2=hp["n2"], tau_u=tau_u, tau_v=tau_v, scale=hp["logit_scale"],
                        select=hp["select_on"])


# (method, on views) -> the public code's loop, transcribed: called as official(features, class_embeddings, hp).
OFFICIAL = {("tda", False): _official_tda, ("tda", True): _official_tda, ("bca", True): _official_bca}
# Methods measured also on a study's views (their own path takes views or one feature).
VIEW_ROWS = ("tda", "bca")


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


def measure(card, stream, preset: dict, repeat: int = 1, views: bool | None = None) -> Row:
    """One row; views: run on the stream's views (default: whether the card takes views)."""
    from orchestrator.methods import make_method
    from orchestrator.methods.lockstep import run_lockstep

    feats, view_feats, emb, ids = stream
    K = emb.shape[0]
    views = card.takes_views if views is None else views
    n = preset["view_n"] if views else preset["n"]
    x = (view_feats if views else feats)[:n]
    configs = differing_configs(card, max(preset["groups"]), n)
    warm = x[:3]

    def build(config, data):
        length = {card.stream_length: data.shape[0]} if card.stream_length else {}
        # a batch method at its official batch size, the one its card's samples_per_s is for
        return make_method(card.name, emb, ids, K, batch_size=card.batch_size or 1, **dict(config, **length))

    def single(config, data):
        method = build(config, data)         # built outside the timed call, as the lockstep's methods are
        return _timed(method.run, data)

    official = OFFICIAL.get((card.name, views))
    lockstep_groups = preset["groups"] if card.lockstep_runner(x.ndim == 3) is not None else ()

    def lock(g, data):
        return _timed(run_lockstep, [build(c, data) for c in configs[:g]], data)

    single(configs[0], warm)
    if official:
        official(warm, emb, configs[0])
    for g in lockstep_groups:
        lock(g, warm)
    # Interleaved repeats, so that a change in the machine's load falls on every column alike; medians.
    seconds = {"single": [], "official": [], **{g: [] for g in lockstep_groups}}
    for _ in range(repeat):
        reference, t = single(configs[0], x)
        seconds["single"].append(t)
        if official:
            seconds["official"].append(_timed(official, x, emb, configs[0])[1])
        for g in lockstep_groups:
            traces, t = lock(g, x)
            seconds[g].append(t)
    official_rate = n / statistics.median(seconds["official"]) if official else None
    lockstep = {g: g * n / statistics.median(seconds[g]) for g in lockstep_groups}
    agree = "-"
    if lockstep_groups:
        same = torch.equal(traces[0].predictions, reference.predictions)
        diff = float((traces[0].posteriors - reference.posteriors).abs().max())
        agree = f"{'yes' if same else 'NO'} {diff:.0e}"
    n_single = n / statistics.median(seconds["single"])
    label = f"{card.label} ({x.shape[1]} views)" if views and not card.takes_views else card.label
    return Row(label, n_single, official_rate, lockstep, agree)


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
    parser.add_argument("--study-views", type=int, help="views a sample of the (V views) rows (default 64; quick 10)")
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
    if args.study_views:
        preset["study_views"] = args.study_views
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
    study = make_stream(preset["K"], preset["d"], preset["view_n"], preset["study_views"], args.device)
    for card in cards:
        if card.name in VIEW_ROWS:
            rows.append(measure(card, study, dict(preset, views=preset["study_views"]), args.repeat, views=True))
            print(f"  done {card.name}-views", flush=True)
    print(format_table(rows, preset["groups"]))
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
