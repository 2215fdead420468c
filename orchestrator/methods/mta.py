"""MTA (Zanella & Ben Ayed, CVPR 2024): MeanShift over a sample's augmented views with inlierness scores.

Episodic: every sample is solved from scratch from its own views; nothing carries across samples. As the
official `solve_mta` (MaxZanella/MTA mta.py; methods-spec section 2), per sample with view features
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
is float32, with distances from pairwise differences (see `bandwidths`). On rare samples whose mode is
still moving after the last step, the iteration amplifies float32 rounding: their posteriors differ from a
float64 run by up to about 1e-4 (predictions agree; tests/test_mta.py).

Official code takes one text embedding per class: the class prototypes (`class_prototypes`: each class's
rows averaged and renormalised, the official prompt ensemble).

Where the official code returns NaN: with V < 5 views, k = 0 and there is no bandwidth; here k is at least 1
(only such inputs differ), and a single view is its own mode (zero-shot CLIP on view 0). A view whose k
nearest views all coincide with it has bandwidth 0: a ValueError naming the sample.

Samples are solved in vectorised chunks: per sample the inner loops stop exactly where the official loop
stops (a converged sample's y or m is frozen while others iterate), so batching changes nothing but
rounding. Episodic (`episodic.py`): a pack's configs with one logit_scale share the bandwidths and the
views' affinities. The Trace has no state, `selected` -1 and `gated` False.
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


def kernel(features: torch.Tensor, mode: torch.Tensor, bandwidth: torch.Tensor) -> torch.Tensor:
    """Gaussian kernel of every view [B, V, d] around the mode [B, d] with per-view bandwidths [B, V]."""
    dist = torch.linalg.vector_norm(features - mode[:, None], dim=-1)
    return torch.exp(-dist ** 2 / (2 * bandwidth ** 2))


def solve(features: torch.Tensor, affinity: torch.Tensor, h: torch.Tensor, lambda_y: float,
          lambda_q: float) -> torch.Tensor:
    """The MeanShift mode [B, d] of each sample's views [B, V, d], given their affinities [B, V, V] and their
    bandwidths [B, V]."""
    B, V, _ = features.shape
    y = torch.full((B, V), 1.0 / V, dtype=features.dtype, device=features.device)
    mode = features[:, 0]
    for _ in range(MAX_ITER):
        density = kernel(features, mode, h)
        active = torch.ones(B, dtype=torch.bool, device=features.device)
        for _ in range(MAX_ITER):
            new = torch.softmax(1 / lambda_y * (density + lambda_q * (affinity @ y[..., None])[..., 0]), dim=-1)
            done = torch.linalg.vector_norm(y - new, dim=-1) < TOL
            y = torch.where(active[:, None], new, y)
            active = active & ~done
            if not bool(active.any()):
                break
        active = torch.ones(B, dtype=torch.bool, device=features.device)
        for _ in range(MAX_ITER):
            weights = kernel(features, mode, h) * y
            new = (weights[..., None] * features).sum(dim=1) / weights.sum(dim=1, keepdim=True)
            new = new / torch.linalg.vector_norm(new, dim=-1, keepdim=True)
            done = torch.linalg.vector_norm(mode - new, dim=-1) < TOL
            mode = torch.where(active[:, None], new, mode)
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

    def shared(self, chunk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The views' bandwidths [c, V] and affinities P P^T [c, V, V] (None for a single view)."""
        if chunk.shape[1] == 1:
            return None
        return bandwidths(chunk), affinities(self.hp["logit_scale"] * chunk @ self.text.T)

    def solve(self, chunk: torch.Tensor, shared: tuple[torch.Tensor, torch.Tensor] | None,
              start: int) -> torch.Tensor:
        if shared is None:  # a single view is its own mode
            mode = chunk[:, 0]
        else:
            h, affinity = shared
            collapsed = (h == 0).any(dim=1)
            if bool(collapsed.any()):
                bad = start + int(torch.nonzero(collapsed)[0])
                raise ValueError(f"mta: sample {bad} has a view whose nearest views all coincide with it "
                                 f"(kernel bandwidth 0; the official code returns NaN there)")
            mode = solve(chunk, affinity, h, self.hp["lambda_y"], self.hp["lambda_q"])
        return torch.softmax(self.hp["logit_scale"] * mode @ self.text.T, dim=-1)
