"""Lockstep streams: G independent states of one method advanced together, one sample per batched step.

    run_lockstep(methods, features) -> list[Trace], one per method, each equal to `methods[g].run(features)`
    LOCKSTEP: the Method classes that have a lockstep runner (`many.run_traces_many` routes them here)

A per-sample loop on a CPU (or a GPU) pays a fixed cost per tensor operation; G configurations of a pack
over one stream pay it once here. Every per-stream gate and update is a mask or an index operation over the
G (or H) rows, never a Python branch per stream. Each runner starts from the methods' initial state (fresh
objects from `make_method`), takes the features as `Method.run` does, and matches the single-stream method:
predictions, selections and gates identical, posteriors within float32 rounding (the batched products sum
in another order than the single-stream ones).

TDA / TDA+PA. A TDA cache is a function of (logit_scale, pos_shot, neg_shot) alone: the zero-shot
prediction, entropy and negative gate that fill it do not depend on the cache weights (alpha, beta) nor on
TDA+PA's prior. So the H distinct cache triples hold one cache each, and the G streams read theirs with
their own alpha / beta (and, for TDA+PA, keep their own prior V and counters C2, applied a block at a
time: `_Prior`). A cache holds its entries
in a pool in arrival order (a replacement reuses the replaced entry's pool row), so the filled entries are a
prefix of the pool and a step multiplies only those, from the first sample on; `slot_*` keep TDA's physical
per-class layout (an entry appends at slot `count`, a replacement reuses the worst slot) for the state.

DMN-ZS. A memory is a function of (logit_scale, the number of views keep keeps, memory_size) alone (its writes follow the text
posteriors of the views), so each distinct triple keeps one (`DMNZeroShot.observe` on its first stream)
and its streams read it with their own beta, then mix with their own memory_weight. The read-out
normalize(read_k) . x0, read_k = tw_k t_k + sum_j mw_kj m_kj, needs no G x K x d read vectors: read_k . x0
comes from the entries' products with x0, and |read_k|^2 from each class's Gram matrix of its entries and
their products with t_k (kept in float64, recomputed for the written class each sample), so a step costs
K depth d once per memory plus G K depth^2, not G K depth d.

OnZeta. The dual variables rho [G, K] per stream, the text logits once per call, and the proxies W [G, K, d]
in blocks of B samples so that W is read twice per block, not three times per sample: a step's update is
W <- diag(1 / |row|) (W + u x^T), so within a block W_t = diag(s_t) (W_a + C_t X^T) with X the block's
samples, and W_t x_t = s_t * (W_a x_t + C_t (X x_t)): the products W_a X^T and X X^T once per block, per step
a [G, K, <B] product and the row norms from |W_t + u x^T|^2 = |W_t|^2 + 2 u (W_t x) + u^2 |x|^2; at the
block's end W is formed and renormalised. The posteriors then differ from the loop's by the loop's own
float32 rounding, which OnZeta's large early steps amplify: at K = 100, d = 32, 400 samples, the float32
loop sits 2e-5 from a float64 run of the same loop and this path 1e-5; at K = 200 (`test_lockstep.py`)
both are within 1e-5 of each other. Below K ~ 100 the loop amplifies rounding further (onzeta.py).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch

from orchestrator.methods.base import Method, StageTimer, Trace, validate_features
from orchestrator.methods.dmn_zs import DMNZeroShot
from orchestrator.methods.onzeta import OnZeta
from orchestrator.methods.tda import NEG_ENTROPY_BOUNDS, NEG_MASK_BOUNDS, TDA, TDAWithPrior, class_logits

ONZETA_BLOCK = 64  # samples per block of OnZeta's proxies (see the module docstring)
TDA_PRIOR_BLOCK = 64  # samples per block of TDA+PA's prior (`_Prior`)


def _column(methods: list[Method], key: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One hparam of every stream as a [G, 1] tensor (broadcasts against per-stream rows)."""
    return torch.tensor([[m.hp[key]] for m in methods], dtype=dtype, device=device)


def _split_timings(timer: StageTimer, g: int) -> dict[str, float]:
    """Each stream's share of the lockstep pass (as a pack reports a run's share of the pass)."""
    return {stage: seconds / g for stage, seconds in timer.seconds.items()}


# ------------------------------------------------------------------------------------------------ TDA

class _Caches:
    """H TDA caches of `shot[h]` entries per class (shot 0: a disabled cache), stepped together."""

    def __init__(self, shots: list[int], num_classes: int, dim: int, device: torch.device, with_values: bool):
        H, K = len(shots), num_classes
        S = max(max(shots), 1)
        P = K * S  # pool rows; row P is a dump that non-entering writes go to
        self.K, self.S, self.P = K, S, P
        self.rows = torch.arange(H, device=device)
        self.shot = torch.tensor(shots, dtype=torch.int64, device=device)
        self.slot_loss = torch.full((H, K, S), math.inf, dtype=torch.float32, device=device)
        self.slot_time = torch.zeros(H, K, S, dtype=torch.int64, device=device)
        self.slot_pool = torch.zeros(H, K, S, dtype=torch.int64, device=device)
        self.count = torch.zeros(H, K, dtype=torch.int64, device=device)
        self.used = torch.zeros(H, dtype=torch.int64, device=device)
        self.keys = torch.zeros(H, P + 1, dim, dtype=torch.float32, device=device)
        self.cls = torch.full((H, P + 1), K, dtype=torch.int64, device=device)  # K: empty (a dropped column)
        self.values = (torch.zeros(H, P + 1, K, dtype=torch.float32, device=device) if with_values else None)
        self.slots = torch.arange(S, device=device)

    def offer(self, step: int, gate: torch.Tensor, pred: torch.Tensor, loss: torch.Tensor, f: torch.Tensor,
              value: torch.Tensor | None = None) -> torch.Tensor:
        """TDA's update_cache in every cache at once: append while class `pred` has room, else replace its worst
        entry (highest loss; among equal losses the newest) when `loss` is strictly lower. [H] bool: entered."""
        rows = self.rows
        count = self.count[rows, pred]
        row_loss = self.slot_loss[rows, pred]
        row_time = self.slot_time[rows, pred]
        filled = self.slots[None, :] < count[:, None]
        ranked = torch.where(filled, row_loss, -math.inf)
        worst = ranked.max(dim=1).values
        worst_slot = torch.where(ranked == worst[:, None], row_time, -1).argmax(dim=1)
        room = count < self.shot
        enter = gate & (room | (loss < worst))
        slot = torch.where(room, count, worst_slot)
        old_pool = self.slot_pool[rows, pred, slot]
        pool = torch.where(enter, torch.where(room, self.used, old_pool), self.P)
        self.keys[rows, pool] = f
        self.cls[rows, pool] = torch.where(enter, pred, self.K)
        if value is not None:
            self.values[rows, pool] = value
        self.slot_loss[rows, pred, slot] = torch.where(enter, loss, row_loss[rows, slot])
        self.slot_time[rows, pred, slot] = torch.where(enter, step, row_time[rows, slot])
        self.slot_pool[rows, pred, slot] = torch.where(enter, pool, old_pool)
        grew = (enter & room).long()
        self.count[rows, pred] += grew
        self.used += grew
        return enter

    def weights(self, f: torch.Tensor, beta: torch.Tensor, group: torch.Tensor) -> tuple[torch.Tensor, int]:
        """exp(-beta (1 - f . key)) per stream over the longest filled pool prefix [G, used]. A cache with
        fewer rows leaves the rest as they started, class K (a dropped column) and zero values, so their
        weights add nothing."""
        used = int(self.used.max())
        affinity = self.keys[:, :used] @ f
        return torch.exp(-1.0 * (beta - beta * affinity[group])), used

    def state(self, h: int, shot: int, prefix: str) -> dict[str, torch.Tensor]:
        """Cache h in TDA's layout ([K, shot, ...], zeros and inf where empty), as `ClassCache.state` gives it."""
        filled = (self.slots[None, :shot] < self.count[h, :, None])
        pool = torch.where(filled, self.slot_pool[h, :, :shot], self.P)
        out = {f"{prefix}_keys": torch.where(filled[..., None], self.keys[h, pool], 0.0),
               f"{prefix}_entropy": self.slot_loss[h, :, :shot].clone()}
        if self.values is not None:
            out[f"{prefix}_values"] = torch.where(filled[..., None], self.values[h, pool], 0.0)
        return out


class _Prior:
    """TDA+PA's prior per stream (V [G, M, K], counters C2 [G, M]), applied to a block of likelihoods at once.

    Nothing TDA+PA's likelihood p, its row s or its gate uses depends on V, so a block's p are known before
    its posteriors: p V_a for the whole block is one product with the block's first V_a, and sample j adds
    what the rows updated earlier in the block changed, sum over i < j of p_j[s_i] (V_{i+1} - V_i)[s_i]."""

    def __init__(self, methods: list[Method], block: int) -> None:
        first = methods[0]
        G, M, K = len(methods), first.class_embeddings.shape[0], first.num_classes
        device = first.class_embeddings.device
        self.block, self.count = block, 0
        self.V = torch.nn.functional.one_hot(first.class_ids, K).float().expand(G, -1, -1).clone()
        self.C2 = _column(methods, "n2", torch.float32, device).expand(-1, M).clone()
        self.p = torch.empty(G, block, M, dtype=torch.float32, device=device)
        self.rows = torch.empty(G, block, dtype=torch.int64, device=device)
        self.fire = torch.empty(G, block, dtype=torch.bool, device=device)
        self.steps = torch.empty(G, block, K, dtype=torch.float32, device=device)
        self.streams = torch.arange(G, device=device)

    def add(self, p: torch.Tensor, s: torch.Tensor, fire: torch.Tensor) -> None:
        self.p[:, self.count], self.rows[:, self.count], self.fire[:, self.count] = p, s, fire
        self.count += 1

    def flush(self, posteriors: torch.Tensor, start: int) -> None:
        """The block's posteriors into posteriors[:, start:], and its prior updates (Eq. 9, count rule)."""
        B, streams, V, C2 = self.count, self.streams, self.V, self.C2
        base = torch.bmm(self.p[:, :B], V)                                   # p_j V_a
        for j in range(B):
            post = base[:, j]
            if j:
                weights = self.p[:, j].gather(1, self.rows[:, :j])
                post = post + torch.bmm(weights[:, None, :], self.steps[:, :j])[:, 0]
            post = post / post.sum(dim=1, keepdim=True)
            posteriors[:, start + j] = post
            s, fire = self.rows[:, j], self.fire[:, j]
            a = C2[streams, s]
            row = V[streams, s]
            new = torch.where(fire[:, None], (a[:, None] * row + 1.0 * post) / (a[:, None] + 1.0), row)
            self.steps[:, j] = new - row
            V[streams, s] = new
            C2[streams, s] = torch.where(fire, a + 1.0, a)
        self.count = 0


def run_tda_lockstep(methods: list[Method], features: torch.Tensor) -> list[Trace]:
    """G TDA (or G TDA+PA) streams over one feature stream [n, d]; trace g equals `methods[g].run(features)`."""
    first = methods[0]
    validate_features(first.name, features, first.class_embeddings, views=False)
    E, class_ids, K = first.class_embeddings, first.class_ids, first.num_classes
    device, (n, d), G = features.device, features.shape, len(methods)
    with_prior = first.with_prior
    triples = [(m.hp["logit_scale"], m.hp["pos_shot"], m.hp["neg_shot"]) for m in methods]
    distinct = list(dict.fromkeys(triples))
    group = torch.tensor([distinct.index(t) for t in triples], dtype=torch.int64, device=device)
    members = [torch.nonzero(group == h).flatten() for h in range(len(distinct))]
    scale = torch.tensor([[t[0]] for t in distinct], dtype=torch.float32, device=device)
    pos = _Caches([t[1] for t in distinct], K, d, device, with_values=False)
    neg = _Caches([t[2] for t in distinct], K, d, device, with_values=True)
    pos_alpha, pos_beta, neg_alpha, neg_beta = (_column(methods, k, torch.float32, device)
                                                for k in ("pos_alpha", "pos_beta", "neg_alpha", "neg_beta"))
    streams = torch.arange(G, device=device)
    if with_prior:
        prior = _Prior(methods, TDA_PRIOR_BLOCK)
        tau = _column(methods, "tau", torch.float64, device).flatten()
    posteriors = torch.zeros(G, n, K, dtype=torch.float32, device=device)
    selected = torch.full((G, n), -1, dtype=torch.int64, device=device)
    gated = torch.zeros(G, n, dtype=torch.bool, device=device)
    gated_prior = torch.zeros(G, n, dtype=torch.bool, device=device)
    lo_entropy, hi_entropy = NEG_ENTROPY_BOUNDS
    lo_mask, hi_mask = NEG_MASK_BOUNDS
    log2_k = math.log2(K)
    always = torch.ones(len(distinct), dtype=torch.bool, device=device)
    timer = StageTimer()
    for i in range(n):
        f = features[i]
        with timer("logits"):
            logits = scale * (E @ f)[None, :]
            clip_logits = class_logits(logits, class_ids, K)
            prob_map = torch.softmax(clip_logits, dim=1)
            loss = -(prob_map * torch.log_softmax(clip_logits, dim=1)).sum(dim=1)
            entropy = loss / log2_k
            pred = torch.argmax(clip_logits, dim=1)
        with timer("update"):
            entered = pos.offer(i, always, pred, loss, f)
            band = (entropy.double() > lo_entropy) & (entropy.double() < hi_entropy)  # as tda's Python floats
            mask = ((prob_map > lo_mask) & (prob_map < hi_mask)).float()
            entered = neg.offer(i, band, pred, loss, f, mask) | entered
            gated[:, i] = entered[group]
        with timer("logits"):
            w_pos, _ = pos.weights(f, pos_beta, group)
            positive = torch.zeros(G, K + 1, dtype=torch.float32, device=device)
            positive = positive.scatter_add_(1, pos.cls[group, :w_pos.shape[1]], w_pos)[:, :K]
            w_neg, used = neg.weights(f, neg_beta, group)
            negative = torch.empty(G, K, dtype=torch.float32, device=device)
            for h, rows in enumerate(members):
                negative[rows] = w_neg[rows] @ neg.values[h, :used]
            adjustment = pos_alpha * positive - neg_alpha * negative
        if not with_prior:
            with timer("posterior"):
                posteriors[:, i] = torch.softmax(clip_logits[group] + adjustment, dim=1)
            continue
        with timer("posterior"):
            p = torch.softmax(logits[group] + adjustment[:, class_ids], dim=1)
            s = torch.argmax(p, dim=1)
            selected[:, i] = s
            fire = p[streams, s].double() > tau
            gated_prior[:, i] = fire
            prior.add(p, s, fire)
            if prior.count == prior.block or i == n - 1:
                prior.flush(posteriors, i + 1 - prior.count)
    timings = _split_timings(timer, G)
    # The streams of one cache share its final state (one copy per cache).
    caches = [{**pos.state(h, t[1], "pos"), **neg.state(h, t[2], "neg")} for h, t in enumerate(distinct)]
    traces = []
    for g in range(G):
        state = dict(caches[int(group[g])])
        if with_prior:
            state.update(V=prior.V[g].clone(), C2=prior.C2[g].clone())
        traces.append(Trace(posteriors[g], selected[g], gated[g], gated_prior[g], state=state,
                            timings=dict(timings)))
    return traces


# --------------------------------------------------------------------------------------------- OnZeta

def run_onzeta_lockstep(methods: list[Method], features: torch.Tensor, *, block: int = ONZETA_BLOCK) -> list[Trace]:
    """G OnZeta streams over one feature stream [n, d]; trace g equals `methods[g].run(features)`."""
    first = methods[0]
    validate_features(first.name, features, first.class_embeddings, views=False)
    n, G, K, device = features.shape[0], len(methods), first.num_classes, features.device
    for method in methods:
        method.claim(n)
    # Per-step scalars in float64, rounded to float32 where they meet a tensor, as the loop's Python floats.
    col = {k: _column(methods, k, torch.float64, device) for k in ("tau_t", "tau_i", "cw", "cr", "alpha", "beta")}
    n_total = torch.tensor([[float(m.n_total)] for m in methods], dtype=torch.float64, device=device)
    i = torch.arange(1, n + 1, dtype=torch.float64, device=device)[None, :]
    step = (-col["cw"] / i.sqrt() / col["tau_i"]).float()             # [G, n]: -lr / tau_i
    rlr = (col["cr"] / i.sqrt()).float()
    mix = (col["beta"] * torch.sqrt(i / n_total)).float()
    tau_t, tau_i = col["tau_t"].float(), col["tau_i"].float()
    target = (col["alpha"] / K).float()
    W = first.text.expand(G, -1, -1).clone()
    rho = torch.zeros(G, K, dtype=torch.float32, device=device)
    posteriors = torch.zeros(G, n, K, dtype=torch.float32, device=device)
    timer = StageTimer()
    with timer("logits"):
        text_products = features @ first.text.T
    rows = W.view(G * K, -1)
    # Buffers written in place: fresh memory costs a page fault per first touch, a sizeable share here.
    products_buf = torch.empty(G * K, block, dtype=torch.float32, device=device)
    coef_buf = torch.empty(G * K, block, dtype=torch.float64, device=device)
    for a in range(0, n, block):
        X = features[a:a + block]
        B = X.shape[0]
        with timer("logits"):
            products = torch.mm(rows, X.T, out=products_buf[:, :B]).view(G, K, B)   # W_a x for the block
            gram = (X @ X.T).double()
            sq_x = gram.diagonal()
            coef = coef_buf[:, :B].zero_()
            # The row scale, squared norm and coefficients recur over the block, and early steps are large
            # (a row's coefficients sum to many times its norm): float64 keeps their rounding from adding up.
            scale = torch.ones(G, K, dtype=torch.float64, device=device)
            sq_norm = torch.linalg.vector_norm(W, dim=2).double().square_()
        for j in range(B):
            t = a + j
            with timer("logits"):
                z64 = scale * (products[:, :, j] + (coef[:, :j] @ gram[:j, j]).view(G, K))   # W_t x_t
                z = z64.float()
                q = torch.softmax(text_products[t] / tau_t + rho, dim=1)
                p = torch.softmax(z / tau_i, dim=1)
            with timer("posterior"):
                posteriors[:, t] = q + mix[:, t:t + 1] * (p - q)
            with timer("update"):
                rho.sub_(rlr[:, t:t + 1] * (q - target)).clamp_(min=0.0)
                u = step[:, t:t + 1] * (p - q)
                coef[:, j] = (u / scale).flatten()
                grown = sq_norm + 2.0 * u * z64 + u.double().square() * sq_x[j]   # |W_t + u x^T|^2
                norm = grown.sqrt().clamp_(min=1e-12)
                scale = scale / norm
                sq_norm = grown / (norm * norm)
        with timer("update"):
            # W_end = diag(scale) (W_a + C X), renormalised: the positive row scale drops out.
            rows.addmm_(coef.float(), X)
            W.div_(torch.linalg.vector_norm(W, dim=2, keepdim=True).clamp_(min=1e-12))
    for method in methods:
        method.step = n
    timings = _split_timings(timer, G)
    none = torch.full((n,), -1, dtype=torch.int64, device=device)
    off = torch.zeros(n, dtype=torch.bool, device=device)
    return [Trace(posteriors[g], none.clone(), off.clone(), off.clone(),
                  state={"W": W[g].clone(), "rho": rho[g].clone(), "step": torch.tensor(n)}, timings=dict(timings))
            for g in range(G)]


# --------------------------------------------------------------------------------------------- DMN-ZS

def run_dmn_lockstep(methods: list[Method], features: torch.Tensor) -> list[Trace]:
    """G DMN-ZS streams over one stream of views [n, V, d]; trace g equals `methods[g].run(features)`."""
    first = methods[0]
    validate_features(first.name, features, first.class_embeddings, views=True)
    n, G, K, device = features.shape[0], len(methods), first.num_classes, features.device
    views = features.shape[1]
    # keep matters through the number of views it keeps (DMNZeroShot.observe), so streams group by that count.
    keys = [(m.hp["logit_scale"], max(1, int(views * m.hp["keep"])), m.hp["memory_size"]) for m in methods]
    distinct = list(dict.fromkeys(keys))
    writers = [methods[keys.index(key)] for key in distinct]      # each memory's first stream keeps it
    members = [torch.tensor([g for g, k in enumerate(keys) if k == key], device=device) for key in distinct]
    betas = [_column([methods[int(g)] for g in rows], "beta", torch.float32, device)[:, :, None]
             for rows in members]
    weight64 = _column(methods, "memory_weight", torch.float64, device)
    weight, denominator = weight64.float(), (1.0 + weight64).float()     # as the loop's Python floats
    text = first.text
    text_sq = (text.double() ** 2).sum(dim=1)
    # Per memory, in float64: each class's entries' Gram matrix and their products with its text prototype.
    grams = [torch.zeros(K, w.hp["memory_size"], w.hp["memory_size"], dtype=torch.float64, device=device)
             for w in writers]
    cross = [torch.zeros(K, w.hp["memory_size"], dtype=torch.float64, device=device) for w in writers]
    posteriors = torch.zeros(G, n, K, dtype=torch.float32, device=device)
    selected = torch.full((G, n), -1, dtype=torch.int64, device=device)
    gated = torch.zeros(G, n, dtype=torch.bool, device=device)
    timer = StageTimer()
    for i in range(n):
        sample = features[i]
        x0 = sample[0]
        query = torch.nn.functional.normalize(x0, dim=0)
        for writer, rows, beta, gram, tm in zip(writers, members, betas, grams, cross):
            text_posterior, label, written = writer.observe(sample, timer)
            with timer("update"):
                entries = writer.memory[label].double()                      # the written class's rows
                gram[label] = entries @ entries.T
                tm[label] = entries @ text[label].double()
            with timer("posterior"):
                depth = writer.depth
                memory = writer.memory[:, :depth]                            # [K, depth, d]
                both = memory @ torch.stack([query, x0], dim=1)              # [K, depth, 2]
                text_weight = torch.exp(-beta[:, :, 0] * (1.0 - text @ query)).double()       # [R, K]
                memory_weight = torch.exp(-beta * (1.0 - both[:, :, 0])).double()          # [R, K, depth]
                # read_k = tw t_k + sum_j mw_j m_kj; its product with x0 and its norm from the Gram matrices.
                along = text_weight * (text @ x0).double() + (memory_weight * both[:, :, 1].double()).sum(-1)
                mw = memory_weight.transpose(0, 1)                            # [K, R, depth]
                quad = (torch.bmm(mw, gram[:, :depth, :depth]) * mw).sum(-1).T
                sq = text_weight ** 2 * text_sq + 2.0 * text_weight * (mw * tm[:, None, :depth]).sum(-1).T + quad
                cosine = (along / sq.sqrt().clamp(min=1e-12)).float()
                p_memory = torch.softmax(writer.hp["logit_scale"] * cosine, dim=1)
                posteriors[rows, i] = (text_posterior + weight[rows] * p_memory) / denominator[rows]
            selected[rows, i] = label
            gated[rows, i] = written
    timings = _split_timings(timer, G)
    # The streams of one memory share its final state (one copy of K x memory_size x d per memory).
    states = [{"memory": w.memory.clone(), "memory_entropy": w.entropy.clone(), "memory_count": w.count.clone()}
              for w in writers]
    state_of = {int(g): state for state, rows in zip(states, members) for g in rows}
    return [Trace(posteriors[g], selected[g], gated[g], torch.zeros(n, dtype=torch.bool, device=device),
                  state=dict(state_of[g]), timings=dict(timings)) for g in range(G)]


class Lockstep(NamedTuple):
    """A lockstep runner and the features it takes: views [n, V, d] (True) or one feature [n, d] (False)."""

    run: Callable[[list[Method], torch.Tensor], list[Trace]]
    views: bool


LOCKSTEP: dict[type, Lockstep] = {
    TDA: Lockstep(run_tda_lockstep, False), TDAWithPrior: Lockstep(run_tda_lockstep, False),
    OnZeta: Lockstep(run_onzeta_lockstep, False), DMNZeroShot: Lockstep(run_dmn_lockstep, True),
}


def run_lockstep(methods: list[Method], features: torch.Tensor) -> list[Trace]:
    """Fresh methods of one class with a lockstep runner, over one feature stream: one Trace per method."""
    kinds = {type(m) for m in methods}
    if len(kinds) != 1 or next(iter(kinds)) not in LOCKSTEP:
        names = sorted(k.__name__ for k in kinds)
        raise ValueError(f"run_lockstep takes methods of one class with a lockstep runner "
                         f"({sorted(k.__name__ for k in LOCKSTEP)}), got {names}")
    return LOCKSTEP[type(methods[0])].run(methods, features)
