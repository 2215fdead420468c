"""DOTA in lockstep. Step 5 updates the means, the counts and the data scatters D_k from the kept views and
their zero-shot soft labels alone, so (mu, counts, D) are a function of (logit_scale, the number of views
keep keeps) and never of the Gaussian scores: each distinct pair keeps one, K d^2 floats, shared by its
streams. sigma and epsilon enter only the precision, (1 - eps) (sum_k D_k / c_k / K + sigma mean_k(1 / c_k) I)
+ eps I (`dota.precision_factor`), so per sample a group forms the Cholesky factors of its distinct
(sigma, epsilon) pairs in one batched call from one weighted reduction of D, and scores them with one batched
triangular solve; rho and eta only set each stream's weight of the scores. These are the single-stream
method's own functions on the same tensors (dota.py keeps sigma out of D for this), so on a CPU the states
equal the loop's bit for bit and the posteriors within float32 rounding (a batched product may sum in
another order).

A group runs over the whole stream before the next starts (groups share nothing but the features), so the
work per sample is one scatter pass per group plus d^3 / 3 + d^2 K per (sigma, epsilon) pair.

Over stream orders the runner takes one order at a time (it is not marked `lockstep.takes_orders`): each order
keeps its own K d^2 data scatters, whose update and reduction read and write K d^2 floats per sample (1 GB at
K = 1000, d = 512), so a step is bound by that traffic, which stepping orders together would batch, not shrink.

The trace's 'sigma' [K, d, d] = (D_k + sigma I) / c_k differs per sigma: G copies would be G K d^2 floats
(34 GB for G = 32 at K = 1000, d = 512). So each stream's state is a `_State` that forms 'sigma' from its
group's D on every access (a fresh tensor, nothing cached), while its other entries are its own tensors: the
traces hold one D per group, and a pack's trial reads and saves one run's state at a time
(`sweep.pack.execute_pack`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from orchestrator.methods.base import Method, StageTimer, Trace, validate_features
from orchestrator.methods.dota.method import covariances, fit, gaussian_scores, kept_views, precision_factor
from orchestrator.methods.lockstep import column, group_by, split_timings
from orchestrator.methods.views import kept_count


class _State(Mapping[str, torch.Tensor]):
    """One stream's final state, its card's keys in order: 'sigma' formed on each access from the group's
    data scatter, the others held."""

    def __init__(self, held: dict[str, torch.Tensor], scatter: torch.Tensor, eye: torch.Tensor,
                 sigma: float) -> None:
        self.held, self.scatter, self.eye, self.sigma = held, scatter, eye, sigma

    def __getitem__(self, key: str) -> torch.Tensor:
        if key == "sigma":
            return covariances(self.scatter, self.held["counts"], self.eye, self.sigma)
        return self.held[key]

    def __iter__(self) -> Iterator[str]:
        return iter(("mu", "sigma", "counts", "precision"))

    def __len__(self) -> int:
        return 4


def _run_group(methods: list[Method], features: torch.Tensor, posteriors: torch.Tensor, rows: torch.Tensor,
               timer: StageTimer) -> list[_State]:
    """Streams of one (logit_scale, kept count) over the stream, their posteriors into posteriors[rows]: their
    states."""
    first = methods[0]
    n, K, device = features.shape[0], first.num_classes, features.device
    scale, keep = first.hp["logit_scale"], first.hp["keep"]
    pairs = [(m.hp["sigma"], m.hp["epsilon"]) for m in methods]
    distinct, index = group_by(pairs)
    which = torch.tensor(index, device=device)
    sigma, epsilon = (torch.tensor(values, dtype=torch.float64, device=device).view(-1, 1, 1)
                      for values in zip(*distinct))
    rho, eta = (column(methods, key, torch.float64, device) for key in ("rho", "eta"))
    eye = first.eye
    mu, counts = first.mu.clone(), first.counts.clone()
    scatter = torch.zeros(K, *eye.shape, dtype=torch.float32, device=device)
    factor = sigma.sqrt().float() * eye                                  # [H, d, d]: Lambda^-1 = sigma I
    for i in range(n):
        with timer("logits"):
            X, L = kept_views(features[i], first.text, scale, keep)
            g = gaussian_scores(factor, X.mean(dim=0), mu)               # [H, K]
        with timer("posterior"):
            # min(rho mean(c) / b, eta) in float64, rounded where it meets the scores, as the loop's Python floats.
            weight = torch.minimum(rho * counts.mean().double() / X.shape[0], eta).float()
            posteriors[rows, i] = torch.softmax(L.mean(dim=0) + weight * g[which], dim=1)
        with timer("update"):
            mu, counts = fit(mu, counts, scatter, X, torch.softmax(L, dim=1))
            factor = precision_factor(scatter, counts, eye, sigma, epsilon)
    precision = torch.cholesky_inverse(factor)
    return [_State({"mu": mu.clone(), "counts": counts.clone(), "precision": precision[h].clone()}, scatter, eye,
                   m.hp["sigma"]) for m, h in zip(methods, which.tolist())]


def run_dota_lockstep(methods: list[Method], features: torch.Tensor) -> list[Trace]:
    """G DOTA streams over one stream of views [n, V, d]; trace g equals `methods[g].run(features)`."""
    first = methods[0]
    validate_features(first.name, features, first.class_embeddings, views=True)
    n, views, G, device = features.shape[0], features.shape[1], len(methods), features.device
    # keep matters through the number of views it keeps, so streams group by that count.
    keys = [(m.hp["logit_scale"], kept_count(views, m.hp["keep"])) for m in methods]
    posteriors = torch.zeros(G, n, first.num_classes, dtype=torch.float32, device=device)
    states: dict[int, _State] = {}
    timer = StageTimer()
    for key in dict.fromkeys(keys):
        rows = [g for g, k in enumerate(keys) if k == key]
        group = _run_group([methods[g] for g in rows], features, posteriors, torch.tensor(rows, device=device), timer)
        states.update(zip(rows, group))
    timings = split_timings(timer, G)
    none = torch.full((n,), -1, dtype=torch.int64, device=device)
    off = torch.zeros(n, dtype=torch.bool, device=device)
    return [Trace(posteriors[g], none.clone(), off.clone(), off.clone(), state=states[g], timings=dict(timings))
            for g in range(G)]
