"""ZLaP (Stojnić, Kalantidis & Tolias, CVPR 2024), transductive label propagation, solved on each batch alone as
StatA's online comparison runs it (`MaxZanella/StatA` solvers/ZLaP.py, a copy of `vladan-stojnic/ZLaP` zlap.py's
do_transductive_lp with main.py's k = 5, gamma = 5, alpha = 0.3; ZLaP's own defaults are the same and it has no
per-dataset values).

The graph of a batch of b features x_i and the K text embeddings w_c (one per class; several per class are
averaged and renormalised) has K + b nodes, text nodes first:

    each image links to its min(n_neighbors, b) nearest images (itself among them) with weight max(0, x_i . x_j)
    and to its min(n_neighbors, K) nearest texts with weight max(0, x_i . w_c) ** gamma
    W = A + A^T without its diagonal;  D = diag(row sums, 0 taken as 1);  L = I - alpha D^-1/2 W D^-1/2
    score_ic = (L^-1 e_c)_(K + i),  the label of class c propagated from its text node to image i

and the prediction is argmax_c score_ic. Transductive, not inductive: the official inductive variants build the
graph on a separate unlabelled set and then query it; in a per-batch online run the batch is the only unlabelled
data there is, so the batch is both the graph and the queries.

Code vs paper: label propagation's scores are the solution L^-1 e_c, which the code approximates by conjugate
gradients stopped at a residual of 1e-6; both are offered (`solver`, below; the paper's text was not compared
line by line here). Code vs this module:
- The official solves L s = e_c for every class by conjugate gradients (cupy, float64 as its sparse identity
  makes it, stop at ||r|| <= 1e-6, at most 50 steps). `solver: cg` (default) runs those CGs, every class's in
  one column of a block iteration, in float32. The stop at 1e-6 is not the solution: on scores of ~1e-3 it
  moves them by ~1e-3 relative, enough to flip near-ties, so the default keeps the official's stop.
  `solver: exact` solves the linear system itself (the paper's L^-1): text nodes link only to images, so the
  image block of L^-1 e_c solves the b x b system (I - alpha A_n - alpha^2 B_n B_n^T) s = alpha B_n e_c (A_n,
  B_n: the normalised image-image and image-text blocks), all classes at once. `reference.py` transcribes the
  official graph and CG in float64.
- The official returns the raw scores (only their argmax is used); a Trace needs posteriors, so each row is
  divided by its sum. The exact scores are non-negative (L^-1 = sum_t alpha^t W_n^t); float32 rounding can
  leave a -1e-9, clamped to 0. An image with no positive link to any text gets uniform posteriors (argmax class
  0, as the official argmax over zeros).
- The official uses faiss for the neighbours; here `topk` over the inner products (ties aside, the same sets).

No lockstep runner: configs differing in n_neighbors or gamma build different graphs, and alpha changes the
system solved, so a pack would share only the batch's inner products.

Trace: `selected` -1 and `gated` False (no gate); no state (nothing crosses batches).
"""

from __future__ import annotations

from typing import Any

import torch

from orchestrator.methods.base import StageTimer, TextBatchMethod


CG_TOL = 1e-6  # the official dfs_search's conjugate gradients: stop at ||r|| <= tol ||e_c||, at most 50 steps
CG_MAXITER = 50


def knn_weights(sims: torch.Tensor, k: int, power: float = 1.0) -> torch.Tensor:
    """Dense [b, m] weights of each row's k largest entries (negative ones as 0) to the power, the rest 0 (no edge:
    the power applies to the neighbours only, as the official masks it, so 0 ** 0 stays off the graph)."""
    top = sims.topk(k, dim=1)
    return torch.zeros_like(sims).scatter_(1, top.indices, top.values.clamp(min=0) ** power)


def normalised_blocks(x: torch.Tensor, text: torch.Tensor, n_neighbors: int,
                      gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The graph's normalised image-image block A_n [b, b] and image-text block B_n [b, K] (text-text is empty)."""
    b, num_classes = x.shape[0], text.shape[0]
    image = knn_weights(x @ x.T, min(n_neighbors, b))
    image = image + image.T
    image.fill_diagonal_(0.0)
    cross = knn_weights(x @ text.T, min(n_neighbors, num_classes), gamma)  # image -> text, [b, K]
    image_degree = image.sum(1) + cross.sum(1)
    text_degree = cross.sum(0)
    di = torch.where(image_degree > 0, image_degree, 1.0).rsqrt()
    dt = torch.where(text_degree > 0, text_degree, 1.0).rsqrt()
    return di[:, None] * image * di[None, :], di[:, None] * cross * dt[None, :]


def exact_scores(image_n: torch.Tensor, cross_n: torch.Tensor, alpha: float) -> torch.Tensor:
    """The image rows of L^-1 [e_1 .. e_K] through the b x b Schur complement (text rows eliminated)."""
    b = image_n.shape[0]
    system = torch.eye(b, dtype=image_n.dtype, device=image_n.device) - alpha * image_n \
        - alpha ** 2 * (cross_n @ cross_n.T)
    return torch.linalg.solve(system, alpha * cross_n)


def cg_scores(image_n: torch.Tensor, cross_n: torch.Tensor, alpha: float, n_neighbors: int) -> torch.Tensor:
    """The official per-class conjugate gradients on the whole (K + b)-node system, all classes at once: column c
    is class c's own CG (x0 = 0), frozen once its residual reaches CG_TOL (||e_c|| = 1). L p is applied block by
    block: the image-text block has at most n_neighbors entries per image, gathered and scattered by index."""
    b, num_classes = cross_n.shape
    links = cross_n.topk(min(n_neighbors, num_classes), dim=1)  # every kept image-text link (and zeros)

    def apply(p: torch.Tensor) -> torch.Tensor:
        text, image = p[:num_classes], p[num_classes:]
        to_text = torch.zeros_like(text).index_add_(
            0, links.indices.flatten(), (links.values.unsqueeze(-1) * image.unsqueeze(1)).flatten(0, 1))
        to_image = (links.values.unsqueeze(-1) * text[links.indices]).sum(1) + image_n @ image
        return p - alpha * torch.cat([to_text, to_image])

    x = torch.zeros(num_classes + b, num_classes, dtype=cross_n.dtype, device=cross_n.device)
    r = torch.eye(num_classes + b, num_classes, dtype=cross_n.dtype, device=cross_n.device)
    p = r
    rho = (r * r).sum(0)
    done = torch.zeros(num_classes, dtype=torch.bool, device=cross_n.device)
    for step in range(CG_MAXITER):
        if step:
            rho_prev, rho = rho, (r * r).sum(0)
            p = r + (rho / rho_prev) * p
        q = apply(p)
        move = rho / (p * q).sum(0)
        x = torch.where(done, x, x + move * p)
        r = torch.where(done, r, r - move * q)
        done = done | (torch.linalg.vector_norm(r, dim=0) <= CG_TOL)
        if bool(done.all()):
            break
    return x[num_classes:]


def zlap_scores(x: torch.Tensor, text: torch.Tensor, hp: dict[str, Any]) -> torch.Tensor:
    """The label-propagation scores [b, K] of a batch (the module's equations), by the hparams' solver."""
    image_n, cross_n = normalised_blocks(x, text, hp["n_neighbors"], hp["gamma"])
    if hp["solver"] == "exact":
        return exact_scores(image_n, cross_n, hp["alpha"])
    # A text node no image links to is isolated: its CG ends after one step with x = e_c, zero on every image.
    # Only the linked classes are solved (the isolated nodes stay 0 in every other column too).
    linked = cross_n.sum(0) > 0
    scores = cross_n.new_zeros(cross_n.shape)
    scores[:, linked] = cg_scores(image_n, cross_n[:, linked], hp["alpha"], hp["n_neighbors"])
    return scores


class ZLaP(TextBatchMethod):
    name = "zlap"

    def solve(self, features: torch.Tensor, timer: StageTimer) -> torch.Tensor:
        with timer("update"):
            scores = zlap_scores(features, self.text, self.hp).clamp(min=0)
        with timer("posterior"):
            total = scores.sum(1, keepdim=True)
            return torch.where(total > 0, scores / torch.where(total > 0, total, 1.0), 1.0 / self.num_classes)
