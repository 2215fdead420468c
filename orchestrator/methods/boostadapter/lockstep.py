"""BoostAdapter in lockstep. What a stream keeps is TDA's two caches, and what fills them is its query (f, l, H,
mask), a function of (logit_scale, query, and with query='confident' the number of views keep keeps) alone:
so each distinct query is computed once (`boostadapter.queries`, a chunk at a time as the method does), the
positive caches are one per distinct (query, pos_shot) and the negative ones one per (query, neg_shot), in
`caches.LockstepCaches` (the negative ones in its FIFO mode), and the G streams read theirs with their own alpha / beta.
Over stream orders (orders [G, n]: stream g is features[orders[g]]) a query is also one order's: each chunk
scores every distinct order's samples of the chunk, and the steps advance the caches of all orders together.

The boosting cache is never kept. A stream's boosting views depend on (logit_scale, the number of views keep
keeps), so they come with its query's chunk too, and only the classes they predict differ from TDA's plain
positive sum. For such a class c the single-stream method sorts [its kept entries in rank order, then its
boosting views in increasing entropy] stably by entropy and sums the first pos_shot + delta. Here every
stream's boosted classes are handled at once by counting ranks: a kept entry of c is summed when its rank
among c's kept entries (by loss, then age: the kept order) plus the boosting views of c with a strictly
lower entropy is below the capacity; a boosting view of c when the kept entries of c with a loss at most
its entropy plus the earlier boosting views of c number fewer than the capacity. Those are the entries
ahead of each in the stable sort, so the two break ties as the single-stream sort does.
"""

from __future__ import annotations

import math

import torch

from orchestrator.methods.base import Method, StageTimer, Trace, validate_features
from orchestrator.methods.boostadapter.method import QUERY_CHUNK, queries, score_views
from orchestrator.methods.lockstep import column, group_by, split_timings, takes_orders
from orchestrator.methods.caches import LockstepCaches
from orchestrator.methods.tda.method import NEG_ENTROPY_BOUNDS


def _boosted(pos: LockstepCaches, cache: torch.Tensor, w_pos: torch.Tensor, boost_class: torch.Tensor,
             boost_entropy: torch.Tensor, w_boost: torch.Tensor, capacity: torch.Tensor,
             K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per stream g and boosting view j [G, B] (class K: no view; entropies increasing along j): the boosting
    cache's sum for the view's class, and where to write it (the class at its first view, K elsewhere).
    cache [G]: each stream's positive cache; w_pos [G, used] its entries' weights by pool row; w_boost [G, B]
    the views' weights; capacity [G, 1] = pos_shot + delta."""
    valid = boost_class < K
    cls = boost_class.clamp(max=K - 1)
    at = (cache[:, None], cls)
    loss, age, pool = pos.slot_loss[at], pos.slot_time[at], pos.slot_pool[at]   # [G, B, S]: the class's kept slots
    filled = pos.slots < pos.count[at][..., None]
    # A kept entry's rank among its class's kept entries: those with a lower loss, or an equal one and older.
    ahead = (loss[..., None, :] < loss[..., :, None]) | ((loss[..., None, :] == loss[..., :, None])
                                                         & (age[..., None, :] < age[..., :, None]))
    rank = (ahead & filled[..., None, :]).sum(dim=-1)
    same = (boost_class[:, :, None] == boost_class[:, None, :]) & valid[:, :, None]     # [G, B, B]
    earlier = torch.ones(same.shape[1:], dtype=torch.bool, device=same.device).tril(diagonal=-1)
    pushed = (same[:, :, None, :] & (boost_entropy[:, None, None, :] < loss[..., None])).sum(dim=-1)
    kept_in = filled & (rank + pushed < capacity[..., None])
    kept_weights = w_pos.gather(1, pool.flatten(1)).view(pool.shape)
    kept_sum = torch.where(kept_in, kept_weights, 0.0).sum(dim=-1)                    # [G, B]
    before = (filled & (loss <= boost_entropy[..., None])).sum(dim=-1) + (same & earlier).sum(dim=-1)
    boost_in = valid & (before < capacity)
    boost_sum = (same.float() @ torch.where(boost_in, w_boost, 0.0)[..., None])[..., 0]
    first = valid & ~(same & earlier).any(dim=-1)
    return kept_sum + boost_sum, torch.where(first, boost_class, K)


@takes_orders(single=True, views=True)
def run_boostadapter_lockstep(methods: list[Method], features: torch.Tensor,
                              orders: torch.Tensor | None = None) -> list[Trace]:
    """G BoostAdapter streams over one stream of views [n, V, d], or stream g = features[orders[g]]; trace g
    equals `methods[g].run(stream g)`."""
    first = methods[0]
    validate_features(first.name, features, first.class_embeddings, views=True)
    (_, V, d), G, K, device = features.shape, len(methods), first.num_classes, features.device
    n = features.shape[0] if orders is None else orders.shape[1]
    for method in methods:
        method.check_views(V)
    # Over orders every group below is also one order's: `order_of` numbers a stream's distinct order row.
    rows_of, order_of = None, [0] * G
    if orders is not None:
        rows_of, inverse = torch.unique(orders, dim=0, return_inverse=True)
        order_of = inverse.tolist()
    # With one view the query is view 0 whatever `query` says (boostadapter.queries).
    modes = ["confident" if V > 1 and m.hp["query"] == "confident" else "original" for m in methods]
    counts = [int(V * m.hp["keep"]) for m in methods]
    view_keys, view_of = group_by([(o, m.hp["logit_scale"], mode, c)
                                   for o, m, mode, c in zip(order_of, methods, modes, counts)])
    query_keys, query_of = group_by([(o, m.hp["logit_scale"], mode, c if mode == "confident" else 0)
                                     for o, m, mode, c in zip(order_of, methods, modes, counts)])
    pos_keys, pos_of = group_by([(q, m.hp["pos_shot"]) for q, m in zip(query_of, methods)])
    neg_keys, neg_of = group_by([(q, m.hp["neg_shot"]) for q, m in zip(query_of, methods)])
    reps = [methods[view_of.index(v)].hp for v in range(len(view_keys))]     # one stream's hparams per view group
    scales, scale_of = group_by([(o, scale) for o, scale, _, _ in view_keys])  # views scored once per (order, scale)
    query_view = [view_of[query_of.index(q)] for q in range(len(query_keys))]  # a view group computing each query
    view_group, query_group, pos_group, neg_group = (torch.tensor(index, device=device)
                                                     for index in (view_of, query_of, pos_of, neg_of))
    pos_query = torch.tensor([q for q, _ in pos_keys], device=device)
    neg_query = torch.tensor([q for q, _ in neg_keys], device=device)
    pos = LockstepCaches([shot for _, shot in pos_keys], K, d, device, with_values=False)
    neg = LockstepCaches([shot for _, shot in neg_keys], K, d, device, with_values=True, fifo=True)
    members = [torch.nonzero(neg_group == h).flatten() for h in range(len(neg_keys))]
    B = max(k[3] for k in view_keys)
    pos_alpha, pos_beta, neg_alpha, neg_beta = (column(methods, k, torch.float32, device)
                                                for k in ("pos_alpha", "pos_beta", "neg_alpha", "neg_beta"))
    capacity = torch.tensor([[m.hp["pos_shot"] + m.hp["delta"]] for m in methods], device=device)
    posteriors = torch.zeros(G, n, K, dtype=torch.float32, device=device)
    gated = torch.zeros(G, n, dtype=torch.bool, device=device)
    lo_entropy, hi_entropy = NEG_ENTROPY_BOUNDS
    log2_k = math.log2(K)
    always = torch.ones(len(pos_keys), dtype=torch.bool, device=device)
    text = first.text
    timer = StageTimer()
    for start in range(0, n, QUERY_CHUNK):
        with timer("logits"):
            if rows_of is None:
                blocks = [features[start:start + QUERY_CHUNK]]
            else:  # each order's chunk, as its single stream chunks features[order]
                blocks = [features[row[start:start + QUERY_CHUNK]] for row in rows_of]
            c = blocks[0].shape[0]
            scored = [score_views(blocks[o], text, scale) for o, scale in scales]
            chunk = [queries(scored[scale_of[v]], hp) for v, hp in enumerate(reps)]
            f, logits, entropy, mask = (torch.stack([getattr(chunk[v], name) for v in query_view])
                                        for name in ("feature", "logits", "entropy", "mask"))      # [Q, c, ...]
            pred = logits.argmax(dim=-1)
            band = entropy.double() / log2_k                                 # as the method's Python floats
            band = (band > lo_entropy) & (band < hi_entropy)
            # What each cache is offered and each stream reads, [H or G, c, ...]: a step takes column j.
            pos_offers = (pred[pos_query], entropy[pos_query], f[pos_query])
            neg_offers = (band[neg_query], pred[neg_query], entropy[neg_query], f[neg_query], mask[neg_query])
            pos_f, neg_f, stream_logits = f[pos_query], f[neg_query], logits[query_group]
            if B:
                # Each view group's boosting views, padded to B (class K: none), and their affinities to the query.
                boost_class = torch.full((len(reps), c, B), K, dtype=torch.int64, device=device)
                boost_entropy = torch.full((len(reps), c, B), math.inf, dtype=torch.float32, device=device)
                boost_affinity = torch.zeros(len(reps), c, B, dtype=torch.float32, device=device)
                for v, x in enumerate(chunk):
                    b = x.boost_class.shape[1]
                    boost_class[v, :, :b], boost_entropy[v, :, :b] = x.boost_class, x.boost_entropy
                    boost_affinity[v, :, :b] = (x.boost_feature @ x.feature[..., None])[..., 0]
                boost_class, boost_entropy, boost_affinity = (x[view_group] for x in
                                                              (boost_class, boost_entropy, boost_affinity))
        for j in range(c):
            i = start + j
            with timer("update"):
                entered = pos.offer(i, always, *(x[:, j] for x in pos_offers))[pos_group]
                entered |= neg.offer(i, *(x[:, j] for x in neg_offers))[neg_group]
                gated[:, i] = entered
            with timer("logits"):
                w_pos = pos.weights(pos_f[:, j], pos_beta, pos_group)
                positive = pos.class_sums(w_pos, pos_group)
                if B:
                    w_boost = torch.exp(-1.0 * (pos_beta - pos_beta * boost_affinity[:, j]))
                    sums, where = _boosted(pos, pos_group, w_pos, boost_class[:, j], boost_entropy[:, j], w_boost,
                                           capacity, K)
                    positive.scatter_(1, where, sums)
                negative = neg.value_sums(neg.weights(neg_f[:, j], neg_beta, neg_group), members)
                adjustment = pos_alpha * positive[:, :K] - neg_alpha * negative
            with timer("posterior"):
                posteriors[:, i] = torch.softmax(stream_logits[:, j] + adjustment, dim=1)
    timings = split_timings(timer, G)
    # The streams of one cache share its final state (one copy per cache).
    pos_states = [pos.state(h, shot, "pos") for h, (_, shot) in enumerate(pos_keys)]
    neg_states = [neg.state(h, shot, "neg") for h, (_, shot) in enumerate(neg_keys)]
    none = torch.full((n,), -1, dtype=torch.int64, device=device)
    off = torch.zeros(n, dtype=torch.bool, device=device)
    return [Trace(posteriors[g], none.clone(), gated[g], off.clone(),
                  state={**pos_states[int(pos_group[g])], **neg_states[int(neg_group[g])]}, timings=dict(timings))
            for g in range(G)]
