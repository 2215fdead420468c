"""Per-view posteriors and the confident-view rule, shared by Zero, TDA, the BCA family and the AugMix
feature selection.

The public protocol (TDA's pipeline, reused by BCA's code) keeps, for each sample, the `keep` fraction of its augmented
views whose class posterior has the lowest softmax entropy; Zero votes over the same views.
"""

from __future__ import annotations

import torch

from orchestrator.methods.hparams import CLIP_LOGIT_SCALE

# The protocol's kept fraction of views (TDA's get_clip_logits, and the BCA code's selection_p).
PROTOCOL_KEEP = 0.1


def view_posteriors(view_features: torch.Tensor, class_embeddings: torch.Tensor, class_ids: torch.Tensor,
                    num_classes: int, logit_scale: float = CLIP_LOGIT_SCALE) -> torch.Tensor:
    """[n, V, d] -> [n, V, K]: softmax over the M class embeddings, summed into their K classes.

    With one embedding per class (M = K) this is the plain softmax over classes.
    """
    probs = torch.softmax(logit_scale * view_features.float() @ class_embeddings.float().T, dim=-1)
    out = probs.new_zeros(*probs.shape[:-1], num_classes)
    return out.index_add_(-1, class_ids.to(probs.device), probs)


def kept_count(num_views: int, keep: float) -> int:
    """k = max(1, int(V * keep)): int() truncates as the public code's filter does; at least one view."""
    return max(1, int(num_views * keep))


def confidence_order(posteriors: torch.Tensor) -> torch.Tensor:
    """[n, V, K] view posteriors -> [n, V] view indices by softmax entropy, lowest first (ties: earlier view)."""
    entropy = -torch.special.xlogy(posteriors, posteriors).sum(-1)
    return torch.argsort(entropy, dim=1, stable=True)


def logit_confidence_order(logits: torch.Tensor) -> torch.Tensor:
    """[n, V, M] logits -> [n, V] view indices by the entropy of softmax over the last axis, lowest first
    (ties: earlier view), computed as the public codes' select_confident_samples does, -(softmax(z) *
    log_softmax(z)).sum(): bit for bit their entropies, and a fraction of xlogy's cost on a CPU."""
    entropy = -(torch.softmax(logits, dim=-1) * torch.log_softmax(logits, dim=-1)).sum(-1)
    return torch.argsort(entropy, dim=1, stable=True)


def lowest_entropy_views(posteriors: torch.Tensor, keep: float) -> torch.Tensor:
    """[n, V, K] view posteriors -> [n, k] indices of the kept_count(V, keep) lowest-entropy views."""
    return confidence_order(posteriors)[:, :kept_count(posteriors.shape[1], keep)]


def lowest_entropy_logit_views(logits: torch.Tensor, keep: float) -> torch.Tensor:
    """lowest_entropy_views from the views' logits [n, V, M] (the posteriors are their softmax)."""
    return logit_confidence_order(logits)[:, :kept_count(logits.shape[1], keep)]


def gather_views(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values [n, V, x], index [n, k] -> [n, k, x]: each sample's chosen views, in index order."""
    return torch.gather(values, 1, index[..., None].expand(-1, -1, values.shape[-1]))


def confident_view_means(view_features: torch.Tensor, class_embeddings: torch.Tensor, class_ids: torch.Tensor,
                         num_classes: int, logit_scale: float = CLIP_LOGIT_SCALE, keep: float = PROTOCOL_KEEP,
                         chunk: int = 1024) -> torch.Tensor:
    """[n, V, d] -> [n, d]: each sample's kept views (lowest entropy against `class_embeddings`) averaged,
    not renormalised, as the public code does. `chunk` samples at a time bound the [chunk, V, M] logits."""
    out = [gather_views(block, lowest_entropy_views(
               view_posteriors(block, class_embeddings, class_ids, num_classes, logit_scale), keep)).mean(dim=1)
           for block in (view_features[s:s + chunk].float() for s in range(0, view_features.shape[0], chunk))]
    return torch.cat(out) if out else view_features.new_zeros(0, view_features.shape[-1], dtype=torch.float32)
