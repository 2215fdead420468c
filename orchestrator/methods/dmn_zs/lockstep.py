"""DMN-ZS in lockstep. A memory is a function of (logit_scale, the number of views keep keeps, memory_size) alone
(its writes follow the text posteriors of the views), so each distinct triple keeps one (`DMNZeroShot.observe`
on its first stream) and its streams read it with their own beta, then mix with their own memory_weight. The
read-out normalize(read_k) . x0, read_k = tw_k t_k + sum_j mw_kj m_kj, needs no G x K x d read vectors:
read_k . x0 comes from the entries' products with x0, and |read_k|^2 from each class's Gram matrix of its
entries and their products with t_k (kept in float64, recomputed for the written class each sample), so a step
costs K depth d once per memory plus G K depth^2, not G K depth d.
"""

from __future__ import annotations

import torch

from orchestrator.methods.base import Method, StageTimer, Trace, validate_features
from orchestrator.methods.lockstep import column, group_by, split_timings
from orchestrator.methods.views import kept_count


def run_dmn_lockstep(methods: list[Method], features: torch.Tensor) -> list[Trace]:
    """G DMN-ZS streams over one stream of views [n, V, d]; trace g equals `methods[g].run(features)`."""
    first = methods[0]
    validate_features(first.name, features, first.class_embeddings, views=True)
    n, G, K, device = features.shape[0], len(methods), first.num_classes, features.device
    views = features.shape[1]
    # keep matters through the number of views it keeps (DMNZeroShot.observe), so streams group by that count.
    keys = [(m.hp["logit_scale"], kept_count(views, m.hp["keep"]), m.hp["memory_size"]) for m in methods]
    distinct, index = group_by(keys)
    writers = [methods[index.index(h)] for h in range(len(distinct))]     # each memory's first stream keeps it
    members = [torch.tensor([g for g, h in enumerate(index) if h == memory], device=device)
               for memory in range(len(distinct))]
    betas = [column([methods[int(g)] for g in rows], "beta", torch.float32, device)[:, :, None]
             for rows in members]
    weight64 = column(methods, "memory_weight", torch.float64, device)
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
    timings = split_timings(timer, G)
    # The streams of one memory share its final state (one copy of K x memory_size x d per memory).
    states = [{"memory": w.memory.clone(), "memory_entropy": w.entropy.clone(), "memory_count": w.count.clone()}
              for w in writers]
    state_of = {int(g): state for state, rows in zip(states, members) for g in rows}
    return [Trace(posteriors[g], selected[g], gated[g], torch.zeros(n, dtype=torch.bool, device=device),
                  state=dict(state_of[g]), timings=dict(timings)) for g in range(G)]
