"""kdiAAA/TDA's per-sample loop as its public code runs it, in float32 or in the public code's float16: the
reference that tests (tests/test_tda.py) and the benchmarks (`benchmarks.methods`' "official" column) compare
`tda` against. Caches are dicts of Python lists, kept sorted by loss, and every sample's cache logits come from
freshly stacked keys, as in the public code; nothing here is fast.
"""

from __future__ import annotations

import math

import torch

from orchestrator.methods.numerics import product  # a float16 product as a GPU computes it


def official_tda(views: torch.Tensor, weights: torch.Tensor, hp: dict,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, dict, dict]:
    """The public code (kdiAAA/TDA: utils.get_clip_logits, tda_runner.run_test_tda / update_cache /
    compute_cache_logits) in `dtype` (float16: the public code's half model, its inputs rounded) over
    per-sample views [n, V, d], one embedding per class ([K, d]): (final posteriors [n, K], the float32 softmax
    of the final logits; positive cache; negative cache) with caches {class: [[f, loss(, prob_map)]]}, loss a
    0-d tensor of `dtype` as the public code keeps it."""
    views, weights = views.to(dtype), weights.to(dtype)
    num_classes = weights.shape[0]
    pos, neg, out = {}, {}, []

    def update(cache, pred, item, shot):
        if pred in cache:
            if len(cache[pred]) < shot:
                cache[pred].append(item)
            elif item[1] < cache[pred][-1][1]:
                cache[pred][-1] = item
            cache[pred] = sorted(cache[pred], key=lambda entry: entry[1])
        else:
            cache[pred] = [item]

    def cache_logits(f, cache, alpha, beta, negative):
        keys = torch.stack([e[0] for c in sorted(cache) for e in cache[c]]).T
        if negative:
            values = torch.stack([e[2] for c in sorted(cache) for e in cache[c]])
            values = ((values > 0.03) & (values < 1.0)).to(dtype)
        else:
            values = torch.nn.functional.one_hot(torch.tensor([c for c in sorted(cache) for _ in cache[c]], device=f.device),
                                                 num_classes).to(dtype)
        return alpha * product(((-1) * (beta - beta * product(f, keys))).exp(), values)

    for sample in views:
        logits = product(hp["logit_scale"] * sample, weights.T)
        if sample.shape[0] > 1:
            entropy = -(logits.softmax(1) * logits.log_softmax(1)).sum(1)
            output = logits[torch.argsort(entropy, stable=True)[:int(sample.shape[0] * 0.1)]]
            f = sample[torch.argsort(entropy, stable=True)[:int(sample.shape[0] * 0.1)]].mean(0)
            clip_logits = output.mean(0)
            log_p = output - output.logsumexp(dim=-1, keepdim=True)
            avg = torch.clamp(log_p.logsumexp(dim=0) - math.log(log_p.shape[0]), min=torch.finfo(dtype).min)
            loss = -(avg * avg.exp()).sum()
            prob_map = output.softmax(1).mean(0)
        else:
            f, clip_logits = sample[0], logits[0]
            loss = -(clip_logits.softmax(0) * clip_logits.log_softmax(0)).sum()
            prob_map = clip_logits.softmax(0)
        pred = int(clip_logits.argmax())
        update(pos, pred, [f, loss], hp["pos_shot"])
        if 0.2 < float(loss / math.log2(num_classes)) < 0.5:   # utils.get_entropy: the division in the loss's dtype
            update(neg, pred, [f, loss, prob_map], hp["neg_shot"])
        final = clip_logits.clone()
        if pos:
            final += cache_logits(f, pos, hp["pos_alpha"], hp["pos_beta"], False)
        if neg:
            final -= cache_logits(f, neg, hp["neg_alpha"], hp["neg_beta"], True)
        out.append(final.float().softmax(0))
    return torch.stack(out), pos, neg
