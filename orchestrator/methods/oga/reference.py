"""A plain per-batch transcription of OGA's official code (cfuchs2023/OGA OGA_core.py GaussAdapt, runner.py's
batch loop), for the tests to hold `method.OGA` to: one sample at a time through the memory, the class means and
covariance as its loops and einsums write them. state_dtype float16 keeps the memory and its entropies float16
as the official code does (its mean of the float16 slots taken as a GPU takes a half mean: float32 sum, one
rounding); float32 is the project's default."""

from __future__ import annotations

import math

import torch

from orchestrator.methods.prototypes import class_prototypes


def run_oga_reference(features: torch.Tensor, class_embeddings: torch.Tensor, class_ids: torch.Tensor,
                      num_classes: int, batch_size: int, map_tau: float = 0.05, shot_capacity: int = 8,
                      cov_estimator: str = "ridge_moore_penrose", normalize_mu: bool = False,
                      logit_scale: float = 100.0, state_dtype: str = "float32") -> tuple[torch.Tensor, torch.Tensor]:
    """(posteriors [n, K], stored [n] bool) over the stream, batch after batch."""
    protos = class_prototypes(class_embeddings, class_ids, num_classes)
    k, d = protos.shape
    dtype = torch.float16 if state_dtype == "float16" else torch.float32
    mus = protos.clone()
    inv_sig = d * torch.eye(d)
    memory = torch.zeros(k, shot_capacity, d, dtype=dtype)
    state = torch.zeros(k, shot_capacity, dtype=torch.bool)
    mem_entropy = math.log(k) * torch.ones(k, shot_capacity, dtype=dtype)
    posteriors, stored = [], []
    for start in range(0, features.shape[0], batch_size):
        x = features[start:start + batch_size]
        zs_probs = (logit_scale * x @ protos.T).softmax(-1)
        zs_entropy = -torch.sum(torch.log(zs_probs + 1e-9) * zs_probs, dim=-1)
        zs_labels = torch.argmax(zs_probs, dim=-1)
        # update_memory: __update_memory_entropy per sample
        updated, flags = False, []
        for j in range(x.shape[0]):
            c = int(zs_labels[j])
            up = bool(torch.any(zs_entropy[j] < mem_entropy[c, :]))
            if up:
                idx = torch.argmax(mem_entropy[c, :])
                memory[c, idx] = x[j].to(dtype)
                mem_entropy[c, idx] = zs_entropy[j].to(dtype)
                state[c, idx] = True
                updated = True
            flags.append(up)
        if updated:
            # __update_mu
            means = torch.mean(state[..., None] * memory.float(), dim=1).to(dtype).float()
            mask = torch.sum(state, dim=1) >= 2
            mus[mask, :] = means[mask, :]
            if normalize_mu:
                mus[mask, :] = mus[mask, :] / torch.linalg.norm(mus[mask, :], dim=-1, keepdim=True)
            # __update_sigma
            if torch.any(torch.sum(state, dim=-1) > 2):
                flat = memory.view(k * shot_capacity, d)
                flat_state = state.view(k * shot_capacity)
                owner = torch.tensor([c for c in range(k) for _ in range(shot_capacity)])
                center = torch.cat([flat[torch.logical_and(flat_state, owner == c)] - mus[c:c + 1, :]
                                    for c in range(k)])
                n = center.shape[0]
                cc = center - center.mean(dim=0)[None, :]
                m = cc.T @ cc / (n - 1)
                if cov_estimator == "moore_penrose" or (cov_estimator == "ridge_moore_penrose" and n > 4 * d):
                    inv_sig = torch.linalg.pinv(m)
                else:
                    trace = torch.sum(m[range(d), range(d)])
                    inv_sig = d * torch.linalg.pinv((n - 1) * m + trace * torch.eye(d))
        # get_log_probs, get_MAP(simplex_p=True)
        w = torch.einsum("nd,dc->cn", mus, inv_sig)
        b = -torch.einsum("nd,dc,nc->n", mus, inv_sig, mus) / 2
        q = -torch.einsum("nd,dc,nc->n", x, inv_sig, x) / 2
        log_probs = x @ w + b + q[:, None]
        z = zs_probs * (map_tau * log_probs).softmax(-1)
        posteriors.append(z / torch.sum(z, dim=1, keepdim=True))
        stored.append(torch.tensor(flags))
    return torch.cat(posteriors), torch.cat(stored)
