"""Per-view posteriors and the confident-view rule, shared by Zero and the AugMix feature selection.

The public protocol (REFERENCE.md section 3) keeps, for each sample, the `keep` fraction of its augmented
views whose class posterior has the lowest softmax entropy; Zero votes over the same views.
"""

from __future__ import annotations

import torch


def view_posteriors(view_features: torch.Tensor, class_embeddings: torch.Tensor, class_ids: torch.Tensor,
                    num_classes: int, logit_scale: float = 100.0) -> torch.Tensor:
    """[n, V, d] -> [n, V, K]: softmax over the M class embeddings, summed into their K classes.

    With one embedding per class (M = K) this is the plain softmax over classes.
    """
    probs = torch.softmax(logit_scale * view_features.float() @ class_embeddings.float().T, dim=-1)
    out = probs.new_zeros(*probs.shape[:-1], num_classes)
    return out.index_add_(-1, class_ids.to(probs.device), probs)


def lowest_entropy_views(posteriors: torch.Tensor, keep: float) -> torch.Tensor:
    """[n, V, K] view posteriors -> [n, k] indices of the k = max(1, int(V * keep)) lowest-entropy views
    (int() truncates, as the public code's filter does; ties go to the earlier view)."""
    entropy = -torch.special.xlogy(posteriors, posteriors).sum(-1)
    k = max(1, int(posteriors.shape[1] * keep))
    return torch.argsort(entropy, dim=1, stable=True)[:, :k]
