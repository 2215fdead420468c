"""ADAPT, online mode (Zhang et al., NeurIPS 2025, "Backpropagation-Free Test-Time Adaptation via Probabilistic
Gaussian Alignment"), as its official code runs it (AIM-SKKU/ADAPT@68481c0 ADAPT_online.py evaluation).

State: a knowledge bank of `bank_size` (L) slots per class, each holding a feature, its zero-shot probabilities and
loss; the class means mu [K, d] (start: the text prototypes T); the GDA classifier (W [d, K], b [K]) and the
similarities of the last bank update. Per sample with views X [V, d] (view 0 the original; s = logit_scale):

1. One view: f = x_0, z = s T f, h = entropy of p = softmax(z). Views (ImageNet's variants): TDA's confident views,
   f their mean feature (not renormalised), z their mean logits, h the entropy of their mean probability p.
   y = argmax z.
2. Bank of class y: fill its next free slot while it has one, else replace its slot of highest loss (the first
   such) when h is lower.
3. Only when the bank changed: mu_y = mean_alpha (sum_j p_j[y] v_j + p[y] f) / (sum_j p_j[y] + p[y]) +
   (1 - mean_alpha) T_y over the bank's entries j of class y (f, just entered, is counted twice, as the code
   does); the n entries of the bank, each centred on its class mean, give the covariance S (torch.cov: centred
   again on their mean, n - 1 in the denominator; S = I for n = 1) and the precision P = d pinv((n - 1) S +
   tr(S) I) (a ridge estimator); W = P mu^T, b_k = log(1/K) - mu_k P mu_k / 2; the similarities a_j = f . v_j
   and the bank logits B_j = p_j[label_j] e_{label_j} are kept.
4. g = log_softmax(f W + b) + fusion_scale / (2 M) sum_j a_j B_j (M: entries at the last update; a and B as
   last kept, so a sample that did not change the bank reuses the similarities of the one that last did);
   logits = z * exp((g - max g) / fusion_scale); posterior = softmax(logits).

Trace: selected = y, gated = the bank changed, gated_prior always False.

Where the code differs from the paper, this follows the code: the paper excludes the current sample from the
update, the code enters it into the bank first and counts it twice in its class mean, and reuses the last
update's similarities for samples that change nothing. The class means start from the text prototypes in
float32 where the official ones are the float16 text encoder's. The views' selection is stable (the official
topk leaves ties unspecified) and keeps at least one view. The precision's pinv is of a symmetric positive
(semi)definite matrix, computed by its eigendecomposition (`hermitian=True`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from orchestrator.methods.base import Method, StageTimer, Trace
from orchestrator.methods.prototypes import class_prototypes, confident_views, mean_prob_entropy


class ADAPT(Method):
    """Online ADAPT: knowledge banks, Gaussian means and a shared ridge covariance, fused with CLIP."""

    name = "adapt"

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        d, device, K, L = class_embeddings.shape[1], class_embeddings.device, num_classes, hparams["bank_size"]
        self.text = class_prototypes(class_embeddings, class_ids, num_classes)
        self.means = self.text.clone()
        self.bank_keys = torch.zeros(K * L, d, dtype=torch.float32, device=device)
        self.bank_labels = torch.full((K * L,), -1, dtype=torch.int64, device=device)
        self.bank_probs = torch.zeros(K * L, K, dtype=torch.float32, device=device)
        self.bank_loss = torch.full((K * L,), math.inf, dtype=torch.float32, device=device)
        self.weights = torch.zeros(d, K, dtype=torch.float32, device=device)
        self.bias = torch.zeros(K, dtype=torch.float32, device=device)
        self.similarity = torch.zeros(K * L, dtype=torch.float32, device=device)  # zero where empty

    def _offer(self, y: int, f: torch.Tensor, h: torch.Tensor, p: torch.Tensor) -> bool:
        """update_knowledge_banks for class y."""
        L = self.hp["bank_size"]
        slots = slice(y * L, (y + 1) * L)
        filled = int((self.bank_labels[slots] == y).sum())
        if filled < L:
            slot = y * L + filled
        else:
            worst = self.bank_loss[slots].max(0)
            if not bool(h < worst.values):
                return False
            slot = y * L + int(worst.indices)
        self.bank_keys[slot], self.bank_labels[slot], self.bank_probs[slot], self.bank_loss[slot] = f, y, p, h
        return True

    def _estimate(self, y: int, f: torch.Tensor, p: torch.Tensor) -> None:
        """param_estimation after the bank of class y took (f, p)."""
        hp, K = self.hp, self.num_classes
        valid = self.bank_labels >= 0
        keys, labels = self.bank_keys[valid], self.bank_labels[valid]
        mine = labels == y
        weights = self.bank_probs[valid][mine, y]
        mean = ((weights[:, None] * keys[mine]).sum(0) + p[y] * f) / (weights.sum() + p[y])
        self.means[y] = hp["mean_alpha"] * mean + (1.0 - hp["mean_alpha"]) * self.text[y]
        centred = keys - self.means[labels]  # the official code stacks them class by class: the covariance is a sum
        n, d = centred.shape
        cov = torch.eye(d, dtype=keys.dtype, device=keys.device) if n == 1 else centred.T.cov()
        ridge = (n - 1) * cov + cov.trace() * torch.eye(d, dtype=keys.dtype, device=keys.device)
        precision = d * torch.linalg.pinv(ridge, hermitian=True)
        self.weights = (self.means @ precision).T
        self.bias = math.log(1.0 / K) - ((self.means @ precision) * self.means).sum(1) / 2
        self.similarity = torch.where(valid, self.bank_keys @ f, 0.0)

    def _step(self, views: torch.Tensor, timer: StageTimer) -> tuple[torch.Tensor, int, bool]:
        hp = self.hp
        with timer("logits"):
            logits = hp["logit_scale"] * views @ self.text.T
            if views.shape[0] > 1:
                idx = confident_views(logits, hp["keep"])
                f, z, h = views[idx].mean(0), logits[idx].mean(0), mean_prob_entropy(logits[idx])
                p = torch.softmax(logits[idx], 1).mean(0)
            else:
                f, z = views[0], logits[0]
                p = torch.softmax(z, 0)
                h = -(p * torch.log_softmax(z, 0)).sum()
            y = int(z.argmax())
        with timer("update"):
            changed = self._offer(y, f, h, p)
            if changed:
                self._estimate(y, f, p)
        with timer("posterior"):
            valid = self.bank_labels >= 0
            filled = int(valid.sum())
            bank = torch.zeros_like(self.bias).index_add_(
                0, self.bank_labels[valid], self.similarity[valid] * self.bank_probs[valid].gather(
                    1, self.bank_labels[valid][:, None])[:, 0])
            g = torch.log_softmax(f @ self.weights + self.bias, 0) + hp["fusion_scale"] / (2 * filled) * bank
            post = torch.softmax(z * torch.exp((g - g.max()) / hp["fusion_scale"]), 0)
        return post, y, changed

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"bank_keys": self.bank_keys.clone(), "bank_labels": self.bank_labels.clone(),
                "bank_probs": self.bank_probs.clone(), "bank_loss": self.bank_loss.clone(),
                "means": self.means.clone(), "weights": self.weights.clone(), "bias": self.bias.clone()}

    def _run(self, features: torch.Tensor) -> Trace:
        return self.run_steps(features)
