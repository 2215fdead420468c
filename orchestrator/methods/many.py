"""Many configurations over one feature stream in one call (the sweep packs grid points into one trial).

    run_stream_many(features, class_embeddings, class_ids, num_classes, configs)
        -> (predictions [G, n] int64, confidences [G, n] float32)
    run_traces_many(...) -> list[Trace], one per config, in config order

Each config is a dict `{"method": name, **hparams}`, validated exactly as `make_method` validates it. On
[n, d] features the BCA-family configs run together through `engine.run_bca_blocked_many` (one logits product
per group of configurations whose U evolves identically); the configs of a method with a lockstep runner for
the features' kind (`lockstep.LOCKSTEP`, keyed by Method class: TDA, TDA+PA and OnZeta on [n, d], DMN-ZS and DOTA on
views [n, V, d]) run as lockstep streams; any other method runs on its own. Every result equals the
separate run (lockstep: within float32 rounding, `lockstep`).
"""

from __future__ import annotations

from typing import Any

import torch

from orchestrator.methods.base import Method, Trace, make_method, validate_features
from orchestrator.methods.bca import BCAFamily
from orchestrator.methods.engine import DEFAULT_BLOCK, run_bca_blocked_many
from orchestrator.methods.lockstep import LOCKSTEP


def _build(config: Any, index: int, class_embeddings: torch.Tensor, class_ids: torch.Tensor,
           num_classes: int) -> Method:
    if not isinstance(config, dict) or "method" not in config:
        raise ValueError(f"configs[{index}] must be a dict with a 'method' key and that method's hparams, "
                         f"got {config!r}")
    hparams = {k: v for k, v in config.items() if k != "method"}
    return make_method(config["method"], class_embeddings, class_ids, num_classes, **hparams)


def run_traces_many(features: torch.Tensor, class_embeddings: torch.Tensor, class_ids: torch.Tensor,
                    num_classes: int, configs: list[dict[str, Any]], *, block: int = DEFAULT_BLOCK) -> list[Trace]:
    """One Trace per config, each equal to `make_method(**config).run(features)` (a BCA-family trace's
    state always holds U, V, C1 and C2, also for clip, whose counters never change)."""
    if not isinstance(configs, (list, tuple)) or not configs:
        raise ValueError(f"configs must be a non-empty list of dicts, got {configs!r}")
    methods = [_build(c, i, class_embeddings, class_ids, num_classes) for i, c in enumerate(configs)]
    # Augmented views [n, V, d]: each method uses them its own way (BCA's adaptive selection runs per sample).
    family = [i for i, m in enumerate(methods) if isinstance(m, BCAFamily)] if features.ndim == 2 else []
    traces: dict[int, Trace] = {}
    if family:
        validate_features(methods[family[0]].name, features, class_embeddings, views=False)
        runs = run_bca_blocked_many(features, [methods[i].state for i in family], class_ids, num_classes,
                                    [methods[i].config for i in family], block=block)
        traces.update(zip(family, runs))
    for kind, lockstep in LOCKSTEP.items():
        members = [i for i, m in enumerate(methods) if type(m) is kind]
        if members and lockstep.views == (features.ndim == 3):
            traces.update(zip(members, lockstep.run([methods[i] for i in members], features)))
    for i, method in enumerate(methods):
        if i not in traces:
            traces[i] = method.run(features)
    return [traces[i] for i in range(len(methods))]


def run_stream_many(features: torch.Tensor, class_embeddings: torch.Tensor, class_ids: torch.Tensor,
                    num_classes: int, configs: list[dict[str, Any]], *,
                    block: int = DEFAULT_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Predictions [G, n] int64 and confidences (max posterior) [G, n] float32, row g for configs[g]."""
    traces = run_traces_many(features, class_embeddings, class_ids, num_classes, configs, block=block)
    return (torch.stack([t.predictions for t in traces]), torch.stack([t.confidences for t in traces]))
