"""The stream a run sees: a protocol's order (`orchestrator.data.streams`) laid over one or more benchmarks.

`arrange` returns every per-sample tensor in stream order plus where each sample came from. Contaminated
streams hold out half of the dataset's classes as the OOD pool (as tta-vlm does) or draw the pool from another
dataset; OOD samples get label -1 and `is_ood`, and with held-out classes the label space (labels, class
embeddings) is remapped to the kept classes. Continual streams need datasets with the same class names.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from orchestrator.data.streams import HELD_OUT_CLASSES, Contaminated, Continual, Protocol, StreamOrder, held_out_split
from orchestrator.data.types import Benchmark

HELD_OUT_FRACTION = 0.5  # of the classes, held out as the OOD pool of a contaminated stream (tta-vlm's split)


@dataclass
class Arranged:
    """A stream ready to run: features [n, d] or [n, V, d], labels (-1 for OOD), image ids, OOD flags, each
    sample's source dataset and its index there, and the label space the method predicts over."""

    features: torch.Tensor
    labels: torch.Tensor
    image_ids: list[str]
    is_ood: torch.Tensor
    sources: list[str]
    order: torch.Tensor
    source_index: torch.Tensor
    class_embeddings: torch.Tensor
    class_ids: torch.Tensor
    class_names: list[str]


def arrange(bench: Benchmark, protocol: Protocol | None, seed: int, *, others: tuple[Benchmark, ...] = (),
            split_seed: int | None = None) -> Arranged:
    """`bench` in `protocol`'s order for `seed` (None: the benchmark's own order). `others`: the pool dataset of
    a contaminated stream, or the datasets after the first of a continual one. `split_seed` (default `seed`)
    draws the held-out classes, so that the orders of one run's configuration share its label space."""
    if isinstance(protocol, Continual):
        return _continual((bench, *others), protocol, seed)
    if isinstance(protocol, Contaminated):
        return _contaminated(bench, protocol, seed, others, seed if split_seed is None else split_seed)
    if protocol is None:
        order = StreamOrder(np.arange(len(bench)), np.zeros(len(bench), np.int64), np.zeros(len(bench), bool))
    else:
        order = protocol.order(bench.labels.numpy(), seed)
    return _gather([bench], order, bench)


def _gather(parts: list[Benchmark], order: StreamOrder, space: Benchmark, labels: list[torch.Tensor] | None = None
            ) -> Arranged:
    """Samples order.index[i] of parts[order.source[i]], in stream order; `labels` overrides the parts' labels."""
    labels = labels if labels is not None else [p.labels for p in parts]
    index, source = torch.from_numpy(order.index), torch.from_numpy(order.source)
    features = torch.empty((len(index), *parts[0].features.shape[1:]), dtype=parts[0].features.dtype)
    stream_labels = torch.empty(len(index), dtype=torch.int64)
    image_ids: list[str] = [""] * len(index)
    for s, part in enumerate(parts):
        at = torch.nonzero(source == s).flatten()
        features[at] = part.features[index[at]]
        stream_labels[at] = labels[s][index[at]]
        for i, j in zip(at.tolist(), index[at].tolist()):
            image_ids[i] = part.image_ids[j]
    names = [p.name for p in parts]
    return Arranged(features=features, labels=stream_labels, image_ids=image_ids,
                    is_ood=torch.from_numpy(order.is_ood.copy()), sources=[names[s] for s in order.source.tolist()],
                    order=index, source_index=source, class_embeddings=space.class_embeddings,
                    class_ids=space.class_ids, class_names=list(space.class_names))


def _subset(bench: Benchmark, idx: np.ndarray) -> Benchmark:
    keep = torch.from_numpy(idx)
    return Benchmark(name=bench.name, features=bench.features[keep], labels=bench.labels[keep],
                     image_ids=[bench.image_ids[i] for i in idx.tolist()], class_names=bench.class_names,
                     class_embeddings=bench.class_embeddings, class_ids=bench.class_ids)


def _contaminated(bench: Benchmark, protocol: Contaminated, seed: int, others: tuple[Benchmark, ...],
                  split_seed: int) -> Arranged:
    if protocol.pool == HELD_OUT_CLASSES:
        kept, in_idx, ood_idx = held_out_split(bench.labels.numpy(), HELD_OUT_FRACTION, split_seed)
        new_label = torch.full((bench.num_classes,), -1, dtype=torch.int64)
        new_label[torch.from_numpy(kept)] = torch.arange(len(kept))
        rows = torch.nonzero(new_label[bench.class_ids] >= 0).flatten()
        space = Benchmark(name=bench.name, features=bench.features[:0], labels=bench.labels[:0], image_ids=[],
                          class_names=[bench.class_names[k] for k in kept.tolist()],
                          class_embeddings=bench.class_embeddings[rows], class_ids=new_label[bench.class_ids[rows]])
        inside, pool = _subset(bench, in_idx), _subset(bench, ood_idx)
        inside_labels = new_label[inside.labels]
    else:
        if len(others) != 1:
            raise ValueError(f"a stream contaminated with {protocol.pool!r} needs that dataset's features")
        inside, pool, space, inside_labels = bench, others[0], bench, bench.labels
        if pool.features.shape[1:] != bench.features.shape[1:]:
            raise ValueError(f"contaminated with {pool.name}: its features {tuple(pool.features.shape[1:])} do not "
                             f"match {bench.name}'s {tuple(bench.features.shape[1:])} (same backbone and views needed)")
    order = protocol.order(inside_labels.numpy(), seed, len(pool))
    pool_labels = torch.full((len(pool),), -1, dtype=torch.int64)
    return _gather([inside, pool], order, space, labels=[inside_labels, pool_labels])


def _continual(parts: tuple[Benchmark, ...], protocol: Continual, seed: int) -> Arranged:
    for part in parts[1:]:
        if part.class_names != parts[0].class_names:
            raise ValueError(f"continual stream: {part.name} does not share {parts[0].name}'s label space (class "
                             f"names differ); expected datasets with the same classes, e.g. imagenet, imagenet-v2, "
                             f"imagenet-sketch")
    order = protocol.order([p.labels.numpy() for p in parts], seed)
    return _gather(list(parts), order, parts[0])
