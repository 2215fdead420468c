"""Every method's throughput, single-stream and as lockstep streams: `python -m benchmarks.methods`.

On one synthetic stream (K classes, M = K class embeddings, dimension d; view methods get V views per sample,
view 0 the feature, the others the feature plus noise), in one process and the same run:

- single /s: samples/s of `make_method(m, ...).run(features)` at the card's defaults and official batch size (the
  BCA family runs on the blocked engine here: its multi-config path is `benchmarks.engine`; a method reading an
  auxiliary encoder, COSMIC, gets random unit features of DINOv2 ViT-L/14's width beside the stream's);
- official /s: the public code's per-sample algorithm where the project transcribes it (`OFFICIAL`: each method's
  `orchestrator/methods/<name>/reference.py`, the loop its tests hold it to), in float32 on this device: the BCA
  family (CLIP, LA and PA are BCA's public loop with the missing gates never firing) on one feature and BCA on
  views, TDA on one feature and on views, Zero, OGA, OnZeta, DOTA, DPE, TPS, DMN-ZS, MTA and BoostAdapter (MTA and
  BoostAdapter transcribed in numpy, the others in torch); "single / official" is the method's own run against
  it, which is not to fall below 1;
- the "(V views)" rows: the methods whose own path takes a stream's views or one feature (TDA, BCA) on
  `--study-views` views a sample (default 64, the Table 1 protocol), as the study runs them;
- G=1 / 8 / 32: config-samples/s of the lockstep runner its card names (`orchestrator.methods.lockstep`) over G configs
  that differ in every float hparam but logit_scale (config 0 the defaults), each with its ratio to the
  single-stream loop, and G=32's ratio to the public loop where there is one (`--groups` sets the G values);
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


def _per_sample_views(x: torch.Tensor) -> torch.Tensor:
    return x if x.ndim == 3 else x[:, None]


def _official_tda(x, emb, ids, hp):
    from orchestrator.methods.tda.reference import official_tda

    return official_tda(_per_sample_views(x), emb, hp)


def _official_bca(x, emb, ids, hp):
    """The BCA family through the public BCA loop: LA without the prior gate, PA without the likelihood gate,
    CLIP with neither (a gate at infinity never fires)."""
    from orchestrator.methods.bca.reference import official_bca

    def gate(own: str, counter: str) -> float:
        if counter not in hp:                       # the variant has no such update
            return math.inf
        return hp["tau"] if hp.get(own) is None else hp[own]

    return official_bca(_per_sample_views(x), emb, n1=hp.get("n1", 1.0), n2=hp.get("n2", 1.0),
                        tau_u=gate("tau_likelihood", "n1"), tau_v=gate("tau_prior", "n2"), scale=hp["logit_scale"],
                        select=hp.get("select_on", "likelihood"))


def _official_zero(x, emb, ids, hp):
    from orchestrator.methods.zero.reference import official_zero

    return official_zero(x, emb, hp)


def _official_oga(x, emb, ids, hp):
    from orchestrator.methods.oga.reference import run_oga_reference
    from orchestrator.registry import method_card

    return run_oga_reference(x, emb, ids, emb.shape[0], method_card("oga").batch_size, **hp)


def _official_onzeta(x, emb, ids, hp):
    from orchestrator.methods.onzeta.reference import official_onzeta

    return official_onzeta(x, emb, dtype=torch.float32, **hp)


def _official_dota(x, emb, ids, hp):
    from orchestrator.methods.dota.reference import official_dota

    return official_dota(x, emb, hp["epsilon"], hp["eta"], hp["rho"], hp["sigma"], keep=hp["keep"],
                         scale=hp["logit_scale"], dtype=torch.float32)


def _official_dpe(x, emb, ids, hp):
    from orchestrator.methods.dpe.reference import official_dpe

    return official_dpe(x, emb, dtype=torch.float32, **hp)


def _official_tps(x, emb, ids, hp):
    from orchestrator.methods.tps.reference import official_tps

    return official_tps(x, emb, lr=hp["lr"], keep=hp["keep"], scale=hp["logit_scale"], dtype=torch.float32)


def _official_dmn_zs(x, emb, ids, hp):
    from orchestrator.methods.dmn_zs.reference import official_dmn_zs

    return official_dmn_zs(x, emb, memory_size=hp["memory_size"], beta=hp["beta"], memory_weight=hp["memory_weight"],
                           keep=hp["keep"], scale=hp["logit_scale"], dtype=torch.float32)


def _official_mta(x, emb, ids, hp):
    from orchestrator.methods.mta.reference import official_mta

    return official_mta(x, emb, lambda_y=hp["lambda_y"], lambda_q=hp["lambda_q"], scale=hp["logit_scale"],
                        dtype=torch.float32)


def _official_boostadapter(x, emb, ids, hp):
    from orchestrator.methods.boostadapter.reference import official_boostadapter

    keys = ("pos_alpha", "pos_beta", "neg_alpha", "neg_beta", "pos_shot", "neg_shot", "delta", "keep", "logit_scale")
    return official_boostadapter(x, emb, infer_ori_image=hp["query"] == "original", dtype=torch.float32,
                                 **{k: hp[k] for k in keys})


# (method, on views) -> the public code's loop, transcribed (orchestrator/methods/<name>/reference.py), in float32:
# called as official(features, class_embeddings, class_ids, hp) with the card's hparams.
OFFICIAL = {("clip", False): _official_bca, ("la", False): _official_bca, ("pa", False): _official_bca,
            ("bca", False): _official_bca, ("bca", True): _official_bca,
            ("tda", False): _official_tda, ("tda", True): _official_tda, ("zero", True): _official_zero,
            ("oga", False): _official_oga, ("onzeta", False): _official_onzeta, ("dota", True): _official_dota,
            ("dpe", True): _official_dpe, ("tps", True): _official_tps, ("dmn_zs", True): _official_dmn_zs,
            ("mta", True): _official_mta, ("boostadapter", True): _official_boostadapter}
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


AUXILIARY_DIM = 1024


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

    # an auxiliary encoder's features (COSMIC's DINOv2 ViT-L/14: 1,024 wide), random unit rows like the stream's
    generator = torch.Generator().manual_seed(1)
    auxiliary = {name: torch.nn.functional.normalize(torch.randn(n, AUXILIARY_DIM, generator=generator), dim=-1)
                 .to(x.device) for name in card.auxiliary}

    def single(config, data):
        method = build(config, data)         # built outside the timed call, as the lockstep's methods are
        return _timed(method.run, data, {k: v[:data.shape[0]] for k, v in auxiliary.items()} or None)

    official = OFFICIAL.get((card.name, views))
    lockstep_groups = preset["groups"] if card.lockstep_runner(x.ndim == 3) is not None else ()

    def lock(g, data):
        return _timed(run_lockstep, [build(c, data) for c in configs[:g]], data)

    single(configs[0], warm)
    if official:
        official(warm, emb, ids, configs[0])
    for g in lockstep_groups:
        lock(g, warm)
    # Interleaved repeats, so that a change in the machine's load falls on every column alike; medians.
    seconds = {"single": [], "official": [], **{g: [] for g in lockstep_groups}}
    for _ in range(repeat):
        reference, t = single(configs[0], x)
        seconds["single"].append(t)
        if official:
            seconds["official"].append(_timed(official, x, emb, ids, configs[0])[1])
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


def _rate(x: float) -> str:
    """A rate as the table prints it: whole numbers, two significant digits below 10 (DOTA's official loop runs
    under one sample a second at K = 1000, d = 512)."""
    return f"{x:,.0f}" if x >= 10 else f"{x:.2g}"


def format_table(rows: list[Row], groups: tuple[int, ...]) -> str:
    top = max(groups)
    head = ["method", "single /s", "official /s", "single / official"] + \
        [f"G={g} cfg-samples/s (/ single)" for g in groups] + [f"G={top} / official", "agree, max dpost"]
    lines = [head]
    for r in rows:
        versus = f"{r.lockstep[top] / r.official:.1f}x" if r.official and top in r.lockstep else "-"
        lines.append([r.method, _rate(r.single), "-" if r.official is None else _rate(r.official),
                      "-" if r.official is None else f"{r.single / r.official:.2f}x"]
                     + [f"{_rate(r.lockstep[g])} ({r.lockstep[g] / r.single:.1f}x)" if g in r.lockstep else "-"
                        for g in groups] + [versus, r.agree])
    return markdown_table(lines, left_columns=1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.methods", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: K 20, d 16, a few samples, G in {1, 4}")
    parser.add_argument("--n", type=int, help="samples per single-feature method (default 300; quick 40)")
    parser.add_argument("--view-n", type=int, help="samples per view method (default 50; quick 10)")
    parser.add_argument("--study-views", type=int, help="views a sample of the (V views) rows (default 64; quick 10)")
    parser.add_argument("--methods", nargs="+", help="method names (default: every registered method but the "
                                                     "prompt-tuning ones: `python -m benchmarks.prompt`)")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--groups", type=int, nargs="+",
                        help="lockstep G values (default 1 8 32; quick 1 4): fewer where memory caps G (DOTA keeps "
                             "K d x d covariances per config)")
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
    if args.groups:
        preset["groups"] = tuple(args.groups)
    # Imported here: benchmarks.gpu imports this module on a GPU machine that has only torch, numpy, numba, pyarrow.
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    # numpy's BLAS too (MTA's and BoostAdapter's official loops are numpy): both sides on the same threads
    with threadpool_limits(args.threads):
        run(args, preset)


def run(args: argparse.Namespace, preset: dict) -> None:
    """Measure the chosen methods on the preset's streams and print the table."""
    from orchestrator.registry import method_cards

    # Prompt tuning runs a text tower, which this synthetic stream has not: benchmarks.prompt measures it
    cards = [c for c in method_cards() if (args.methods is None or c.name in args.methods) and c.text_encoder is None
             and c.image_encoder is None]
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
