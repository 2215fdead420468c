"""skylineeeeen/DOTA's per-sample loop (dota.py: the DOTA class's predict / fit / update and run_test_dota with
get_clip_logits_aug), transcribed one sample at a time with K full d x d covariances: the reference that
tests/test_dota.py holds `dota` to and `benchmarks.methods`' "official" column times.
"""

from __future__ import annotations

import torch


def official_dota(VF: torch.Tensor, T: torch.Tensor, epsilon: float, eta: float, rho: float, sigma: float,
                  keep: float = 0.1, scale: float = 100.0,
                  dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """dota.py's DOTA class and run_test_dota body (with get_clip_logits_aug) over views [n, V, d], one embedding
    per class [K, d], in `dtype` (float64 for the tests), per sample: (final logits [n, K], the state after the
    stream)."""
    VF, T = VF.to(dtype), T.to(dtype)
    n, V, d = VF.shape
    K = T.shape[0]
    mu = torch.full((K, d), 0.001, dtype=dtype)
    c = torch.ones(K, dtype=dtype)
    Sigma = sigma * torch.eye(d, dtype=dtype).repeat(K, 1, 1)
    Lambda = torch.linalg.pinv(Sigma.mean(dim=0))
    out = torch.zeros(n, K, dtype=dtype)
    for t in range(n):
        feats = VF[t]
        logits = scale * feats @ T.T
        if V > 1:
            entropy = -(logits.softmax(1) * logits.log_softmax(1)).sum(1)
            idx = torch.argsort(entropy, stable=True)[:max(1, int(V * keep))]
            feats, output = feats[idx], logits[idx]
            clip_logits = output.mean(dim=0)
            prob_map = output.softmax(dim=1)
        else:
            clip_logits = logits[0]
            prob_map = logits.softmax(dim=1)
        # predict
        W = Lambda @ mu.T
        scores = feats.mean(dim=0) @ W - 0.5 * (mu.T * W).sum(dim=0)
        weight = min(rho * float(c.mean()) / feats.shape[0], eta)
        out[t] = clip_logits + weight * scores
        # fit
        sum_weights = prob_map.sum(dim=0)
        new_mu = (prob_map.T @ feats + c[:, None] * mu) / (sum_weights[:, None] + c[:, None])
        x_minus_mu = feats[:, None] - mu[None]
        delta = torch.einsum("bji,bjk->jik", prob_map[:, :, None] * x_minus_mu, x_minus_mu)
        Sigma = (c[:, None, None] * Sigma + delta) / (c[:, None, None] + sum_weights[:, None, None])
        mu, c = new_mu, c + sum_weights
        # update
        Lambda = torch.linalg.inv((1 - epsilon) * Sigma.mean(dim=0) + epsilon * torch.eye(d, dtype=dtype))
    return out, {"mu": mu, "sigma": Sigma, "counts": c, "precision": Lambda}
