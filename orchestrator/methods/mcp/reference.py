"""CenturyChen/MCP's per-sample loop (mcp_runner.py run_test_mcp with --res False: update_cache, update_align_cache,
update_cache_joint, shrink_cache_keys_and_values, compute_cache_logits, compute_cache_key_logits, get_cache_pred;
utils.py get_clip_logits, select_confident_samples, avg_entropy) transcribed on features: the caches are dicts of
Python lists re-sorted after each change, as in the public code. The reference that tests/test_mcp.py holds `mcp`
to; nothing here is fast.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from orchestrator.methods.dpe.reference import adamw_first_step


def official_mcp(views: torch.Tensor, weights: torch.Tensor, hp: dict, dataset_a: bool = False, res: bool = False,
                 dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, list[int], dict, dict]:
    """views [n, V, d] (view 0 the original), one unit text embedding per class [K, d]; `dataset_a`: the code's
    ImageNet-A branch of get_clip_logits; `res`: MCP++ (--res True, --tta_steps 1; its gradients by autograd, its
    AdamW step by the formula). Returns (posteriors [n, K]: the fused prediction with the hparams'
    weights in place of the official label search, each sample's entropy-cache class, the caches, and how often
    the rules the tests want exercised fired: an align entry replaced, the negative cache taking a sample, the
    negative branch feeding the entropy cache)."""
    views, W = views.to(dtype), weights.to(dtype).T                                  # W [d, K] as clip_weights
    d, K = W.shape
    s, keep = hp["logit_scale"], hp["keep"]
    E, A = hp["entropy_shot"], hp["align_shot"]
    log2_k = math.log2(K)
    entro, align, neg = {}, {}, {}
    memory = torch.zeros(K, E + A, d, dtype=dtype)
    cache_keys = torch.zeros(d, K, dtype=dtype)
    all_classes, pos_keys = [], None
    posts, labels = [], []
    events = {"align_replaced": 0, "negative": 0, "negative_to_entropy": 0}
    if res:
        events["global_gate"] = 0  # the cumulative text average's gate, which the tests hold to never opening

    def update_cache(cache, pred, item, shot):
        if pred in cache:
            if len(cache[pred]) < shot:
                cache[pred].append(item)
            elif item[1] < cache[pred][-1][1]:
                cache[pred][-1] = item
            cache[pred] = sorted(cache[pred], key=lambda e: float(e[1]))
        else:
            cache[pred] = [item]

    def entropy(logits):
        return -(logits.softmax(0) * logits.log_softmax(0)).sum()

    for x in views:
        if res:  # TextResidue over clip_weights_global, which stays W (its gate never opens)
            r_t = torch.zeros(d, K, dtype=dtype, requires_grad=True)
            new_W = F.normalize(F.normalize(W, dim=0) + r_t, dim=0)
        else:
            new_W = W
        view_logits = s * x @ new_W                                                  # [V, K]
        img_text = view_logits.softmax(1).detach()
        kept = max(1, int(x.shape[0] * keep))
        if dataset_a:
            idx = torch.argsort(-(view_logits.softmax(1) * view_logits.log_softmax(1)).sum(1), stable=True)[:kept]
            f, clip_logits = x[idx].mean(0), view_logits[idx].mean(0)
            log_p = (view_logits[idx] - view_logits[idx].logsumexp(1, keepdim=True)).detach()
            avg = log_p.logsumexp(0) - math.log(kept)
            loss = -(avg * avg.exp()).sum()
        else:
            f, clip_logits = x[0], view_logits[0]
            loss = entropy(clip_logits.detach())
        ent_pred = int(clip_logits.argmax())
        # select_confident_samples
        batch_entropy = -(img_text * torch.log(img_text + 1e-6)).sum(1)
        init_pred = img_text[torch.argsort(batch_entropy, stable=True)[:kept]].mean(0)
        align_pred = int(init_pred.argmax())
        aug_loss = -(init_pred * init_pred.clamp_min(1e-8).log()).sum()
        # the positive caches
        update_cache(entro, ent_pred, [f, loss], E)
        text_feat = W[:, align_pred]
        if align_pred in all_classes and pos_keys is not None:
            centre = hp["center"] * pos_keys[:, all_classes.index(align_pred)] + (1 - hp["center"]) * text_feat
        else:
            centre = text_feat
        lst = align.setdefault(align_pred, [])
        if len(lst) < A:
            lst.append((x[0], aug_loss))
            lst.sort(key=lambda e: float(e[1]))
        elif aug_loss < lst[-1][1] and torch.norm(x[0] - centre) < torch.norm(lst[-1][0] - centre):
            lst[-1] = (x[0], aug_loss)
            events["align_replaced"] += 1
            lst.sort(key=lambda e: float(e[1]))
        for cls in {ent_pred, align_pred}:
            rows = [e[0] for e in align.get(cls, [])] + [e[0] for e in entro.get(cls, [])]
            memory[cls] = 0
            memory[cls, :len(rows)] = torch.stack(rows)
            cache_keys[:, cls] = memory[cls, :len(rows)].mean(0)
        nonzero = (cache_keys.abs().sum(0) != 0).nonzero(as_tuple=True)[0]
        pos_keys, all_classes = cache_keys[:, nonzero], nonzero.tolist()
        pos_values = F.one_hot(nonzero, K).to(dtype)

        def cache_logits(cache, alpha, beta, masked):
            keys = torch.stack([e[0] for c in sorted(cache) for e in cache[c]]).T
            if masked:
                values = torch.stack([e[2] for c in sorted(cache) for e in cache[c]])
                values = ((values > 0.03) & (values < 1.0)).to(dtype)
            else:
                values = F.one_hot(torch.tensor([c for c in sorted(cache) for _ in cache[c]]), K).to(dtype)
            return alpha * (-(beta - beta * (f @ keys))).exp() @ values

        # the negative cache
        neg_logits = s * f @ W
        if 0.2 < float(loss / log2_k) < 0.5:
            neg_logits = neg_logits + cache_logits(entro, hp["pos_alpha"], hp["pos_beta"], False)
            neg_loss = entropy(neg_logits)
            neg_entropy = float(neg_loss / log2_k)
            neg_pred = int(neg_logits.argmax())
            if 0.2 < neg_entropy < 0.5:
                update_cache(neg, neg_pred, [f, neg_loss, neg_logits.softmax(0)], hp["neg_shot"])
                events["negative"] += 1
            elif neg_entropy <= 0.2:
                update_cache(entro, neg_pred, [f, neg_loss], E)
                events["negative_to_entropy"] += 1
        final = clip_logits.clone()

        def positive(keys):  # compute_cache_key_logits
            return hp["pos_alpha"] * (-(hp["pos_beta"] - hp["pos_beta"] * (f @ keys))).exp() @ pos_values

        if res:
            r_c = torch.zeros_like(pos_keys, requires_grad=True)
            neg_keys = torch.stack([sum(e[0] / len(neg[c]) for e in neg[c]) if c in neg else torch.zeros(d, dtype=dtype)
                                    for c in all_classes], dim=1)                     # align_neg_keys [d, C]
            new_keys = F.normalize(pos_keys + r_c, dim=0)
            final = final + positive(new_keys)
            if neg:
                final = final - cache_logits(neg, hp["neg_alpha"], hp["neg_beta"], True)
            objective = entropy(final)
            cos = F.cosine_similarity(new_keys.T, neg_keys.T, dim=1)
            pos2neg = -torch.log(1 - cos + 1e-7).mean()
            q, k = F.normalize(new_keys, dim=1), F.normalize(new_W[:, all_classes], dim=1)  # InfoNCE on [d, C]
            img2text = F.cross_entropy(q @ k.T / 0.01, torch.arange(d))
            objective = objective + 0.5 * img2text + 0.2 * pos2neg
            g_t, g_c = torch.autograd.grad(objective, [r_t, r_c])
            step_t = adamw_first_step(g_t, hp["lr_text"], 1e-3, 0.1)
            step_c = adamw_first_step(g_c, hp["lr_image"], 1e-3, 0.1)
            final = final.detach()
            stepped_W = F.normalize(F.normalize(W, dim=0) + step_t, dim=0)
            new_img_text = (s * x @ stepped_W).softmax(1)
            batch_entropy = -(new_img_text * torch.log(new_img_text + 1e-6)).sum(1)
            init_pred = new_img_text[torch.argsort(batch_entropy, stable=True)[:kept]].mean(0)
            final = final + positive(F.normalize(pos_keys + step_c, dim=0))
        else:
            final = final + positive(pos_keys)
        if neg:
            final = final - cache_logits(neg, hp["neg_alpha"], hp["neg_beta"], True)
        img_pro_pred = final.softmax(0)
        if res and entropy(img_pro_pred) / log2_k < 0.1:  # avg_entropy of the softmaxed final_logits
            events["global_gate"] += 1
        # get_cache_pred
        kv = torch.cat([memory, W.T[:, None]], dim=1)
        kv_n = kv / kv.norm(dim=-1, keepdim=True)
        kv_n[kv.sum(-1) == 0] = 0
        sim = torch.exp(-hp["memory_beta"] * (1 - (x[0] * kv_n).sum(-1)))
        adaptive = (kv_n * sim[..., None]).sum(1)
        adaptive = adaptive / adaptive.norm(dim=-1, keepdim=True)
        img_global_pred = (s * adaptive @ x[0]).softmax(0)
        fused = init_pred + hp["memory_weight"] * img_global_pred + hp["cache_weight"] * img_pro_pred
        posts.append(fused / (1 + hp["memory_weight"] + hp["cache_weight"]))
        labels.append(ent_pred)
    return torch.stack(posts), labels, {"entropy": entro, "align": align, "negative": neg}, events
