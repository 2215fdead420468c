"""The built-in methods' cards (see `orchestrator.registry.methods` for what a card holds).

The values are the official ones: BCA's from the paper (tau / n1 / n2 = 0.3 / 30000 / 10 on the OOD benchmark,
0.35 / 50000 / 10 on the cross-domain one, REFERENCE.md section 1), TDA's positive-cache alpha / beta per dataset
from its public configs (section 3), Zero's from its official code.
"""

from __future__ import annotations

from orchestrator.registry.datasets import CROSS_DOMAIN, group_datasets
from orchestrator.registry.methods import HParam, MethodCard, register_method

_CROSS_DOMAIN = group_datasets(CROSS_DOMAIN)

LOGIT_SCALE = HParam("logit_scale", "float", 100.0, "softmax scale of the cosine logits (CLIP's)", "scale",
                     low=0.0, low_open=True)


def _tau(name: str, doc: str, *, nullable: bool = False) -> HParam:
    per_dataset = {} if nullable else dict.fromkeys(_CROSS_DOMAIN, 0.35)
    return HParam(name, "float", None if nullable else 0.3, doc, "threshold", low=0.0, high=1.0,
                  nullable=nullable, per_dataset=per_dataset)


TAU = _tau("tau", "confidence gate of the updates: a probability, strict '>' (1 disables the gate)")
TAU_LIKELIHOOD = _tau("tau_likelihood", "gate of the class-embedding (U) update; null = tau", nullable=True)
TAU_PRIOR = _tau("tau_prior", "gate of the prior (V) update; null = tau", nullable=True)
N1 = HParam("n1", "int", 30000, "initial count of the class embeddings' running means (larger = slower)", "count",
            low=0, log=True, per_dataset=dict.fromkeys(_CROSS_DOMAIN, 50000))
N2 = HParam("n2", "int", 10, "initial count of the prior's running means (larger = slower)", "count", low=0,
            log=True)
_OPTIONS = (
    HParam("select_on", "str", "likelihood", "which distribution picks the embedding to update: likelihood (paper) "
           "or posterior (public code; needs M = K)", "choice", choices=("likelihood", "posterior")),
    HParam("update", "str", "count", "running-mean rule: count (Eqs. 7, 9), momentum (fixed rate) or decay "
           "(forgetting counter)", "choice", choices=("count", "momentum", "decay")),
    HParam("decay", "float", 0.999, "counter decay per sample of update=decay (memory about 1/(1 - decay))", "rate",
           low=0.0, high=1.0, low_open=True, when={"update": ("decay",)}),
    HParam("state_dtype", "str", "float32", "precision of U and V (float16 only to study its rounding)", "choice",
           choices=("float32", "float16")),
    HParam("view_selection", "str", "adaptive", "augmented views: adaptive re-selects each sample's confident views "
           "against the current U (public code), fixed selects them once against the prompts (TDA's rule)",
           "choice", choices=("adaptive", "fixed")),
)
# The BCA family takes a stream's augmented views only to re-select them as it adapts.
_BCA_VIEWS = {"inputs": "either", "views_when": {"view_selection": ("adaptive",)}, "views": "augmix"}

_BCA_SOURCE = "BCA, CVPR 2025 (paper Algorithm 1; public code's two thresholds)"

register_method(MethodCard(
    "clip", "CLIP", 0, "clip", "nothing: softmax(logit_scale · U f) summed into the K classes",
    "orchestrator.methods.bca:Clip", (LOGIT_SCALE,), baseline=True, state=("U", "V"),
    source="CLIP zero-shot classification"))
register_method(MethodCard(
    "la", "CLIP+LA", 10, "bca", "class embeddings U only (CLIP with LA)", "orchestrator.methods.bca:LikelihoodAdaptation",
    (TAU, TAU_LIKELIHOOD, N1, LOGIT_SCALE, *_OPTIONS), state=("U", "V", "C1", "C2"), source=_BCA_SOURCE,
    **_BCA_VIEWS))
register_method(MethodCard(
    "pa", "CLIP+PA", 20, "bca", "prior V only (CLIP with PA)", "orchestrator.methods.bca:PriorAdaptation",
    (TAU, TAU_PRIOR, N2, LOGIT_SCALE, *_OPTIONS), prior=True, prior_count="n2", state=("U", "V", "C1", "C2"),
    source=_BCA_SOURCE, **_BCA_VIEWS))
register_method(MethodCard(
    "bca", "BCA", 30, "bca", "both U and V (Algorithm 1)", "orchestrator.methods.bca:BCA",
    (TAU, TAU_LIKELIHOOD, TAU_PRIOR, N1, N2, LOGIT_SCALE, *_OPTIONS), prior=True, prior_count="n2",
    state=("U", "V", "C1", "C2"), source=_BCA_SOURCE, **_BCA_VIEWS))

# TDA's positive cache per dataset (pos_alpha, pos_beta), from its public configs.
_TDA_POSITIVE = {
    "imagenet": (2.0, 5.0), "imagenet-a": (2.0, 5.0), "imagenet-v2": (1.0, 8.0), "imagenet-r": (1.0, 8.0),
    "imagenet-sketch": (2.363, 7.45), "caltech101": (5.0, 5.0), "dtd": (2.0, 3.0), "eurosat": (4.0, 8.0),
    "aircraft": (2.0, 2.0), "food101": (1.0, 1.0), "flowers102": (1.0, 5.0), "pets": (2.0, 7.0),
    "cars": (1.0, 7.0), "sun397": (2.0, 3.0), "ucf101": (3.0, 8.0),
}
_TDA = (
    HParam("pos_alpha", "float", 2.0, "weight of the positive cache's logits", "weight", low=0.0,
           per_dataset={k: a for k, (a, _) in _TDA_POSITIVE.items()}),
    HParam("pos_beta", "float", 5.0, "sharpness of the positive cache's affinities", "scale", low=0.0,
           per_dataset={k: b for k, (_, b) in _TDA_POSITIVE.items()}),
    HParam("neg_alpha", "float", 0.117, "weight of the negative cache's logits", "weight", low=0.0),
    HParam("neg_beta", "float", 1.0, "sharpness of the negative cache's affinities", "scale", low=0.0),
    HParam("pos_shot", "int", 3, "positive cache entries per class", "size", low=0),
    HParam("neg_shot", "int", 2, "negative cache entries per class", "size", low=0),
    LOGIT_SCALE,
)
_TDA_STATE = ("pos_keys", "pos_entropy", "neg_keys", "neg_entropy", "neg_values")
_TDA_SOURCE = "kdiAAA/TDA (tda_runner.py, utils.py, configs/)"

register_method(MethodCard(
    "tda", "TDA", 40, "tda", "positive / negative feature caches", "orchestrator.methods.tda:TDA", _TDA,
    state=_TDA_STATE, source=_TDA_SOURCE, inputs="either", views="augmix"))
register_method(MethodCard(
    "tda_pa", "TDA+PA", 50, "tda", "TDA's caches + BCA's prior", "orchestrator.methods.tda:TDAWithPrior",
    (*_TDA, TAU, N2), prior=True, prior_count="n2", state=(*_TDA_STATE, "V", "C2"),
    source=_TDA_SOURCE + "; BCA's Eq. 9", inputs="either", views="augmix"))
register_method(MethodCard(
    "zero", "Zero", 60, "zero", "nothing: majority vote of the confident augmented views",
    "orchestrator.methods.zero:Zero",
    (HParam("keep", "float", 0.3, "fraction of the views kept (lowest entropy; the official gamma)", "rate",
            low=0.0, high=1.0, low_open=True),
     HParam("tie_break", "str", "discarded", "a tied vote: discarded = the first discarded view voting a tied class "
            "(official code), mean_prob = the higher mean probability of the kept views", "choice",
            choices=("discarded", "mean_prob")), LOGIT_SCALE),
    inputs="views", views="augmix", source="FarinaMatteo/zero (ttas/zero.py)"))
