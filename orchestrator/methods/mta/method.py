"""MTA (Zanella & Ben Ayed, CVPR 2024): MeanShift over a sample's augmented views with inlierness scores.

Episodic: every sample is solved from scratch from its own views; nothing carries across samples. As the
official `solve_mta` (MaxZanella/MTA mta.py), per sample with view features
F [V, d] (view 0 the original image) and class embeddings T [K, d]:

1. bandwidths: h_j = sqrt(0.5 * mean of the squared distances from view j to its k = int(0.3 (V - 1))
   nearest other views) (torch.cdist distances, each row sorted, its first entry dropped);
2. affinity A = P P^T with P = softmax(logit_scale * F T^T) per view (temperature 1);
3. y = 1/V (inlierness, warm-started across outer iterations), mode m = F_0;
4. exactly 5 outer iterations of
   a. g_j = exp(-||F_j - m||^2 / (2 h_j^2)) at the current mode;
   b. at most 5 times: y = softmax((g + lambda_q A y) / lambda_y), g held fixed, stop once ||dy|| < 1e-6;
   c. at most 5 times: m = sum_j g_j y_j F_j / sum_j g_j y_j normalised, with g at the current m, stop
      once ||dm|| < 1e-6;
5. logits = logit_scale * T m; the posterior is their softmax (the official code returns the logits).

The code is followed where the paper leaves details open: exactly 5 outer iterations without a convergence
test, both inner loops capped at 5 steps, y warm-started. The official runs CLIP under fp16 autocast; ours
is float32, with the bandwidths' distances from pairwise differences (see `bandwidths`). The iteration
itself runs on the mode's coefficients over the views (`solve`): the same sequence of modes, in float64 on
[V, V] arrays. This is cheaper than float32 over [V, d] and closer to exact: the iteration amplifies
rounding on samples whose mode still moves after the last step. That is no bound on the distance from a
float64 run: the float32 logits, bandwidths and affinities it starts from are rounded, and the capped
iteration amplifies that on rare samples. On tests/test_mta.py's streams the posteriors stay within 1e-5 of
a float64 transcription of the official loop; on CLIP features at K = 100, 3 of 600 samples were reported
5.3e-4 away (issue 29), with the same predictions.

Text: the official runs embed one prompt per class, "a photo of a {}." (main.py:113 `get_coop` with
`--ctx_init a_photo_of_a`, main.py:339; custom_clip.py:114 appends the class name and a full stop, and
`get_text_features`, custom_clip.py:300-307, returns that single embedding): the template set `tpt1`, the card's
`templates` and so the default of a sweep (`templates: protocol`). Several
rows per class (another template set) are averaged and renormalised into one (`class_prototypes`), which the
official code never does.

Where the official code returns NaN: with V < 5 views, k = 0 and there is no bandwidth; here k is at least 1
(only such inputs differ), and a single view is its own mode (zero-shot CLIP on view 0). A view whose k
nearest views all coincide with it has bandwidth 0: a ValueError naming the sample.

Samples are solved in vectorised chunks: per sample the inner loops stop exactly where the official loop
stops (a converged sample's y or m is frozen while others iterate), so batching changes nothing but
rounding. Episodic (`episodic.py`): a pack's configs with one logit_scale share the bandwidths, the views'
affinities, Gram matrices and logits, and are solved together, a row of coefficients each. The Trace has no
state, `selected` -1 and `gated` False.
"""

from __future__ import annotations

from typing import Any

import torch

from orchestrator.methods.episodic import Episodic
from orchestrator.methods.prototypes import class_prototypes

MAX_ITER = 5        # outer iterations, and the cap of each inner loop (hard-coded in the official code)
TOL = 1e-6          # inner-loop stop threshold on the L2 change of y and of m
KNN_FRACTION = 0.3  # the bandwidth uses the int(0.3 (V - 1)) nearest other views (at least one)


def bandwidths(features: torch.Tensor) -> torch.Tensor:
    """[B, V, d] -> [B, V]: each view's kernel bandwidth from its k nearest other views."""
    k = max(1, int(KNN_FRACTION * (features.shape[1] - 1)))
    # Pairwise differences, not cdist's |x|^2 + |y|^2 - 2 x.y shortcut: between near views that shortcut
    # loses most of float32's digits, and the squared bandwidth divides every kernel exponent.
    dist = torch.cdist(features, features, compute_mode="donot_use_mm_for_euclid_dist")
    nearest = torch.sort(dist, dim=2).values[:, :, 1:k + 1]
    return torch.sqrt(0.5 * torch.mean(nearest ** 2, dim=2))


def affinities(view_logits: torch.Tensor) -> torch.Tensor:
    """[B, V, K] view logits -> [B, V, V]: A = P P^T with P the views' softmax (temperature 1)."""
    probs = torch.softmax(view_logits, dim=-1)
    return probs @ probs.transpose(1, 2)


def gram(features: torch.Tensor) -> torch.Tensor:
    """[B, V, d] -> [B, V, V] float64: the views' inner products, exact to float64 rounding (the products of
    float32 numbers are exact in float64), so that distances recovered from them keep float32's digits."""
    wide = features.double()
    return wide @ wide.transpose(1, 2)


def _kernel(gram: torch.Tensor, diag: torch.Tensor, mode: torch.Tensor, h2: torch.Tensor) -> torch.Tensor:
    """Gaussian kernel of every view around each mode m = F^T a (coefficients `mode` [B, G, V]):
    |F_j - m|^2 = G_jj - 2 (G a)_j + a^T G a, over 2 h_j^2 ([B, 1, V])."""
    ga = mode @ gram  # the Gram matrices are symmetric: a^T G = (G a)^T
    dist2 = (diag - 2 * ga + (mode * ga).sum(2, keepdim=True)).clamp_min(0.0)
    return torch.exp(-dist2 / h2)


def _norm(x: torch.Tensor) -> torch.Tensor:
    """L2 norm over the last dim (a sum of squares: torch's vector_norm is slow on these small rows)."""
    return (x * x).sum(-1, keepdim=True).sqrt()


def _softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim, written out: torch's kernel is slow on many rows of a few views."""
    e = (x - x.amax(-1, keepdim=True)).exp_()
    return e / e.sum(-1, keepdim=True)


def solve(gram: torch.Tensor, affinity: torch.Tensor, h: torch.Tensor, lambda_y: torch.Tensor,
          lambda_q: torch.Tensor) -> torch.Tensor:
    """The MeanShift modes of each sample's views for G (lambda_y, lambda_q) pairs ([G] each), as coefficients
    a [B, G, V] over the views (mode = F^T a), given the views' Gram matrices [B, V, V] (`gram`), affinities
    [B, V, V] and bandwidths [B, V].

    Every mode the official iteration visits is a normalised non-negative combination of the views (view 0,
    then sum_j g_j y_j F_j normalised), so it runs on the coefficients: each kernel distance, mode norm and
    convergence test is a quadratic form in the Gram matrix, O(V^2) per step rather than O(V d), in float64
    on these small arrays. A config's row never depends on another's: a stream's modes are those of its own
    run (a row is frozen once its inner loop stops, as the official loop stops)."""
    B, V, _ = gram.shape
    G = lambda_y.shape[0]
    f64 = torch.float64
    lambda_y, lambda_q = lambda_y.to(gram)[None, :, None], lambda_q.to(gram)[None, :, None]
    diag = torch.diagonal(gram, dim1=1, dim2=2)[:, None, :]
    h2 = 2 * h.to(f64)[:, None, :] ** 2
    affinity = affinity.to(f64)  # symmetric too: y^T A = (A y)^T
    y = torch.full((B, G, V), 1.0 / V, dtype=f64, device=gram.device)
    mode = torch.zeros(B, G, V, dtype=f64, device=gram.device)
    mode[..., 0] = 1.0
    for _ in range(MAX_ITER):
        density = _kernel(gram, diag, mode, h2)
        active = torch.ones(B, G, 1, dtype=torch.bool, device=gram.device)
        for _ in range(MAX_ITER):
            new = _softmax((density + lambda_q * (y @ affinity)) / lambda_y)
            done = _norm(y - new) < TOL
            y = torch.where(active, new, y)
            active = active & ~done
            if not bool(active.any()):
                break
        active = torch.ones(B, G, 1, dtype=torch.bool, device=gram.device)
        for _ in range(MAX_ITER):
            weights = _kernel(gram, diag, mode, h2) * y
            new = weights / (weights * (weights @ gram)).sum(-1, keepdim=True).sqrt()
            step = mode - new
            done = (step * (step @ gram)).sum(-1, keepdim=True).clamp_min(0.0).sqrt() < TOL
            mode = torch.where(active, new, mode)
            active = active & ~done
            if not bool(active.any()):
                break
    return mode


class MTA(Episodic):
    """MeanShift for test-time augmentation: the inlierness-weighted mode of the views, classified zero-shot
    (hparams lambda_y, lambda_q, logit_scale: its registry card)."""

    name = "mta"
    chunk = 128

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        self.text = class_prototypes(class_embeddings, class_ids, num_classes)

    def shared(self, chunk: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        """The views' bandwidths [c, V], affinities P P^T [c, V, V], Gram matrices [c, V, V] and logits
        [c, V, K] (None for a single view)."""
        if chunk.shape[1] == 1:
            return None
        logits = self.hp["logit_scale"] * chunk @ self.text.T
        return bandwidths(chunk), affinities(logits), gram(chunk), logits

    def solve(self, chunk: torch.Tensor, shared: tuple[torch.Tensor, ...] | None, start: int) -> torch.Tensor:
        return self.solve_many([self], chunk, shared, start)[0]

    def solve_many(self, methods: list[Episodic], chunk: torch.Tensor, shared: tuple[torch.Tensor, ...] | None,
                   start: int) -> torch.Tensor:
        """All configs' modes in one solve, a row each (`solve`); their logits are the mode's coefficients
        times the views' logits, logit_scale T m = sum_j a_j (logit_scale T F_j)."""
        if shared is None:  # a single view is its own mode
            post = torch.softmax(self.hp["logit_scale"] * chunk[:, 0] @ self.text.T, dim=-1)
            return post.expand(len(methods), -1, -1)
        h, affinity, views_gram, logits = shared
        collapsed = (h == 0).any(dim=1)
        if bool(collapsed.any()):
            bad = start + int(torch.nonzero(collapsed)[0])
            raise ValueError(f"mta: sample {bad} has a view whose nearest views all coincide with it "
                             f"(kernel bandwidth 0; the official code returns NaN there)")
        lambda_y, lambda_q = (torch.tensor([m.hp[k] for m in methods], dtype=torch.float64)
                              for k in ("lambda_y", "lambda_q"))
        mode = solve(views_gram, affinity, h, lambda_y, lambda_q)
        return torch.softmax(mode.float() @ logits, dim=-1).transpose(0, 1)
