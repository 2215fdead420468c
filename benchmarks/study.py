"""The paper's study on one device, measured on a slice and projected: `python -m benchmarks.study`.

The study: Tables 1-2's grid (every benchmark dataset at its real K, test-set size n and view protocol per
method; both backbones' embedding widths, RN50 d = 1024 and ViT-B/16 d = 512; every built-in method at its
per-dataset defaults) over `--orders` stream orders (default 100), with the features cached once, so only
the methods' passes count. For each (dataset, backbone, method) unit the benchmark builds synthetic
L2-normalised features of that shape on the device, runs the method's multi-config path
(`run_traces_many`: the blocked engine for the BCA family, the lockstep runner where the card has one, else
one stream at a time) over G streams at once for `--slice` samples, and projects the unit to n samples x
orders from the measured config-samples/s.

The G streams of a pass differ in their hparams (`benchmarks.methods.differing_configs`), as different
orders would make their states differ; where the runner steps orders together on views (BCA's adaptive view
selection, TDA: `orchestrator.methods.lockstep`), stream g also reads the slice in its own order
(`run_traces_many(..., orders=...)`), so the pass is G orders x grid points as the study runs them; elsewhere
one order's G grid points do the same work per step.

Printed per method and in total: projected device-seconds, config-samples/s, peak memory of one pass, the
fraction of the device's measured fp32 GEMM rate that the dominant product (each sample's views against the
class embeddings, 2 V d M flop per config-sample) reaches, and the projected wall time on 1, 8 and 64 devices
(units split into passes of G orders, longest-first onto the least loaded device; no scheduling overhead).
`--quick` runs a tiny slice on a CPU (CI).
"""

from __future__ import annotations

import argparse
import heapq
import math
import os
import resource
import time
from dataclasses import dataclass

import torch

from benchmarks.methods import differing_configs
from benchmarks.tables import markdown_table

BACKBONES = {"RN50": 1024, "ViT-B-16": 512}
FULL = {"slice": 256, "groups": 100, "orders": 100, "max_classes": None, "dim": None}
QUICK = {"slice": 12, "groups": 3, "orders": 100, "max_classes": 12, "dim": 16}
QUICK_DATASETS = ("imagenet-a", "dtd")


@dataclass
class Unit:
    """One (dataset, backbone, method) of the study and what its measured slice projects to."""

    dataset: str
    backbone: str
    method: str
    samples: int          # n x orders config-samples the study runs
    views: int            # views each method step reads (1 for one feature)
    rate: float           # measured config-samples/s
    peak_bytes: int
    gemm_fraction: float
    groups: int

    @property
    def seconds(self) -> float:
        return self.samples / self.rate


def measured_gemm_rate(device: str, size: int) -> float:
    """fp32 flop/s of one square product on this device (its achievable peak for the methods' products)."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    a @ b
    _sync(device)
    start, reps = time.perf_counter(), 3
    for _ in range(reps):
        a @ b
    _sync(device)
    return 2 * size ** 3 * reps / (time.perf_counter() - start)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_reset(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def _peak_bytes(device: str) -> int:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # process-wide on a CPU


def study_inputs(K: int, d: int, n: int, views: int, device: str, seed: int = 0):
    """Features ([n, d], or [n, V, d] with view 0 the sample's feature) near K random class embeddings."""
    gen = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(K, d, generator=gen), dim=-1)
    labels = torch.randint(0, K, (n,), generator=gen)
    base = torch.nn.functional.normalize(emb[labels] + 1.2 / math.sqrt(d) * torch.randn(n, d, generator=gen), dim=-1)
    if views > 1:
        noisy = base[:, None] + 0.3 / math.sqrt(d) * torch.randn(n, views, d, generator=gen)
        noisy[:, 0] = base
        base = torch.nn.functional.normalize(noisy, dim=-1)
    return base.to(device), emb.to(device), torch.arange(K, device=device)


def measure_unit(card, dataset, backbone: str, preset: dict, device: str, gemm: float) -> Unit:
    from orchestrator.methods import run_traces_many

    K = min(dataset.num_classes, preset["max_classes"] or dataset.num_classes)
    d = preset["dim"] or BACKBONES[backbone]
    hparams = card.defaults(dataset.name)
    views = card.protocol_views(dataset.name).num_views if card.wants_views(hparams) else 1
    m = min(preset["slice"], dataset.test_images)
    feats, emb, ids = study_inputs(K, d, m, views, device)
    if card.takes_views and views == 1:
        feats = feats[:, None]  # a view method on a single-view protocol takes one view per sample
    configs = [{"method": card.name, **c} for c in differing_configs(card, preset["groups"], m)]
    for c in configs:
        c.update({k: v for k, v in hparams.items() if k not in c})
    orders = None
    if views > 1 and getattr(card.lockstep_runner(True), "takes_orders", False):
        gen = torch.Generator().manual_seed(1)
        orders = torch.stack([torch.randperm(m, generator=gen) for _ in configs]).to(device)
    run_traces_many(feats[:2], emb, ids, K, configs)  # first-call work (allocation, compilation) off the clock
    _sync(device)
    _peak_reset(device)
    start = time.perf_counter()
    run_traces_many(feats, emb, ids, K, configs, orders=orders)
    _sync(device)
    seconds = time.perf_counter() - start
    rate = len(configs) * m / seconds
    return Unit(dataset.name, backbone, card.name, dataset.test_images * preset["orders"], views, rate,
                _peak_bytes(device), 2 * views * d * K * rate / gemm, len(configs))


def makespan(units: list[Unit], devices: int, orders: int) -> float:
    """Wall seconds on `devices` devices: each unit as passes of G orders, longest first onto the least
    loaded device (an order cannot be split: its samples depend on each other)."""
    passes = []
    for u in units:
        count = math.ceil(orders / u.groups)
        passes += [u.seconds / count] * count
    loads = [0.0] * devices
    heapq.heapify(loads)
    for p in sorted(passes, reverse=True):
        heapq.heappush(loads, heapq.heappop(loads) + p)
    return max(loads)


def report(units: list[Unit], orders: int, gemm: float, device: str) -> str:
    from orchestrator.registry import method_label

    lines = [["method", "device-s", "cfg-samples/s", "peak MB", "GEMM fraction", "share"]]
    total = sum(u.seconds for u in units)
    for method in dict.fromkeys(u.method for u in units):
        mine = [u for u in units if u.method == method]
        seconds = sum(u.seconds for u in mine)
        samples = sum(u.samples for u in mine)
        fraction = sum(u.gemm_fraction * u.seconds for u in mine) / seconds
        lines.append([method_label(method), f"{seconds:,.0f}", f"{samples / seconds:,.0f}",
                      f"{max(u.peak_bytes for u in mine) / 2**20:,.0f}", f"{fraction:.2%}", f"{seconds / total:.0%}"])
    samples = sum(u.samples for u in units)
    lines.append(["total", f"{total:,.0f}", f"{samples / total:,.0f}",
                  f"{max(u.peak_bytes for u in units) / 2**20:,.0f}",
                  f"{sum(u.gemm_fraction * u.seconds for u in units) / total:.2%}", "100%"])
    out = [markdown_table(lines, left_columns=1), "",
           f"device {device}; measured fp32 GEMM {gemm / 1e9:,.1f} Gflop/s; {samples:,} method-samples "
           f"({orders} orders)"]
    for n in (1, 8, 64):
        seconds = makespan(units, n, orders)
        out.append(f"projected on {n:>2} device(s): {seconds / 3600:.2f} h ({seconds:.3g} s)")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    from orchestrator.registry import dataset_card, method_cards, paper_datasets

    parser = argparse.ArgumentParser(prog="python -m benchmarks.study", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"CPU smoke run: {', '.join(QUICK_DATASETS)}, K <= 12, d = 16, G = 3, 12 samples")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--datasets", nargs="+", help="benchmark datasets (default: all of Tables 1-2)")
    parser.add_argument("--methods", nargs="+", help="method names (default: every built-in method)")
    parser.add_argument("--backbones", nargs="+", choices=sorted(BACKBONES), default=sorted(BACKBONES))
    parser.add_argument("--slice", type=int, help="samples measured per unit (default 256)")
    parser.add_argument("--groups", type=int, help="streams per pass, G (default 100: all orders at once)")
    parser.add_argument("--orders", type=int, help="stream orders of the study (default 100)")
    args = parser.parse_args(argv)
    preset = dict(QUICK if args.quick else FULL)
    for key in ("slice", "groups", "orders"):
        if getattr(args, key):
            preset[key] = getattr(args, key)
    names = args.datasets or (QUICK_DATASETS if args.quick else paper_datasets())
    datasets = [dataset_card(name) for name in names]
    cards = [c for c in method_cards() if args.methods is None or c.name in args.methods]
    gemm = measured_gemm_rate(args.device, 256 if args.quick else 4096)
    print(f"machine: {os.cpu_count()} cpus, device {args.device}; load average at start {os.getloadavg()[0]:.1f}")
    print(f"slice {preset['slice']} samples per unit, G = {preset['groups']} streams per pass, "
          f"{preset['orders']} orders", flush=True)
    units = []
    for dataset in datasets:
        for backbone in args.backbones:
            for card in cards:
                units.append(measure_unit(card, dataset, backbone, preset, args.device, gemm))
            print(f"  done {dataset.name} {backbone}", flush=True)
    print(report(units, preset["orders"], gemm, args.device))


if __name__ == "__main__":
    main()
