"""Stream protocols: the order in which a dataset's samples reach an online method (numpy only, no torch).

Each protocol is a small frozen dataclass, validated on construction, whose ``order(...)`` is a pure
function of (labels, seed): the same arguments give the same order on every machine. An order is a
``StreamOrder``: for each stream position, the source it comes from and the sample's index there, and
whether the sample is out of distribution.

- ``Iid``: a uniform random permutation, bit-identical to ``torch.randperm(n, generator=
  torch.Generator().manual_seed(seed))``, the order every real-dataset run has used so far, so existing
  runs keep their order. It replays torch's CPU algorithm (a Fisher-Yates pass drawing
  ``mt19937() % (n - i)``, with the generator seeded by the seed's low 32 bits) with numpy's legacy
  MT19937, which is seeded the same way.
- ``Dirichlet(gamma, slots, batch)``: label-correlated bursts, StatA's definition (``MaxZanella/StatA``
  sampler.py, ``OnlineSampler.create_indices``): every class draws Dirichlet(gamma, ..., gamma) proportions
  over S slots; the class's samples, in dataset order, are cut into S consecutive chunks by those proportions
  (cut points floor(cumsum * count));
  slot s gathers chunk s of every class; each slot is shuffled; the stream is slot 0, slot 1, ...
  Smaller gamma concentrates each class in fewer slots: longer runs of one class. The slot rule:
  ``batches`` (the default), StatA's main.py, S = min(n // batch, number of classes present) with ``batch``
  the run's batch size (StatA's online runs: 128), at least 1 (StatA's loop has no slot at all when n <
  batch); ``classes``, one slot per class present (what batch size 1 gives under ``batches`` too, so every
  batch-1 order is the same under both rules); or a fixed number. OGA's
  ``LabelCorrelatedSampler`` (``cfuchs2023/OGA`` datasets/sampler.py) means the same but, as written,
  empties the slots and extends the stream inside its per-class loop, which yields the classes one after
  another (in label order); we follow StatA.
- ``Separate``: class after class (class-incremental): the classes present in a random order, each
  class's samples shuffled (StatA's gamma = -1).
- ``LongTail(imbalance)``: a long-tailed subset of the dataset in a uniformly random order (L-TTA, ICLR 2026,
  streams at imbalance 10, 20 and 50; its code was not available to us, so this follows the paper's
  description with the exponential profile of the long-tailed benchmarks it builds on, LDAM-DRW's
  ``get_img_num_per_cls``): the classes present are ranked at random (per order), and the class at rank r of
  K keeps n_r = floor(n_head * imbalance^(-r / (K - 1))) of its samples, drawn at random, with n_head the
  largest head count every class can supply (min over r of count_r * imbalance^(r / (K - 1)), floored; on a
  balanced dataset its class size). Frequencies fall geometrically from head to tail; max / min = imbalance
  up to the flooring to whole samples.
- ``Contaminated(rate, pool)``: a base protocol's order of the dataset with out-of-distribution samples
  interleaved: m = round(rate * n / (1 - rate)) samples drawn without replacement from the OOD pool
  (held-out classes of the same dataset, or another dataset) at uniformly random positions, so that a
  fraction ``rate`` of the stream is OOD. Source 0 is the dataset, source 1 the pool; OOD positions are
  flagged ``is_ood``.
- ``Continual(datasets, mixing)``: one stream across several datasets that share a label space, one after
  another, each in its own i.i.d. order; ``source`` keeps each sample's dataset (its position in the list).
  An entry may be a corruption benchmark's ``{name: cifar10-c, corruption: all, severity: 5}``, which stands
  for its (corruption, severity) datasets in order: ``corruption: all`` is CoTTA's continual benchmark, the
  15 corruptions in CoTTA's order at one severity (``orchestrator.registry.corruptions``).
  With ``mixing`` > 0, a gradual drift: neighbours share a window (the last mixing/2 of one dataset, the first
  mixing/2 of the next) in which the next one's share rises linearly (our construction, as the gradual
  settings of continual TTA change the domain step by step rather than at once).
- ``Realtime(base, k)``: the base protocol's order, streamed at the speed of zero-shot CLIP (Alfarra et al.,
  "Evaluation of Test-Time Adaptation Under Computational Time Constraints", ICML 2024): a method whose cost
  per sample is k times CLIP's is busy for k samples after each adaptation step, so it adapts on the samples at
  positions 0, k, 2k, ... and predicts the others from its current state without adapting. The order does not
  depend on k; k is the method's (``orchestrator.sweep.cost.realtime_k`` from its card's measured cost, or the
  spec's ``k``), recorded in each run's config as ``realtime_k``.

``derive_order_seeds(seed, n)`` gives the seeds of ``orders: n`` (the first is the run's seed itself, so
one order is today's order); ``protocol_from_spec`` reads the YAML forms
(``iid``, ``separate``, ``{dirichlet: {gamma: 0.1}}``, ``{longtail: {imbalance: 10}}``,
``{contaminated: {with: X, rate: 0.2}}``, ``{continual: [a, b, c]}``,
``{continual: {datasets: [a, b], mixing: 0.2}}``, ``{realtime: {base: iid}}``, ``{realtime: {base: iid, k: 4}}``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from orchestrator.registry.corruptions import BENCHMARKS, benchmark_key, expand_variants

PROTOCOLS = ("iid", "dirichlet", "separate", "longtail", "contaminated", "continual", "realtime")
# StatA's and OGA's gamma presets: smaller is burstier.
DIRICHLET_GAMMAS = (0.1, 0.01, 0.001)
# The contamination pool meaning "the dataset's own held-out classes" rather than another dataset's name.
HELD_OUT_CLASSES = "held_out_classes"
# torch.randperm switches to another algorithm from this length on (aten TensorFactories.cpp, randperm_cpu).
_TORCH_SMALL_N = (2**32 - 1) // 20
_SEED_MASK = 0xFFFFFFFF


@dataclass(frozen=True)
class StreamOrder:
    """A stream: position i is sample ``index[i]`` of source ``source[i]``; ``is_ood[i]`` flags OOD samples."""

    index: np.ndarray   # [n] int64
    source: np.ndarray  # [n] int64: 0 for single-dataset protocols; the pool (1) or the dataset's list position
    is_ood: np.ndarray  # [n] bool

    def __len__(self) -> int:
        return int(self.index.shape[0])


def _single(index: np.ndarray) -> StreamOrder:
    n = index.shape[0]
    return StreamOrder(index=index.astype(np.int64), source=np.zeros(n, np.int64), is_ood=np.zeros(n, bool))


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"stream seed must be an integer >= 0, got {seed!r}")
    return int(seed)


def _check_labels(labels: Any, name: str = "labels") -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"stream {name} must be a 1-D integer array, got shape {arr.shape} dtype {arr.dtype}")
    return arr.astype(np.int64)


def iid_permutation(n: int, seed: int) -> np.ndarray:
    """torch.randperm(n, generator=torch.Generator().manual_seed(seed)), reproduced without torch."""
    seed = _check_seed(seed)
    if not 0 <= n < _TORCH_SMALL_N:
        raise ValueError(f"iid stream length must be in [0, {_TORCH_SMALL_N}), got {n}")
    draws = np.random.RandomState(seed & _SEED_MASK).randint(0, 2**32, size=max(n - 1, 0), dtype=np.uint32)
    out = np.arange(n, dtype=np.int64)
    for i, draw in enumerate(draws.tolist()):
        j = i + draw % (n - i)
        out[i], out[j] = out[j], out[i]
    return out


def derive_order_seeds(seed: int, n: int) -> list[int]:
    """``n`` distinct seeds for ``orders: n``: the run's seed, then seeds drawn from a SeedSequence of it.

    Deterministic; all in [0, 2**32) after the first (torch seeds on the low 32 bits, so distinct low 32
    bits are what make the orders distinct: a drawn seed equal to the run's seed there is skipped).
    """
    seed = _check_seed(seed)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"orders must be an integer >= 1, got {n!r}")
    seeds, seen = [seed], {seed & _SEED_MASK}
    sequence = np.random.SeedSequence(seed)
    while len(seeds) < n:
        for value in sequence.generate_state(n, dtype=np.uint32).tolist():
            if value not in seen and len(seeds) < n:
                seeds.append(value)
                seen.add(value)
        sequence = sequence.spawn(1)[0]
    return seeds


@dataclass(frozen=True)
class Iid:
    """Today's order: a uniform random permutation (bit-identical to the trial's torch.randperm)."""

    name = "iid"

    def order(self, labels: Any, seed: int) -> StreamOrder:
        return _single(iid_permutation(len(_check_labels(labels)), seed))

    def describe(self) -> str:
        return "iid: every sample once, in a uniformly random order (torch.randperm of the run's seed)"


SLOT_RULES = ("batches", "classes")


@dataclass(frozen=True)
class Dirichlet:
    """Label-correlated bursts (StatA): per class, Dirichlet(gamma) proportions over the slots ``slots`` gives:
    'batches' (StatA's main.py: min(n // batch, classes present), None means it), 'classes' (one per class
    present) or a fixed number. ``batch``: the batch size the 'batches' rule divides by (None: 1)."""

    gamma: float
    slots: int | str | None = None
    batch: int | None = None
    name = "dirichlet"

    def __post_init__(self) -> None:
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, (int, float)) or not (
                math.isfinite(self.gamma) and self.gamma > 0):
            raise ValueError(f"dirichlet gamma must be a finite number > 0, got {self.gamma!r}")
        if self.slots is not None and self.slots not in SLOT_RULES and (
                isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 1):
            raise ValueError(f"dirichlet slots must be {' or '.join(SLOT_RULES)}, an integer >= 1 or null, "
                             f"got {self.slots!r}")
        if self.batch is not None and (isinstance(self.batch, bool) or not isinstance(self.batch, int)
                                       or self.batch < 1):
            raise ValueError(f"dirichlet batch must be an integer >= 1 or null, got {self.batch!r}")
        if self.batch is not None and self.rule != "batches":
            raise ValueError(f"dirichlet batch sets the 'batches' slot rule's batch size; slots {self.slots!r} "
                             "does not use it")

    @property
    def rule(self) -> str:
        """'batches', 'classes' or 'fixed'."""
        return "batches" if self.slots is None else self.slots if isinstance(self.slots, str) else "fixed"

    def num_slots(self, n: int, num_classes: int) -> int:
        """The slots of a stream of n samples from num_classes classes."""
        if self.rule == "fixed":
            return int(self.slots)
        if self.rule == "classes":
            return num_classes
        return max(1, min(n // (self.batch or 1), num_classes))

    def order(self, labels: Any, seed: int) -> StreamOrder:
        labels = _check_labels(labels)
        rng = np.random.default_rng(_check_seed(seed))
        classes = np.unique(labels)
        num_slots = self.num_slots(len(labels), len(classes))
        proportions = rng.dirichlet([float(self.gamma)] * num_slots, len(classes))
        slots: list[list[np.ndarray]] = [[] for _ in range(num_slots)]
        for c, share in zip(classes, proportions):
            members = np.flatnonzero(labels == c)
            cuts = (np.cumsum(share)[:-1] * len(members)).astype(np.int64)
            for s, chunk in enumerate(np.split(members, cuts)):
                slots[s].append(chunk)
        parts = [rng.permutation(np.concatenate(slot)) for slot in slots if slot]
        return _single(np.concatenate(parts) if parts else np.zeros(0, np.int64))

    def describe(self) -> str:
        slots = {"batches": f"StatA's slots, min(n // {self.batch or 1}, classes)" if (self.batch or 1) > 1
                 else "one slot per class", "classes": "one slot per class",
                 "fixed": f"{self.slots} slots"}[self.rule]
        return (f"dirichlet(gamma={self.gamma}): label-correlated bursts as in StatA, {slots}; each class's "
                "samples split over the slots by Dirichlet(gamma) proportions, slots shuffled and streamed "
                "in turn (smaller gamma: longer runs of one class)")


@dataclass(frozen=True)
class Separate:
    """Class after class: the classes in a random order, each class's samples shuffled."""

    name = "separate"

    def order(self, labels: Any, seed: int) -> StreamOrder:
        labels = _check_labels(labels)
        rng = np.random.default_rng(_check_seed(seed))
        parts = [rng.permutation(np.flatnonzero(labels == c)) for c in rng.permutation(np.unique(labels))]
        return _single(np.concatenate(parts) if parts else np.zeros(0, np.int64))

    def describe(self) -> str:
        return "separate: one class after another (classes in a random order), each class's samples shuffled"


@dataclass(frozen=True)
class LongTail:
    """A long-tailed subset, class frequencies falling geometrically over a random class ranking (max / min =
    ``imbalance``), in a uniformly random order."""

    imbalance: float
    name = "longtail"

    def __post_init__(self) -> None:
        if isinstance(self.imbalance, bool) or not isinstance(self.imbalance, (int, float)) or not (
                math.isfinite(self.imbalance) and self.imbalance >= 1):
            raise ValueError(f"longtail imbalance must be a finite number >= 1 (max / min class frequency, e.g. 10, "
                             f"20, 50), got {self.imbalance!r}")

    def counts(self, available: np.ndarray) -> np.ndarray:
        """Samples kept per rank, given the samples ``available`` of the class at each rank (head first)."""
        k = len(available)
        factor = float(self.imbalance) ** -(np.arange(k) / max(k - 1, 1))
        head = int(np.floor((available / factor).min()))
        if head * factor[-1] < 1:
            raise ValueError(f"longtail imbalance {self.imbalance:g} over {k} classes needs a head class of at least "
                             f"{math.ceil(self.imbalance)} samples, but the classes' sizes allow only {head}")
        return np.minimum(available, np.floor(head * factor).astype(np.int64))

    def order(self, labels: Any, seed: int) -> StreamOrder:
        labels = _check_labels(labels)
        rng = np.random.default_rng(_check_seed(seed))
        ranked = rng.permutation(np.unique(labels))  # head first
        members = [np.flatnonzero(labels == c) for c in ranked]
        counts = self.counts(np.array([len(m) for m in members], np.int64)) if members else []
        kept = [rng.choice(m, size=int(c), replace=False) for m, c in zip(members, counts)]
        return _single(rng.permutation(np.concatenate(kept)) if kept else np.zeros(0, np.int64))

    def describe(self) -> str:
        return (f"longtail(imbalance={self.imbalance:g}): a long-tailed subset, class frequencies falling "
                "geometrically over a random class ranking (max / min = imbalance), in a random order")


_IN_DISTRIBUTION = (Iid, Dirichlet, Separate)


@dataclass(frozen=True)
class Contaminated:
    """The base protocol's order with a fraction ``rate`` of the stream drawn from an OOD pool."""

    rate: float
    pool: str = HELD_OUT_CLASSES  # another dataset's name, or HELD_OUT_CLASSES
    base: Iid | Dirichlet | Separate = Iid()
    name = "contaminated"

    def __post_init__(self) -> None:
        if isinstance(self.rate, bool) or not isinstance(self.rate, (int, float)) or not 0 <= self.rate < 1:
            raise ValueError(f"contaminated rate must be a number in [0, 1), got {self.rate!r}")
        if not isinstance(self.pool, str) or not self.pool:
            raise ValueError(f"contaminated with must be a dataset name or {HELD_OUT_CLASSES!r}, got {self.pool!r}")
        if not isinstance(self.base, _IN_DISTRIBUTION):
            raise ValueError(f"contaminated base must be iid, dirichlet or separate, got {self.base!r}")

    def ood_count(self, n: int) -> int:
        """How many pool samples a stream of ``n`` in-distribution samples gets."""
        return int(round(self.rate * n / (1 - self.rate)))

    def order(self, labels: Any, seed: int, pool_size: int) -> StreamOrder:
        labels = _check_labels(labels)
        seed = _check_seed(seed)
        base = self.base.order(labels, seed)
        m = self.ood_count(len(labels))
        if m > pool_size:
            raise ValueError(f"contaminated rate {self.rate} needs {m} OOD samples for {len(labels)} in-distribution "
                             f"ones, but the pool {self.pool!r} has {pool_size}")
        rng = np.random.default_rng([seed, 1])  # independent of the base order's stream
        picked = rng.choice(pool_size, size=m, replace=False)
        total = len(labels) + m
        is_ood = np.zeros(total, bool)
        is_ood[rng.choice(total, size=m, replace=False)] = True
        index = np.empty(total, np.int64)
        index[~is_ood], index[is_ood] = base.index, picked
        return StreamOrder(index=index, source=is_ood.astype(np.int64), is_ood=is_ood)

    def describe(self) -> str:
        pool = "held-out classes of the same dataset" if self.pool == HELD_OUT_CLASSES else f"dataset {self.pool}"
        return (f"contaminated(rate={self.rate}, with={pool}): the {self.base.name} order with OOD samples "
                f"at random positions, {self.rate:.0%} of the stream, flagged is_ood and left out of accuracy")


def held_out_split(labels: Any, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hold out a random ``fraction`` of the classes as the OOD pool (tta-vlm holds out 50%).

    Returns (kept classes sorted, indices of the kept classes' samples, indices of the held-out ones'), the
    indices in dataset order. The kept classes are the run's label space.
    """
    labels = _check_labels(labels)
    classes = np.unique(labels)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ValueError(f"held-out fraction must be a number in (0, 1), got {fraction!r}")
    held = int(round(fraction * len(classes)))
    if not 0 < held < len(classes):
        raise ValueError(f"held-out fraction {fraction} of {len(classes)} classes leaves one side without a class")
    rng = np.random.default_rng([_check_seed(seed), 2])
    held_classes = rng.choice(classes, size=held, replace=False)
    is_held = np.isin(labels, held_classes)
    return np.setdiff1d(classes, held_classes), np.flatnonzero(~is_held), np.flatnonzero(is_held)


@dataclass(frozen=True)
class Continual:
    """Several datasets sharing a label space, one after another, each in its own i.i.d. order; with ``mixing``
    > 0 (gradual drift) each pair of neighbours interleaved over a window, the next one's share rising linearly
    across it."""

    datasets: tuple[str, ...]
    mixing: float = 0.0
    name = "continual"

    def __post_init__(self) -> None:
        if (not isinstance(self.datasets, tuple) or len(self.datasets) < 2
                or not all(isinstance(d, str) and d for d in self.datasets)):
            raise ValueError(f"continual needs a list of at least 2 dataset names, got {self.datasets!r}")
        if len(set(self.datasets)) != len(self.datasets):
            raise ValueError(f"continual datasets must be distinct, got {list(self.datasets)}")
        if isinstance(self.mixing, bool) or not isinstance(self.mixing, (int, float)) or not 0 <= self.mixing <= 1:
            raise ValueError(f"continual mixing must be a number in [0, 1] (the share of each dataset in a mixing "
                             f"window), got {self.mixing!r}")

    def order(self, labels: Sequence[Any], seed: int) -> StreamOrder:
        """``labels``: one label array per dataset, in ``datasets`` order."""
        if len(labels) != len(self.datasets):
            raise ValueError(f"continual needs labels for its {len(self.datasets)} datasets, got {len(labels)}")
        seeds = derive_order_seeds(_check_seed(seed), len(self.datasets))
        parts = [iid_permutation(len(_check_labels(lab, f"labels of {name}")), s)
                 for lab, s, name in zip(labels, seeds, self.datasets)]
        if not self.mixing:
            source = np.concatenate([np.full(len(p), i, np.int64) for i, p in enumerate(parts)])
            return StreamOrder(index=np.concatenate(parts), source=source, is_ood=np.zeros(len(source), bool))
        return self._gradual(parts, _check_seed(seed))

    def _gradual(self, parts: list[np.ndarray], seed: int) -> StreamOrder:
        """Dataset i's last floor(mixing * n_i / 2) samples and dataset i+1's first floor(mixing * n_{i+1} / 2)
        share a window: each side's samples get sorted positions drawn from a density falling (2 (1 - x)) or
        rising (2 x) across it, and the window streams them by position, each side in its own order."""
        rng = np.random.default_rng([seed, 4])  # apart from the datasets' own orders
        edge = [int(self.mixing * len(p) / 2) for p in parts]
        index, source = [], []

        def emit(idx: np.ndarray, src: np.ndarray) -> None:
            index.append(idx)
            source.append(src)

        for i, part in enumerate(parts):
            head = edge[i] if i > 0 else 0
            tail = edge[i] if i < len(parts) - 1 else 0
            emit(part[head:len(part) - tail], np.full(len(part) - head - tail, i, np.int64))
            if tail:
                prev, nxt = part[len(part) - tail:], parts[i + 1][:edge[i + 1]]
                at = np.concatenate([np.sort(rng.triangular(0, 0, 1, len(prev))),
                                     np.sort(rng.triangular(0, 1, 1, len(nxt)))])
                by = np.argsort(at, kind="stable")
                emit(np.concatenate([prev, nxt])[by],
                     np.concatenate([np.full(len(prev), i, np.int64), np.full(len(nxt), i + 1, np.int64)])[by])
        src = np.concatenate(source)
        return StreamOrder(index=np.concatenate(index), source=src, is_ood=np.zeros(len(src), bool))

    def describe(self) -> str:
        drift = (f", neighbours interleaved over windows of {self.mixing:.0%} of each (gradual drift: the next "
                 "dataset's share rising linearly across a window)" if self.mixing else "")
        return (f"continual({', '.join(self.datasets)}): one method state across the datasets in turn, each "
                f"in its own i.i.d. order{drift}; rows keep their source dataset")


@dataclass(frozen=True)
class Realtime:
    """The base protocol's order; the method adapts on every k-th sample (positions 0, k, 2k, ...) and predicts the
    others from its current state. ``k`` None: each method's own, from its measured cost (the planner fills it)."""

    base: Iid | Dirichlet | Separate | LongTail = Iid()
    k: int | None = None
    name = "realtime"

    def __post_init__(self) -> None:
        if not isinstance(self.base, _REALTIME_BASES):
            raise ValueError(f"realtime base must be iid, dirichlet, separate or longtail, got {self.base!r}")
        if self.k is not None and (isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1):
            raise ValueError(f"realtime k must be an integer >= 1 (the method adapts on every k-th sample) or "
                             f"null (from the method's measured cost), got {self.k!r}")

    def order(self, labels: Any, seed: int) -> StreamOrder:
        return self.base.order(labels, seed)

    def describe(self) -> str:
        every = f"every {self.k}-th sample" if self.k else "every k-th sample, k its cost per sample over CLIP's"
        return (f"realtime({self.base.name}): the {self.base.name} order at CLIP's speed; a method adapts on {every} "
                "and predicts the samples that pass while it is busy from its current state (Alfarra et al., ICML "
                "2024)")


_REALTIME_BASES = (Iid, Dirichlet, Separate, LongTail)
Protocol = Iid | Dirichlet | Separate | LongTail | Contaminated | Continual | Realtime


def _fields(name: str, value: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"stream {name} takes a mapping of {sorted(allowed)}, got {value!r}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ValueError(f"unknown stream {name} field {unknown[0]!r}; expected {sorted(allowed)}")
    return value


def _continual_entry(entry: Any) -> list[Any]:
    """A continual list's entry as dataset names: a name, or a corruption benchmark's {name, corruption,
    severity} as its variants."""
    if not isinstance(entry, dict):
        return [entry]
    entry = _fields("continual entry", entry, {"name", "corruption", "severity"})
    bench = benchmark_key(entry.get("name"))
    if bench is None:
        raise ValueError(f"stream continual entry {entry!r}: a mapping names a corruption benchmark "
                         f"({', '.join(BENCHMARKS)}) with its corruption and severity; other datasets go by name")
    return expand_variants(bench, entry.get("corruption"), entry.get("severity"))


def stream_value(stored: Any) -> Any:
    """A stored stream as the spec's value (None: the dataset's own order, a word, or a one-key mapping), decoded
    here alone: the runs table's stream column (a word as it is, a mapping as JSON, null or NaN) and a data
    source's canonical JSON of the value."""
    if stored is None or (isinstance(stored, float) and math.isnan(stored)):
        return None
    if isinstance(stored, str) and stored[:1] in ("{", '"'):
        return json.loads(stored)
    return stored


def stream_label(value: Any) -> str:
    """A short name of a spec's stream value for labels: iid, dirichlet(gamma=0.01), contaminated(rate=0.2), ..."""
    if not isinstance(value, dict) or len(value) != 1:
        return str(value)
    name, body = next(iter(value.items()))
    if isinstance(body, dict):
        def text(v: Any) -> str:
            return stream_label(v) if isinstance(v, dict) else " > ".join(map(str, v)) if isinstance(v, list) else str(v)

        inner = ", ".join(f"{k}={text(v)}" for k, v in body.items())
        return f"{name}({inner})"
    if isinstance(body, list):
        entries = (" ".join(str(v) for v in e.values()) if isinstance(e, dict) else str(e) for e in body)
        return f"{name}({' > '.join(entries)})"
    return name


def stream_for_batch(value: Any, batch_size: int) -> Any:
    """A spec's stream value as a run at `batch_size` streams it: a Dirichlet order under the 'batches' slot rule
    (the default) with no batch of its own takes the run's, written into the value (slots: batches, batch: B) so
    the run's config says which rule and batch size its order used. Unchanged at batch size 1 (that order is
    the one-slot-per-class order every earlier run has, and keeps their run_ids) and for other protocols."""
    if batch_size == 1 or not isinstance(value, dict) or len(value) != 1:
        return value
    name, body = next(iter(value.items()))
    if name == "contaminated" and isinstance(body, dict) and "base" in body:
        return {name: {**body, "base": stream_for_batch(body["base"], batch_size)}}
    if name == "dirichlet" and isinstance(body, dict) and body.get("slots") in (None, "batches") and (
            body.get("batch") is None):
        return {name: {**body, "slots": "batches", "batch": batch_size}}
    return value


def protocol_from_spec(value: Any) -> Protocol:
    """The protocol a spec's ``stream:`` value names (see the module docstring for the forms)."""
    if value in ("iid", "separate"):
        return Iid() if value == "iid" else Separate()
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in PROTOCOLS:
        raise ValueError(f"unknown stream {value!r}; expected one of {', '.join(PROTOCOLS)} "
                         "(iid and separate as words, the others as a one-key mapping)")
    name, body = next(iter(value.items()))
    if name == "dirichlet":
        body = _fields(name, body, {"gamma", "slots", "batch"})
        if "gamma" not in body:
            raise ValueError("stream dirichlet needs gamma (e.g. 0.1, 0.01, 0.001)")
        return Dirichlet(**body)
    if name == "longtail":
        body = _fields(name, body, {"imbalance"})
        if "imbalance" not in body:
            raise ValueError("stream longtail needs imbalance (max / min class frequency, e.g. 10, 20, 50)")
        return LongTail(**body)
    if name == "contaminated":
        body = _fields(name, body, {"with", "rate", "base"})
        if "rate" not in body:
            raise ValueError("stream contaminated needs rate")
        base = protocol_from_spec(body.get("base", "iid"))
        if not isinstance(base, _IN_DISTRIBUTION):
            raise ValueError(f"contaminated base must be iid, dirichlet or separate, got {body['base']!r}")
        return Contaminated(rate=body["rate"], pool=body.get("with", HELD_OUT_CLASSES), base=base)
    if name == "realtime":
        body = _fields(name, body, {"base", "k"})
        base = protocol_from_spec(body.get("base", "iid"))
        if not isinstance(base, _REALTIME_BASES):
            raise ValueError(f"realtime base must be iid, dirichlet, separate or longtail, got {body['base']!r}")
        return Realtime(base=base, k=body.get("k"))
    if name == "continual":
        if isinstance(body, dict):
            body = _fields(name, body, {"datasets", "mixing"})
            if not isinstance(body.get("datasets"), list):
                raise ValueError(f"stream continual needs datasets, a list of dataset names, got "
                                 f"{body.get('datasets')!r}")
            return Continual(datasets=tuple(d for entry in body["datasets"] for d in _continual_entry(entry)),
                             mixing=body.get("mixing", 0.0))
        if not isinstance(body, list):
            raise ValueError(f"stream continual takes a list of dataset names (or datasets and mixing), got {body!r}")
        return Continual(datasets=tuple(d for entry in body for d in _continual_entry(entry)))
    if body not in (None, {}):
        raise ValueError(f"stream {name} takes no parameters, got {body!r}")
    return protocol_from_spec(name)
