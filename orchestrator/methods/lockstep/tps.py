"""TPS in lockstep. TPS is episodic, so its streams share no state, only work: each sample's AdamW step
direction q (`TPS.step_directions`, the cost of a step: several passes over [K, d] per sample) depends on
the views, logit_scale and the number of views keep keeps, not on lr (the step is S = -(lr / (1 - b1)) q).
So the streams of one (logit_scale, kept count) share one q per sample, and each adds O(K) per sample for its
own lr (`TPS.episodes`); the views' products with the prototypes are shared by all. Each stream's posteriors
come from the same calls on the same chunks as its single-stream run, so they equal it.
"""

from __future__ import annotations

import torch

from orchestrator.methods.base import Method, StageTimer, Trace, validate_features
from orchestrator.methods.lockstep.common import column, split_timings
from orchestrator.methods.tps import _CHUNK
from orchestrator.methods.views import kept_count


def run_tps_lockstep(methods: list[Method], features: torch.Tensor) -> list[Trace]:
    """G TPS streams over one stream of views [n, V, d]; trace g equals `methods[g].run(features)`."""
    first = methods[0]
    validate_features(first.name, features, first.class_embeddings, views=True)
    n, G, K, device = features.shape[0], len(methods), first.num_classes, features.device
    keys = [(m.hp["logit_scale"], kept_count(features.shape[1], m.hp["keep"])) for m in methods]
    distinct = list(dict.fromkeys(keys))
    members = [[g for g, key in enumerate(keys) if key == shared] for shared in distinct]
    groups = [(methods[rows[0]].hp["logit_scale"], methods[rows[0]].hp["keep"],
               torch.tensor(rows, device=device), column([methods[g] for g in rows], "lr", torch.float64, device)[:, 0])
              for rows in members]
    posteriors = torch.zeros(G, n, K, dtype=torch.float32, device=device)
    timer = StageTimer()
    for start in range(0, n, _CHUNK):
        chunk = features[start:start + _CHUNK]
        with timer("logits"):
            products = chunk @ first.unit.T
        for scale, keep, rows, lrs in groups:
            posteriors[rows, start:start + _CHUNK] = first.episodes(chunk, products, scale, keep, lrs, timer)
    timings = split_timings(timer, G)
    none = torch.full((n,), -1, dtype=torch.int64, device=device)
    false = torch.zeros(n, dtype=torch.bool, device=device)
    return [Trace(posteriors[g], none.clone(), false.clone(), false.clone(), state={}, timings=dict(timings))
            for g in range(G)]
