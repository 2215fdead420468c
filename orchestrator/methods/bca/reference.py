"""The BCA family (clip, la, pa, bca) as a plain per-sample loop written from the paper's equations.

This is the readable implementation that tests and benchmarks compare the blocked engine against; it is
the paper's own implementation style (one sample, one softmax, one optional row update).

State (the paper's Algorithm 1, docs/methods.md): class embeddings U [M, d] (initialised from the prompt
embeddings), prior V [M, K] (row m one-hot at class_ids[m]), counters C1 = n1 and C2 = n2 [M].
Per sample f, in stream order:

1. p = softmax(logit_scale * U f) over the M class embeddings                     (Eq. 6 / 10)
2. post = p V over the K classes: the returned posterior and prediction          (Eq. 8 / 10)
   divided by its sum: a no-op up to rounding in float32, but float16 rows of V drift off the simplex
   by about 1e-3, and the returned posterior must sum to 1 (the V update uses this same post).
3. select a row s and its confidence c:
   - select_on='likelihood' (paper text):  s = argmax_m p[m],  c = p[s]
   - select_on='posterior' (public code):  k = argmax_k post[k], c = post[k], s = the row of class k
     (only defined for M == K, one embedding per class)
4. gates, strict as in the paper: likelihood gate c > tau_likelihood, prior gate c > tau_prior;
   `la` has only the likelihood gate, `pa` only the prior gate, `clip` neither (and selects nothing).
5. if the likelihood gate fires: U[s] = normalise(blend(U[s], f)), C1[s] advances;
   if the prior gate fires:      V[s] = blend(V[s], post), C2[s] advances (no renormalisation: a convex
   combination of rows on the simplex stays on the simplex).

The blend, for a row r, new observation x and its counter C (n = n1 for U, n2 for V), always in the
shared form r <- (a r + b x) / (a + b) (`update_weights` gives a, b and the next C):

- update='count' (Eqs. 7 and 9):     r <- (C r + x) / (C + 1);            C <- C + 1
  The weight of a new sample is 1 / (C + 1): a running mean seeded with n pseudo-observations.
- update='momentum' (fixed-rate EMA): r <- (1 - m) r + m x with m = 1 / (n + 1);  C <- C + 1
  (the shared form with a = 1 - m, b = m)
  The rate is the count rule's first-step rate and never shrinks, so the row forgets old samples
  geometrically. Tying m to n1 / n2 (rather than one free momentum) keeps the paper's two learning rates
  (slow for U, fast for V) and makes the three strategies differ in exactly one thing, as in the
  supplementary's ablation; with n1 = 30000 a shared m = 0.01 would move U 300 times faster than Eq. 7.
  C only counts the absorbed samples here.
- update='decay' (exponentially forgetting counter): C' = decay * C;  r <- (C' r + x) / (C' + 1);
  C <- C' + 1. The weight of a new sample is 1 / C (after the step); decay = 1 is exactly 'count'.
  C tends to 1 / (1 - decay) from either side, so each row's effective memory is capped at
  1 / (1 - decay) absorbed samples: the default 0.999 (about 1000 samples per row) leaves the paper's
  benchmarks (tens to hundreds of updates per row) close to 'count' while letting U and V keep tracking
  a drifting (continual) stream.

Augmented views (features [n, V, d], view 0 the original, V > 1: view_selection='adaptive'), as the public
code's copy (TTABC bca.py, assign_label with select_confident_samples): before step 1 each sample's views
get logits Z = logit_scale * f_v U^T against the CURRENT, adapted U (the likelihood only: no prior, no
summing into classes), the PROTOCOL_KEEP (10%) views with the lowest entropy of softmax(Z) over the M rows
are kept (at least one; ties go to the earlier view), f = the mean of the kept views' features (not
renormalised: it is what U[s] absorbs), and step 1's p = softmax(mean of the kept views' Z), the code's
P_x_um (equal to logit_scale * U f up to float rounding). The engine cannot batch this (a sample's views
depend on every earlier update), so it runs here, per sample.

Precision (state_dtype): U and V are stored in that dtype and every update operation runs on tensors of
that dtype (torch rounds after each op: C * r, + x, / (C + 1), normalise), so float16 reproduces what a
float16 copy of the public code does: with C1 = 30000, C1 * U[s] + f rounds the feature away. Counters are
float32 in both cases; the scalar weights (C, m, decay * C) are Python floats. Logits and posteriors are computed in
float32 from the stored values.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from orchestrator.methods.base import StageTimer, Trace
from orchestrator.methods.views import PROTOCOL_KEEP, lowest_entropy_logit_views

SELECT_ON = ("likelihood", "posterior")
UPDATES = ("count", "momentum", "decay")
STATE_DTYPES = {"float32": torch.float32, "float16": torch.float16}


@dataclass(frozen=True)
class BCAConfig:
    """One BCA-family variant, fully resolved (gates separate, flags for which parts adapt). No defaults here:
    the values come from the cards (`BCAFamily.make_config`)."""

    adapt_likelihood: bool
    adapt_prior: bool
    tau_likelihood: float
    tau_prior: float
    n1: float
    n2: float
    logit_scale: float
    select_on: str
    update: str
    decay: float
    state_dtype: str

    @property
    def selects(self) -> bool:
        return self.adapt_likelihood or self.adapt_prior


def init_state(class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
               cfg: BCAConfig) -> dict[str, torch.Tensor]:
    """Algorithm 1, lines 1-3: U from the prompt embeddings, V one-hot rows, C1 = n1, C2 = n2."""
    dtype = STATE_DTYPES[cfg.state_dtype]
    m = class_embeddings.shape[0]
    device = class_embeddings.device
    return {
        "U": class_embeddings.to(dtype).clone(),
        "V": torch.nn.functional.one_hot(class_ids, num_classes).to(dtype),
        "C1": torch.full((m,), cfg.n1, dtype=torch.float32, device=device),
        "C2": torch.full((m,), cfg.n2, dtype=torch.float32, device=device),
    }


def rows_of_classes(class_ids: torch.Tensor, num_classes: int) -> torch.Tensor:
    """For M == K with one embedding per class: the row index of each class (select_on='posterior')."""
    rows = torch.empty(num_classes, dtype=torch.int64, device=class_ids.device)
    rows[class_ids] = torch.arange(class_ids.shape[0], device=class_ids.device)
    return rows


def update_weights(update: str, counter: float, n: float, decay: float) -> tuple[float, float, float]:
    """(weight of the old row a, weight of the new observation b, next counter) for one gated update.

    The new row is (a * r + b * x) / (a + b); see the module docstring for each rule.
    """
    if update == "count":
        return counter, 1.0, counter + 1.0
    if update == "momentum":
        m = 1.0 / (n + 1.0)
        return 1.0 - m, m, counter + 1.0
    if update == "decay":
        kept = decay * counter
        return kept, 1.0, kept + 1.0
    raise ValueError(f"update must be one of {list(UPDATES)}, got {update!r}")


def blend(row: torch.Tensor, x: torch.Tensor, a: float, b: float) -> torch.Tensor:
    """(a * row + b * x) / (a + b), in the dtype of `row` (x is cast to it first)."""
    return (a * row + b * x.to(row.dtype)) / (a + b)


def normalise(v: torch.Tensor) -> torch.Tensor:
    return v / torch.linalg.vector_norm(v)


def adaptive_view_sample(views: torch.Tensor, U32: torch.Tensor, logit_scale: float) -> tuple[torch.Tensor, ...]:
    """One sample's views [V, d] against the current U -> (feature [d], likelihood p [M]) (module docstring)."""
    z = (logit_scale * views) @ U32.T  # the public code's order: scale the [V, d] views, not the [V, M] logits
    kept = lowest_entropy_logit_views(z[None], PROTOCOL_KEEP)[0]
    return views[kept].mean(dim=0), torch.softmax(z[kept].mean(dim=0), dim=0)


def bca_family_reference(features: torch.Tensor, state: dict[str, torch.Tensor], class_ids: torch.Tensor,
                         num_classes: int, cfg: BCAConfig) -> Trace:
    """Run the per-sample loop over `features` [n, d] (or [n, V, d], views selected adaptively) from `state`
    (not modified); the Trace holds the new state."""
    U, V = state["U"].clone(), state["V"].clone()
    # The counters as Python floats, each rounded to float32 where it is stored, as the state's tensors hold them;
    # the per-sample outputs as lists: tensor element access costs more than the step's arithmetic on views.
    C1, C2 = state["C1"].tolist(), state["C2"].tolist()
    # float32 mirrors of the stored rows (the stored rows themselves in float32): the logits and posteriors are
    # always computed in float32.
    U32, V32 = U.float(), V.float()
    mirror_u, mirror_v = U32 is not U, V32 is not V
    n = features.shape[0]
    posteriors = torch.zeros(n, num_classes, dtype=torch.float32, device=features.device)
    selected, gated, gated_prior = [-1] * n, [False] * n, [False] * n
    rows = rows_of_classes(class_ids, num_classes).tolist() if cfg.select_on == "posterior" else None
    timer = StageTimer()
    for i in range(n):
        with timer("logits"):
            if features.ndim == 2 or features.shape[1] == 1:
                f = features[i].reshape(-1)
                p = torch.softmax(cfg.logit_scale * (U32 @ f), dim=0)
            else:
                f, p = adaptive_view_sample(features[i], U32, cfg.logit_scale)
        with timer("posterior"):
            post = p @ V32
            post = post / post.sum()
            posteriors[i] = post
        if not cfg.selects:
            continue
        with timer("update"):
            if cfg.select_on == "likelihood":
                conf, s = p.max(dim=0)
                conf, s = float(conf), int(s)
            else:
                conf, k = post.max(dim=0)
                conf, s = float(conf), rows[int(k)]
            selected[i] = s
            if cfg.adapt_likelihood and conf > cfg.tau_likelihood:
                a, b, c_next = update_weights(cfg.update, C1[s], cfg.n1, cfg.decay)
                U[s] = normalise(blend(U[s], f, a, b))
                if mirror_u:
                    U32[s] = U[s].float()
                C1[s] = _float32(c_next)
                gated[i] = True
            if cfg.adapt_prior and conf > cfg.tau_prior:
                a, b, c_next = update_weights(cfg.update, C2[s], cfg.n2, cfg.decay)
                V[s] = blend(V[s], post, a, b)
                if mirror_v:
                    V32[s] = V[s].float()
                C2[s] = _float32(c_next)
                gated_prior[i] = True
    device = features.device
    return Trace(posteriors, torch.tensor(selected, dtype=torch.int64, device=device),
                 torch.tensor(gated, dtype=torch.bool, device=device),
                 torch.tensor(gated_prior, dtype=torch.bool, device=device),
                 state={"U": U, "V": V, "C1": torch.tensor(C1, dtype=torch.float32, device=state["C1"].device),
                        "C2": torch.tensor(C2, dtype=torch.float32, device=state["C2"].device)},
                 timings=timer.seconds)


def _float32(x: float) -> float:
    """x rounded to float32, as a counter stored in the state's float32 tensor."""
    return struct.unpack("f", struct.pack("f", x))[0]


def official_bca(views: torch.Tensor, U0: torch.Tensor, *, n1: float, n2: float, tau_u: float, tau_v: float,
                 scale: float = 100.0, select: str = "posterior") -> dict:
    """The public code's per-sample loop (TTABC bca.py: BCAState.bca_step with select_confident_samples) over
    views [n, V, d] (or one view), re-expressed in float32, M = K, prior starting at the identity: the reference
    that tests (tests/test_bca_views.py) and `benchmarks.methods`' official column compare the view path against.
    select:
    'posterior' as that code (row = argmax of the posterior), or 'likelihood' (the paper text's argmax of
    the likelihood softmax). Returns the posteriors, rows, gates, final state and each sample's kept views."""
    mu, m = U0.clone(), U0.shape[0]
    prior = torch.eye(m)
    c1, c2 = [n1] * m, [n2] * m
    out = {"post": [], "row": [], "gated": [], "gated_prior": [], "kept": []}
    for sample in views:
        logits = scale * sample @ mu.T                                    # P(x | u_m), against the current mu
        if sample.shape[0] > 1:
            entropy = -(logits.softmax(1) * logits.log_softmax(1)).sum(1)
            idx = torch.argsort(entropy, stable=True)[:int(sample.shape[0] * 0.1)]
            f, logits = sample[idx].mean(0), logits[idx].mean(0)
            out["kept"].append(sorted(idx.tolist()))
        else:
            f, logits = sample[0], logits[0]
        likelihood = logits.softmax(0)
        post = likelihood @ prior
        conf, row = (post.max(0) if select == "posterior" else likelihood.max(0))
        row = int(row)
        if conf > tau_u:
            mu[row] = (c1[row] * mu[row] + f) / (c1[row] + 1)
            mu[row] = mu[row] / torch.norm(mu[row])
            c1[row] += 1
        if conf > tau_v:
            prior[row] = (c2[row] * prior[row] + post) / (c2[row] + 1)
            c2[row] += 1
        for key, value in (("post", post), ("row", row), ("gated", bool(conf > tau_u)),
                           ("gated_prior", bool(conf > tau_v))):
            out[key].append(value)
    return {"post": torch.stack(out["post"]), "row": torch.tensor(out["row"]), "gated": torch.tensor(out["gated"]),
            "gated_prior": torch.tensor(out["gated_prior"]), "U": mu, "V": prior, "kept": out["kept"]}
