"""DOTA (Han et al., NeurIPS 2025): distributional test-time adaptation, ONLINE, as `skylineeeeen/DOTA`
dota.py runs it (methods-spec.md section 4): per-class Gaussian means and covariances estimated from the
zero-shot soft labels, scored through one shared precision.

State (one model for the whole stream, never reset): mu [K, d] = 0.001 everywhere; counts c [K] = 1;
Sigma_k = sigma I for every class; the shared precision Lambda = (mean_k Sigma_k)^-1 = I / sigma (no
epsilon at initialisation). Per sample with views F [V, d] (view 0 the original) and L = s F T^T:

1. keep the int(V * keep) views with the lowest softmax entropy (at least one; ties to the lower view index):
   X [b, d], l = their mean logits, P = softmax of each kept view's logits [b, K] (not averaged);
2. xbar = mean of X (not renormalised);
3. g_k = xbar^T Lambda mu_k - 0.5 mu_k^T Lambda mu_k;  w = min(rho * mean(c) / b, eta);
4. logits = l + w g; the posterior is softmax(logits) (the official returns the logits: same argmax);
5. then update, with s_k = sum_b P_bk and the OLD mu_k:
   mu_k <- (sum_b P_bk X_b + c_k mu_k) / (c_k + s_k),
   Sigma_k <- (c_k Sigma_k + sum_b P_bk (X_b - mu_k)(X_b - mu_k)^T) / (c_k + s_k),  c_k <- c_k + s_k,
   Lambda <- ((1 - epsilon) mean_k Sigma_k + epsilon I)^-1.

How the state is held. Sigma is kept as the scatter S_k = c_k Sigma_k (= sigma I plus the weighted
scatters so far), which turns step 5 into one in-place rank-b addition per class (an elementwise pass for
one view, a batched matmul for several; no [K, d, d] temporary and no rescaling pass), and mean_k Sigma_k
into one weighted reduction sum_k S_k / c_k.
Sigma_k = S_k / c_k is what the trace reports. The memory is the K covariance matrices, K d^2 float32:
K = 1000, d = 512: 262M floats = 1.05 GB (plus 1.05 GB for the trace's Sigma copy at the end of a run);
K = 1000, d = 768: 590M floats = 2.36 GB (plus the same again for the copy). The official code holds the
same K d^2 in fp32 and materialises further [K, d, d] temporaries (its scatter `delta`, the rescaled
Sigma) on every sample.

The shared precision. The change of mean_k Sigma_k per sample is NOT low rank: every class with s_k > 0
(with soft labels, every class) has its Sigma_k rescaled by c_k / (c_k + s_k), a full-rank change
-(s_k / c_k') Sigma_k per class, so no exact Sherman-Morrison / Woodbury update of Lambda exists for the
official rule (the scatter additions alone are rank b per class, but K of them plus the rescaling make
the sum full rank). Instead Lambda is never formed: the state keeps the Cholesky factor R of
Lambda^-1 = R R^T (d^3 / 3 per sample instead of an inverse's ~2 d^3), and step 3 uses triangular solves,
Y = R^-1 mu^T, z = R^-1 xbar, g = z^T Y - 0.5 |Y_k|^2. This is exact (tests check it against the plain
inverse); per sample the work is dominated by the K d^2 passes over the covariances in any case.

Differences from the official code, all deliberate: float32 throughout (the official casts Lambda and mu to
fp16 in `predict`); the posterior is softmax of the official logits; for 1 < V < 10 the official keeps no
view and produces NaN, here at least one view is kept (V = 1 is the official single-view path); several
class embeddings per class (M > K) are averaged and renormalised (`prototypes.py`), which is how the
official `clip_classifier` builds its one embedding per class from the templates. Versions and paper: HEAD
initialises mu to 0.001 while the first commit (da08fd9) used the text embeddings; the README speaks of
posteriors by Bayes' theorem, while the code's score has no class log-prior (equal priors) and mixes it
with the CLIP logits by the weight w. This module follows HEAD's code throughout.

Trace: `selected` -1, `gated` False (no gate). State: 'mu' [K, d], 'sigma' [K, d, d], 'counts' [K],
'precision' [d, d] (Lambda). Hyperparameters and the official per-dataset configs are on the registry card
(`orchestrator.registry.cards`); the official protocol takes 64 AugMix views on ImageNet-A/-V2/-R/-Sketch
and the single original view on ImageNet and the ten cross-domain sets.
"""

from __future__ import annotations

from typing import Any

import torch

from orchestrator.methods.base import Method, StageTimer, Trace, empty_trace
from orchestrator.methods.prototypes import class_prototypes
from orchestrator.methods.views import lowest_entropy_views


class DOTA(Method):
    """Online per-class Gaussians (means, covariances) from soft zero-shot labels, one shared precision."""

    name = "dota"

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        K, d, device = num_classes, class_embeddings.shape[1], class_embeddings.device
        self.text = class_prototypes(class_embeddings, class_ids, num_classes)
        self.mu = torch.full((K, d), 0.001, dtype=torch.float32, device=device)
        self.counts = torch.ones(K, dtype=torch.float32, device=device)
        self.eye = torch.eye(d, dtype=torch.float32, device=device)
        self.scatter = (hparams["sigma"] * self.eye).repeat(K, 1, 1)     # one [K, d, d] allocation
        self.factor = hparams["sigma"] ** 0.5 * self.eye                  # Lambda^-1 = sigma I (no epsilon)

    def gaussian_scores(self, xbar: torch.Tensor) -> torch.Tensor:
        """g_k = xbar^T Lambda mu_k - 0.5 mu_k^T Lambda mu_k [K], with Lambda from the Cholesky factor."""
        solved = torch.linalg.solve_triangular(self.factor, torch.cat([xbar[:, None], self.mu.T], dim=1),
                                               upper=False)
        z, Y = solved[:, 0], solved[:, 1:]
        return z @ Y - 0.5 * (Y * Y).sum(dim=0)

    def _update(self, X: torch.Tensor, P: torch.Tensor) -> None:
        """Step 5 for kept views X [b, d] with soft labels P [b, K]."""
        hp = self.hp
        diff = X[None] - self.mu[:, None]                                  # [K, b, d], the OLD means
        weighted = diff * P.T[:, :, None]
        if X.shape[0] == 1:     # one outer product per class: an elementwise pass beats a batched matmul
            self.scatter.addcmul_(weighted.transpose(1, 2), diff)
        else:
            self.scatter.baddbmm_(weighted.transpose(1, 2), diff)
        mass = P.sum(dim=0)
        self.mu = (P.T @ X + self.counts[:, None] * self.mu) / (self.counts + mass)[:, None]
        self.counts = self.counts + mass
        mean_sigma = (1.0 / self.counts) @ self.scatter.flatten(1)
        mean_sigma = mean_sigma.view_as(self.eye) / self.num_classes
        self.factor = torch.linalg.cholesky((1.0 - hp["epsilon"]) * mean_sigma + hp["epsilon"] * self.eye)

    def _run(self, features: torch.Tensor) -> Trace:
        hp, K = self.hp, self.num_classes
        n = features.shape[0]
        posteriors, selected, gated, gated_prior = empty_trace(n, K, features.device)
        timer = StageTimer()
        for i in range(n):
            with timer("logits"):
                logits = hp["logit_scale"] * (features[i] @ self.text.T)         # [V, K]
                kept = lowest_entropy_views(torch.softmax(logits, dim=1)[None], hp["keep"])[0]
                X, L = features[i, kept], logits[kept]
                g = self.gaussian_scores(X.mean(dim=0))
            with timer("posterior"):
                weight = min(hp["rho"] * float(self.counts.mean()) / X.shape[0], hp["eta"])
                posteriors[i] = torch.softmax(L.mean(dim=0) + weight * g, dim=0)
            with timer("update"):
                self._update(X, torch.softmax(L, dim=1))
        state = {"mu": self.mu.clone(), "sigma": self.scatter / self.counts[:, None, None],
                 "counts": self.counts.clone(), "precision": torch.cholesky_inverse(self.factor)}
        return Trace(posteriors, selected, gated, gated_prior, state=state, timings=timer.seconds)
