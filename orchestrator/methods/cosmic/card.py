"""COSMIC's card: DMN's CLIP memory and a DINOv2 cache read through graph cliques, with its configs_l/*.yaml per
dataset and its scripts' shots (16 on ImageNet and its variants, 8 on the cross-domain sets)."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.card import Cost, HParam, MethodCard, Views

# hf618/COSMIC configs_l/<dataset>.yaml positive: (alpha, beta), the clique logits' weight and sharpness
_CLIQUE = {
    "imagenet": (2.0, 5.0), "imagenet-a": (2.0, 5.0), "imagenet-v2": (1.0, 8.0), "imagenet-r": (1.0, 8.0),
    "imagenet-sketch": (2.363, 7.45), "caltech101": (5.0, 5.0), "dtd": (2.0, 3.0), "eurosat": (4.0, 8.0),
    "aircraft": (2.0, 2.0), "food101": (1.0, 1.0), "flowers102": (1.0, 5.0), "pets": (2.0, 7.0),
    "cars": (1.0, 7.0), "sun397": (2.0, 3.0), "ucf101": (3.0, 8.0),
}
# scripts/cosmic_ood.sh: --CLIP_Cache_shot 16 --DINO_Cache_shot 16; cosmic_cd.sh: 8 and 8
_OOD_SHOT = {name: 16 for name in ("imagenet", "imagenet-a", "imagenet-v2", "imagenet-r", "imagenet-sketch")}
_FUSION = ("(the official code picks it per dataset afterwards by a grid search over [0, 0.001 .. 1000] against "
           "the test labels, search_best_weights; it states no fixed value)")

CARDS = (
    MethodCard(
        "cosmic", "COSMIC", 175, "memory",
        "DMN's CLIP memory and a DINOv2 cache, each read through the maximal cliques of its class graph",
        "orchestrator.methods.cosmic.method:COSMIC",
        (
            HParam("memory_size", "int", 8, "CLIP memory entries per class (--CLIP_Cache_shot)", "size", low=1,
                   per_dataset=_OOD_SHOT),
            HParam("dino_shot", "int", 8, "DINOv2 cache entries per class (--DINO_Cache_shot)", "size", low=1,
                   per_dataset=_OOD_SHOT),
            HParam("beta", "float", 5.5, "sharpness of the CLIP memory's attention weights exp(-beta (1 - cos))",
                   "scale", low=0.0),
            HParam("keep", "float", 0.1, "fraction of lowest-entropy views that choose the pseudo-label and the "
                   "stored feature (--selection_p)", "threshold", low=0.0, high=1.0, low_open=True),
            HParam("clique_alpha", "float", 2.0, "weight of a clique node's score (configs_l positive alpha)",
                   "weight", low=0.0, per_dataset={k: a for k, (a, _) in _CLIQUE.items()}),
            HParam("clique_beta", "float", 5.0, "sharpness of a clique node's score exp(-beta (1 - cos)) "
                   "(configs_l positive beta)", "scale", low=0.0, per_dataset={k: b for k, (_, b) in _CLIQUE.items()}),
            HParam("ratio", "float", 0.2, "fraction of the cliques, nearest the query by their anchors, whose nodes "
                   "score (--r)", "threshold", low=0.0, high=1.0, low_open=True),
            HParam("clip_degree", "float", 4.0, "mean degree the CLIP graph's threshold is bisected to "
                   "(0.8 --target_avg_degree)", "size", low=0.0, low_open=True),
            HParam("dino_degree", "float", 5.0, "mean degree the DINOv2 graph's threshold is bisected to "
                   "(--target_avg_degree)", "size", low=0.0, low_open=True),
            HParam("mac_step", "int", 100, "samples between graph rebuilds once the caches could be full "
                   "(--mac_step)", "count", low=1),
            HParam("clip_clique_weight", "float", 1.0, "weight of the CLIP clique logits " + _FUSION, "weight",
                   low=0.0),
            HParam("dino_clique_weight", "float", 1.0, "weight of the DINOv2 clique logits " + _FUSION, "weight",
                   low=0.0),
            LOGIT_SCALE,
        ),
        inputs="views", views=Views("augmix", count=8, groups={"ood": "crops"}),
        state=("memory", "memory_entropy", "memory_count", "dino_keys", "dino_loss", "dino_count"),
        # the CLIP memory [K, memory_size, d], its entropies and int64 counts, the text prototypes; the DINOv2 cache's
        # keys [K, dino_shot, a], losses and int64 counts (a: the auxiliary encoder's width). Besides these, the two
        # graphs' cliques and anchors, whose number the data decide (about one clique per node: 2K of width d for
        # CLIP's graph, K of width a for DINOv2's), are counted at that estimate.
        cost=Cost(samples_per_s=1.5, state_words="K*memory_size*d + K*memory_size + K*d + 2*K + K*dino_shot*a + K*dino_shot + 2*K "
                              "+ 2*K*d + K*a"),
        auxiliary=("dinov2",),
        source="hf618/COSMIC@34fde07 cosmic_main.py (direct_inference), utils/DualMems.py (update_memory_bank, "
               "get_image_pred with center_type_clip attn, position all), utils/utils_cosmic.py (update_cache, "
               "make_prototype_features, make_max_cliques with is_SOG, build_graph_by_degree, "
               "compute_clique_logits), configs_l/, scripts/cosmic_ood.sh and cosmic_cd.sh (-b 8: the original "
               "and 7 views, random resized crops + flips on ImageNet and its variants, AugMix on the cross-domain "
               "sets; DINOv2 ViT-L/14 with registers on the same CLIP-preprocessed views)"),
)
