"""DLAE's card: DPE's textual prototypes and visual cache with a logit adjustment by class frequency and
confidence, a reflection on disagreeing predictions and a time decay of doubtful cache entries; its configs/*.yaml
per dataset (the ViT-B/16 entries)."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.card import Cost, HParam, MethodCard, Views

# whynotcooper/dlae configs/<dataset>.yaml, as main_dlae.py reads them for ViT-B/16: positive alpha, beta,
# learning_rate text (both residuals' rate) and align, belta[0] (the logit adjustment), alpha1[1] (the
# reflection), epoch[1] (the loss decay). shot_capacity is 3 in every config.
_DLAE = {
    "imagenet": (6.0, 5.0, 0.0006, 0.5, 0.8, 0.001, 0.0),
    "imagenet-a": (6.0, 5.0, 0.0003, 2.5, 1.0, 0.3, 0.00001),
    "imagenet-v2": (3.0, 8.0, 0.0005, 0.5, 2.5, 0.5, 0.002),
    "imagenet-r": (3.0, 8.0, 0.0006, 0.0, 0.8, 0.3, 0.00001),
    "imagenet-sketch": (7.0, 7.45, 0.0006, 0.2, 3.0, 1.0, 0.005),
    "caltech101": (15.0, 5.0, 0.0006, 0.2, 0.3, 0.3, 0.0005),
    "dtd": (6.0, 3.0, 0.0006, 0.2, 2.0, 0.5, 0.02),
    "eurosat": (5.0, 8.0, 0.00005, 0.2, 1.0, 0.3, 0.000001),
    "aircraft": (6.0, 2.0, 0.0006, 0.2, 2.5, 0.5, 0.005),
    "food101": (3.0, 1.0, 0.0002, 0.2, 3.0, 0.5, 0.005),
    "flowers102": (8.0, 5.0, 0.0002, 0.2, 2.0, 0.5, 0.00001),
    "pets": (4.0, 7.0, 0.0001, 0.3, 1.0, 0.0, 0.000001),
    "cars": (3.0, 7.0, 0.0001, 1.5, 3.2, 0.5, 0.01),
    "sun397": (3.0, 7.0, 0.0001, 1.5, 3.2, 0.5, 0.01),
    "ucf101": (9.0, 8.0, 0.0004, 0.2, 3.0, 0.5, 0.00001),
}


def _per_dataset(i: int) -> dict:
    return {k: v[i] for k, v in _DLAE.items()}


CARDS = (
    MethodCard(
        "dlae", "DLAE", 180, "prototype",
        "DPE's prototypes and cache with frequency- and confidence-adjusted logits and a decaying cache, one AdamW "
        "step per sample on their residuals",
        "orchestrator.methods.dlae.method:DLAE",
        (
            HParam("alpha", "float", 6.0, "weight of the visual-cache logits", "weight", low=0.0,
                   per_dataset=_per_dataset(0)),
            HParam("beta", "float", 5.0, "sharpness of the cache affinity exp(-beta (1 - cos))", "scale", low=0.0,
                   per_dataset=_per_dataset(1)),
            HParam("lr_text", "float", 0.0006, "AdamW learning rate of the textual and the cache residuals (the "
                   "official optimizer gives both learning_rate.text)", "rate", low=0.0, low_open=True, log=True,
                   per_dataset=_per_dataset(2)),
            HParam("align", "float", 0.5, "weight of the InfoNCE alignment of cache and text prototypes", "weight",
                   low=0.0, per_dataset=_per_dataset(3)),
            HParam("adjust_alpha", "float", 0.8, "strength of the logit adjustment: each class's logits times "
                   "exp(-adjust_alpha (1 - confidence gap) * its pseudo-label frequency) (belta)", "scale", low=0.0,
                   per_dataset=_per_dataset(4)),
            HParam("reflect_alpha", "float", 0.001, "reflection: where the adjusted and plain predictions differ, the "
                   "cache loss times exp(-reflect_alpha cos(their text embeddings)) (alpha1)", "scale", low=0.0,
                   per_dataset=_per_dataset(5)),
            HParam("loss_decay", "float", 0.0, "rate at which a doubtful cache entry's loss grows with its age, "
                   "loss exp(age loss_decay) (epoch)", "rate", low=0.0, per_dataset=_per_dataset(6)),
            HParam("shot", "int", 3, "cache entries per class", "size", low=1),
            HParam("keep", "float", 0.1, "fraction of lowest-entropy views kept", "threshold", low=0.0, high=1.0,
                   low_open=True),
            HParam("tau_global", "float", 0.1, "normalised-entropy threshold of the global text-prototype update",
                   "threshold", low=0.0),
            HParam("query", "str", "original", "the prediction's query: the original view or the confident views "
                   "re-selected against the stepped prototypes (the official ImageNet-A branch)", "choice",
                   choices=("original", "confident"), per_dataset={"imagenet-a": "confident"}),
            LOGIT_SCALE,
        ),
        inputs="views",
        views=Views("crops", datasets={"imagenet-r": "augmix", "dtd": "augmix", "aircraft": "augmix", "cars": "augmix",
                                       "sun397": "augmix", "food101": "augmix", "eurosat": "single", "pets": "single",
                                       "flowers102": "single", "caltech101": "single"}),
        state=("text", "text_updates", "counter", "confidence", "cache_keys", "cache_loss", "cache_time"),
        # the initial and the global prototypes [K, d], the cache's keys [K, shot, d], losses, int64 times and
        # counts, the class counters (int64 pseudo-labels, float mean confidence, int64 confidence counts)
        cost=Cost(samples_per_s=146.0, state_words="2*K*d + K*shot*d + 3*K*shot + 7*K"),
        source="whynotcooper/dlae@253163b main_dlae.py (run_test_dlae, update_cache, cache_key_value), utils.py "
               "(get_clip_logits_2, get_clip_logits_3, logits_adjustment), configs/ (ViT-B/16 entries); views: "
               "utils.py build_test_data_loader: 63 crops on ImageNet, -A, -V2, -Sketch and UCF101, 63 AugMix views "
               "on ImageNet-R, DTD, Aircraft, Cars, SUN397 and Food101, the CLIP preprocess on EuroSAT, Pets, "
               "Flowers and Caltech101"),
)
