"""StatA's card (online mode: each batch of 128 solved alone with the statistical anchor)."""

from __future__ import annotations

from orchestrator.methods.transclip.card import PER_BATCH, PER_BATCH_WORDS, TRANSDUCTIVE
from orchestrator.registry.card import Cost, HParam, MethodCard

CARDS = (
    MethodCard(
        "stata", "StatA", 140, "transductive",
        "nothing kept: each batch solved alone, anchored to the text statistics",
        "orchestrator.methods.stata.method:StatA",
        (HParam("alpha", "float", 1.0, "anchor strength: a class keeps weight alpha / (alpha + n_k) on its text "
                "statistics", "weight", low=0.0),
         HParam("soft_beta", "bool", False, "n_k as the soft mass sum_i z_ik instead of the count of samples "
                "predicted k (official default: counts)", "flag"),
         *TRANSDUCTIVE),
        **PER_BATCH, cost=Cost(samples_per_s=117.0, gpu_samples_per_s=6152.0, state_words=PER_BATCH_WORDS),
        source="MaxZanella/StatA@eea8637 solvers/StatA.py, main.py (--online, get_hp); every dataset alike "
               "(script/StatA_online.sh); batch 128 from the README's table and script/StatA_online.sh (main.py's "
               "--batch_size default and one README command say 64)"),
)
