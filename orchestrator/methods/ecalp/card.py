"""ECALP's card (one setting for every dataset in its official code)."""

from __future__ import annotations

from orchestrator.registry.card import Cost, HParam, MethodCard

CARDS = (
    MethodCard(
        "ecalp", "ECALP", 150, "graph", "label propagation over a growing k-NN graph of the samples seen and the "
        "class texts",
        "orchestrator.methods.ecalp.method:ECALP",
        (HParam("k_image", "int", 8, "image neighbours of each image node in the k-NN graph", "count", low=1),
         HParam("k_text", "int", 3, "class-text neighbours of each image node", "count", low=1),
         HParam("edge_power", "int", 10, "an edge weighs its similarity to this power (the official gamma)", "scale",
                low=1),
         HParam("alpha", "float", 1.0, "propagation Y <- alpha W Y + (1 - alpha) Y0; 1 (the official code) drops "
                "the paper's Y0 term", "weight", low=0.0, high=1.0),
         HParam("iterations", "int", 3, "label-propagation iterations per sample", "count", low=1),
         HParam("graph", "str", "exact", "the image k-NN lists: exact (default: each row the k_image nearest nodes, "
                "the paper's graph and the official one from sample k_image + 1 on) or official (the official "
                "incremental store, whose rows of samples 0..k_image can lose a true neighbour to a sample's "
                "second node)", "choice", choices=("exact", "official"))),
        source="Yushu-Li/ECALP@96ddf0b (main.py, utils/iterative_label_propagation.py), zero-shot; one setting "
               "for every dataset",
        # per sample seen: its two d-vectors, k-NN list and text neighbours (similarities and int64 indices), a
        # carried value and class; its buffers grow by doubling (up to twice this); the texts [K, d]. graph:
        # official keeps k_image + 2 list entries, 6 words a sample more than this
        cost=Cost(samples_per_s=18.0, gpu_samples_per_s=295.0,
                  state_words="n*(2*d + 3*k_image + 3*k_text + 3) + K*d + d")),
)
