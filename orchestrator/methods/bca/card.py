"""The BCA family's cards: clip (zero-shot, the baseline), la (U adapts), pa (V adapts), bca (both).

The values are the paper's: tau / n1 / n2 = 0.3 / 30000 / 10 on the OOD benchmark and 0.35 / 50000 / 10 on the
cross-domain one. Their lockstep runner (`lockstep.py`) is the blocked engine (`orchestrator.methods.engine`) on one
feature per sample, which runs the four cards' configs of a pack together, and the adaptive view path on views.
"""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.datasets import CROSS_DOMAIN, group_datasets
from orchestrator.registry.card import Cost, HParam, Lockstep, MethodCard, Prior, Views

_CROSS_DOMAIN = group_datasets(CROSS_DOMAIN)


def _tau(name: str, doc: str, *, nullable: bool = False) -> HParam:
    per_dataset = {} if nullable else dict.fromkeys(_CROSS_DOMAIN, 0.35)
    return HParam(name, "float", None if nullable else 0.3, doc, "threshold", low=0.0, high=1.0,
                  nullable=nullable, null_means="tau" if nullable else None, per_dataset=per_dataset)


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
# The BCA family takes a stream's augmented views only to re-select them as it adapts; its lockstep runner takes
# both (the blocked engine on one feature per sample, the adaptive view path on views).
_BCA_VIEWS = Views("augmix", when={"view_selection": ("adaptive",)})
_BCA_LOCKSTEP = Lockstep("orchestrator.methods.bca.lockstep:run_bca_lockstep")

_BCA_SOURCE = "BCA, CVPR 2025 (paper Algorithm 1; public code's two thresholds)"
# U [M, d], V [M, K], C1 and C2 [M], at M = K (CLIP holds the same, unadapted)
_BCA_WORDS = "K*d + K*K + 2*K"
_BCA_STATE = ("U", "V", "C1", "C2")

CARDS = (
    MethodCard(
        "clip", "CLIP", 0, "clip", "nothing: softmax(logit_scale · U f) summed into the K classes",
        "orchestrator.methods.bca.method:Clip", (LOGIT_SCALE,), baseline=True, state=("U", "V"),
        cost=Cost(samples_per_s=27783.0, gpu_samples_per_s=36826.0, state_words=_BCA_WORDS),
        lockstep=_BCA_LOCKSTEP, source="CLIP zero-shot classification"),
    MethodCard(
        "la", "CLIP+LA", 10, "bca", "class embeddings U only (CLIP with LA)",
        "orchestrator.methods.bca.method:LikelihoodAdaptation", (TAU, TAU_LIKELIHOOD, N1, LOGIT_SCALE, *_OPTIONS),
        inputs="either", views=_BCA_VIEWS, state=_BCA_STATE,
        cost=Cost(samples_per_s=25731.0, gpu_samples_per_s=36826.0, state_words=_BCA_WORDS),
        lockstep=_BCA_LOCKSTEP, source=_BCA_SOURCE),
    MethodCard(
        "pa", "CLIP+PA", 20, "bca", "prior V only (CLIP with PA)", "orchestrator.methods.bca.method:PriorAdaptation",
        (TAU, TAU_PRIOR, N2, LOGIT_SCALE, *_OPTIONS), inputs="either", views=_BCA_VIEWS, state=_BCA_STATE,
        prior=Prior(count="n2"), cost=Cost(samples_per_s=22292.0, gpu_samples_per_s=36826.0, state_words=_BCA_WORDS),
        lockstep=_BCA_LOCKSTEP, source=_BCA_SOURCE),
    MethodCard(
        "bca", "BCA", 30, "bca", "both U and V (Algorithm 1)", "orchestrator.methods.bca.method:BCA",
        (TAU, TAU_LIKELIHOOD, TAU_PRIOR, N1, N2, LOGIT_SCALE, *_OPTIONS), inputs="either", views=_BCA_VIEWS,
        state=_BCA_STATE, prior=Prior(count="n2"),
        cost=Cost(samples_per_s=19314.0, gpu_samples_per_s=36826.0, state_words=_BCA_WORDS),
        lockstep=_BCA_LOCKSTEP, source=_BCA_SOURCE),
)
