"""A plain per-batch transcription of the official TransCLIP solver as StatA runs it (`MaxZanella/StatA`
solvers/TransCLIP.py), in float64, for the tests: the Gaussian terms broadcast over [b, K, d] as the official
writes them, the sparse kNN affinity as a dense matrix, with the departures `method.py` lists (neighbours capped
at b - 1, the plain-mean variance, a class with zero mass keeping its mean, a batch of one keeping its zero-shot
posterior). `stata/reference.py` builds StatA's solver on the same pieces."""

from __future__ import annotations

from typing import Any

import torch

INNER_STEPS = 5
TEMPERATURE = 50.0


def affinity_matrix(x: torch.Tensor, n_neighbors: int) -> torch.Tensor:
    """The official build_affinity_matrix, dense: W[i, j] = x_i . x_j for the top n_neighbors + 1 of row i but
    its first."""
    b = x.shape[0]
    k = min(n_neighbors, b - 1)
    affinity = x @ x.T
    W = torch.zeros(b, b, dtype=x.dtype)
    for i in range(b):
        for j in affinity[i].topk(k + 1).indices[1:].tolist():
            W[i, j] = affinity[i, j]
    return W


def log_likelihood(x: torch.Tensor, mu: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """The official Gaussian.forward(no_exp=True): -1/2 sum_d (x - mu)^2 / var, var [K, d] or [d]."""
    return -0.5 * ((x[:, None, :] - mu[None, :, :]) ** 2 * (1 / var)).sum(dim=2)


def update_z(loglik, y_hat, z, W, lambda_y_hat, lambda_laplacian, n_neighbors, log_det=None):
    for _ in range(INNER_STEPS):
        inter = loglik.clone()
        inter += lambda_laplacian * (TEMPERATURE / (n_neighbors * 2)) * (W.T @ z + W @ z)
        if log_det is not None:
            inter -= 0.5 * log_det.unsqueeze(0)
        inter -= inter.max(dim=1, keepdim=True).values
        inter = (y_hat ** lambda_y_hat) * torch.exp(1 / TEMPERATURE * inter)
        z = inter / inter.sum(dim=1, keepdim=True)
    return z


def class_means(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The official update_mu's first half: normalise(sum_i z_ik x_i / sum_i z_ik)."""
    mu = torch.einsum("ij,ik->jk", z, x) / z.sum(dim=0).unsqueeze(-1)
    return mu / mu.norm(dim=-1, keepdim=True)


def zero_shot(x: torch.Tensor, text: torch.Tensor, logit_scale: float) -> torch.Tensor:
    return torch.softmax(logit_scale * x @ text.T, dim=1)


def confident_init(x: torch.Tensor, z: torch.Tensor, n_most_confident: int = 8) -> torch.Tensor:
    """transduction-for-vlms init_mu (zero-shot): per class, the mean of z-weighted features of its top samples."""
    k = min(n_most_confident, x.shape[0])
    mu = torch.zeros(z.shape[1], x.shape[1], dtype=x.dtype)
    top = torch.topk(z, k=k, dim=0).indices
    for c in range(z.shape[1]):
        rows = top[:, c]
        mu[c] = (x[rows] * z[rows, c].unsqueeze(1)).mean(dim=0)
    return mu / mu.norm(dim=-1, keepdim=True)


def transclip_batch(x: torch.Tensor, text: torch.Tensor, hp: dict[str, Any]) -> torch.Tensor:
    b, d = x.shape
    y_hat = zero_shot(x, text, hp["logit_scale"])
    if b == 1:
        return y_hat
    z = y_hat.clone()
    mu = confident_init(x, z) if hp["mu_init"] == "confident" else text.clone()
    var = torch.ones(d, dtype=x.dtype) / d
    W = affinity_matrix(x, hp["n_neighbors"])
    for k in range(hp["max_iter"] + 1):
        loglik = log_likelihood(x, mu, var)
        z = update_z(loglik, y_hat, z, W, hp["lambda_y_hat"], hp["lambda_laplacian"], hp["n_neighbors"])
        if k == hp["max_iter"]:
            break
        means = class_means(x, z)
        mu = torch.where((z.sum(0) == 0).unsqueeze(1), mu, means)
        var = torch.einsum("ij,ijk->k", z, (x[:, None, :] - mu[None, :, :]) ** 2) / b
    return z


def run_batches(solver, features: torch.Tensor, text: torch.Tensor, hp: dict[str, Any],
                batch_size: int) -> torch.Tensor:
    """Posteriors [n, K] (float64) of consecutive batches of `batch_size`, each solved alone, the last as it is."""
    x, t = features.double(), text.double()
    return torch.cat([solver(x[s:s + batch_size], t, hp) for s in range(0, x.shape[0], batch_size)])
