"""A plain per-batch transcription of the official StatA solver (`MaxZanella/StatA` solvers/StatA.py), in float64,
for the tests; the shared pieces (affinity, Gaussian, z update) are TransCLIP's reference, as the official files
share them. Departures as `transclip/method.py` lists (neighbours capped at b - 1, plain-mean variances, a class
with zero mass at its text statistics)."""

from __future__ import annotations

from typing import Any

import torch

from orchestrator.methods.transclip.reference import (affinity_matrix, class_means, log_likelihood, update_z,
                                                      zero_shot)


def update_beta(z: torch.Tensor, alpha: float, soft: bool) -> torch.Tensor:
    if soft:
        sum_z = z.sum(dim=0)
        return torch.where(sum_z > 0, sum_z / (alpha + sum_z), 0.0)  # the departure: 0 where the official has 0 / 0
    sum_z = torch.bincount(z.argmax(dim=1), minlength=z.shape[1]).to(z.dtype)
    return sum_z / (alpha + sum_z + 1e-12)


def stata_batch(x: torch.Tensor, text: torch.Tensor, hp: dict[str, Any]) -> torch.Tensor:
    b, _ = x.shape
    y_hat = zero_shot(x, text, hp["logit_scale"])
    z = y_hat.clone()
    mu = text.clone()
    # init_cov: the zero-shot spread, one value per dimension, every class alike
    init_var = torch.einsum("ij,ijk->k", z, (x[:, None, :] - text[None, :, :]) ** 2) / b
    var = init_var.unsqueeze(0).repeat(text.shape[0], 1)
    W = affinity_matrix(x, hp["n_neighbors"])
    for k in range(hp["max_iter"] + 1):
        loglik = log_likelihood(x, mu, var)
        z = update_z(loglik, y_hat, z, W, hp["lambda_y_hat"], hp["lambda_laplacian"], hp["n_neighbors"],
                     log_det=var.log().sum(dim=1))
        if k == hp["max_iter"]:
            break
        beta = update_beta(z, hp["alpha"], hp["soft_beta"]).unsqueeze(-1)
        empty = (z.sum(0) == 0).unsqueeze(1)
        means = torch.where(empty, 0.0, class_means(x, z))
        mu = beta * means + (1 - beta) * text
        mu = mu / mu.norm(dim=-1, keepdim=True)
        spread = ((x[:, None, :] - mu[None, :, :]) ** 2 * z[:, :, None]).sum(dim=0) / z.sum(dim=0)[:, None]
        spread = torch.where(empty, 0.0, spread)
        var = beta * spread + (1 - beta) * (init_var + (text - mu) ** 2)
    return z
