"""Zero (Farina et al., NeurIPS 2024): test-time augmentation with the softmax temperature taken to zero.

Per sample with view features [V, d] (view 0 the original image, the rest augmentations):

1. each view's class probabilities q_v = softmax(logit_scale * U f_v) summed into the K classes (as `clip`);
2. keep the confident views: the int(V * keep) views with the lowest entropy of q_v, at least one
   (int(...) as the public code's confidence filter; ties go to the earlier view);
3. each kept view votes for argmax q_v (zero temperature); the prediction is the majority vote, ties broken
   toward the class with the higher mean probability over the kept views.

The posterior is the vote histogram with one extra soft vote spread as that mean probability:
post = (votes + mean_q) / (kept + 1). It sums to 1, and its argmax is exactly the tie-broken majority
vote: if class a has more votes than b it leads by at least one whole vote, and the soft votes cannot
overturn that, since mean_q[b] - mean_q[a] <= 1 - 2 mean_q[a] < 1 (a got a vote, so mean_q[a] > 0).
Stateless: samples are processed in vectorised chunks.
"""

from __future__ import annotations

import torch

from orchestrator.methods.base import Method, StageTimer, Trace, empty_trace
from orchestrator.methods.views import lowest_entropy_views, view_posteriors

_CHUNK = 256  # samples per vectorised chunk: bounds the [chunk, V, M] logits in memory


class Zero(Method):
    """Majority vote of the confident augmented views' argmax predictions."""

    name = "zero"

    def _run(self, features: torch.Tensor) -> Trace:
        n = features.shape[0]
        K = self.num_classes
        posteriors, selected, gated, gated_prior = empty_trace(n, K, features.device)
        timer = StageTimer()
        for start in range(0, n, _CHUNK):
            chunk = features[start:start + _CHUNK]
            with timer("logits"):
                q = view_posteriors(chunk, self.class_embeddings, self.class_ids, K, self.hp["logit_scale"])
            with timer("posterior"):
                order = lowest_entropy_views(q, self.hp["keep"])
                q_kept = torch.gather(q, 1, order[..., None].expand(-1, -1, K))
                votes = torch.nn.functional.one_hot(q_kept.argmax(dim=-1), K).sum(dim=1).float()
                posteriors[start:start + _CHUNK] = (votes + q_kept.mean(dim=1)) / (order.shape[1] + 1)
        return Trace(posteriors, selected, gated, gated_prior, state={}, timings=timer.seconds)
