"""OnZeta (Qian & Hu, ECCV 2024): online label learning (a dual variable on class proportions) plus online
proxy learning (vision-space class proxies), single view, as `idstcv/OnZeta` main_online.py runs it.

State: proxies W [K, d] (rows; the official holds the transpose), initialised to the text embeddings T;
rho [K] = 0; the step counter i (global over `run` calls). Per sample x, with N = n_total:

1. lr = cw / sqrt(i+1), rlr = cr / sqrt(i+1), b = beta * sqrt((i+1) / N);
2. q = softmax(T x / tau_t + rho)                      (the text label, rho from before this sample);
3. rho <- max(0, rho - rlr * (q - alpha / K));
4. p = softmax(W x / tau_i)                            (the vision label, W from before this sample);
5. posterior = b p + (1 - b) q                         (the official `combo_label`; rows sum to 1);
6. W <- W - (lr / tau_i) (p - q) x^T, then each row renormalised.

Differences from the official code, all deliberate:
- q is computed as softmax(T x / tau_t + rho) instead of softmax(T x / tau_t) * exp(rho) renormalised:
  equal in exact arithmetic, but the official exp(rho) overflows in float32 once a starved class's rho
  passes 88, where this form stays finite.
- The official shuffles the stream itself (torch.randperm, 5 repeats, mean accuracy); here the stream
  arrives in the order given, once (the sweep owns the order and the seeds).
- Several class embeddings per class (M > K) are averaged per class and renormalised (`prototypes.py`),
  which is exactly how the official builds T from its 7 templates.
- b depends on the stream length N, so N must be known in advance: `n_total` sets it; when None, the first
  `run` call's length is taken as the whole stream, and a later call that runs past N raises a ValueError
  (running a stream in parts needs n_total).
Paper vs code: the spec was written from the code; this module follows the code. The official repository
ships ImageNet only, so the same hyperparameters serve every dataset (no per-dataset configs exist).
The step (cw / tau_i)(p - q) is sized for K ~ 1000: at K ~ 20 the proxies jump and float32 and float64
runs of the same loop can disagree on a few percent of predictions; at K >= 100 they agree.

Trace: `selected` -1 and `gated` False (no gate); state 'W' [K, d], 'rho' [K], 'step' (samples seen).
Hyperparameters are on its registry card (`card.py` in this folder).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from orchestrator.methods.base import Method, StageTimer, Trace, empty_trace
from orchestrator.methods.prototypes import class_prototypes


class OnZeta(Method):
    """Online label learning (rho) and online proxy learning (W), mixed by a weight that grows to beta."""

    name = "onzeta"

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        self.text = class_prototypes(class_embeddings, class_ids, num_classes)
        self.W = self.text.clone()
        self.rho = torch.zeros(num_classes, dtype=torch.float32, device=class_embeddings.device)
        self.step = 0
        self.n_total = hparams["n_total"]

    def claim(self, n: int) -> None:
        """Check that n more samples fit the stream length N (the first call sets N when n_total is None)."""
        if self.n_total is None and n > 0:
            self.n_total = n                   # no sample seen yet: this call is taken as the whole stream
        if n > 0 and self.step + n > self.n_total:
            raise ValueError(f"{self.name}: the stream runs past n_total = {self.n_total} samples (this call would "
                             f"reach {self.step + n}); hparam 'n_total' must be the whole stream's length, "
                             f"which OnZeta's mixing weight needs in advance")

    def _run(self, features: torch.Tensor) -> Trace:
        hp, K = self.hp, self.num_classes
        n = features.shape[0]
        self.claim(n)
        posteriors, selected, gated, gated_prior = empty_trace(n, K, features.device)
        timer = StageTimer()
        target = hp["alpha"] / K
        with timer("logits"):
            text_logits = (features @ self.text.T) / hp["tau_t"]       # T is fixed: one product per call
        for j in range(n):
            x = features[j]
            i = self.step + 1
            lr, rlr = hp["cw"] / math.sqrt(i), hp["cr"] / math.sqrt(i)
            b = hp["beta"] * math.sqrt(i / self.n_total)
            with timer("logits"):
                q = torch.softmax(text_logits[j] + self.rho, dim=0)
                p = torch.softmax((self.W @ x) / hp["tau_i"], dim=0)
            with timer("posterior"):
                torch.add(q, p - q, alpha=b, out=posteriors[j])
            with timer("update"):
                self.rho.sub_(q - target, alpha=rlr).clamp_(min=0.0)
                self.W.addr_(p - q, x, alpha=-lr / hp["tau_i"])
                self.W.div_(torch.linalg.vector_norm(self.W, dim=1, keepdim=True).clamp_(min=1e-12))
            self.step = i
        state = {"W": self.W.clone(), "rho": self.rho.clone(), "step": torch.tensor(self.step)}
        return Trace(posteriors, selected, gated, gated_prior, state=state, timings=timer.seconds)
