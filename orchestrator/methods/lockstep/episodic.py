"""Episodic methods (Zero, MTA, TPS) in lockstep: per chunk of samples, the shared part (`Episodic.shared`: the
views' posteriors, bandwidths and affinities, TPS's step directions) once per distinct `shared_key`, then the
group's `solve_many` on it (each stream's own `solve`, or one solve with a row per stream). Every stream sees the
tensors its own run computes, so its trace is identical (MTA: up to the batched products' rounding)."""

from __future__ import annotations

import torch

from orchestrator.methods.base import StageTimer, Trace, validate_features
from orchestrator.methods.episodic import Episodic
from orchestrator.methods.lockstep.common import split_timings


def run_episodic_lockstep(methods: list[Episodic], features: torch.Tensor) -> list[Trace]:
    """G streams of one episodic method over one stream of views [n, V, d]; trace g equals
    `methods[g].run(features)`."""
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
