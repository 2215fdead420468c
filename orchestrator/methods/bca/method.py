"""The BCA-family methods: `clip` (zero-shot), `la` (only U adapts), `pa` (only V adapts), `bca` (both).

The equations, gates and update rules are documented in `orchestrator.methods.bca.reference`, the plain
per-sample loop; `run()` computes the same thing with the exact blocked engine (`engine.run_bca_blocked`),
which the tests hold to the reference. Their hparams (tau or tau_likelihood / tau_prior, n1, n2, logit_scale,
select_on, update, decay, state_dtype), ranges and defaults are declared in their registry cards
(`card.py` in this folder). A gate compares a probability with a strict '>', so tau = 1 disables it.

Augmented views [n, V, d] (view 0 the original; la, pa and bca), by `view_selection`:
- 'adaptive' (default, the public code's rule: TTABC's bca.py, which cites the official repository): every
  sample re-selects its 10% lowest-entropy views against the CURRENT, adapted U, the entropy of
  softmax(logit_scale * f_v U^T) over the M class embeddings (the likelihood alone: no prior, not summed
  into classes), then averages them; see `reference.py` for the equations. One stream runs the per-sample
  reference loop (the fewest operations a step); the lockstep path over orders and grid points
  (`views.run_bca_views_many`) steps G streams in batched operations, bitwise the same per stream. The blocked
  engine cannot know a sample's views before every earlier update is done.
- 'fixed' (TDA's rule): the views are selected once, against the prompt embeddings, exactly as
  `orchestrator.clip.select_views` selects them for every single-view method (class-summed posteriors at
  CLIP's logit scale 100, which TDA's pipeline hard-codes), then the blocked engine runs on their means.
  The trial hands such runs those means directly (the card's `Views.when`).
The two agree while U has not moved. A single view ([n, 1, d]) is the single-view path.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch

from orchestrator.methods.base import Method, Trace
from orchestrator.methods.engine import run_bca_blocked
from orchestrator.methods.bca.reference import BCAConfig, bca_family_reference, init_state
from orchestrator.methods.views import confident_view_means
from orchestrator.registry import method_card

_CONFIG_KEYS = ("tau_likelihood", "tau_prior", "n1", "n2", "logit_scale", "select_on", "update", "decay", "state_dtype")


class BCAFamily(Method):
    adapt_likelihood: ClassVar[bool]
    adapt_prior: ClassVar[bool]

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        self.config = self.make_config(hparams)
        self.state = init_state(class_embeddings, class_ids, num_classes, self.config)

    @classmethod
    def make_config(cls, hp: dict[str, Any]) -> BCAConfig:
        """The variant's config from its hparams. A part it does not adapt keeps the bca card's defaults (clip
        and pa never read n1, clip and la never read n2, they only seed the counters the state reports); the
        card's null gates take tau (`MethodCard.derived`), as `make_method` resolves them."""
        family = method_card(BCA.name)
        full = family.derived({**family.resolve({}), **hp})
        return BCAConfig(adapt_likelihood=cls.adapt_likelihood, adapt_prior=cls.adapt_prior,
                         **{k: full[k] for k in _CONFIG_KEYS})

    @classmethod
    def check_hparams(cls, hp: dict[str, Any], num_embeddings: int, num_classes: int) -> dict[str, Any]:
        if hp.get("select_on") == "posterior" and num_embeddings != num_classes:
            raise ValueError(f"{cls.name}: select_on='posterior' selects a class, so it needs exactly one class "
                             f"embedding per class (M == K); got M={num_embeddings}, K={num_classes}. "
                             f"Use select_on='likelihood'.")
        return hp

    def _pass(self, features: torch.Tensor, config: BCAConfig) -> Trace:
        """The stream from the current state under `config`; the trace holds the new state (not kept here)."""
        if features.ndim == 3 and features.shape[1] == 1:
            features = features[:, 0]
        elif features.ndim == 3 and self.hp.get("view_selection") != "adaptive":
            features = confident_view_means(features, self.class_embeddings, self.class_ids, self.num_classes)
        if features.ndim == 3:
            return bca_family_reference(features, self.state, self.class_ids, self.num_classes, config)
        return run_bca_blocked(features, self.state, self.class_ids, self.num_classes, config)

    def frozen(self, features: torch.Tensor) -> torch.Tensor:
        # the posterior comes before either update (Eqs. 7-9), so the same pass with both updates off
        return self._pass(features, replace(self.config, adapt_likelihood=False, adapt_prior=False)).posteriors

    def _run(self, features: torch.Tensor) -> Trace:
        trace = self._pass(features, self.config)
        self.state = trace.state
        # The caller gets its own copy; clip has no counters to report.
        keys = ("U", "V", "C1", "C2") if self.config.selects else ("U", "V")
        trace.state = {k: self.state[k].clone() for k in keys}
        return trace


class Clip(BCAFamily):
    """Zero-shot CLIP: posterior = softmax(logit_scale * U f) summed into the K classes (p V with V one-hot)."""

    name = "clip"
    adapt_likelihood = False
    adapt_prior = False


class LikelihoodAdaptation(BCAFamily):
    """CLIP with LA: only U adapts (Eq. 7), gated by tau_likelihood; V stays one-hot."""

    name = "la"
    adapt_likelihood = True
    adapt_prior = False


class PriorAdaptation(BCAFamily):
    """CLIP with PA: only V adapts (Eq. 9), gated by tau_prior; U stays the prompt embeddings."""

    name = "pa"
    adapt_likelihood = False
    adapt_prior = True


class BCA(BCAFamily):
    """Bayesian Class Adaptation, Algorithm 1: U and V adapt (Eqs. 7 and 9)."""

    name = "bca"
    adapt_likelihood = True
    adapt_prior = True
