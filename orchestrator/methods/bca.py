"""The BCA-family methods: `clip` (zero-shot), `la` (only U adapts), `pa` (only V adapts), `bca` (both).

The equations, gates and update rules are documented in `orchestrator.methods.reference`, the plain
per-sample loop; `run()` computes the same thing with the exact blocked engine (`engine.run_bca_blocked`),
which the tests hold to the reference. Hparams:

- tau: shorthand for both gates (default 0.3, the paper's OOD value). tau_likelihood / tau_prior
  (default None = use tau) override it per gate, as the public code's two thresholds. A gate compares a
  probability with a strict '>', so any tau >= 1 disables it (the method then equals `clip`).
- n1, n2: initial counters of U and V (30000 / 10, the paper's OOD values).
- logit_scale (100, CLIP's), select_on ('likelihood' | 'posterior'), update ('count' | 'momentum' |
  'decay'), decay (0.999, used only by update='decay'), state_dtype ('float32' | 'float16').
- view_selection ('adaptive' | 'fixed'; la, pa and bca), used only when the features are augmented views
  [n, V, d] (view 0 the original, V > 1):
  - 'adaptive' (default, the public code's rule: TTABC's bca.py, which cites the official repository):
    every sample re-selects its 10% lowest-entropy views against the CURRENT, adapted U, scored with the
    logit scale over the M class embeddings, U only (no prior), then averages them; see
    `reference.py` for the equations. It runs the per-sample reference loop: the blocked engine cannot
    know a sample's views before every earlier update is done.
  - 'fixed' (TDA's rule): the views are selected once, against the prompt embeddings, exactly as
    `orchestrator.clip.select_views` selects them for every single-view method (class-summed posteriors at
    CLIP's logit scale 100, as TDA's pipeline hard-codes it), then the blocked engine runs on the means.
    The two agree while U has not moved; `clip` (U never moves) always selects this way.
  Single-view features ([n, d] or [n, 1, d]) ignore it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from orchestrator.methods.base import Method, Trace, check_choice, check_real, register
from orchestrator.methods.engine import run_bca_blocked
from orchestrator.methods.reference import (SELECT_ON, STATE_DTYPES, UPDATES, BCAConfig, bca_family_reference,
                                            init_state)
from orchestrator.methods.views import confident_view_means

VIEW_SELECTIONS = ("adaptive", "fixed")

_TAU_HINT = " (a probability threshold; values >= 1 disable the gate)"


class BCAFamily(Method):
    adapt_likelihood: ClassVar[bool]
    adapt_prior: ClassVar[bool]
    accepts_views = True

    @classmethod
    def wants_views(cls, hp: dict[str, Any]) -> bool:
        # 'fixed' selection of the views is what the trial already hands every single-view method.
        return {**cls.hparams, **hp}.get("view_selection") == "adaptive"

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        self.config = self.make_config(hparams)
        self.state = init_state(class_embeddings, class_ids, num_classes, self.config)

    @classmethod
    def make_config(cls, hp: dict[str, Any]) -> BCAConfig:
        options = {k: hp[k] for k in ("n1", "n2", "logit_scale", "select_on", "update", "decay", "state_dtype")
                   if k in hp}
        if "tau" in hp:
            options["tau_likelihood"] = hp["tau"] if hp.get("tau_likelihood") is None else hp["tau_likelihood"]
            options["tau_prior"] = hp["tau"] if hp.get("tau_prior") is None else hp["tau_prior"]
        return BCAConfig(adapt_likelihood=cls.adapt_likelihood, adapt_prior=cls.adapt_prior, **options)

    @classmethod
    def check_hparams(cls, hp: dict[str, Any], num_embeddings: int, num_classes: int) -> dict[str, Any]:
        name = cls.name
        out = dict(hp)
        out["logit_scale"] = check_real(name, "logit_scale", hp["logit_scale"], low=0.0, low_inclusive=False)
        if "tau" in hp:
            out["tau"] = check_real(name, "tau", hp["tau"], low=0.0, allow_inf=True, hint=_TAU_HINT)
        for key in ("tau_likelihood", "tau_prior"):
            if hp.get(key) is not None:                 # None: inherit tau
                out[key] = check_real(name, key, hp[key], low=0.0, allow_inf=True, hint=_TAU_HINT)
        for key in ("n1", "n2"):
            if key in hp:
                out[key] = check_real(name, key, hp[key], low=0.0, hint=" (an initial counter)")
        if "decay" in hp:
            out["decay"] = check_real(name, "decay", hp["decay"], low=0.0, low_inclusive=False, high=1.0)
        if "update" in hp:
            check_choice(name, "update", hp["update"], UPDATES)
        if "state_dtype" in hp:
            check_choice(name, "state_dtype", hp["state_dtype"], tuple(STATE_DTYPES))
        if "view_selection" in hp:
            check_choice(name, "view_selection", hp["view_selection"], VIEW_SELECTIONS)
        if "select_on" in hp:
            check_choice(name, "select_on", hp["select_on"], SELECT_ON)
            if hp["select_on"] == "posterior" and num_embeddings != num_classes:
                raise ValueError(f"{name}: select_on='posterior' selects a class, so it needs exactly one class "
                                 f"embedding per class (M == K); got M={num_embeddings}, K={num_classes}. "
                                 f"Use select_on='likelihood'.")
        return out

    def _run(self, features: torch.Tensor) -> Trace:
        if features.ndim == 3 and features.shape[1] == 1:
            features = features[:, 0]
        elif features.ndim == 3 and self.hp.get("view_selection") != "adaptive":
            features = confident_view_means(features, self.class_embeddings, self.class_ids, self.num_classes)
        if features.ndim == 3:
            trace = bca_family_reference(features, self.state, self.class_ids, self.num_classes, self.config)
        else:
            trace = run_bca_blocked(features, self.state, self.class_ids, self.num_classes, self.config)
        self.state = trace.state
        # The caller gets its own copy; clip has no counters to report.
        keys = ("U", "V", "C1", "C2") if self.config.selects else ("U", "V")
        trace.state = {k: self.state[k].clone() for k in keys}
        return trace


_ADAPTIVE = {"logit_scale": 100.0, "select_on": "likelihood", "update": "count", "decay": 0.999,
             "state_dtype": "float32", "view_selection": "adaptive"}


@register
class Clip(BCAFamily):
    """Zero-shot CLIP: posterior = softmax(logit_scale * U f) summed into the K classes (p V with V one-hot)."""

    name = "clip"
    adapt_likelihood = False
    adapt_prior = False
    hparams = {"logit_scale": 100.0}


@register
class LikelihoodAdaptation(BCAFamily):
    """CLIP with LA: only U adapts (Eq. 7), gated by tau_likelihood; V stays one-hot."""

    name = "la"
    adapt_likelihood = True
    adapt_prior = False
    hparams = {"tau": 0.3, "tau_likelihood": None, "n1": 30000, **_ADAPTIVE}


@register
class PriorAdaptation(BCAFamily):
    """CLIP with PA: only V adapts (Eq. 9), gated by tau_prior; U stays the prompt embeddings."""

    name = "pa"
    adapt_likelihood = False
    adapt_prior = True
    hparams = {"tau": 0.3, "tau_prior": None, "n2": 10, **_ADAPTIVE}


@register
class BCA(BCAFamily):
    """Bayesian Class Adaptation, Algorithm 1: U and V adapt (Eqs. 7 and 9)."""

    name = "bca"
    adapt_likelihood = True
    adapt_prior = True
    hparams = {"tau": 0.3, "tau_likelihood": None, "tau_prior": None, "n1": 30000, "n2": 10, **_ADAPTIVE}
