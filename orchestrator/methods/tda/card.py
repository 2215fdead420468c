"""TDA's cards: tda (positive / negative feature caches) and tda_pa (TDA's caches with BCA's prior, Eq. 9)."""

from __future__ import annotations

from orchestrator.methods.bca.card import N2, TAU
from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.card import Cost, HParam, Lockstep, MethodCard, Prior, Views

# TDA's positive cache per dataset (pos_alpha, pos_beta), from its public configs.
_TDA_POSITIVE = {
    "imagenet": (2.0, 5.0), "imagenet-a": (2.0, 5.0), "imagenet-v2": (1.0, 8.0), "imagenet-r": (1.0, 8.0),
    "imagenet-sketch": (2.363, 7.45), "caltech101": (5.0, 5.0), "dtd": (2.0, 3.0), "eurosat": (4.0, 8.0),
    "aircraft": (2.0, 2.0), "food101": (1.0, 1.0), "flowers102": (1.0, 5.0), "pets": (2.0, 7.0),
    "cars": (1.0, 7.0), "sun397": (2.0, 3.0), "ucf101": (3.0, 8.0),
}
# At least 1: the official update_cache (tda_runner.py:30-40) gives a class its first entry whatever the capacity,
# so a capacity of 0 runs as 1 there; 0 is refused rather than run as a second spelling of 1.
_SHOT = ("{} cache entries per class (at least 1: the official code keeps one even at 0; {}_alpha 0 switches "
         "the cache off)")
_TDA = (
    HParam("pos_alpha", "float", 2.0, "weight of the positive cache's logits", "weight", low=0.0,
           per_dataset={k: a for k, (a, _) in _TDA_POSITIVE.items()}),
    HParam("pos_beta", "float", 5.0, "sharpness of the positive cache's affinities", "scale", low=0.0,
           per_dataset={k: b for k, (_, b) in _TDA_POSITIVE.items()}),
    HParam("neg_alpha", "float", 0.117, "weight of the negative cache's logits", "weight", low=0.0),
    HParam("neg_beta", "float", 1.0, "sharpness of the negative cache's affinities", "scale", low=0.0),
    HParam("pos_shot", "int", 3, _SHOT.format("positive", "pos"), "size", low=1),
    HParam("neg_shot", "int", 2, _SHOT.format("negative", "neg"), "size", low=1),
    LOGIT_SCALE,
)
TDA_STATE = ("pos_keys", "pos_entropy", "neg_keys", "neg_entropy", "neg_values")
# each cache: keys [K, shot, d] and their flat copy [K shot, d] with its int64 classes, entropies [K, shot]; the
# negative one also values [K, shot, K] and their flat copy
TDA_WORDS = "2*K*(pos_shot + neg_shot)*d + 3*K*(pos_shot + neg_shot) + 2*K*neg_shot*K"
_TDA_SOURCE = ("kdiAAA/TDA@e697fb0 (tda_runner.py, utils.py, configs/); views: utils.py:127-139 "
               "build_test_data_loader, get_ood_preprocess() (utils.py:94-103, 63 AugMix views) on ImageNet-A/-V2/-R/-Sketch")

# The public code runs in float16 (tda_runner.py, utils.py: clip.load's half model, .half() cache values).
_STATE_DTYPE = HParam("state_dtype", "str", "float32", "dtype of the features, logits, caches and cache logits: "
                      "float32 (default: float16's rounding belongs to the dtype, not the method) or float16 as the "
                      "official code", "choice", choices=("float32", "float16"))
_TDA_LOCKSTEP = Lockstep("orchestrator.methods.tda.lockstep:run_tda_lockstep")
FAMILY = "tda"  # the chart colour family of TDA and the methods built on its caches

CARDS = (
    MethodCard(
        "tda", "TDA", 40, FAMILY, "positive / negative feature caches", "orchestrator.methods.tda.method:TDA",
        (*_TDA, _STATE_DTYPE), inputs="either", views=Views("augmix"), state=TDA_STATE,
        cost=Cost(samples_per_s=2816.0, gpu_samples_per_s=19119.0, state_words=TDA_WORDS), lockstep=_TDA_LOCKSTEP,
        source=_TDA_SOURCE),
    MethodCard(
        "tda_pa", "TDA+PA", 50, FAMILY, "TDA's caches + BCA's prior", "orchestrator.methods.tda.method:TDAWithPrior",
        (*_TDA, TAU, N2), inputs="either", views=Views("augmix"), state=(*TDA_STATE, "V", "C2"),
        prior=Prior(count="n2"),
        cost=Cost(samples_per_s=1471.0, gpu_samples_per_s=12071.0, state_words=TDA_WORDS + " + K*K + K"),
        lockstep=_TDA_LOCKSTEP, source=_TDA_SOURCE + "; BCA's Eq. 9"),
)
