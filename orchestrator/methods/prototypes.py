"""Shared pieces of the methods whose official code keeps one prototype per class (DPE, TPS, DMN-ZS, OnZeta,
DOTA): the class prototypes, the confident-view rule of their official code, and the entropy of the mean
probability (TPT's `avg_entropy`).
"""

from __future__ import annotations

import math

import torch

from orchestrator.methods.views import kept_count


def class_prototypes(class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int) -> torch.Tensor:
    """[M, d] rows -> [K, d]: each class's rows averaged and L2-renormalised.

    The official code of DPE, TPS, DMN, OnZeta and DOTA builds exactly this from per-prompt embeddings (mean of
    the unit prompt embeddings, renormalised), so M > K rows of one prompt each reproduce it; with M = K it only
    renormalises.
    """
    d = class_embeddings.shape[1]
    sums = class_embeddings.new_zeros(num_classes, d).index_add_(0, class_ids, class_embeddings)
    counts = torch.bincount(class_ids, minlength=num_classes).to(class_embeddings.dtype)
    return torch.nn.functional.normalize(sums / counts[:, None], dim=1)


def confident_views(logits: torch.Tensor, keep: float) -> torch.Tensor:
    """[..., V, K] view logits -> [..., k] indices of the k = max(1, int(V * keep)) views with the lowest
    softmax entropy (of each sample, given a leading sample axis).

    TPT's select_confident_samples, used by DPE and TPS; the official code keeps int(V * keep), which is
    empty below 1 / keep views (a nan loss there), hence the floor of one. Ties go to the earlier view.
    """
    entropy = -(torch.softmax(logits, dim=-1) * torch.log_softmax(logits, dim=-1)).sum(-1)
    k = kept_count(logits.shape[-2], keep)
    return torch.argsort(entropy, dim=-1, stable=True)[..., :k]


def mean_prob_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of the mean of the rows' softmax probabilities, via log-mean-exp (TPT's avg_entropy)."""
    log_probs = torch.log_softmax(logits, dim=-1)
    log_mean = torch.logsumexp(log_probs, dim=0) - math.log(logits.shape[0])
    log_mean = log_mean.clamp_min(torch.finfo(log_mean.dtype).min)
    return -(log_mean * log_mean.exp()).sum(-1)


def mean_prob_entropy_grad(logits: torch.Tensor) -> torch.Tensor:
    """[..., k, K] -> [..., k, K]: the gradient of `mean_prob_entropy` over each [k, K] block of logits.

    With p_i = softmax(z_i) and log m the log of their mean (clamped as there),
    dH/dz_ij = p_ij (sum_l p_il log m_l - log m_j) / k: autograd's value, without its graph.
    """
    log_probs = torch.log_softmax(logits, dim=-1)
    probs = log_probs.exp()
    k = logits.shape[-2]
    log_mean = torch.logsumexp(log_probs, dim=-2, keepdim=True) - math.log(k)
    log_mean = log_mean.clamp_min(torch.finfo(log_mean.dtype).min)
    return probs * ((probs * log_mean).sum(-1, keepdim=True) - log_mean) / k
