"""DOTA (Han et al., NeurIPS 2025): distributional test-time adaptation, ONLINE, as `skylineeeeen/DOTA`
dota.py runs it: per-class Gaussian means and covariances estimated from the
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

How the state is held. Sigma_k is kept as the data scatter D_k = c_k Sigma_k - sigma I = the weighted
scatters so far (zero at the start: sigma I only adds to every class's scatter, so it is added where the
covariances are used, never held), which turns step 5 into one in-place rank-b addition per class (an
elementwise pass for one view, a batched matmul for several; no [K, d, d] temporary and no rescaling pass),
and mean_k Sigma_k into one weighted reduction plus a diagonal term, sum_k D_k / c_k / K + sigma mean_k(1 / c_k) I.
Keeping sigma out of D is what lets the lockstep runner (`lockstep.dota`) share one D between streams of
different sigma and still do this module's arithmetic, operation for operation. Sigma_k = (D_k + sigma I) / c_k
is what the trace reports. The memory is the K scatter matrices, K d^2 float32, allocated at the first `run`
(a pack builds its G method objects before running any):
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
(`card.py` in this folder); the official protocol takes 64 AugMix views on ImageNet-A/-V2/-R/-Sketch
and the single original view on ImageNet and the ten cross-domain sets.
"""

from __future__ import annotations

from typing import Any

import torch

from orchestrator.methods.base import Method, StageTimer, Trace, empty_trace
from orchestrator.methods.prototypes import class_prototypes
from orchestrator.methods.views import lowest_entropy_logit_views


def kept_views(views: torch.Tensor, text: torch.Tensor, logit_scale: float,
               keep: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1 for one sample's views [V, d]: the kept views X [b, d] and their logits [b, K]."""
    logits = logit_scale * (views @ text.T)
    kept = lowest_entropy_logit_views(logits[None], keep)[0]
    return views[kept], logits[kept]


def gaussian_scores(factor: torch.Tensor, xbar: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """g_k = xbar^T Lambda mu_k - 0.5 mu_k^T Lambda mu_k [K], with Lambda^-1 = R R^T from the Cholesky factor
    R [d, d]; factors [H, d, d] give the scores of H precisions at once [H, K]."""
    solved = torch.linalg.solve_triangular(factor, torch.cat([xbar[:, None], mu.T], dim=1), upper=False)
    z, Y = solved[..., 0], solved[..., 1:]
    return (z[..., None, :] @ Y)[..., 0, :] - 0.5 * (Y * Y).sum(dim=-2)


def fit(mu: torch.Tensor, counts: torch.Tensor, scatter: torch.Tensor, X: torch.Tensor,
        P: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 5's means and counts, and the data scatter [K, d, d] in place, for kept views X [b, d] with soft
    labels P [b, K]: (mu, counts) after the sample."""
    diff = X[None] - mu[:, None]                                       # [K, b, d], the OLD means
    weighted = diff * P.T[:, :, None]
    if X.shape[0] == 1:     # one outer product per class: an elementwise pass beats a batched matmul
        scatter.addcmul_(weighted.transpose(1, 2), diff)
    else:
        scatter.baddbmm_(weighted.transpose(1, 2), diff)
    mass = P.sum(dim=0)
    return (P.T @ X + counts[:, None] * mu) / (counts + mass)[:, None], counts + mass


def precision_factor(scatter: torch.Tensor, counts: torch.Tensor, eye: torch.Tensor, sigma: torch.Tensor,
                     epsilon: torch.Tensor) -> torch.Tensor:
    """The Cholesky factor R of Lambda^-1 = (1 - eps) mean_k Sigma_k + eps I, Sigma_k = (D_k + sigma I) / c_k.
    sigma, epsilon: float64 tensors, 0-dim for one factor [d, d] or [H, 1, 1] for H factors [H, d, d] of one
    scatter (the scalars are formed in float64 and rounded once, as Python floats meet a float32 tensor)."""
    inverse = 1.0 / counts
    mean_data = (inverse @ scatter.flatten(1)).view_as(eye) / counts.shape[0]
    retain = 1.0 - epsilon
    diagonal = (retain * sigma).float() * inverse.mean() + epsilon.float()
    return torch.linalg.cholesky(retain.float() * mean_data + diagonal * eye)


def covariances(scatter: torch.Tensor, counts: torch.Tensor, eye: torch.Tensor, sigma: float) -> torch.Tensor:
    """Sigma_k = (D_k + sigma I) / c_k [K, d, d], one new K d^2 tensor."""
    return torch.add(scatter, sigma * eye).div_(counts[:, None, None])


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
        self.scatter: torch.Tensor | None = None                           # D [K, d, d], from the first run
        self.sigma, self.epsilon = (torch.tensor(hparams[k], dtype=torch.float64, device=device)
                                    for k in ("sigma", "epsilon"))
        self.factor = self.sigma.sqrt().float() * self.eye                 # Lambda^-1 = sigma I (no epsilon)

    def _run(self, features: torch.Tensor) -> Trace:
        hp, K = self.hp, self.num_classes
        n = features.shape[0]
        posteriors, selected, gated, gated_prior = empty_trace(n, K, features.device)
        if self.scatter is None:
            self.scatter = torch.zeros(K, *self.eye.shape, dtype=torch.float32, device=features.device)
        timer = StageTimer()
        for i in range(n):
            with timer("logits"):
                X, L = kept_views(features[i], self.text, hp["logit_scale"], hp["keep"])
                g = gaussian_scores(self.factor, X.mean(dim=0), self.mu)
            with timer("posterior"):
                weight = min(hp["rho"] * float(self.counts.mean()) / X.shape[0], hp["eta"])
                posteriors[i] = torch.softmax(L.mean(dim=0) + weight * g, dim=0)
            with timer("update"):
                self.mu, self.counts = fit(self.mu, self.counts, self.scatter, X, torch.softmax(L, dim=1))
                self.factor = precision_factor(self.scatter, self.counts, self.eye, self.sigma, self.epsilon)
        state = {"mu": self.mu.clone(), "sigma": covariances(self.scatter, self.counts, self.eye, hp["sigma"]),
                 "counts": self.counts.clone(), "precision": torch.cholesky_inverse(self.factor)}
        return Trace(posteriors, selected, gated, gated_prior, state=state, timings=timer.seconds)
