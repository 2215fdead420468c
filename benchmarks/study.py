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
orders would make their states differ; where the runner steps orders together on the unit's features
(`orchestrator.methods.lockstep.steps_orders`), stream g also reads the slice in its own order
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
import functools
import heapq
import math
import os
import resource
import time
from dataclasses import dataclass, replace

import torch

from benchmarks.methods import differing_configs
from benchmarks.tables import markdown_table

BACKBONES = {"RN50": 1024, "ViT-B-16": 512}
# slice / text_slice: samples measured at most per unit (prompt tuning: its text tower runs per sample); probe: the
# first pass's samples; unit_seconds: what the last pass's samples may take, so the whole study fits one device call;
# tower: the text tower of prompt tuning (None: the backbone's; --quick: the tiny test tower).
FULL = {"slice": 256, "text_slice": 2, "probe": 32, "unit_seconds": 0.3, "groups": 100, "orders": 100,
        "max_classes": None, "dim": None, "tower": None}
QUICK = {"slice": 16, "text_slice": 2, "probe": 2, "unit_seconds": 0.02, "groups": 3, "orders": 100,
         "max_classes": 12, "dim": 16, "tower": "bca-tiny-vit"}
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
    order_free: bool = False  # episodic: every order gives the same per-sample outputs
    prompt: bool = False      # runs CLIP's text tower (prompt tuning)
    measured: int = 0         # samples of the longest timed pass
    setup_s: float = 0.0      # a pass's fixed cost (its G methods built), paid once per pass
    passes: int = 1           # passes of G streams the study's orders take
    # whether the pass steps G orders (True), G grid points of one order (False: a runner that runs one order at a
    # time, so a sweep of one configuration per order gets G = 1 from it), or one stream (None)
    orders_together: bool | None = None

    @property
    def seconds(self) -> float:
        return self.samples / self.rate + self.passes * self.setup_s


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


@functools.lru_cache(maxsize=2)
def study_inputs(K: int, d: int, n: int, views: int, device: str, seed: int = 0):
    """Features ([n, d], or [n, V, d] with view 0 the sample's feature) near K random class embeddings, drawn on the
    device (the methods of a unit's dataset and backbone share them: nothing changes them in place)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(K, d, generator=gen, device=device), dim=-1)
    labels = torch.randint(0, K, (n,), generator=gen, device=device)
    noise = torch.randn(n, d, generator=gen, device=device)
    base = torch.nn.functional.normalize(emb[labels] + 1.2 / math.sqrt(d) * noise, dim=-1)
    if views > 1:
        noisy = base[:, None] + 0.3 / math.sqrt(d) * torch.randn(n, views, d, generator=gen, device=device)
        noisy[:, 0] = base
        base = torch.nn.functional.normalize(noisy, dim=-1)
    return base, emb, torch.arange(K, device=device)


def _text_inputs(card, K: int, m: int, views: int, tower: str, device: str):
    """A prompt-tuning unit's text (the open_clip model `tower`'s text tower, random weights), class
    embeddings and view features, and the flop of one config-sample: forward and backward through the tower's
    transformer per tuning step (its weights are frozen: the backward costs about one forward), then the final
    forward, each 2 x parameters x K prompts x tokens."""
    from benchmarks.prompt import tower_inputs

    text, emb, feats = tower_inputs(tower, K, m, views, device)
    params = sum(p.numel() for p in text.tower.transformer.parameters())
    steps = int(card.defaults().get("steps", 1))
    flop = 2 * params * K * text.tokens.shape[1] * (2 * steps + 1)
    return text, emb, feats, flop


def pass_width(card, K: int, d: int, m: int, groups: int, device: str, views: bool) -> int:
    """G of a unit's pass: the preset's, capped where the configs' memory (the cost model's `config_bytes`, as the
    sweep packs a GPU trial) would overfill the device; one stream where the configs would run one after another
    anyway (no lockstep runner for these features; prompt tuning, whose text tower's activations fill the device
    per sample), the same config-samples/s for less device time."""
    from orchestrator.sweep.cost import PACK_MEMORY_FRACTION, config_bytes

    if card.text_encoder is not None or card.lockstep_runner(views) is None:
        return 1
    if not device.startswith("cuda"):
        return groups
    budget = PACK_MEMORY_FRACTION * torch.cuda.get_device_properties(device).total_memory
    return max(1, min(groups, int(budget // config_bytes(card.name, K, d, m))))


def _timed_pass(call, device: str) -> float:
    _sync(device)
    start = time.perf_counter()
    call()
    _sync(device)
    return time.perf_counter() - start


def measure_unit(card, dataset, backbone: str, preset: dict, device: str, gemm: float) -> Unit:
    """One unit's rate and a pass's setup, from three passes over growing prefixes of its slice (the last as long as
    fits `unit_seconds`, so every unit costs about the same device time whatever its method)."""
    from orchestrator.methods import run_traces_many
    from orchestrator.methods.episodic import order_free
    from orchestrator.methods.lockstep import steps_orders

    K = min(dataset.num_classes, preset["max_classes"] or dataset.num_classes)
    d = preset["dim"] or BACKBONES[backbone]
    hparams = card.defaults(dataset.name)
    views = card.protocol_views(dataset.name).num_views if card.wants_views(hparams) else 1
    batch = card.batch_size or 1
    m = min(preset["text_slice"] if card.text_encoder else preset["slice"], dataset.test_images)
    text, flop = None, 2 * views * d * K
    if card.text_encoder is not None:
        text, emb, feats, flop = _text_inputs(card, K, m, views, preset["tower"] or backbone, device)
        ids = torch.arange(K, device=device)
    else:
        feats, emb, ids = study_inputs(K, d, m, views, device)
    if card.takes_views and feats.ndim == 2:
        feats = feats[:, None]  # a view method on a single-view protocol takes one view per sample
    groups = pass_width(card, K, feats.shape[-1], m, preset["groups"], device, feats.ndim == 3)
    configs = [{"method": card.name, "batch_size": batch, **c} for c in differing_configs(card, groups, m)]
    for c in configs:
        c.update({k: v for k, v in hparams.items() if k not in c})
    lockstep_orders = steps_orders(card.lockstep_runner(feats.ndim == 3), views > 1)

    def run(length: int) -> None:
        # where the runner steps orders together, stream g reads the prefix in its own order; elsewhere one
        # order's G grid points do the same work per step
        gen = torch.Generator().manual_seed(1)
        orders = torch.stack([torch.randperm(length, generator=gen) for _ in configs]).to(device) \
            if lockstep_orders else None
        run_traces_many(feats[:length], emb, ids, K, configs, text, orders=orders)

    # Three passes: over a samples (first-call work: allocation, compilation), over 2a, and over as much of the
    # slice as fits unit_seconds. The last two differ by the per-sample cost of the pass; the rest of a pass is its
    # setup (building G methods and their states), paid once per pass of a whole stream.
    a = max(1, min(m // 4, max(batch, preset["probe"])))
    t_first = _timed_pass(lambda: run(a), device)
    _peak_reset(device)
    t_base = _timed_pass(lambda: run(2 * a), device)
    per = (t_base - t_first) / a  # an underestimate where the first pass paid first-call work: a longer last pass
    fits = int(preset["unit_seconds"] / per) if per > 0 else m
    length = min(m, max(4 * a, fits // batch * batch))
    t_long = _timed_pass(lambda: run(length), device) if length > 2 * a else t_base
    per = (t_long - t_base) / (length - 2 * a) if length > 2 * a else 0.0
    if per <= 0:  # a slice too short for a third pass, or timing noise: the pass's whole time, an upper bound
        per = t_long / length
    setup = max(t_base - 2 * a * per, 0.0)
    rate = len(configs) / per
    together = None if len(configs) == 1 else bool(lockstep_orders)
    return Unit(dataset.name, backbone, card.name, dataset.test_images * preset["orders"], views, rate,
                _peak_bytes(device), flop * rate / gemm, len(configs), order_free(card.name),
                card.text_encoder is not None, length, setup, math.ceil(preset["orders"] / len(configs)), together)


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


def as_swept(units: list[Unit], orders: int) -> list[Unit]:
    """The units as a sweep runs them: an order-free method's configuration computed once for all its orders
    (orchestrator.sweep.replay writes its rows in every order), every other method over each order."""
    return [replace(u, samples=u.samples // orders, groups=orders, passes=1) if u.order_free else u for u in units]


def report(units: list[Unit], orders: int, gemm: float, device: str) -> str:
    from orchestrator.registry import method_label

    measured, units = units, as_swept(units, orders)
    lines = [["method", "device-s", "cfg-samples/s", "G", "orders in a pass", "peak MB", "GEMM fraction", "share"]]
    total = sum(u.seconds for u in units)
    for method in dict.fromkeys(u.method for u in units):
        mine = [u for u in units if u.method == method]
        seconds = sum(u.seconds for u in mine)
        samples = sum(u.samples for u in mine)
        fraction = sum(u.gemm_fraction * u.seconds for u in mine) / seconds
        groups = sorted({u.groups for u in measured if u.method == method})
        lines.append([method_label(method), f"{seconds:,.0f}", _rate(samples / seconds),
                      f"{groups[0]}" if len(groups) == 1 else f"{groups[0]}-{groups[-1]}", _together(mine),
                      f"{max(u.peak_bytes for u in mine) / 2**20:,.0f}", f"{fraction:.2%}", f"{seconds / total:.0%}"])
    samples = sum(u.samples for u in units)
    lines.append(["total", f"{total:,.0f}", f"{samples / total:,.0f}", "", "",
                  f"{max(u.peak_bytes for u in units) / 2**20:,.0f}",
                  f"{sum(u.gemm_fraction * u.seconds for u in units) / total:.2%}", "100%"])
    free = sorted({u.method for u in units if u.order_free})
    out = [markdown_table(lines, left_columns=1), "",
           f"device {device}; measured fp32 GEMM {gemm / 1e9:,.1f} Gflop/s; {samples:,} method-samples "
           f"computed ({orders} orders"
           + (f"; the order-free methods, {', '.join(method_label(m) for m in free)}, computed once for all of "
              f"them, as the sweep replays their rows" if free else "")
           + "); GEMM fraction: the dominant products' flop (views x classes x d per config-sample; "
           "prompt tuning: its text tower's forward and backward) over that rate, above 100% where the configs "
           "share the product (Zero's and MTA's runner scores the views once for all). Orders in a pass: 'G' where "
           "the runner steps G orders together; 'one' where it steps G grid points of one order (a sweep gives such "
           "a runner one order's configurations per pass, so a grid of one configuration per order, the paper's, "
           "runs at G = 1 there and slower than this projection); 'once' where the configuration is computed once "
           "for every order; '-' for one stream a pass"]
    for n in (1, 8, 64):
        seconds = makespan(units, n, orders)
        out.append(f"projected on {n:>2} device(s): {seconds / 3600:.2f} h ({seconds:.3g} s)")
    out.append("")
    out.extend(_variants(measured, units, orders))
    return "\n".join(out)


def _together(units: list[Unit]) -> str:
    """The 'orders in a pass' cell of one method's units (report's note)."""
    if all(u.order_free for u in units):
        return "once"
    kinds = {u.orders_together for u in units}
    return "/".join({True: "G", False: "one", None: "-"}[k] for k in (True, False, None) if k in kinds)


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _variants(measured: list[Unit], swept: list[Unit], orders: int) -> list[str]:
    """The study without what bounds it (prompt tuning), and with every order computed (no replay)."""
    from orchestrator.registry import method_label

    out = []
    prompt = sorted({u.method for u in swept if u.prompt})
    rest = [u for u in swept if not u.prompt]
    if prompt and rest:
        seconds = makespan(rest, 1, orders)
        out.append(f"without prompt tuning ({', '.join(method_label(m) for m in prompt)}): "
                   f"{seconds / 3600:.2f} h on 1 device ({seconds:.3g} s)")
    if any(u.order_free for u in measured):
        seconds = makespan(measured, 1, orders)
        out.append(f"every order computed (order-free runs not replayed): {seconds / 3600:.2f} h on 1 device "
                   f"({seconds:.3g} s)")
    return out


def main(argv: list[str] | None = None) -> None:
    from orchestrator.registry import dataset_card, method_cards, paper_datasets
    from orchestrator.registry.backbones import names_teacher

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
    parser.add_argument("--time-limit", type=float, metavar="S",
                        help="measure no new unit after S seconds; the report then covers the measured units only "
                             "and says which were left (a device lent for minutes)")
    args = parser.parse_args(argv)
    preset = dict(QUICK if args.quick else FULL)
    for key in ("slice", "groups", "orders"):
        if getattr(args, key):
            preset[key] = getattr(args, key)
    names = args.datasets or (QUICK_DATASETS if args.quick else paper_datasets())
    datasets = [dataset_card(name) for name in names]
    # the methods adapting the image encoder run on images, which the study's synthetic features are not; those
    # reading an auxiliary encoder's or a CLIP teacher's features need them beside CLIP's, which the study's streams
    # have not (`python -m benchmarks.prompt` measures RLCF beside TPT)
    cards = [c for c in method_cards() if (args.methods is None or c.name in args.methods) and c.image_encoder is None
             and not c.auxiliary and not names_teacher(c)]
    gemm = measured_gemm_rate(args.device, 256 if args.quick else 4096)
    name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    print(f"machine: {os.cpu_count()} cpus, device {args.device} ({name}); load average at start "
          f"{os.getloadavg()[0]:.1f}")
    print(f"slice {preset['slice']} samples per unit, G = {preset['groups']} streams per pass, "
          f"{preset['orders']} orders", flush=True)
    units, left = [], []
    began = time.perf_counter()
    for dataset in datasets:
        for backbone in args.backbones:
            for card in cards:
                if args.time_limit is not None and time.perf_counter() - began > args.time_limit:
                    left.append(f"{dataset.name} {backbone} {card.name}")
                    continue
                unit = measure_unit(card, dataset, backbone, preset, args.device, gemm)
                units.append(unit)
                print(f"  {dataset.name} {backbone} {card.name}: G = {unit.groups}, up to {unit.measured} samples "
                      f"timed, {_rate(unit.rate)} cfg-samples/s, setup {unit.setup_s:.3f} s/pass, peak "
                      f"{unit.peak_bytes / 2**20:,.0f} MB", flush=True)
    if units:
        print(report(units, preset["orders"], gemm, args.device))
    print(f"measured {len(units)} units in {time.perf_counter() - began:.0f} s")
    if left:
        datasets_left = dict.fromkeys(unit.split()[0] for unit in left)
        print(f"NOT measured (--time-limit {args.time_limit:g} s reached), so not in the totals: {len(left)} units, "
              f"of {', '.join(datasets_left)}; first left: {left[0]}")


if __name__ == "__main__":
    main()
