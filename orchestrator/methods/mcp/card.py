"""MCP's card: entropy, align and negative caches with per-class prototypes, with its configs/*.yaml per dataset."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.card import Cost, HParam, MethodCard, Views

# CenturyChen/MCP configs/<dataset>.yaml: the positive caches' (alpha, beta); every config has align_shot 10,
# entropy_shot 10, negative shot_capacity 3, alpha 0.117, beta 1.0 and TDA's entropy / mask thresholds.
_MCP = {
    "imagenet": (5.5, 8.0), "imagenet-a": (4.0, 3.0), "imagenet-v2": (2.5, 1.0), "imagenet-r": (1.0, 8.0),
    "imagenet-sketch": (2.0, 3.0), "caltech101": (5.0, 5.0), "dtd": (5.0, 7.0), "eurosat": (3.0, 8.0),
    "aircraft": (4.0, 5.0), "food101": (1.0, 1.0), "flowers102": (1.0, 8.0), "pets": (2.0, 7.0),
    "cars": (3.0, 4.0), "sun397": (1.0, 2.0), "ucf101": (1.0, 7.0),
}
_FUSION = ("(the official code picks it per dataset afterwards by a grid search over [0.001 .. 1000] against the "
           "test labels, mcp_runner.py run_test_mcp; it states no fixed value)")
# configs/<dataset>.yaml learning_rate (text and image alike in every config): MCP++'s residuals
_LR = {
    "imagenet": 6e-5, "imagenet-a": 3e-4, "imagenet-v2": 8e-5, "imagenet-r": 8e-5, "imagenet-sketch": 1e-4,
    "caltech101": 8e-5, "dtd": 6e-4, "eurosat": 4e-4, "aircraft": 1e-4, "food101": 2e-4, "flowers102": 8e-4,
    "pets": 4e-4, "cars": 1e-4, "sun397": 3e-4, "ucf101": 8e-4,
}
_MCP_HPARAMS = (
    HParam("pos_alpha", "float", 5.5, "weight of the prototype (positive) cache's logits", "weight", low=0.0,
           per_dataset={k: a for k, (a, _) in _MCP.items()}),
    HParam("pos_beta", "float", 8.0, "sharpness of the prototype cache's affinities", "scale", low=0.0,
           per_dataset={k: b for k, (_, b) in _MCP.items()}),
    HParam("neg_alpha", "float", 0.117, "weight of the negative cache's logits", "weight", low=0.0),
    HParam("neg_beta", "float", 1.0, "sharpness of the negative cache's affinities", "scale", low=0.0),
    HParam("entropy_shot", "int", 10, "entropy-cache entries per class", "size", low=1),
    HParam("align_shot", "int", 10, "align-cache entries per class", "size", low=1),
    HParam("neg_shot", "int", 3, "negative-cache entries per class", "size", low=1),
    HParam("center", "float", 0.8, "weight of the class prototype against its text embedding in the align "
           "cache's class centre (--cen)", "weight", low=0.0, high=1.0),
    HParam("memory_beta", "float", 5.5, "sharpness of the cached-feature read-out's weights exp(-beta (1 - "
           "cos)) (get_cache_pred)", "scale", low=0.0),
    HParam("memory_weight", "float", 1.0, "weight of the cached-feature read-out's posterior " + _FUSION,
           "weight", low=0.0),
    HParam("cache_weight", "float", 1.0, "weight of the cache-adjusted posterior " + _FUSION, "weight",
           low=0.0),
    HParam("keep", "float", 0.1, "fraction of lowest-entropy views: the confident prediction and, on "
           "ImageNet-A, the caches' query", "threshold", low=0.0, high=1.0, low_open=True),
    HParam("query", "str", "original", "the caches' query: the original view or the confident views' mean "
           "(get_clip_logits: ImageNet-A only)", "choice", choices=("original", "confident"),
           per_dataset={"imagenet-a": "confident"}),
    LOGIT_SCALE,
)
# caches' keys [K, shot, d] and losses [K, shot], the negative masks [K, neg_shot, K], their int64 counts; the cached
# features [K, entropy_shot + align_shot, d], the prototypes [K, d] with their bool flags, the text [K, d]
_WORDS = ("2*K*(entropy_shot + align_shot)*d + K*neg_shot*d + K*(entropy_shot + align_shot + neg_shot) + K*neg_shot*K "
          "+ 6*K + 2*K*d + K/4")
_VIEWS_AND_STATE = dict(
    inputs="views", views=Views("augmix", count=32, groups={"ood": "crops"}),
    state=("entropy_keys", "entropy_loss", "align_keys", "align_loss", "neg_keys", "neg_loss", "neg_values",
           "memory", "prototypes"),
    source="CenturyChen/MCP@f9d063f mcp_runner.py (run_test_mcp with --res False, update_cache, "
           "update_align_cache, update_cache_joint, get_cache_pred), utils.py (get_clip_logits, "
           "select_confident_samples), configs/; views: utils.py build_test_data_loader, AugMixAugmenter "
           "n_views=31: random resized crops + flips on ImageNet and its variants (augmix=False), AugMix on the "
           "cross-domain sets")
# samples/s at K = M = 1000, d = 512 on 8 views (benchmarks/logs/methods-cpu-2026-11-29.txt)
CARDS = (
    MethodCard("mcp", "MCP", 170, "tda",
               "entropy, align and negative caches; their per-class prototypes and a read-out of the cached features",
               "orchestrator.methods.mcp.method:MCP", _MCP_HPARAMS, cost=Cost(samples_per_s=28.0, state_words=_WORDS),
               **_VIEWS_AND_STATE),
    MethodCard("mcp_pp", "MCP++", 171, "tda",
               "MCP plus one AdamW step per sample on residuals of the text embeddings and the prototypes",
               "orchestrator.methods.mcp.method:MCPPlusPlus",
               (*_MCP_HPARAMS,
                HParam("lr_text", "float", 6e-5, "AdamW learning rate of the text residual", "rate", low=0.0,
                       low_open=True, log=True, per_dataset=_LR),
                HParam("lr_image", "float", 6e-5, "AdamW learning rate of the prototype residual", "rate", low=0.0,
                       low_open=True, log=True, per_dataset=_LR)),
               cost=Cost(samples_per_s=22.0, state_words=_WORDS),
               **{**_VIEWS_AND_STATE,
                  "source": _VIEWS_AND_STATE["source"].replace("--res False", "--res True, --tta_steps 1")}),
)
