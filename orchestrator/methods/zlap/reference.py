"""A plain per-batch transcription of the official ZLaP transductive solver (`MaxZanella/StatA` solvers/ZLaP.py =
`vladan-stojnic/ZLaP` zlap.py do_transductive_lp), in float64, for the tests: the kNN lists (text nodes first,
rows of -1 for them), the symmetric graph without its diagonal, its normalisation, L = I - alpha W_n, and one
conjugate-gradient solve per class as cupyx.scipy.sparse.linalg.cg runs it (x0 = 0, stop when
||r|| <= tol ||b||, at most maxiter steps). Returns the raw scores [b, K]."""

from __future__ import annotations

import torch

CG_TOL = 1e-6
CG_MAXITER = 50


def separate_graph(x: torch.Tensor, clf: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """create_separate_graph: (knn [K + b, k_ii + k_it], sim) with images offset by K, -1 / 0 on text rows."""
    num_classes, b = clf.shape[0], x.shape[0]
    ii = (x @ x.T).topk(min(k, b), dim=1)
    it = (x @ clf.T).topk(min(k, num_classes), dim=1)
    knn = torch.cat([ii.indices + num_classes, it.indices], dim=1)
    sim = torch.cat([ii.values, it.values], dim=1)
    knn = torch.cat([torch.full((num_classes, knn.shape[1]), -1, dtype=knn.dtype), knn])
    sim = torch.cat([torch.zeros(num_classes, sim.shape[1], dtype=sim.dtype), sim])
    return knn, sim


def laplacian(knn: torch.Tensor, sim: torch.Tensor, alpha: float) -> torch.Tensor:
    """knn2laplacian + normalize_connection_graph, dense."""
    n = knn.shape[0]
    W = torch.zeros(n, n, dtype=sim.dtype)
    for i in range(n):
        for j, s in zip(knn[i].tolist(), sim[i].tolist()):
            if j != -1:
                W[i, j] += s
    W = W + W.T
    W = W - torch.diag(torch.diagonal(W))
    S = W.sum(dim=1)
    S[S == 0] = 1
    D = torch.diag(1.0 / torch.sqrt(S))
    return torch.eye(n, dtype=sim.dtype) - alpha * (D @ W @ D)


def conjugate_gradient(A: torch.Tensor, b: torch.Tensor, tol: float = CG_TOL, maxiter: int = CG_MAXITER):
    x = torch.zeros_like(b)
    r = b - A @ x
    atol = tol * float(b.norm())
    rho = 0.0
    p = None
    for it in range(maxiter):
        z = r
        rho1, rho = rho, float(r @ z)
        p = z if it == 0 else z + (rho / rho1) * p
        q = A @ p
        step = rho / float(p @ q)
        x = x + step * p
        r = r - step * q
        if float(r.norm()) <= atol:
            break
    return x


def zlap_batch(x: torch.Tensor, clf: torch.Tensor, k: int, gamma: float, alpha: float, tol: float = CG_TOL,
               maxiter: int = CG_MAXITER) -> torch.Tensor:
    """do_transductive_lp (scale_sim off): the scores [b, K] of the batch's images (tol, maxiter: the CG's)."""
    num_classes = clf.shape[0]
    knn, sim = separate_graph(x, clf, k)
    sim[sim < 0] = 0
    mask = knn < num_classes
    sim[mask] = sim[mask] ** gamma
    L = laplacian(knn, sim, alpha)
    scores = torch.zeros(x.shape[0], num_classes, dtype=x.dtype)
    for c in range(num_classes):
        Y = torch.zeros(L.shape[0], dtype=x.dtype)
        Y[c] = 1
        scores[:, c] = conjugate_gradient(L, Y, tol, maxiter)[num_classes:]
    return scores
