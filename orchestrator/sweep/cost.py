"""What a run costs, and how `pack: auto` (the default) sizes trials by it.

A run's cost is its method's seconds per sample times its stream's length. Seconds per sample are measured, as
the ETA measures them (1 / samples_per_s of finished runs: in a pack, a run's share of its method's pass), from this
sweep's finished runs when there are any (a resumed sweep), else taken from the prior below. A trial then holds
the runs of one data source in stream order until they add up to TRIAL_TARGET_S of work, and never more than
TRIAL_MAX_S (a retried trial runs all of its runs again), so per-trial overhead (a Tune trial, a process
round trip, Tune's state) is a small share of the work and a lost trial costs at most about a minute.

On a GPU (a sweep whose trials ask for a GPU, planned where the driver sees one) a pack is sized by memory
instead: the runs of a source go into one trial until their configs' memory (`config_bytes`: each config's trace
and state in the lockstep pass) fills PACK_MEMORY_FRACTION of the trial's share of the device
(`memory_chunks`), so a lockstep pass takes as many configs as the card holds.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Protocol

from orchestrator.registry import baseline_method, find_method, method_card
from orchestrator.registry.backbones import BACKBONES


class RunLike(Protocol):
    """What a cost is taken of: a planned run (`orchestrator.sweep.plan.Run`, which imports this module)."""

    method: str
    source: Any

TRIAL_TARGET_S = 5.0
TRIAL_MAX_S = 60.0
# Where the cards' gpu_samples_per_s come from (tests/test_study_spec.py holds them to it); the projection of
# `bca sweep --dry-run` uses them where a GPU will run the sweep.
GPU_RATES_LOGS = ("benchmarks/logs/gpu-h100-2026-11-26.txt", "benchmarks/logs/gpu-h100-2026-11-26-2.txt")
# Images per second of each backbone's image encoder on the H100 of GPU_RATES_LOGS[0] ("3. image encoders": fp16,
# batch 64), as its record gives it (orchestrator.registry.backbones), which prices the dry run's encoding
# (tests/test_study_spec.py holds them to the log).
GPU_ENCODER_IMAGES_PER_S = {b.model: b.gpu_images_per_s for b in BACKBONES.values() if b.gpu_images_per_s}
# A method whose card has no samples_per_s (a plugin): as slow as the slowest known, one run a trial. The cards'
# rates are single-stream on one CPU core: slower than most real settings on a GPU, so trials start small.
UNKNOWN_SAMPLES_PER_S = 5.0
UNKNOWN_LENGTH = 50_000      # a real dataset the driver cannot list: ImageNet's size, so trials stay small
# Of a trial's share of the device's memory, what its pack's configs may take (the rest: the stream's features,
# the class embeddings, the allocator's slack).
PACK_MEMORY_FRACTION = 0.5


def measured_sample_seconds(rows: dict[str, dict[str, Any]]) -> dict[str, float]:
    """method -> median seconds per sample over the finished runs among runs-table `rows`."""
    seen: dict[str, list[float]] = {}
    for row in rows.values():
        rate = row.get("samples_per_s")
        if row.get("status") == "finished" and rate and rate > 0:
            seen.setdefault(row["method"], []).append(1.0 / rate)
    return {method: statistics.median(values) for method, values in seen.items()}


def cost_model(lengths: Callable[[Any], int], measured: dict[str, float] | None = None) -> Callable[[RunLike], float]:
    """Seconds a run is expected to take: measured (or prior) seconds per sample times `lengths(run.source)`."""
    per_sample_of = dict(measured or {})  # per method, looked up once
    memo: dict[Any, int] = {}

    def cost(run: RunLike) -> float:
        per_sample = per_sample_of.get(run.method)
        if per_sample is None:
            card = find_method(run.method)
            per_sample = per_sample_of[run.method] = 1.0 / ((card.cost.samples_per_s if card else None)
                                                             or UNKNOWN_SAMPLES_PER_S)
        length = memo.get(run.source)
        if length is None:
            length = memo[run.source] = lengths(run.source)
        return per_sample * length

    return cost


def stream_length(spec: Any, source: Any) -> int:
    """A data source's stream length: a synthetic scenario's n, a real dataset's listing, or when the driver
    cannot list it (data only the workers mount) the registry's test-set size (UNKNOWN_LENGTH if it has none)."""
    if source.is_synthetic:
        return int(source.params()["n"])
    from orchestrator.sweep.catalog import dataset_listing

    try:
        return len(dataset_listing(source.dataset, spec.data_root))
    except Exception:  # noqa: BLE001 - any listing failure only makes trials smaller; the trial reports it
        return registry_length(source.dataset)


def registry_length(dataset: str) -> int:
    """The registry's test-set size of a dataset, UNKNOWN_LENGTH where it has none."""
    from orchestrator.registry import dataset_card, dataset_key

    return (dataset_card(dataset).test_images if dataset_key(dataset) else None) or UNKNOWN_LENGTH


def projected_hours(runs: list[RunLike], length: Callable[[Any], int], encode: dict[str, int] | None = None
                    ) -> list[str]:
    """The dry run's projection: device-hours of `runs` (samples through each method) at the cards' CPU rates and
    at their gpu_samples_per_s (runs of a method without a GPU rate counted at its CPU rate, and named), plus on
    the GPU the image views to encode per backbone (`encode`: model -> views) at GPU_ENCODER_IMAGES_PER_S (a
    backbone without a measured rate is named, not priced). No CPU rate of the encoders is measured: the CPU
    projection says it leaves encoding out."""
    samples: dict[str, int] = {}
    memo: dict[Any, int] = {}
    for run in runs:
        if run.source not in memo:
            memo[run.source] = length(run.source)
        samples[run.method] = samples.get(run.method, 0) + memo[run.source]
    cpu = gpu = 0.0
    missing = []
    for method, count in samples.items():
        card = find_method(method)
        seconds = count / ((card.cost.samples_per_s if card else None) or UNKNOWN_SAMPLES_PER_S)
        cpu += seconds
        if card is not None and card.cost.gpu_samples_per_s:
            gpu += count / card.cost.gpu_samples_per_s
        else:
            gpu += seconds
            missing.append(method)
    encode = {model: views for model, views in (encode or {}).items() if views}
    rates = {model: GPU_ENCODER_IMAGES_PER_S.get(model.replace("/", "-")) for model in encode}
    encoding = sum(views / rates[model] for model, views in encode.items() if rates[model]) / 3600
    unpriced = sorted(model for model in encode if not rates[model])
    views = sum(encode.values())
    return [f"projected CPU-hours: {cpu / 3600:,.1f} (one core a run, the cards' samples_per_s at K = M = 1000, "
            f"d = 512; {sum(samples.values()):,} samples through the methods"
            + (f"; the {views:,} image views to encode are not in it: no CPU rate of the encoders is measured"
               if views else "") + ")",
            f"projected GPU-hours: {gpu / 3600 + encoding:,.1f} (one H100: methods {gpu / 3600:,.1f}, lockstep packs "
            f"of 32 configs where a method has a runner, rates from {' and '.join(GPU_RATES_LOGS)}"
            + (f"; at CPU rates: {', '.join(sorted(missing))}" if missing else "")
            + (f"; encoding {encoding:,.1f}, {views:,} image views at the image encoders' fp16 rates from "
               f"{GPU_RATES_LOGS[0]}" + (f", not priced for {', '.join(unpriced)} (no measured rate)" if unpriced
                                         else "") if views else "") + ")"]


def sweep_memory(spec: Any, device_bytes: int | None) -> tuple[float, Callable[[RunLike], int]] | None:
    """`make_trials`' memory sizing for a sweep whose trials take a GPU of `device_bytes` (None: pack by time)."""
    budget = pack_budget(spec.resources.gpu, device_bytes)
    return None if budget is None else (budget, memory_of(spec))


def trial_device_bytes(spec: Any) -> int | None:
    """The memory of the GPU a trial runs on: the spec's `resources.gpu_memory_gb` where given (the trials' nodes
    may have other GPUs than the driver), else this machine's first GPU, else None (packs by time)."""
    given = spec.resources.gpu_memory_gb
    return int(given * 2**30) if given is not None else local_device_bytes()


def unknown_device_note(spec: Any, device_bytes: int | None) -> list[str]:
    """A line when `pack: auto` trials take a GPU whose memory nothing here tells: their packs are then sized by CPU
    time, which gives methods slow on a CPU one run a trial, so a GPU steps their orders one at a time."""
    if spec.pack != "auto" or spec.resources.gpu <= 0 or device_bytes:
        return []
    return ["trials take a GPU but its memory is not known here (no GPU on this machine, no resources.gpu_memory_gb "
            "in the spec): packs are sized by CPU time instead of by the GPU's memory; set resources.gpu_memory_gb "
            "to the trials' GPU memory to pack them by it"]


def sweep_cost(spec: Any, rows: dict[str, dict[str, Any]] | None = None) -> Callable[[RunLike], float]:
    """The cost model of a sweep: measured from its finished runs' `rows` where there are any."""
    return cost_model(lambda source: stream_length(spec, source), measured_sample_seconds(rows or {}))


def config_bytes(method: str, num_classes: int, dim: int, length: int) -> int:
    """A config's memory in a lockstep pass, float32: its trace (posteriors [n, K] and three per-sample columns)
    and its state (`state_bytes`)."""
    return 4 * length * (num_classes + 3) + state_bytes(method, num_classes, dim, length)


def state_bytes(method: str, num_classes: int, dim: int, length: int = 0) -> int:
    """A config's state after `length` samples: its card's `Cost.state_words` (the methods table's memory column); a
    card without them (a plugin), rows of d + K per class (U and V, a cache's keys and values), float32."""
    card = find_method(method)
    if card is not None and card.cost.state_words is not None:
        return card.state_bytes(num_classes, dim, length)
    return 4 * num_classes * (dim + num_classes)


def source_shape(source: Any) -> tuple[int, int]:
    """(K, d) of a data source: a synthetic scenario's parameters, else the registry's classes and the
    backbone's embedding width."""
    if source.is_synthetic:
        params = source.params()
        return int(params["num_classes"]), int(params["dim"])
    from orchestrator.clip.backbone import model_config
    from orchestrator.registry import dataset_card, dataset_key

    classes = dataset_card(source.dataset).num_classes if dataset_key(source.dataset) else 1000
    return classes, int(model_config(source.model)["embed_dim"])


def memory_chunks(group: list[RunLike], budget_bytes: float, bytes_of: Callable[[RunLike], int]
                  ) -> list[tuple[RunLike, ...]]:
    """Consecutive runs of one group into packs whose configs' memory stays within `budget_bytes` (a run needing
    more is a pack of its own)."""
    return _greedy_chunks(group, bytes_of, lambda total, b: total + b > budget_bytes)


def _greedy_chunks(group: list[RunLike], weight: Callable[[RunLike], float],
                   closes: Callable[[float, float], bool]) -> list[tuple[RunLike, ...]]:
    """Consecutive runs into chunks: a non-empty chunk is closed before a run when closes(its total, the run's
    weight)."""
    chunks: list[tuple[RunLike, ...]] = []
    members: list[RunLike] = []
    total = 0.0
    for run in group:
        w = weight(run)
        if members and closes(total, w):
            chunks.append(tuple(members))
            members, total = [], 0.0
        members.append(run)
        total += w
    if members:
        chunks.append(tuple(members))
    return chunks


def pack_budget(gpu_share: float, device_bytes: int | None) -> float | None:
    """The memory a trial's pack may fill: PACK_MEMORY_FRACTION of its share (resources.gpu) of the device; None
    when the trials take no GPU or the device's memory is not known here."""
    if gpu_share <= 0 or not device_bytes:
        return None
    return PACK_MEMORY_FRACTION * min(gpu_share, 1.0) * device_bytes


def local_device_bytes() -> int | None:
    """The memory of this machine's first GPU, None without one (a driver without a GPU packs by time)."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None


def memory_of(spec: Any) -> Callable[[RunLike], int]:
    """A run's `config_bytes` from its source's shape and stream length."""
    memo: dict[Any, tuple[int, int, int]] = {}
    sizes: dict[tuple[str, int, int, int], int] = {}  # a card's expression evaluated once per method and shape

    def bytes_of(run: RunLike) -> int:
        shape = memo.get(run.source)
        if shape is None:
            shape = memo[run.source] = (*source_shape(run.source), stream_length(spec, run.source))
        key = (run.method, *shape)
        size = sizes.get(key)
        if size is None:
            size = sizes[key] = config_bytes(*key)
        return size

    return bytes_of


def chunk_by_cost(group: list[RunLike], cost: Callable[[RunLike], float]) -> list[tuple[RunLike, ...]]:
    """Consecutive runs of one group into trials of about TRIAL_TARGET_S and at most TRIAL_MAX_S of work (a run
    costing more is a trial of its own)."""
    return _greedy_chunks(group, cost, lambda total, c: total >= TRIAL_TARGET_S or total + c > TRIAL_MAX_S)


def realtime_k(method: str, views: int, model: str | None) -> int:
    """A realtime stream's k for `method` (`orchestrator.data.streams.Realtime`): its seconds per sample over
    zero-shot CLIP's, rounded up, both on one H100 as measured (GPU_RATES_LOGS): the image encoder on each view it
    reads (`views`; CLIP reads one) at the backbone's rate (none on a synthetic benchmark, which has no images,
    `model` None) plus the method's own step at its card's `gpu_samples_per_s`. A method slower than CLIP by any
    margin cannot keep up, hence up. ValueError where a rate is not measured (the spec's `k` then says it)."""
    encoder = 0.0
    if model is not None:
        rate = GPU_ENCODER_IMAGES_PER_S.get(model.replace("/", "-"))
        if rate is None:
            raise ValueError(f"backbone {model!r} has no measured image-encoder rate to derive a realtime k from; "
                             f"give the stream's k (e.g. {{realtime: {{base: iid, k: 2}}}})")
        encoder = 1.0 / rate

    def step(name: str) -> float:
        rate = method_card(name).cost.gpu_samples_per_s
        if rate is None:
            raise ValueError(f"method {name!r} has no measured GPU cost (its card's gpu_samples_per_s) to derive a "
                             f"realtime k from; give the stream's k (e.g. {{realtime: {{base: iid, k: 2}}}})")
        return 1.0 / rate

    ratio = (views * encoder + step(method)) / (encoder + step(baseline_method()))
    return max(1, math.ceil(ratio * (1 - 1e-9)))  # a ratio of 2 computed as 2.0000000001 is 2
