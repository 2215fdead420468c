"""FreeTTA's online EM (Dai & Yang, CVPR 2025) transcribed per sample from the paper's equations as
`orchestrator.methods.freetta.method` states them, in float64 with an explicit matrix inverse and plain loops over
the classes: the reference that tests/test_freetta.py holds `freetta` to. Nothing here is fast.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def paper_freetta(features: torch.Tensor, class_embeddings: torch.Tensor, hp: dict,
                  dtype: torch.dtype = torch.float64):
    """Features [n, d], one embedding per class [K, d]. Returns (posteriors [n, K], pseudo-labels, EM weights, the
    smallest and largest eigenvalues the covariance took along the stream, which bound float32's drift)."""
    x_all = features.to(dtype)
    T = F.normalize(class_embeddings.to(dtype), dim=1)
    K, d = T.shape
    mu = [T[k].clone() for k in range(K)]
    N = [1.0 / K] * K
    t = 1.0
    S = torch.eye(d, dtype=dtype)
    posts, preds, weights = [], [], []
    low, high = 1.0, 1.0
    for x in x_all:
        z = hp["logit_scale"] * (T @ x)
        p = torch.softmax(z, 0)
        H = -sum(float(p[k]) * math.log(float(p[k])) for k in range(K) if float(p[k]) > 0)
        w = math.exp(-hp["beta"] * H)
        P = torch.linalg.inv(S)
        g = torch.stack([x @ P @ mu[k] - 0.5 * mu[k] @ P @ mu[k] + math.log(N[k] / t) for k in range(K)])
        gamma = torch.softmax(z + hp["alpha"] * g, 0)
        for k in range(K):
            N_new = N[k] + w * float(gamma[k])
            mu[k] = (N[k] * mu[k] + w * float(gamma[k]) * x) / N_new
            N[k] = N_new
        scatter = sum(float(gamma[k]) * torch.outer(x - mu[k], x - mu[k]) for k in range(K))
        S = (t * S + w * scatter) / (t + w)
        t = t + w
        eig = torch.linalg.eigvalsh(S)
        low, high = min(low, float(eig[0])), max(high, float(eig[-1]))
        posts.append(gamma)
        preds.append(int(gamma.argmax()))
        weights.append(w)
    return torch.stack(posts), preds, weights, (low, high)
