"""taolinzhang/BoostAdapter's per-sample loop (runner.py run_test_tda in boostadapter mode, with utils.py
get_clip_logits and the cache updates), transcribed one sample at a time: the reference that tests/test_boostadapter.py
holds `boostadapter` to and `benchmarks.methods`' "official" column times. Caches are dicts of Python lists, every
sample's cache logits come from freshly stacked keys, as in the public code; nothing here is fast.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis (numpy)."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def entropy(p: np.ndarray) -> np.ndarray:
    # 0 log 0 = 0, as the code's softmax * log_softmax gives where a probability underflows (float32)
    return -(p * np.log(p, out=np.zeros_like(p), where=p > 0)).sum(axis=-1)


def official_boostadapter(views: torch.Tensor, text: torch.Tensor, *, pos_alpha=2.0, pos_beta=5.0, neg_alpha=0.117,
                          neg_beta=1.0, pos_shot=3, neg_shot=2, delta=0, keep=0.1, infer_ori_image=True,
                          boost=True, logit_scale=100.0,
                          dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, dict]:
    """Logits [n, K] of the official run_test_tda (boostadapter mode) over views [n, V, d] (view 0 the original)
    and one embedding per class [K, d], one sample at a time, in numpy at `dtype` (float64 for the tests); and
    counters of what the caches did. infer_ori_image: the cache query is the original view (else the confident
    views' mean); boost=False leaves out the boosting cache (TDA with a FIFO negative cache)."""
    text = text.to(dtype).numpy()
    K = text.shape[0]
    pos, neg = {}, {}
    acts = {"pos_dropped": 0, "neg_dropped": 0, "neg_entries": 0, "boosted_classes": 0}

    def update(cache, pred, item, capacity, fifo):
        if pred in cache:
            cache[pred].append(item)
            if fifo:
                if len(cache[pred]) > capacity:
                    cache[pred] = cache[pred][1:]
                    return 1
            else:
                cache[pred] = sorted(cache[pred], key=lambda entry: entry[1])
                dropped = len(cache[pred]) > capacity
                cache[pred] = cache[pred][:capacity]
                return int(dropped)
        else:
            cache[pred] = [item]
        return 0

    def cache_logits(f, cache, alpha, beta, negative):
        keys, values = [], []
        for c in sorted(cache):
            for item in cache[c]:
                keys.append(item[0])
                values.append(((item[2] > 0.03) & (item[2] < 1.0)).astype(np.float64) if negative else c)
        if not keys:
            return 0.0
        weights = np.exp(-1.0 * (beta - beta * (f @ np.stack(keys).T)))
        if negative:
            return alpha * weights @ np.stack(values)
        out = np.zeros(K)  # weights @ one-hot(classes), without building the one-hot matrix
        np.add.at(out, values, weights)
        return alpha * out

    out = []
    for feats in views.to(dtype).numpy():
        V = feats.shape[0]
        logits = logit_scale * feats @ text.T
        ent = entropy(softmax(logits))
        order = np.argsort(ent, kind="stable")
        if V > 1 and not infer_ori_image:
            kept = order[:int(V * 0.1)]
            f, l = feats[kept].mean(0), logits[kept].mean(0)
            pm = softmax(logits[kept]).mean(0)
            loss = entropy(pm)
        else:
            f, l, pm, loss = feats[0], logits[0], softmax(logits[0]), ent[0]
        pred = int(np.argmax(l))
        acts["pos_dropped"] += update(pos, pred, (f, loss), pos_shot, fifo=False)
        scored = pos
        if boost:
            scored = {c: list(entries) for c, entries in pos.items()}
            for v in order[:int(V * keep)]:
                update(scored, int(np.argmax(logits[v])), (feats[v], ent[v]), pos_shot + delta, fifo=False)
            acts["boosted_classes"] += sum(scored[c] != pos.get(c) for c in scored)
        if 0.2 < loss / math.log2(K) < 0.5:
            acts["neg_entries"] += 1
            acts["neg_dropped"] += update(neg, pred, (f, loss, pm), neg_shot, fifo=True)
        final = l + cache_logits(f, scored, pos_alpha, pos_beta, False)
        if neg:
            final = final - cache_logits(f, neg, neg_alpha, neg_beta, True)
        out.append(final)
    return torch.from_numpy(np.stack(out)), acts
