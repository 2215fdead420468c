"""TransCLIP (Zanella et al., NeurIPS 2024), zero-shot, solved on each batch alone as StatA's online comparison
runs it (`MaxZanella/StatA` solvers/TransCLIP.py, main.py), and the batch solver StatA shares with it.

On a batch of b features x_i with text embeddings w_k (one per class; several per class are averaged and
renormalised, `prototypes.class_prototypes`; the official code has one template per dataset):

    y_hat = softmax(logit_scale * x w^T)                        zero-shot posteriors, z = y_hat
    W: each sample's n_neighbors nearest other samples (cosine, the first of the top n_neighbors + 1 dropped)
    repeat max_iter + 1 times:
        l_ik = -1/2 sum_d (x_id - mu_kd)^2 / sigma_(k)d           a diagonal Gaussian (no exp)
        5 times: z <- normalise(y_hat^lambda_y_hat * exp((l + c (W^T + W) z) / 50)),
                 c = lambda_laplacian 50 / (2 n_neighbors)
        (last round: stop here; z is the batch's posterior)
        mu_k <- normalise(sum_i z_ik x_i / sum_i z_ik)
        sigma_d <- sum_ik z_ik (x_id - mu_kd)^2 / b               one variance per dimension, shared by the classes

    mu starts at the text embeddings, sigma at 1 / d.

StatA (`orchestrator.methods.stata`) is the same solver with its statistical anchor: per-class variances that
start from the zero-shot spread, the -1/2 sum_d log sigma_kd term in the z update, and mu and sigma pulled
towards the text statistics with weight 1 - beta_k, beta_k = n_k / (alpha + n_k).

Each batch is solved on its own: no state crosses batches, so a run is order-free within the batching. No
lockstep runner: configs of one stream would share only the zero-shot logits and the kNN graph, a small part of
a solve whose iterations (the Gaussian terms over [b, K] from [b, d] x [d, K] products) are each config's own.

Code vs paper: the two official codes differ (below) and this module follows them; the TransCLIP paper's
equations were not compared line by line with them here. Where this module departs from the code:
- StatA's repository initialises TransCLIP's means at the text embeddings; TransCLIP's own repository
  (`MaxZanella/transduction-for-vlms`, TransCLIP_utils.init_mu) starts them at the zero-shot-weighted mean of
  each class's 8 most confident samples (and takes K from the labels present, which a label-free run cannot;
  here K is every class). `mu_init: text` (default) is StatA's solver, the one StatA's comparison (and its
  README's numbers on batches with few classes) ran; `mu_init: confident` is TransCLIP's own (a batch of
  b < 8 samples uses its b most confident).
- The official variance update divides the running sum by b once per chunk of 2500 samples (a slip that only
  acts on batches larger than 2500); this module takes the plain mean, the paper's equation.
- A batch of b <= n_neighbors samples has b - 1 neighbours per sample (the official `topk` fails there).
- A class whose responsibilities all underflow to 0 (sum_i z_ik = 0, the official divides 0 by 0 and the
  batch turns nan) keeps its mean (TransCLIP) or takes the text statistics (StatA: beta_k = 0 there). The
  class statistics are computed from the responsibilities divided by their class's mass, so a class whose mass
  is a float32 denormal (zero-shot posteriors of 1e-35 at logit scale 100 on well-separated classes) gives
  bounded statistics where the official's underflowed sums divided by the mass turn inf, then nan.
- TransCLIP on a batch of one sample keeps its zero-shot posterior: every class mean becomes the sample
  itself, so sigma = 0 and the official code divides 0 by 0; the limit is a likelihood equal across classes.
- The z update y_hat^lambda exp(u / 50), normalised, is taken as softmax(lambda log y_hat + u / 50): the same
  numbers, but the official product turns 0 / 0 (nan) where float32 underflows both factors of every class
  (zero-shot posteriors below 1e-38 against Gaussian terms 4000 apart), and the log form does not.
- The Gaussian terms are expanded (x^2 / sigma - 2 x mu / sigma + mu^2 / sigma) rather than broadcast over
  [b, K, d], in float32; `reference.py` is the broadcast transcription in float64.

Trace: `selected` -1 and `gated` False (no gate); no state (nothing crosses batches).
"""

from __future__ import annotations

from typing import Any

import torch

from orchestrator.methods.base import StageTimer, TextBatchMethod

INNER_STEPS = 5  # the official update_z's max_iter
TEMPERATURE = 50.0  # the official z update's 1 / 50 (and its Laplacian weight's 50)
CONFIDENT = 8  # transduction-for-vlms init_mu's n_most_confident


def knn_graph(features: torch.Tensor, n_neighbors: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The official sparse affinity W as (columns [b, k], values [b, k]), W[i, columns[i, j]] = values[i, j]:
    the top k + 1 inner products of each row with the batch, the first (the sample itself) dropped;
    k = min(n_neighbors, b - 1)."""
    k = min(n_neighbors, features.shape[0] - 1)
    affinity = features @ features.T
    columns = affinity.topk(k + 1, dim=1).indices[:, 1:]
    return columns, affinity.gather(1, columns)


def neighbour_sum(columns: torch.Tensor, values: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """(W^T + W) z for the kNN affinity (W z gathers each row's neighbours, W^T z scatters them back)."""
    weighted = values.unsqueeze(-1) * z[columns]  # [b, k, K]: W[i, j] z_j
    wz = weighted.sum(1)
    scattered = (values.unsqueeze(-1) * z.unsqueeze(1)).flatten(0, 1)  # W[i, j] z_i, summed into row j
    wtz = torch.zeros_like(z).index_add_(0, columns.flatten(), scattered)
    return wtz + wz


def gaussian_log_likelihood(x: torch.Tensor, mu: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """-1/2 sum_d (x_id - mu_kd)^2 / var_(k)d, [b, K]; var is [K, d] or [d] (shared)."""
    inv = (1.0 / var).expand_as(mu)
    quad = (x * x) @ inv.T - 2.0 * (x @ (mu * inv).T) + (mu * mu * inv).sum(1)
    return -0.5 * quad


def weighted_sq_dev(x: torch.Tensor, z: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """sum_i z_ik (x_id - mu_kd)^2, [K, d]."""
    zx = z.T @ x
    return z.T @ (x * x) - 2.0 * mu * zx + mu * mu * z.sum(0).unsqueeze(1)


def solve_batch(x: torch.Tensor, text: torch.Tensor, hp: dict[str, Any], anchor: bool,
                timer: StageTimer) -> torch.Tensor:
    """The batch's posteriors z [b, K]: TransCLIP (anchor False) or StatA (anchor True), as the module says."""
    b, d = x.shape
    with timer("logits"):
        log_y_hat = torch.log_softmax(hp["logit_scale"] * (x @ text.T), dim=1)
        y_hat = log_y_hat.exp()
    if not anchor and b == 1:
        return y_hat
    with timer("update"):
        log_prior = hp["lambda_y_hat"] * log_y_hat
        columns, values = knn_graph(x, hp["n_neighbors"])
        lap = hp["lambda_laplacian"] * TEMPERATURE / (2 * hp["n_neighbors"])
        mu = confident_means(x, y_hat) if not anchor and hp["mu_init"] == "confident" else text
        if anchor:
            var0 = weighted_sq_dev(x, y_hat, text).sum(0) / b  # the zero-shot spread, one value per dimension
            var = var0.expand_as(text)
        else:
            var = torch.full((d,), 1.0 / d, dtype=x.dtype, device=x.device)
        z = y_hat
        for step in range(hp["max_iter"] + 1):
            loglik = gaussian_log_likelihood(x, mu, var)
            if anchor:
                loglik = loglik - 0.5 * var.log().sum(1)
            for _ in range(INNER_STEPS):
                z = torch.softmax(log_prior + (loglik + lap * neighbour_sum(columns, values, z)) / TEMPERATURE, dim=1)
            if step == hp["max_iter"]:
                break
            mass = z.sum(0)
            empty = (mass == 0).unsqueeze(1)
            # responsibilities normalised per class before the products: a class holding a denormal mass would
            # otherwise divide underflowed products by it (inf, then 0 * inf = nan through StatA's beta)
            share = z / torch.where(empty.T, 1.0, mass)
            means = share.T @ x
            means = torch.where(empty, 0.0, means / means.norm(dim=1, keepdim=True))
            if anchor:
                beta = anchor_weights(z, hp["alpha"], hp["soft_beta"]).unsqueeze(1)
                mu = beta * means + (1 - beta) * text
                mu = mu / mu.norm(dim=1, keepdim=True)
                var = beta * weighted_sq_dev(x, share, mu) + (1 - beta) * (var0 + (text - mu) ** 2)
            else:
                mu = torch.where(empty, mu, means)
                var = weighted_sq_dev(x, z, mu).sum(0) / b
    return z


def confident_means(x: torch.Tensor, y_hat: torch.Tensor) -> torch.Tensor:
    """TransCLIP's own init_mu: each class's mean of its CONFIDENT most confident samples, weighted by their
    zero-shot posterior, renormalised (the batch's min(CONFIDENT, b) when it holds fewer)."""
    top = y_hat.topk(min(CONFIDENT, x.shape[0]), dim=0)  # [k, K]
    means = torch.einsum("jc,jcd->cd", top.values, x[top.indices])
    return means / means.norm(dim=1, keepdim=True)


def anchor_weights(z: torch.Tensor, alpha: float, soft: bool) -> torch.Tensor:
    """StatA's beta_k = n_k / (alpha + n_k): n_k the soft mass sum_i z_ik, or (official default) the count of
    samples predicted k, with the official 1e-12 in the denominator."""
    if soft:  # a class without mass: 0 (the official 0 / 0 at alpha = 0)
        mass = z.sum(0)
        return torch.where(mass > 0, mass / (alpha + mass), 0.0)
    counts = torch.bincount(z.argmax(dim=1), minlength=z.shape[1]).to(z.dtype)
    return counts / (alpha + counts + 1e-12)


class TransductiveBatch(TextBatchMethod):
    """TransCLIP's batch solver (`solve_batch`), with StatA's anchor where `anchor` is set."""

    anchor: bool

    def solve(self, features: torch.Tensor, timer: StageTimer) -> torch.Tensor:
        return solve_batch(features, self.text, self.hp, self.anchor, timer)


class TransCLIP(TransductiveBatch):
    name = "transclip"
    anchor = False
