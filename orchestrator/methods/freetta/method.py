"""FreeTTA (Dai & Yang, CVPR 2025, "Free on the Fly: Enhancing Flexibility in Test-Time Adaptation with Online EM",
arXiv 2507.06973), from the paper: no official code was found (GitHub, the code and issue indexes, the harnesses
that carry the field's methods), and the paper's method section was not at hand either (only its abstract): the
steps below are reconstructed from the abstract and the equations independent reimplementations quote, and are
unconfirmed until checked against the paper's Sec. 3. What the abstract states: Gaussian discriminant analysis
(GDA) of the test distribution, one Gaussian per class with a shared covariance, whose parameters an online EM
estimates sample by sample with CLIP's zero-shot prediction as the prior and each sample weighted by that
prediction's confidence.

State: the class means mu [K, d] (start: the text prototypes T), the class counts N [K] (start: 1/K each), the
total weight t (start: 1; the counts always sum to it) and the shared covariance S [d, d] (start: I). Per sample x
(s = logit_scale):

1. CLIP's prior: z = s T x, p = softmax(z), H = -sum p log p (nats); the sample's weight w = exp(-beta H).
2. GDA with the current parameters: with P = S^-1, g_k = x P mu_k - mu_k P mu_k / 2 + log(N_k / t).
3. E-step and prediction: the posterior gamma = softmax(z + alpha g), CLIP's prediction as the prior times the GDA
   likelihood to the power alpha.
4. M-step, the sample weighted by w: N' = N + w gamma, t' = t + w; mu'_k = (N_k mu_k + w gamma_k x) / N'_k;
   S' = (t S + w sum_k gamma_k (x - mu'_k)(x - mu'_k)^T) / t'.

Trace: selected = argmax gamma, gated always True (every sample updates, by its weight), gated_prior always False.

What the paper leaves open and this chooses: the posterior that drives the M-step is the fused one (step 3, the
zero-shot prior times the likelihood), not the GDA's alone; the covariance is the weighted average of the initial
I and the samples' scatter about the updated means, normalised by the total weight, so it stays positive definite
and the initial I fades as 1/t; the means are not renormalised. Reimplementations mention a trace-regularised
inverse, and the paper's alpha and beta were not at hand; the plain inverse is used and the defaults are not the
paper's (the card says why). S^-1 mu is solved through S's Cholesky factor in float32. Cost per sample: a
d x d Cholesky factorisation and K solves against it, and the K-term scatter (O(K d^2)).
"""

from __future__ import annotations

from typing import Any

import torch

from orchestrator.methods.base import Method, StageTimer, Trace
from orchestrator.methods.prototypes import class_prototypes


class FreeTTA(Method):
    """Online EM of Gaussian class statistics with CLIP's zero-shot prior."""

    name = "freetta"

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        d, device, K = class_embeddings.shape[1], class_embeddings.device, num_classes
        self.text = class_prototypes(class_embeddings, class_ids, num_classes)
        self.means = self.text.clone()
        self.counts = torch.full((K,), 1.0 / K, dtype=torch.float32, device=device)
        self.total = torch.ones((), dtype=torch.float32, device=device)
        self.covariance = torch.eye(d, dtype=torch.float32, device=device)

    def _step(self, x: torch.Tensor, timer: StageTimer) -> tuple[torch.Tensor, int, bool]:
        hp = self.hp
        with timer("logits"):
            z = hp["logit_scale"] * (self.text @ x)
            log_p = torch.log_softmax(z, dim=0)
            weight = torch.exp(hp["beta"] * (log_p.exp() * log_p).sum())
            factor = torch.linalg.cholesky(self.covariance)
            solved = torch.cholesky_solve(self.means.T, factor)                    # P mu^T [d, K]
            g = x @ solved - 0.5 * (self.means * solved.T).sum(1) + torch.log(self.counts / self.total)
        with timer("posterior"):
            post = torch.softmax(z + hp["alpha"] * g, dim=0)
        with timer("update"):
            gain = weight * post
            counts = self.counts + gain
            self.means = (self.counts[:, None] * self.means + gain[:, None] * x) / counts[:, None]
            self.counts = counts
            total = self.total + weight
            diff = x - self.means
            scatter = diff.T @ (gain[:, None] * diff)
            self.covariance = (self.total * self.covariance + scatter) / total
            self.total = total
        return post, int(post.argmax()), True

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"means": self.means.clone(), "counts": self.counts.clone(), "total": self.total.clone(),
                "covariance": self.covariance.clone()}

    def _run(self, features: torch.Tensor) -> Trace:
        return self.run_steps(features)
