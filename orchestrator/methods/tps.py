"""TPS (Sui et al., "Just Shift It: Test-Time Prototype Shifting"), as its official code runs it
(elaine-sui/TPS@556db0f, shift_classification.py test_time_adapt_eval, model/learnable_shift.py, model/shifter.py;
the per-class shift of scripts/shift/*: --text_shift --do_shift --per_label --tta_steps 1).

Episodic: nothing carries over between samples. Per sample with views X [V, d] (view 0 the original image),
cached prototypes P [K, d] (prototypes.class_prototypes) and s = logit_scale:

1. per-class shifts S [K, d] start at zero; W(S) = normalize(P + S);
2. the max(1, int(V * keep)) views of lowest softmax entropy of s X W(0)^T are kept; the loss is the entropy
   of their mean probability (TPT's avg_entropy);
3. one step of a fresh torch.optim.AdamW (the official optimizer: lr, torch's defaults otherwise, i.e. weight
   decay 0.01, eps 1e-8) on S;
4. the posterior is softmax(s W(S) x_0) on the original view.

Trace: no state, selected = -1, gated and gated_prior False (the step is taken on every sample).

Where the official code differs from the paper or this port, this follows the code:
- The official step runs under fp16 autocast with a GradScaler (init scale 1e3): in float32 the scaled and
  unscaled gradients agree up to rounding, and the scaler's inf/nan step skipping never triggers.
- int(V * keep) views (the official count) is floored at one, which only matters below 1 / keep views.
- The confident views are chosen once against the unshifted prototypes and their logits recomputed under the
  step's graph: S = 0 there, so the values are the official ones.
Learning rate: 5e-3 as in the README's example run; 1e-3 on the cross-domain sets as the paper reports (the
official scripts take lr as an argument). Views: TPT's protocol, 63 random resized crops + flips and the
original (`augmix=False` on ImageNet and its variants; the cross-domain sets add AugMix operations on top of
the crops). Text: the official runs average a
template ensemble and GPT-4 descriptors (gpt4_descriptors/<dataset>-gpt4.json); give them as several rows per
class (M > K), which are averaged and renormalised here.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from orchestrator.methods.base import Method, StageTimer, Trace, empty_trace
from orchestrator.methods.prototypes import class_prototypes, confident_views, mean_prob_entropy

class TPS(Method):
    """Test-time prototype shifting: one AdamW step on per-class shifts, reset every sample."""

    name = "tps"

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        self.prototypes = class_prototypes(class_embeddings, class_ids, num_classes)


    def _step(self, views: torch.Tensor, timer: StageTimer) -> torch.Tensor:
        """One sample's posterior [K]."""
        scale = self.hp["logit_scale"]
        with timer("logits"):
            kept = views[confident_views(scale * views @ self.prototypes.T, self.hp["keep"])]
        with timer("update"):
            shift = torch.zeros_like(self.prototypes, requires_grad=True)
            optimizer = torch.optim.AdamW([shift], lr=self.hp["lr"])
            with torch.enable_grad():
                loss = mean_prob_entropy(scale * kept @ F.normalize(self.prototypes + shift, dim=1).T)
                optimizer.zero_grad()
                loss.backward()
            optimizer.step()
        with timer("posterior"):
            return torch.softmax(scale * F.normalize(self.prototypes + shift.detach(), dim=1) @ views[0], dim=0)

    def _run(self, features: torch.Tensor) -> Trace:
        n = features.shape[0]
        posteriors, selected, gated, gated_prior = empty_trace(n, self.num_classes, features.device)
        timer = StageTimer()
        for i in range(n):
            posteriors[i] = self._step(features[i], timer)
        return Trace(posteriors, selected, gated, gated_prior, state={}, timings=timer.seconds)
