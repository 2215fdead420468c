"""The built-in methods' cards (see `orchestrator.registry.methods` for what a card holds).

The values are the official ones: BCA's from the paper (tau / n1 / n2 = 0.3 / 30000 / 10 on the OOD benchmark,
0.35 / 50000 / 10 on the cross-domain one), TDA's positive-cache alpha / beta per dataset
from its public configs (section 3), the other methods' from their official code and configs (each card's
`source`; where code and paper differ, the method module's docstring says which is followed).
"""

from __future__ import annotations

from orchestrator.registry.datasets import CROSS_DOMAIN, group_datasets
from orchestrator.registry.methods import HParam, MethodCard, register_method

_CROSS_DOMAIN = group_datasets(CROSS_DOMAIN)

CLIP_LOGIT_SCALE = 100.0  # CLIP's learned logit scale, as the official codes write it (exp(4.6052))
LOGIT_SCALE = HParam("logit_scale", "float", CLIP_LOGIT_SCALE, "softmax scale of the cosine logits (CLIP's)", "scale",
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

# Methods beyond the BCA paper (docs/methods.md): their official repositories' per-dataset configs.
register_method(MethodCard(
    'dpe', 'DPE', 100, 'prototype', 'textual prototypes and a visual cache, one AdamW step per sample on their residuals',
    "orchestrator.methods.dpe:DPE",
    (
        HParam('alpha', 'float', 6.0, 'weight of the visual-cache logits', 'weight', low=0.0, per_dataset={'imagenet': 6.0, 'imagenet-a': 6.0, 'imagenet-v2': 3.0, 'imagenet-r': 3.0, 'imagenet-sketch': 7.0, 'caltech101': 15.0, 'dtd': 6.0, 'eurosat': 3.0, 'aircraft': 6.0, 'food101': 3.0, 'flowers102': 2.5, 'pets': 4.0, 'cars': 3.0, 'sun397': 6.0, 'ucf101': 9.0}),
        HParam('beta', 'float', 5.0, 'sharpness of the cache affinity exp(-beta (1 - cos))', 'scale', low=0.0, per_dataset={'imagenet': 5.0, 'imagenet-a': 5.0, 'imagenet-v2': 8.0, 'imagenet-r': 8.0, 'imagenet-sketch': 7.45, 'caltech101': 5.0, 'dtd': 3.0, 'eurosat': 8.0, 'aircraft': 2.0, 'food101': 1.0, 'flowers102': 5.0, 'pets': 7.0, 'cars': 7.0, 'sun397': 3.0, 'ucf101': 8.0}),
        HParam('lr_text', 'float', 0.0006, 'AdamW learning rate of the textual residual', 'rate', low=0.0, low_open=True, log=True, per_dataset={'imagenet': 0.0006, 'imagenet-a': 0.0003, 'imagenet-v2': 0.0005, 'imagenet-r': 0.0006, 'imagenet-sketch': 0.0006, 'caltech101': 0.0006, 'dtd': 0.0006, 'eurosat': 5e-05, 'aircraft': 0.0006, 'food101': 0.0002, 'flowers102': 0.0001, 'pets': 5e-05, 'cars': 0.0001, 'sun397': 0.0002, 'ucf101': 0.0004}),
        HParam('lr_image', 'float', 0.0006, 'AdamW learning rate of the visual-cache residual', 'rate', low=0.0, low_open=True, log=True, per_dataset={'imagenet': 0.0006, 'imagenet-a': 0.0003, 'imagenet-v2': 0.0005, 'imagenet-r': 0.0006, 'imagenet-sketch': 0.0006, 'caltech101': 0.0006, 'dtd': 0.0006, 'eurosat': 5e-05, 'aircraft': 0.0006, 'food101': 0.0002, 'flowers102': 0.0001, 'pets': 5e-05, 'cars': 0.0001, 'sun397': 0.0002, 'ucf101': 0.0004}),
        HParam('align', 'float', 0.5, 'weight of the InfoNCE alignment of cache and text prototypes', 'weight', low=0.0, per_dataset={'imagenet': 0.5, 'imagenet-a': 2.5, 'imagenet-v2': 0.5, 'imagenet-r': 0.0, 'imagenet-sketch': 0.2, 'caltech101': 0.2, 'dtd': 0.2, 'eurosat': 0.2, 'aircraft': 0.2, 'food101': 0.2, 'flowers102': 0.2, 'pets': 0.2, 'cars': 1.5, 'sun397': 0.2, 'ucf101': 0.2}),
        HParam('shot', 'int', 3, 'cache entries per class', 'size', low=1),
        HParam('keep', 'float', 0.1, 'fraction of lowest-entropy views kept', 'threshold', low=0.0, high=1.0, low_open=True),
        HParam('tau_global', 'float', 0.1, 'normalised-entropy threshold of the global text-prototype update', 'threshold', low=0.0),
        LOGIT_SCALE,
        HParam('predict_views', 'str', 'original', 'predict on the original view or on the re-selected confident views', 'choice', choices=('original', 'confident'), per_dataset={'imagenet-a': 'confident'}),
    ),
    inputs='views', views='augmix', view_scope='protocol', state=('text', 'text_updates', 'cache_keys', 'cache_entropy'),
    source='zhangce01/DPE-CLIP@fecae5a50d7dc39fb944221be390201a56948416 main_dpe.py, utils.py, configs/'))

register_method(MethodCard(
    'tps', 'TPS', 110, 'episodic', 'per-class shifts of the prototypes, one AdamW step per sample, reset every sample (episodic)',
    "orchestrator.methods.tps:TPS",
    (
        HParam('lr', 'float', 0.005, 'AdamW learning rate of the per-class shifts', 'rate', low=0.0, low_open=True, log=True, per_dataset={'aircraft': 0.001, 'caltech101': 0.001, 'cars': 0.001, 'dtd': 0.001, 'eurosat': 0.001, 'flowers102': 0.001, 'food101': 0.001, 'pets': 0.001, 'sun397': 0.001, 'ucf101': 0.001}),
        HParam('keep', 'float', 0.1, 'fraction of lowest-entropy views in the loss', 'threshold', low=0.0, high=1.0, low_open=True),
        LOGIT_SCALE,
    ),
    inputs='views', views='crops', state=(),
    source='elaine-sui/TPS@556db0fe310f029fc7b796ffa83eaa64c578b505 shift_classification.py, model/shifter.py'))

register_method(MethodCard(
    'dmn_zs', 'DMN-ZS', 120, 'memory', 'a per-class memory of confident test features read by attention',
    "orchestrator.methods.dmn_zs:DMNZeroShot",
    (
        HParam('memory_size', 'int', 50, 'memory entries per class', 'size', low=1),
        HParam('beta', 'float', 5.5, 'sharpness of the attention weights exp(-beta (1 - cos))', 'scale', low=0.0),
        HParam('memory_weight', 'float', 1.0, 'weight of the memory posterior against the text posterior (per dataset: the official logs\' values, chosen on test labels)', 'weight', low=0.0, per_dataset={'imagenet': 1.0, 'flowers102': 10.0, 'dtd': 10.0, 'pets': 1.0, 'cars': 0.3, 'ucf101': 0.3, 'caltech101': 0.3, 'food101': 0.3, 'sun397': 3.0, 'aircraft': 1.0, 'eurosat': 0.3, 'imagenet-a': 3.0, 'imagenet-v2': 1.0, 'imagenet-r': 0.3, 'imagenet-sketch': 1.0}),
        HParam('keep', 'float', 0.1, 'fraction of lowest-entropy views that choose the pseudo-label', 'threshold', low=0.0, high=1.0, low_open=True),
        LOGIT_SCALE,
    ),
    inputs='views', views='crops', view_count=32, state=('memory', 'memory_entropy', 'memory_count'),
    source='YBZh/DMN@c6c218c70ebbc701b31cc3d7f7b9597117daad8e dmn_main.py (DualMem, direct_inference)'))
# DOTA's configs/vit/*.yaml per dataset (epsilon, eta, rho); sigma is 0.002 everywhere (dota.py's default).
_DOTA = {
    "imagenet": (1e-4, 0.2, 0.005), "imagenet-a": (1e-4, 0.5, 0.02), "imagenet-v2": (1e-4, 0.1, 0.01),
    "imagenet-r": (1e-4, 0.3, 0.0025), "imagenet-sketch": (1e-4, 0.8, 0.03), "caltech101": (0.002, 0.3, 0.02),
    "dtd": (1e-4, 0.3, 0.02), "eurosat": (1e-4, 3.0, 0.05), "aircraft": (1e-4, 0.2, 0.01),
    "food101": (4e-5, 0.1, 0.01), "flowers102": (1e-4, 0.2, 0.02), "pets": (1e-4, 0.3, 0.02),
    "cars": (1e-4, 0.3, 0.01), "sun397": (1e-4, 0.2, 0.01), "ucf101": (1e-4, 0.4, 0.02),
}
register_method(MethodCard(
    "dota", "DOTA", 70, "gaussian", "per-class Gaussian means and covariances from soft labels, shared precision",
    "orchestrator.methods.dota:DOTA",
    (HParam("epsilon", "float", 1e-4, "identity blended into the mean covariance before inverting", "weight",
            low=0.0, high=1.0, log=True, per_dataset={k: v[0] for k, v in _DOTA.items()}),
     HParam("eta", "float", 0.2, "cap of the Gaussian score's weight min(rho · mean count / views kept, eta)",
            "weight", low=0.0, per_dataset={k: v[1] for k, v in _DOTA.items()}),
     HParam("rho", "float", 0.005, "growth of the Gaussian score's weight with the samples seen", "rate", low=0.0,
            per_dataset={k: v[2] for k, v in _DOTA.items()}),
     HParam("sigma", "float", 0.002, "initial covariance sigma · I of every class", "scale", low=0.0,
            low_open=True, log=True),
     HParam("keep", "float", 0.1, "fraction of the views kept (lowest entropy; at least one)", "rate", low=0.0,
            high=1.0, low_open=True),
     LOGIT_SCALE),
    inputs="views", views="augmix", view_scope="protocol", state=("mu", "sigma", "counts", "precision"),
    source="skylineeeeen/DOTA@bc67d44 (dota.py, configs/vit/); 64 AugMix views on ImageNet-A/-V2/-R/-Sketch, "
           "the original view elsewhere"))
register_method(MethodCard(
    "onzeta", "OnZeta", 80, "onzeta", "class-proportion dual variable and vision-space class proxies",
    "orchestrator.methods.onzeta:OnZeta",
    (HParam("tau_t", "float", 0.01, "temperature of the text label q (0.01 is logit scale 100)", "scale", low=0.0,
            low_open=True, log=True),
     HParam("tau_i", "float", 0.04, "temperature of the vision-proxy label p", "scale", low=0.0, low_open=True,
            log=True),
     HParam("cw", "float", 0.5, "proxy learning rate constant: cw / sqrt(i + 1)", "rate", low=0.0),
     HParam("cr", "float", 20.0, "dual (class-proportion) learning rate constant: cr / sqrt(i + 1)", "rate",
            low=0.0),
     HParam("alpha", "float", 1.0, "target class proportion alpha / K (1: uniform)", "weight", low=0.0),
     HParam("beta", "float", 0.8, "final weight of the proxy label, reached at the last sample", "weight",
            low=0.0, high=1.0),
     HParam("n_total", "int", None, "stream length N of the mixing weight's schedule; null: the first run "
            "call's length", "size", low=1, nullable=True)),
    state=("W", "rho", "step"), stream_length="n_total", source="idstcv/OnZeta@befef06 (main_online.py); ImageNet only, no per-dataset configs"))

register_method(MethodCard(
    'mta', 'MTA', 130, 'episodic', 'nothing kept: the MeanShift mode of each sample\'s views, weighted by inlierness',
    "orchestrator.methods.mta:MTA",
    (
        HParam('lambda_y', 'float', 0.2, 'temperature of the inlierness softmax (the entropic term)', 'scale', low=0.0,
               low_open=True, log=True),
        HParam('lambda_q', 'float', 4.0, 'weight of the view-affinity (quadratic) term of the inlierness', 'weight',
               low=0.0),
        LOGIT_SCALE,
    ),
    inputs='views', views='crops', state=(),
    source='MaxZanella/MTA@cafafdf mta.py (solve_mta), main.py'))

# BoostAdapter's configs/*.yaml: positive cache (alpha, beta) and delta (imagenet.yaml has no delta: unused
# there, ImageNet runs with one view); the cache query is view 0 on the cross-domain sets (`infer_ori_image`)
# and the confident views' mean on ImageNet's variants.
_BOOST = {
    "imagenet": (2.0, 5.0, 0), "imagenet-a": (2.0, 5.0, 3), "imagenet-v2": (1.0, 8.0, 1),
    "imagenet-r": (1.0, 8.0, 3), "imagenet-sketch": (2.363, 7.45, 1), "caltech101": (5.0, 5.0, 2),
    "dtd": (2.0, 3.0, 0), "eurosat": (4.0, 8.0, 0), "aircraft": (2.0, 2.0, 2), "food101": (1.0, 1.0, 3),
    "flowers102": (1.0, 5.0, 0), "pets": (2.0, 7.0, 0), "cars": (1.0, 7.0, 3), "sun397": (2.0, 3.0, 1),
    "ucf101": (3.0, 8.0, 0),
}
register_method(MethodCard(
    'boostadapter', 'BoostAdapter', 140, 'tda',
    'TDA\'s positive / negative caches, the positive one boosted per sample by its own confident views',
    "orchestrator.methods.boostadapter:BoostAdapter",
    (
        HParam('pos_alpha', 'float', 2.0, 'weight of the positive (boosting) cache\'s logits', 'weight', low=0.0,
               per_dataset={k: a for k, (a, _, _) in _BOOST.items()}),
        HParam('pos_beta', 'float', 5.0, 'sharpness of the positive cache\'s affinities', 'scale', low=0.0,
               per_dataset={k: b for k, (_, b, _) in _BOOST.items()}),
        HParam('neg_alpha', 'float', 0.117, 'weight of the negative cache\'s logits', 'weight', low=0.0),
        HParam('neg_beta', 'float', 1.0, 'sharpness of the negative cache\'s affinities', 'scale', low=0.0),
        HParam('pos_shot', 'int', 3, 'positive cache entries per class', 'size', low=1),
        HParam('neg_shot', 'int', 2, 'negative cache entries per class (first in, first out)', 'size', low=1),
        HParam('delta', 'int', 0, 'boosting-cache entries per class beyond pos_shot', 'size', low=0,
               per_dataset={k: d for k, (_, _, d) in _BOOST.items()}),
        HParam('keep', 'float', 0.1, 'fraction of lowest-entropy views: the confident query and the boosting views',
               'threshold', low=0.0, high=1.0, low_open=True),
        HParam('query', 'str', 'original', 'the caches\' query: the original view or the confident views\' mean',
               'choice', choices=('original', 'confident'),
               per_dataset=dict.fromkeys(("imagenet-a", "imagenet-v2", "imagenet-r", "imagenet-sketch"), 'confident')),
        LOGIT_SCALE,
    ),
    inputs='views', views='crops', single_view_datasets=('imagenet',), state=_TDA_STATE,
    source='taolinzhang/BoostAdapter@9983e1a runner.py (run_test_tda, boostadapter mode), utils.py, configs/'))
