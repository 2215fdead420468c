"""The BCA family's lockstep runner: the exact blocked engine (`orchestrator.methods.engine`), which runs the
configs of clip, la, pa and bca together (one logits product per group of configs whose U evolves alike)."""

from __future__ import annotations

import torch

from orchestrator.methods.base import Trace, validate_features
from orchestrator.methods.bca.method import BCAFamily
from orchestrator.methods.engine import run_bca_blocked_many


def run_bca_lockstep(methods: list[BCAFamily], features: torch.Tensor) -> list[Trace]:
    """Fresh BCA-family methods over one stream [n, d]: trace g equals `methods[g].run(features)`."""
    first = methods[0]
    validate_features(first.name, features, first.class_embeddings, views=False)
    return run_bca_blocked_many(features, [m.state for m in methods], first.class_ids, first.num_classes,
                                [m.config for m in methods])
