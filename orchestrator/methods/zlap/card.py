"""ZLaP's card (transductive label propagation, per batch as StatA compares it)."""

from __future__ import annotations

from orchestrator.methods.transclip.card import PER_BATCH, PER_BATCH_WORDS
from orchestrator.registry.card import Cost, HParam, MethodCard

CARDS = (
    MethodCard(
        "zlap", "ZLaP", 160, "transductive",
        "nothing kept: each batch's kNN graph with the text nodes, labels propagated from the texts",
        "orchestrator.methods.zlap.method:ZLaP",
        (HParam("n_neighbors", "int", 5, "nearest images (itself included) and nearest texts of each image in the "
                "graph (the official k)", "count", low=1),
         HParam("gamma", "float", 5.0, "power of the image-text similarities (sharpens the text links)", "scale",
                low=0.0),
         HParam("alpha", "float", 0.3, "propagation weight: L = I - alpha * normalised W (below 1: L invertible)",
                "weight", low=0.0, high=1.0, high_open=True),
         HParam("solver", "str", "cg", "cg: the official conjugate gradients (stop at residual 1e-6, 50 steps); "
                "exact: the linear system solved (the paper's L^-1)", "choice", choices=("cg", "exact"))),
        **PER_BATCH, cost=Cost(samples_per_s=1444.0, gpu_samples_per_s=29295.0, state_words=PER_BATCH_WORDS),
        source="MaxZanella/StatA@eea8637 solvers/ZLaP.py, main.py get_hp (k 5, gamma 5, alpha 0.3, scale_sim off), "
               "from vladan-stojnic/ZLaP@89ab14b zlap.py do_transductive_lp; no per-dataset values"),
)
