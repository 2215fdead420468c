"""A plain per-sample transcription of COSMIC's official inference loop (hf618/COSMIC cosmic_main.py
direct_inference with the scripts' flags; utils/DualMems.py, utils/utils_cosmic.py), in float64, for the tests:
the caches as the official dicts of lists, the graph's maximal cliques by a plain Bron-Kerbosch enumeration (not
networkx), the bisection run for all its 500 steps. Returns the unnormalised fused scores z of every sample (the
method's posterior is z / sum z) and each sample's pseudo-label."""

from __future__ import annotations

import math
import operator

import torch


def _avg_entropy(outputs: torch.Tensor) -> torch.Tensor:
    logits = outputs - outputs.logsumexp(dim=-1, keepdim=True)
    avg = logits.logsumexp(dim=0) - math.log(logits.shape[0])
    avg = torch.clamp(avg, min=torch.finfo(avg.dtype).min)
    return -(avg * torch.exp(avg)).sum(dim=-1)


def _maximal_cliques(adj: list[set[int]]) -> list[list[int]]:
    out: list[list[int]] = []

    def expand(r: set[int], p: set[int], x: set[int]) -> None:
        if not p and not x:
            out.append(sorted(r))
        for v in sorted(p):
            expand(r | {v}, p & adj[v], x & adj[v])
            p = p - {v}
            x = x | {v}

    expand(set(), set(range(len(adj))), set())
    return out


def _make_max_cliques(feats: torch.Tensor, target: float) -> tuple[list[list[int]], torch.Tensor]:
    # The graph thresholds similarities that tie (an empty class's prototype is its text embedding), so the
    # similarities are those of the float32 nodes, as the method (and the official fp16 code) rounds them: a
    # float64 product would break the ties by rounding noise of 1e-16.
    sim = (feats.float() @ feats.float().T).double()
    n = sim.shape[0]
    low, high = sim.min().item(), sim.max().item()
    reached = False
    for _ in range(500):
        mid = (low + high) / 2
        adj = (sim > mid).double()
        adj.fill_diagonal_(0)
        degree = adj.sum() / n
        if abs(degree - target) < 1e-2:
            reached = True
            break
        elif degree < target:
            high = mid
        else:
            low = mid
    if not reached:  # closed on a jump of the degree: the sparser side (the method's documented choice)
        adj = (sim > high).double()
        adj.fill_diagonal_(0)
    adj = ((adj * (adj @ adj)) > 1).double()
    cliques = _maximal_cliques([set(torch.nonzero(adj[i]).flatten().tolist()) for i in range(n)])
    return cliques, torch.stack([feats[c].mean(0) for c in cliques])


def _clique_logits(f: torch.Tensor, anchors: torch.Tensor, target: torch.Tensor, cliques: list[list[int]],
                   r: float, alpha: float, beta: float) -> torch.Tensor:
    top = max(1, int(len(cliques) * r))
    idx = torch.topk(anchors @ f, k=top).indices
    relevant = sorted({node for c in idx.tolist() for node in cliques[c]})
    out = torch.zeros(target.shape[0], dtype=torch.float64)
    for j in relevant:
        out[j] = alpha * math.exp(-(beta - beta * float(target[j] @ f)))
    return out


def cosmic_reference(views: torch.Tensor, dino: torch.Tensor, text: torch.Tensor, *, memory_size: int,
                     dino_shot: int, beta: float, keep: float, clique_alpha: float, clique_beta: float, ratio: float,
                     clip_degree: float, dino_degree: float, mac_step: int, clip_clique_weight: float,
                     dino_clique_weight: float, logit_scale: float) -> tuple[torch.Tensor, list[int]]:
    views, dino, text = views.double(), dino.double(), text.double()
    K, d = text.shape
    memory = torch.zeros(K, memory_size, d, dtype=torch.float64)
    mem_entropy = torch.zeros(K, memory_size, dtype=torch.float64)
    mem_count = [0] * K
    dino_cache: dict[int, list] = {}
    scores, labels = [], []
    graph1 = graph2 = None
    for i in range(views.shape[0]):
        x = views[i]
        img_text = torch.softmax(logit_scale * x @ text.T, dim=-1)
        ent = -(img_text * torch.log(img_text + 1e-6)).sum(1)
        n_select = max(1, int(x.shape[0] * keep))
        selected = sorted(range(x.shape[0]), key=lambda v: float(ent[v]))[:n_select]
        mean_prob = img_text[selected].mean(0)
        y = int(mean_prob.argmax())
        labels.append(y)
        h = -(mean_prob * torch.log(mean_prob + 1e-8)).sum()
        feat = x[selected].mean(0)
        # update_memory_bank
        clip_updated = False
        if mem_count[y] == memory_size:
            if bool((h < mem_entropy[y]).any()):
                worst = max(range(memory_size), key=lambda s: (float(mem_entropy[y, s]), s))
                memory[y, worst], mem_entropy[y, worst] = feat, h
                clip_updated = True
        else:
            memory[y, mem_count[y]], mem_entropy[y, mem_count[y]] = feat, h
            mem_count[y] += 1
            clip_updated = True
        # get_image_pred, center_type_clip attn, position all
        mem = torch.cat([memory, text[:, None]], dim=1)
        keys = mem / mem.norm(dim=-1, keepdim=True)
        keys[mem.sum(-1) == 0] = 0
        f = x[0] / x[0].norm()
        weights = torch.exp(-beta * (-(f * keys).sum(-1) + 1))
        adaptive = (keys * weights[..., None]).sum(1)
        adaptive = adaptive / adaptive.norm(dim=-1, keepdim=True)
        img_global = torch.softmax(logit_scale * adaptive @ x[0], dim=0)
        temp = img_text[0] + img_global
        loss = _avg_entropy(temp[None])
        pred = int(temp.argmax())
        # update_cache on the DINOv2 cache
        g = dino[i]
        dino_updated = False
        if pred in dino_cache:
            if len(dino_cache[pred]) < dino_shot:
                dino_cache[pred].append([g, loss])
                dino_updated = True
            elif loss < dino_cache[pred][-1][1]:
                dino_cache[pred][-1] = [g, loss]
                dino_updated = True
            dino_cache[pred] = sorted(dino_cache[pred], key=operator.itemgetter(1))
        else:
            dino_cache[pred] = [[g, loss]]
            dino_updated = True
        # the cliques
        space1 = torch.cat([text, adaptive])
        if (i % mac_step == 0 and i > K * memory_size) or (clip_updated and i <= K * memory_size):
            graph1 = _make_max_cliques(space1, clip_degree)
        prototypes = torch.zeros(K, dino.shape[1], dtype=torch.float64)
        for k, items in dino_cache.items():
            prototypes[k] = torch.stack([item[0] for item in items]).mean(0)
        if (i % mac_step == 0 and i > K * dino_shot) or (dino_updated and i <= K * dino_shot):
            graph2 = _make_max_cliques(prototypes, dino_degree)
        m1 = _clique_logits(x[0], graph1[1], space1, graph1[0], ratio, clique_alpha, clique_beta)
        m1 = (m1[:K] + m1[K:]) / 2
        m2 = _clique_logits(g, graph2[1], prototypes, graph2[0], ratio, clique_alpha, clique_beta)
        scores.append(img_text[0] + clip_clique_weight * m1 + dino_clique_weight * m2)
    return torch.stack(scores), labels
