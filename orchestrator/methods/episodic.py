"""Episodic methods: each sample is solved from its own views alone, nothing carries between samples.

Such a method runs in chunks of samples, and splits a chunk's work in two:

    shared(chunk)          what depends only on the hparams named in `shared_hparams` (e.g. the views'
                           class posteriors, which depend on logit_scale alone; `shared_key` may refine
                           this, e.g. to the number of views a keep fraction keeps): the costly part;
    solve(chunk, shared)   the chunk's posteriors [c, K] under this method's other hparams.

`run` is the two in turn. A pack of configs of one episodic method over one stream computes `shared` once per
chunk for every group of configs with one `shared_key` (`run_episodic_lockstep`), and `solve_many` solves the
group on it, which is exact: each config's solve sees the very tensors its own run would compute.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

import torch

from orchestrator.methods.base import Method, StageTimer, Trace, empty_trace, validate_features
from orchestrator.methods.lockstep import per_card, split_timings


class Episodic(Method):
    """Base of the episodic methods (Zero, MTA, TPS): subclasses set `chunk`, `shared_hparams` and implement
    `shared` and `solve`."""

    chunk: ClassVar[int]                     # samples per chunk: bounds the [chunk, V, M] view logits in memory
    shared_hparams: ClassVar[tuple[str, ...]] = ("logit_scale",)

    def shared_key(self, views: int) -> tuple:
        """Configs with equal keys compute equal `shared` parts on chunks of `views` views."""
        return tuple(self.hp[name] for name in self.shared_hparams)

    @abstractmethod
    def shared(self, chunk: torch.Tensor) -> Any:
        """The part of a chunk [c, V, d] that depends on `shared_hparams` alone (module docstring)."""

    @abstractmethod
    def solve(self, chunk: torch.Tensor, shared: Any, start: int) -> torch.Tensor:
        """The chunk's posteriors [c, K] from `shared(chunk)`; `start` is its first sample's stream index."""

    def solve_many(self, methods: list[Episodic], chunk: torch.Tensor, shared: Any, start: int) -> torch.Tensor:
        """The chunk's posteriors [g, c, K] under each of `methods` (this one among them, all with its
        `shared_key`) from one `shared` part: each config's own `solve`, unless a subclass solves them
        together (MTA: one row per config), exactly as each would alone."""
        return torch.stack([method.solve(chunk, shared, start) for method in methods])

    def _run(self, features: torch.Tensor) -> Trace:
        n = features.shape[0]
        posteriors, selected, gated, gated_prior = empty_trace(n, self.num_classes, features.device)
        timer = StageTimer()
        for start in range(0, n, self.chunk):
            chunk = features[start:start + self.chunk]
            with timer("logits"):
                shared = self.shared(chunk)
            with timer("posterior"):
                posteriors[start:start + self.chunk] = self.solve(chunk, shared, start)
        return Trace(posteriors, selected, gated, gated_prior, state={}, timings=timer.seconds)


def order_free(method: str) -> bool:
    """Whether a registered method is episodic (its class derives from `Episodic`): each sample's outputs depend
    on that sample alone, so a sweep may split its stream into shards run apart (orchestrator.sweep.shard)."""
    from orchestrator.registry import method_card

    return issubclass(method_card(method).implementation(), Episodic)


@per_card
def run_episodic_lockstep(methods: list[Episodic], features: torch.Tensor) -> list[Trace]:
    """G streams of one episodic method over one stream of views [n, V, d]; trace g equals
    `methods[g].run(features)`. Per chunk of samples, the shared part once per distinct `shared_key`, then the
    group's `solve_many` on it: every stream sees the tensors its own run computes, so its trace is identical
    (MTA: up to the batched products' rounding). The cards of Zero, MTA and TPS name it."""
    first = methods[0]
    validate_features(first.name, features, first.class_embeddings, views=True)
    n, G = features.shape[0], len(methods)
    keys = [m.shared_key(features.shape[1]) for m in methods]
    groups = {key: [g for g in range(G) if keys[g] == key] for key in dict.fromkeys(keys)}
    posteriors = torch.zeros(G, n, first.num_classes, dtype=torch.float32, device=features.device)
    timer = StageTimer()
    for start in range(0, n, first.chunk):
        chunk = features[start:start + first.chunk]
        with timer("logits"):
            shared = {key: methods[group[0]].shared(chunk) for key, group in groups.items()}
        with timer("posterior"):
            for key, group in groups.items():
                posteriors[group, start:start + first.chunk] = methods[group[0]].solve_many(
                    [methods[g] for g in group], chunk, shared[key], start)
    timings = split_timings(timer, G)
    # Episodic methods select nothing and gate nothing (as Episodic._run's trace).
    none = torch.full((n,), -1, dtype=torch.int64, device=features.device)
    off = torch.zeros(n, dtype=torch.bool, device=features.device)
    return [Trace(posteriors[g], none.clone(), off.clone(), off.clone(), state={}, timings=dict(timings))
            for g in range(G)]
