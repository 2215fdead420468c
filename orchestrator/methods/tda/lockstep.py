"""TDA / TDA+PA in lockstep. A TDA cache is a function of (logit_scale, pos_shot, neg_shot) alone: the zero-shot
prediction, entropy and negative gate that fill it do not depend on the cache weights (alpha, beta) nor on
TDA+PA's prior. So the H distinct cache triples hold one cache each, and the G streams read theirs with
their own alpha / beta (and, for TDA+PA, keep their own prior V and counters C2, applied a block at a
time: `_Prior`). A cache holds its entries
in a pool in arrival order (a replacement reuses the replaced entry's pool row), so the filled entries are a
prefix of the pool and a step multiplies only those, from the first sample on; `slot_*` keep TDA's physical
per-class layout (an entry appends at slot `count`, a replacement reuses the worst slot) for the state.
On augmented views [n, V, d] each cache's query (the mean of its kept views, their logits, entropy and
probability map) depends on logit_scale alone, so it is computed once per distinct logit_scale, by TDA's
own chunked view path (`_queries`). Over stream orders (views [N, V, d], orders [G, n]: stream g is
features[orders[g]]) a cache is one per distinct (order, cache triple), and a chunk of steps computes the
queries of every such cache's samples in one pass; on one feature per sample a step's product is that of
every cache's own sample [H, d] with the embeddings.
"""

from __future__ import annotations

import math
from typing import Iterator

import numba
import numpy as np
import torch

from orchestrator.methods.base import Method, StageTimer, Trace, validate_features
from orchestrator.methods.caches import LockstepCaches
from orchestrator.methods.lockstep import column, gather_members, group_by, per_card, split_timings, takes_orders
from orchestrator.methods.tda.method import NEG_ENTROPY_BOUNDS, NEG_MASK_BOUNDS, class_logits, view_chunk

TDA_PRIOR_BLOCK = 64  # samples per block of TDA+PA's prior (`_Prior`)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _fused_flush(base, p, rows, fire, steps, V, C2, posteriors, start):
    """_Prior.flush's walk a stream at a time (its block of steps stays in the core's cache): each sample's
    posterior from its p V_a row and the earlier samples' row changes, then its prior update."""
    G, B, K = base.shape
    post = np.empty(K, dtype=np.float32)
    one = np.float32(1.0)
    for g in range(G):
        for j in range(B):
            post[:] = base[g, j]
            for i in range(j):
                weight = p[g, j, rows[g, i]]
                for k in range(K):
                    post[k] += weight * steps[g, i, k]
            total = np.float32(0.0)
            for k in range(K):
                total += post[k]
            s = rows[g, j]
            a = C2[g, s]
            for k in range(K):
                value = post[k] / total
                posteriors[g, start + j, k] = value
                row = V[g, s, k]
                new = (a * row + value) / (a + one) if fire[g, j] else row
                steps[g, j, k] = new - row
                V[g, s, k] = new
            if fire[g, j]:
                C2[g, s] = a + one


class _Prior:
    """TDA+PA's prior per stream (V [G, M, K], counters C2 [G, M]), applied to a block of likelihoods at once.

    Nothing TDA+PA's likelihood p, its row s or its gate uses depends on V, so a block's p are known before
    its posteriors: p V_a for the whole block is one product with the block's first V_a, and sample j adds
    what the rows updated earlier in the block changed, sum over i < j of p_j[s_i] (V_{i+1} - V_i)[s_i]. On a
    CPU that walk is compiled (`_fused_flush`, a stream at a time); elsewhere (`fused=False`) it runs as torch
    operations over the G streams, a sample at a time."""

    def __init__(self, methods: list[Method], block: int, fused: bool) -> None:
        first = methods[0]
        G, M, K = len(methods), first.class_embeddings.shape[0], first.num_classes
        device = first.class_embeddings.device
        self.block, self.count = block, 0
        self.V = torch.nn.functional.one_hot(first.class_ids, K).float().expand(G, -1, -1).clone()
        self.C2 = column(methods, "n2", torch.float32, device).expand(-1, M).clone()
        self.p = torch.empty(G, block, M, dtype=torch.float32, device=device)
        self.rows = torch.empty(G, block, dtype=torch.int64, device=device)
        self.fire = torch.empty(G, block, dtype=torch.bool, device=device)
        self.steps = torch.empty(G, block, K, dtype=torch.float32, device=device)
        self.streams = torch.arange(G, device=device)
        self.fused = fused

    def add(self, p: torch.Tensor, s: torch.Tensor, fire: torch.Tensor) -> None:
        self.p[:, self.count], self.rows[:, self.count], self.fire[:, self.count] = p, s, fire
        self.count += 1

    def flush(self, posteriors: torch.Tensor, start: int) -> None:
        """The block's posteriors into posteriors[:, start:], and its prior updates (Eq. 9, count rule)."""
        B, streams, V, C2 = self.count, self.streams, self.V, self.C2
        base = torch.bmm(self.p[:, :B], V)                                   # p_j V_a
        if self.fused:
            _fused_flush(base.numpy(), self.p.numpy(), self.rows.numpy(), self.fire.numpy(), self.steps.numpy(),
                         V.numpy(), C2.numpy(), posteriors.numpy(), start)
            self.count = 0
            return
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


def _queries(caches: list[Method], features: torch.Tensor, timer: StageTimer,
             orders: torch.Tensor | None = None) -> Iterator[tuple[torch.Tensor, ...]]:
    """Per sample, each cache's query: (f, per-embedding logits [H, M], clip_logits [H, K], prob_map [H, K],
    loss [H]), computed as its TDA computes them (`caches[h]` is one of cache h's streams). f is the one
    feature [d] on [n, d] ([H, d] with orders); on views [n, V, d] it is [H, d], each cache's mean of its kept
    views (the views kept depend on logit_scale), in TDA's chunks so that every value is the single-stream one.
    With `orders` [H, n], cache h reads sample orders[h, i] at step i."""
    first = caches[0]
    E, K = first.class_embeddings, first.num_classes
    if features.ndim == 2:
        scale = torch.tensor([[m.hp["logit_scale"]] for m in caches], dtype=torch.float32, device=features.device)
        for i in range(features.shape[0] if orders is None else orders.shape[1]):
            with timer("logits"):
                if orders is None:
                    f = features[i]
                    logits = scale * (E @ f)[None, :]
                else:  # each cache's own sample [H, d]
                    f = features[orders[:, i]]
                    logits = scale * (f @ E.T)
                clip_logits = class_logits(logits, first.logit_classes, K)
                prob_map = torch.softmax(clip_logits, dim=1)
                loss = -(prob_map * torch.log_softmax(clip_logits, dim=1)).sum(dim=1)
            yield f, logits, clip_logits, prob_map, loss
        return
    scales = [m.hp["logit_scale"] for m in caches]
    distinct, index = group_by(scales)
    of_cache = torch.tensor(index, device=features.device)
    if orders is None:
        step = view_chunk(features, E.shape[0])
        for start in range(0, features.shape[0], step):
            with timer("logits"):
                chunk = features[start:start + step]
                per_scale = [caches[scales.index(s)].view_queries(chunk) for s in distinct]
                queries = [torch.stack(parts, dim=1)[:, of_cache] for parts in zip(*per_scale)]   # each [c, H, ...]
            yield from zip(*queries)
        return
    # Each scale's caches' samples of a chunk of steps in one view pass (chunked as TDA chunks its stream).
    members = [torch.nonzero(of_cache == s).flatten() for s in range(len(distinct))]
    position = torch.empty(len(caches), dtype=torch.int64, device=features.device)
    for rows in members:
        position[rows] = torch.arange(rows.shape[0], device=features.device)
    step = max(1, view_chunk(features, E.shape[0]) // len(caches))
    for start in range(0, orders.shape[1], step):
        with timer("logits"):
            parts = []
            for s, rows in enumerate(members):
                index_block = orders[rows, start:start + step]                              # [H_s, c]
                q = caches[int(rows[0])].view_queries(features[index_block.reshape(-1)])
                parts.append([t.reshape(*index_block.shape, *t.shape[1:]) for t in q])     # each [H_s, c, ...]
            queries = [torch.stack([parts[s][j][position[h]] for h, s in enumerate(index)], dim=1)
                       for j in range(5)]                                                   # each [c, H, ...]
        yield from zip(*queries)


@per_card
@takes_orders(single=True, views=True)
def run_tda_lockstep(methods: list[Method], features: torch.Tensor, *, fused: bool | None = None,
                     orders: torch.Tensor | None = None) -> list[Trace]:
    """G TDA (or G TDA+PA) streams over one feature stream, [n, d] or views [n, V, d], or stream g =
    features[orders[g]]; trace g equals `methods[g].run(stream g)`. fused: TDA+PA's prior walk compiled
    (`_Prior`; the default on a CPU)."""
    half = [g for g, m in enumerate(methods) if m.hp.get("state_dtype") == "float16"]
    if half:
        # the shared caches below are float32; a float16 config (tda only) runs its own per-sample loop
        fast = [g for g in range(len(methods)) if g not in half]
        traces: list[Trace | None] = [None] * len(methods)
        if fast:
            gather_members(traces, fast, run_tda_lockstep([methods[g] for g in fast], features, fused=fused,
                                                          orders=None if orders is None else orders[fast]))
        for g in half:
            traces[g] = methods[g].run(features if orders is None else features[orders[g]])
        return traces  # type: ignore[return-value]
    first = methods[0]
    validate_features(first.name, features, first.class_embeddings, views=None)
    if features.ndim == 3 and features.shape[1] == 1:
        features = features[:, 0]
    class_ids, K = first.class_ids, first.num_classes
    device, d, G = features.device, features.shape[-1], len(methods)
    n = features.shape[0] if orders is None else orders.shape[1]
    with_prior = first.with_prior
    # A cache: one per distinct (order, cache triple); `order_of` numbers the distinct order rows.
    order_of = [0] * G if orders is None else torch.unique(orders, dim=0, return_inverse=True)[1].tolist()
    triples = [(o, m.hp["logit_scale"], m.hp["pos_shot"], m.hp["neg_shot"]) for o, m in zip(order_of, methods)]
    distinct, index = group_by(triples)
    group = torch.tensor(index, dtype=torch.int64, device=device)
    members = [torch.nonzero(group == h).flatten() for h in range(len(distinct))]
    pos = LockstepCaches([t[2] for t in distinct], K, d, device, with_values=False)
    neg = LockstepCaches([t[3] for t in distinct], K, d, device, with_values=True)
    pos_alpha, pos_beta, neg_alpha, neg_beta = (column(methods, k, torch.float32, device)
                                                for k in ("pos_alpha", "pos_beta", "neg_alpha", "neg_beta"))
    streams = torch.arange(G, device=device)
    if with_prior:
        prior = _Prior(methods, TDA_PRIOR_BLOCK, device.type == "cpu" if fused is None else fused)
        tau = column(methods, "tau", torch.float64, device).flatten()
    posteriors = torch.zeros(G, n, K, dtype=torch.float32, device=device)
    selected = torch.full((G, n), -1, dtype=torch.int64, device=device)
    gated = torch.zeros(G, n, dtype=torch.bool, device=device)
    gated_prior = torch.zeros(G, n, dtype=torch.bool, device=device)
    lo_entropy, hi_entropy = NEG_ENTROPY_BOUNDS
    lo_mask, hi_mask = NEG_MASK_BOUNDS
    log2_k = math.log2(K)
    always = torch.ones(len(distinct), dtype=torch.bool, device=device)
    timer = StageTimer()
    heads = [triples.index(t) for t in distinct]
    queries = _queries([methods[g] for g in heads], features, timer, None if orders is None else orders[heads])
    for i, (f, logits, clip_logits, prob_map, loss) in enumerate(queries):
        with timer("logits"):
            entropy = loss / log2_k
            pred = torch.argmax(clip_logits, dim=1)
        with timer("update"):
            entered = pos.offer(i, always, pred, loss, f)
            band = (entropy.double() > lo_entropy) & (entropy.double() < hi_entropy)  # as tda's Python floats
            mask = ((prob_map > lo_mask) & (prob_map < hi_mask)).float()
            entered = neg.offer(i, band, pred, loss, f, mask) | entered
            gated[:, i] = entered[group]
        with timer("logits"):
            w_pos = pos.weights(f, pos_beta, group)
            positive = pos.class_sums(w_pos, group)[:, :K]
            negative = neg.value_sums(neg.weights(f, neg_beta, group), members)
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
    timings = split_timings(timer, G)
    # The streams of one cache share its final state (one copy per cache).
    caches = [{**pos.state(h, t[2], "pos"), **neg.state(h, t[3], "neg")} for h, t in enumerate(distinct)]
    traces = []
    for g in range(G):
        state = dict(caches[int(group[g])])
        if with_prior:
            state.update(V=prior.V[g], C2=prior.C2[g])       # views: nothing changes them after the run
        traces.append(Trace(posteriors[g], selected[g], gated[g], gated_prior[g], state=state,
                            timings=dict(timings)))
    return traces
