"""OGA (Fuchs, Zanella, De Vleeschouwer, CVPR 2025 workshop), `cfuchs2023/OGA` OGA/OGA_core.py and runner.py.

Each batch first updates the model, then is predicted with it (runner.py: `update_memory` on the batch, then
`get_log_probs` and `get_MAP`):

1. Zero-shot: p = softmax(logit_scale * f U^T) over the class prototypes, its entropy H = -sum p log(p + 1e-9)
   and pseudo-label c = argmax p.
2. Memory, sample by sample in batch order: class c keeps `shot_capacity` slots, each with the entropy of the
   sample it holds (log K while empty); if H is below the largest of them, the sample replaces that slot (the
   first such slot on ties).
3. If any sample entered the memory: each class with at least 2 stored samples takes as mean the sum of its
   stored features divided by `shot_capacity` (the official code averages over all slots, empty ones as zeros,
   not over the stored ones; followed as written); once a class holds more than 2, the shared covariance is
   refitted: the stored features minus their class's mean, centred, M = C^T C / (n - 1), and its inverse
   d * pinv((n - 1) M + tr(M) I) (ridge, while n <= 4d for the default estimator) or pinv(M).
4. Prediction: the Gaussian log-likelihoods l_k = f S^-1 mu_k - mu_k S^-1 mu_k / 2 - f S^-1 f / 2, and the MAP
   posterior z proportional to p * softmax(tau * l) (get_MAP with simplex_p=True, lambda 1).

Trace: selected = the pseudo-label whose memory took the sample (-1: none), gated = it entered the memory,
gated_prior always False. State: 'mus' [K, d], 'inv_sigma' [d, d], 'memory_filled' [K, S], 'memory_entropy'
[K, S].

Precision: the official memory, memory entropies and soft labels are float16 and its zero-shot logits float64.
Here everything is float32 by default (the project's rule), so a sample whose entropy lies between a stored
entropy and that entropy's float16 value below it is kept here where the official code drops it.
`state_dtype: float16` keeps the memory and its entropies in float16 as the official code does: the empty
slots start at float16(log K), a sample is compared with the stored float16 values and its entropy stored
rounded, and a class's mean is the float16 mean of its float16 slots (float32 sum, one rounding, as a GPU takes
a half mean), read as float32; the zero-shot logits and entropies stay float32, the covariance and the
prediction float32 (as the official code's). tests/test_oga.py holds it to a float16 transcription
(`reference.py`) on a stream built so that a sample's entropy falls in that gap.
The class prototypes are the mean of a class's prompt embeddings, renormalised (the official `clip_prototypes`).
The soft labels the official memory stores are read only by an estimator option its runner never turns on, so
they are not kept.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from orchestrator.methods.base import BatchMethod, StageTimer, Trace, empty_trace
from orchestrator.methods.prototypes import class_prototypes

ENTROPY_EPS = 1e-9  # runner.py's zero-shot entropy


def zero_shot(features: torch.Tensor, prototypes: torch.Tensor, logit_scale: float
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Zero-shot probabilities [b, K], their entropies [b] and pseudo-labels [b] (runner.py)."""
    probs = torch.softmax(logit_scale * features @ prototypes.T, dim=1)
    entropy = -(torch.log(probs + ENTROPY_EPS) * probs).sum(dim=1)
    return probs, entropy, probs.argmax(dim=1)


def inverse_covariance(centred: torch.Tensor, estimator: str) -> torch.Tensor:
    """The shared inverse covariance from the stored features minus their class means [n, d] (__update_sigma)."""
    n, d = centred.shape
    c = centred - centred.mean(dim=0, keepdim=True)
    m = c.T @ c / (n - 1)
    if estimator == "moore_penrose" or (estimator == "ridge_moore_penrose" and n > 4 * d):
        return torch.linalg.pinv(m)
    eye = torch.eye(d, dtype=m.dtype, device=m.device)
    return d * torch.linalg.pinv((n - 1) * m + torch.trace(m) * eye)


def map_posterior(features: torch.Tensor, zs_probs: torch.Tensor, mus: torch.Tensor, inv_sigma: torch.Tensor,
                  tau: float) -> torch.Tensor:
    """z proportional to zs_probs * softmax(tau * Gaussian log-likelihoods) (get_log_probs, get_MAP)."""
    a = mus @ inv_sigma
    log_probs = features @ a.T - (a * mus).sum(dim=1) / 2 - ((features @ inv_sigma) * features).sum(dim=1,
                                                                                                   keepdim=True) / 2
    z = zs_probs * torch.softmax(tau * log_probs, dim=1)
    return z / z.sum(dim=1, keepdim=True)


class OGA(BatchMethod):
    name = "oga"

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        k, d, s = num_classes, class_embeddings.shape[1], self.hp["shot_capacity"]
        device = class_embeddings.device
        dtype = torch.float16 if self.hp["state_dtype"] == "float16" else torch.float32
        self.prototypes = class_prototypes(class_embeddings, class_ids, num_classes)
        self.mus = self.prototypes.clone()
        self.inv_sigma = d * torch.eye(d, dtype=torch.float32, device=device)
        self.memory = torch.zeros(k, s, d, dtype=dtype, device=device)
        self.filled = torch.zeros(k, s, dtype=torch.bool, device=device)
        self.memory_entropy = torch.full((k, s), math.log(k), dtype=dtype, device=device)

    def _store(self, features: torch.Tensor, entropy: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Step 2 over the batch in order; returns which samples entered the memory [b] bool. The decisions run on
        host copies (a few scalars per sample); the features are written once, the last writer of a slot winning."""
        held = self.memory_entropy.cpu()
        ent, lab = entropy.cpu(), labels.tolist()
        stored = torch.zeros(len(lab), dtype=torch.bool)
        writes: dict[tuple[int, int], int] = {}
        for j, c in enumerate(lab):
            slot = int(held[c].argmax())
            if ent[j] < held[c, slot]:
                held[c, slot] = ent[j]
                writes[(c, slot)] = j
                stored[j] = True
        if writes:
            (cs, slots), rows = zip(*writes), list(writes.values())
            cs, slots = torch.tensor(cs, device=features.device), torch.tensor(slots, device=features.device)
            self.memory[cs, slots] = features[torch.tensor(rows, device=features.device)].to(self.memory.dtype)
            self.filled[cs, slots] = True
            self.memory_entropy.copy_(held)
        return stored.to(features.device)

    def _refit(self) -> None:
        """Step 3: the means of classes with >= 2 stored samples, then the covariance once one class holds > 2."""
        counts = self.filled.sum(dim=1)
        # float16: the mean of the float16 slots rounded once (a no-op in float32)
        means = (self.filled[..., None] * self.memory.float()).mean(dim=1).to(self.memory.dtype).float()
        mask = counts >= 2
        self.mus[mask] = means[mask]
        if self.hp["normalize_mu"]:
            self.mus[mask] = torch.nn.functional.normalize(self.mus[mask], dim=1)
        if bool((counts > 2).any()):
            owners = torch.arange(self.num_classes, device=counts.device).repeat_interleave(counts)
            centred = self.memory[self.filled] - self.mus[owners]
            self.inv_sigma = inverse_covariance(centred, self.hp["cov_estimator"])

    def _batch(self, features: torch.Tensor) -> Trace:
        b = features.shape[0]
        _, selected, _, gated_prior = empty_trace(b, self.num_classes, features.device)
        timer = StageTimer()
        with timer("logits"):
            probs, entropy, labels = zero_shot(features, self.prototypes, self.hp["logit_scale"])
        with timer("update"):
            stored = self._store(features, entropy, labels)
            if bool(stored.any()):
                self._refit()
        with timer("posterior"):
            posteriors = map_posterior(features, probs, self.mus, self.inv_sigma, self.hp["map_tau"])
        selected = torch.where(stored, labels, selected)
        return Trace(posteriors, selected, stored, gated_prior, state=self.state_tensors(), timings=timer.seconds)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"mus": self.mus.clone(), "inv_sigma": self.inv_sigma.clone(), "memory_filled": self.filled.clone(),
                "memory_entropy": self.memory_entropy.float()}    # a float16 memory's values exactly
