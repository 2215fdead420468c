"""DMN-ZS in lockstep. A memory is a function of (logit_scale, the number of views keep keeps, memory_size) alone
(its writes follow the text posteriors of the views), and over stream orders (orders [G, n]: stream g is
features[orders[g]]) of the order it reads: so each distinct (order, triple) keeps one, and the H memories
step together, [H, K, S, d] (S the largest memory_size; a smaller memory's extra slots stay empty). A step
scores each memory's sample, chooses its pseudo-label and writes it as `DMNZeroShot.observe` and `_write` do,
for all memories at once. The streams of a memory read it with their own beta, then mix with their own
memory_weight. The read-out normalize(read_k) . x0, read_k = tw_k t_k + sum_j mw_kj m_kj, needs no G x K x d
read vectors: read_k . x0 comes from the entries' products with x0, and |read_k|^2 from each class's Gram
matrix of its entries and their products with t_k (kept in float64, recomputed for the written class each
sample), so a step costs K depth d once per memory plus G K depth^2, not G K depth d. The streams are laid out
as a table [H, R] of each memory's R readers (a memory with fewer repeats its first), so that a step reads
every memory's Gram matrices in place. A step reads the slots up to the fullest class of any memory; the
empty ones (zero rows) add exact zeros to every sum, as in the single-stream read-out over its fullest class.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from orchestrator.methods.base import Method, StageTimer, Trace, validate_features
from orchestrator.methods.lockstep import group_by, split_timings, takes_orders
from orchestrator.methods.views import kept_count


def _tensor(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


@takes_orders(single=True, views=True)
def run_dmn_lockstep(methods: list[Method], features: torch.Tensor,
                     orders: torch.Tensor | None = None) -> list[Trace]:
    """G DMN-ZS streams over one stream of views [n, V, d], or stream g = features[orders[g]]; trace g equals
    `methods[g].run(stream g)`."""
    first = methods[0]
    validate_features(first.name, features, first.class_embeddings, views=True)
    G, K, device = len(methods), first.num_classes, features.device
    (_, V, d) = features.shape
    n = features.shape[0] if orders is None else orders.shape[1]
    order_of = [0] * G if orders is None else torch.unique(orders, dim=0, return_inverse=True)[1].tolist()
    # keep matters through the number of views it keeps (DMNZeroShot.observe), so streams group by that count.
    keys = [(o, m.hp["logit_scale"], kept_count(V, m.hp["keep"]), m.hp["memory_size"])
            for o, m in zip(order_of, methods)]
    distinct, index = group_by(keys)
    H = len(distinct)
    readers = [[g for g, h in enumerate(index) if h == memory] for memory in range(H)]
    R = max(len(rows) for rows in readers)
    table = _tensor([rows + rows[:1] * (R - len(rows)) for rows in readers], torch.int64, device)   # [H, R]
    heads = table[:, 0]
    f32, f64 = torch.float32, torch.float64
    scale = _tensor([key[1] for key in distinct], f32, device)                           # [H]
    kept = _tensor([key[2] for key in distinct], torch.int64, device)
    size = _tensor([key[3] for key in distinct], torch.int64, device)
    S = int(size.max())
    beta = _tensor([m.hp["beta"] for m in methods], f32, device)[table]                 # [H, R]
    read_scale = scale[:, None, None]
    weight64 = _tensor([m.hp["memory_weight"] for m in methods], f64, device)[table][..., None]
    weight, denominator = weight64.float(), (1.0 + weight64).float()                     # as the loop's Python floats
    text = first.text
    text_sq = (text.double() ** 2).sum(dim=1)
    memory = torch.zeros(H, K, S, d, dtype=f32, device=device)
    entropy_mem = torch.zeros(H, K, S, dtype=f32, device=device)
    count = torch.zeros(H, K, dtype=torch.int64, device=device)
    beyond = torch.arange(S, device=device)[None, :] >= size[:, None]                    # [H, S]: no such slot
    # Per memory, in float64: each class's entries' Gram matrix and their products with its text prototype.
    gram = torch.zeros(H, K, S, S, dtype=f64, device=device)
    cross = torch.zeros(H, K, S, dtype=f64, device=device)
    memories = torch.arange(H, device=device)
    rank = torch.arange(V, device=device)[None, :, None]
    posteriors = torch.zeros(G, n, K, dtype=f32, device=device)
    selected = torch.full((G, n), -1, dtype=torch.int64, device=device)
    gated = torch.zeros(G, n, dtype=torch.bool, device=device)
    rows_of = None if orders is None else orders[heads]
    depth = 0
    timer = StageTimer()
    for i in range(n):
        X = features[i].expand(H, V, d) if rows_of is None else features[rows_of[:, i]]  # each memory's sample
        x0 = X[:, 0]
        with timer("logits"):  # observe: the views' text posteriors, the pseudo-label from the kept views
            probs = torch.softmax((scale[:, None, None] * X) @ text.T, dim=-1)           # [H, V, K]
            entropy = -(probs * torch.log(probs + 1e-6)).sum(-1)
            ranked = torch.gather(probs, 1, torch.argsort(entropy, dim=1, stable=True)[..., None].expand(-1, -1, K))
            mean_prob = torch.where(rank < kept[:, None, None], ranked, 0.0).sum(1) / kept[:, None]
            label = mean_prob.argmax(dim=1)
            h = -(mean_prob * torch.log(mean_prob + 1e-8)).sum(-1)
        with timer("update"):  # _write: append while there is room, else replace the last highest entropy
            c = count[memories, label]
            room = c < size
            row = entropy_mem[memories, label].masked_fill(beyond, -torch.inf)
            highest = row.max(dim=1).values
            last = S - 1 - row.flip(1).argmax(dim=1)
            written = room | (h < highest)
            slot = torch.where(room, c, last)
            at = (memories, label, slot)
            memory[at] = torch.where(written[:, None], F.normalize(x0, dim=-1), memory[at])
            entropy_mem[at] = torch.where(written, h, entropy_mem[at])
            count[memories, label] = c + room
            depth = max(depth, int((c + room).max()))  # the fullest class of any memory: a step reads that many
            entries = memory[memories, label].double()                                  # the written class's rows
            gram[memories, label] = entries @ entries.transpose(1, 2)
            cross[memories, label] = (entries @ text[label].double()[..., None])[..., 0]
        with timer("posterior"):
            query = F.normalize(x0, dim=-1)
            held = memory[:, :, :depth]                                                  # [H, K, depth, d]
            both = held @ torch.stack([query, x0], dim=2)[:, None]                       # [H, K, depth, 2]
            text_weight = torch.exp(-beta[..., None] * (1.0 - (query @ text.T)[:, None])).double()   # [H, R, K]
            memory_weight = torch.exp(-beta[..., None, None] * (1.0 - both[:, None, ..., 0])).double()
            # read_k = tw t_k + sum_j mw_j m_kj; its product with x0 and its norm from the Gram matrices.
            along = text_weight * (x0 @ text.T).double()[:, None] \
                + (memory_weight * both[:, None, ..., 1].double()).sum(-1)
            quad = torch.einsum("hrkj,hkjl,hrkl->hrk", memory_weight, gram[..., :depth, :depth], memory_weight)
            sq = text_weight ** 2 * text_sq + 2.0 * text_weight * (memory_weight * cross[:, None, :, :depth]).sum(-1) \
                + quad
            cosine = (along / sq.sqrt().clamp(min=1e-12)).float()
            p_memory = torch.softmax(read_scale * cosine, dim=-1)
            # a memory's repeated first reader writes its own values again
            posteriors[table, i] = (probs[:, None, 0] + weight * p_memory) / denominator
        selected[table, i] = label[:, None].expand(-1, R)
        gated[table, i] = written[:, None].expand(-1, R)
    timings = split_timings(timer, G)
    # The streams of one memory share its final state (one copy of K x memory_size x d per memory).
    states = [{"memory": memory[h, :, :key[3]].clone(), "memory_entropy": entropy_mem[h, :, :key[3]].clone(),
               "memory_count": count[h].clone()} for h, key in enumerate(distinct)]
    return [Trace(posteriors[g], selected[g], gated[g], torch.zeros(n, dtype=torch.bool, device=device),
                  state=dict(states[index[g]]), timings=dict(timings)) for g in range(G)]
