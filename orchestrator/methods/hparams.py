"""Hyperparameters several methods declare alike (one results column each): plain data, no torch."""

from __future__ import annotations

from orchestrator.registry.card import HParam

CLIP_LOGIT_SCALE = 100.0  # CLIP's learned logit scale, as the official codes write it (exp(4.6052))
LOGIT_SCALE = HParam("logit_scale", "float", CLIP_LOGIT_SCALE, "softmax scale of the cosine logits (CLIP's)", "scale",
                     low=0.0, low_open=True)
