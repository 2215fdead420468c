"""The BCA family's adaptive view selection (`view_selection='adaptive'`) for G streams in one pass: the
lockstep path over orders x grid points (one stream alone runs `reference.bca_family_reference`, whose per-step
operations are fewer: tests/test_lockstep_views.py holds each stream of this path to it).

Each stream keeps its own U, V, C1, C2 (a sample's kept views depend on every earlier update of its stream, so
no state is shared); a step re-scores every stream's views against its current U in one batched product
[G, V, d] x [G, d, M] and does the per-sample algorithm of `reference.bca_family_reference` (its module
docstring has the equations) with the G streams as a leading axis. Stream g reads `features[orders[g]]` when
`orders` [G, n] is given (the stream orders of one cached feature set), else `features` itself.

Exactness: every operation is the reference's, row by row (the update weights a, b are computed in float64 and
rounded as the reference's Python floats are); the batched products [1, M] x [M, K] and [V, d] x [d, M] may
sum in another order than the reference's vector products, so posteriors agree within float32 rounding
(tests/test_lockstep_views.py). Counted, momentum and decay updates are all batched; float16 state (a
precision study) runs the reference loop instead (`takes`).
"""

from __future__ import annotations

import math

import torch

from orchestrator.methods.base import StageTimer, Trace
from orchestrator.methods.bca.reference import BCAConfig, rows_of_classes
from orchestrator.methods.views import PROTOCOL_KEEP, kept_count, logit_confidence_order



def takes(cfg: BCAConfig) -> bool:
    """Whether this path runs the config (float32 state; float16 runs `bca_family_reference`)."""
    return cfg.state_dtype == "float32"


def _rule(cfg: BCAConfig, n: float) -> tuple[float, float, float, float]:
    """`reference.update_weights` as a = alpha C + beta (weight of the old row), b (of the observation) and the
    next counter delta C + 1, for counter C: the same float64 values its Python floats take."""
    if cfg.update == "count":
        return 1.0, 0.0, 1.0, 1.0
    if cfg.update == "momentum":
        m = 1.0 / (n + 1.0)
        return 0.0, 1.0 - m, m, 1.0
    return cfg.decay, 0.0, 1.0, cfg.decay


def _gate(tau: float, adapts: bool) -> float:
    """The float32 threshold t with p > t exactly when the reference's float(p) > tau, for float32 p: the
    largest float32 not above tau (+inf where the part does not adapt)."""
    if not adapts:
        return math.inf
    t = torch.tensor(tau, dtype=torch.float32)
    return float(torch.nextafter(t, torch.tensor(-math.inf)) if float(t) > tau else t)


def _where(fire: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """The new rows of the streams that fire, the old ones of the others (all new: no select)."""
    return new if bool(fire.all()) else torch.where(fire.view(-1, *[1] * (new.ndim - 1)), new, old)


def run_bca_views_many(features: torch.Tensor, states: list[dict[str, torch.Tensor]], class_ids: torch.Tensor,
                       num_classes: int, cfgs: list[BCAConfig], orders: torch.Tensor | None = None) -> list[Trace]:
    """G streams of views [n, V, d] (or features [N, V, d] and orders [G, n]) from `states` (not modified), one
    float32 config each (`takes`): trace g equals `bca_family_reference` of stream g from states[g]."""
    device, G = features.device, len(cfgs)
    n = features.shape[0] if orders is None else orders.shape[1]
    num_views = features.shape[1]
    k = kept_count(num_views, PROTOCOL_KEEP)
    U = torch.stack([s["U"].float() for s in states])                     # [G, M, d]
    V = torch.stack([s["V"].float() for s in states])                     # [G, M, K]
    C1 = torch.stack([s["C1"].clone() for s in states])                   # [G, M]
    C2 = torch.stack([s["C2"].clone() for s in states])

    def column(values, dtype=torch.float64):
        return torch.tensor(values, dtype=dtype, device=device)

    scale = column([c.logit_scale for c in cfgs], torch.float32)[:, None, None]
    gate_u = column([_gate(c.tau_likelihood, c.adapt_likelihood) for c in cfgs], torch.float32)
    gate_v = column([_gate(c.tau_prior, c.adapt_prior) for c in cfgs], torch.float32)
    unselected = column([not c.selects for c in cfgs], torch.bool)
    on_posterior = column([c.select_on == "posterior" for c in cfgs], torch.bool)
    rules = [column(list(zip(*(_rule(c, getattr(c, count)) for c in cfgs)))) for count in ("n1", "n2")]

    def weights(rule: torch.Tensor, counter: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(a, b, a + b) [3, G, 1] in float32 as the reference's Python floats round into its float32 ops, and
        the next counter."""
        alpha, beta, b, delta = rule
        c = counter.double()
        a = alpha * c + beta
        return torch.stack((a, b, a + b)).float()[..., None], (delta * c + 1.0).float()

    class_rows = rows_of_classes(class_ids, num_classes) if any(c.select_on == "posterior" for c in cfgs) else None
    streams = torch.arange(G, device=device)
    first_view = streams[:, None] * num_views
    posteriors = torch.zeros(G, n, num_classes, dtype=torch.float32, device=device)
    selected = torch.full((G, n), -1, dtype=torch.int64, device=device)
    gated = torch.zeros(G, n, dtype=torch.bool, device=device)
    gated_prior = torch.zeros(G, n, dtype=torch.bool, device=device)
    timer = StageTimer()
    for i in range(n):
        with timer("logits"):
            x = features[i].expand(G, -1, -1) if orders is None else features[orders[:, i]]   # [G, V, d]
            z = torch.bmm(scale * x, U.transpose(1, 2))                   # the reference's (scale * views) @ U^T
            # each stream's kept views as rows of the flattened [G V, ...] (a row gather, as the reference indexes)
            kept = (logit_confidence_order(z)[:, :k] + first_view).flatten()
            f = x.reshape(G * num_views, -1)[kept].view(G, k, -1).mean(dim=1)                       # [G, d]
            p = torch.softmax(z.reshape(G * num_views, -1)[kept].view(G, k, -1).mean(dim=1), dim=1)  # [G, M]
        with timer("posterior"):
            post = torch.bmm(p[:, None], V)[:, 0]
            post = post / post.sum(dim=1, keepdim=True)
            posteriors[:, i] = post
        with timer("update"):
            s = torch.argmax(p, dim=1)
            conf = p[streams, s]
            if class_rows is not None:
                best, cls = post.max(dim=1)
                s = torch.where(on_posterior, class_rows[cls], s)
                conf = torch.where(on_posterior, best, conf)
            fire_u, fire_v = conf > gate_u, conf > gate_v
            selected[:, i] = s.masked_fill(unselected, -1)
            gated[:, i], gated_prior[:, i] = fire_u, fire_v
            if bool(fire_u.any()):
                (a, b, ab), c_next = weights(rules[0], C1[streams, s])
                row = U[streams, s]
                new = (a * row + b * f) / ab
                new = new / torch.linalg.vector_norm(new, dim=1, keepdim=True)
                U[streams, s], C1[streams, s] = _where(fire_u, new, row), _where(fire_u, c_next, C1[streams, s])
            if bool(fire_v.any()):
                (a, b, ab), c_next = weights(rules[1], C2[streams, s])
                row = V[streams, s]
                new = (a * row + b * post) / ab
                V[streams, s], C2[streams, s] = _where(fire_v, new, row), _where(fire_v, c_next, C2[streams, s])
    seconds = {stage: t / G for stage, t in timer.seconds.items()}
    return [Trace(posteriors[g], selected[g], gated[g], gated_prior[g],
                  state={"U": U[g], "V": V[g], "C1": C1[g], "C2": C2[g]}, timings=dict(seconds)) for g in range(G)]
