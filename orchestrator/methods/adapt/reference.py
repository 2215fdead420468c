"""AIM-SKKU/ADAPT's online loop (ADAPT_online.py evaluation, get_clip_feature_logits, update_knowledge_banks,
param_estimation, compute_final_prediction) transcribed on features: the reference that tests/test_adapt.py holds
`adapt` to; nothing here is fast.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def official_adapt(views: torch.Tensor, class_embeddings: torch.Tensor, hp: dict, dtype: torch.dtype = torch.float64):
    """The official loop over views [n, V, d] (view 0 the original; V = 1 the single view), one embedding per class
    [K, d], in `dtype`. Returns (posteriors: softmax of the final logits, pseudo-labels, whether the bank changed)."""
    views = views.to(dtype)
    clip_weights = F.normalize(class_embeddings.to(dtype), dim=1).T                    # [d, K]
    d, K = clip_weights.shape
    L, alpha, scale = hp["bank_size"], hp["mean_alpha"], hp["fusion_scale"]
    initial_mean = clip_weights.T
    vecs_all = torch.zeros(K * L, d, dtype=dtype)
    labels_all = torch.full((K * L,), -1, dtype=torch.long)
    pro_all = torch.zeros(K * L, K, dtype=dtype)
    loss_all = torch.full((K * L,), float("inf"), dtype=dtype)
    mean = None
    posts, preds, updates = [], [], []
    for x in views:
        clip_logits = hp["logit_scale"] * x @ clip_weights
        if x.shape[0] > 1:
            ent = -(clip_logits.softmax(-1) * clip_logits.log_softmax(-1)).sum(-1)
            idx = torch.argsort(ent, stable=True)[:max(int(x.shape[0] * hp["keep"]), 1)]
            output = clip_logits[idx]
            f, z = x[idx].mean(0), output.mean(0)
            log_p = output - output.logsumexp(-1, keepdim=True)
            avg = log_p.logsumexp(0) - math.log(output.shape[0])
            loss = -(avg * avg.exp()).sum()
            prob_map = output.softmax(1).mean(0)
        else:
            f, z = x[0], clip_logits[0]
            loss = -(z.softmax(-1) * z.log_softmax(-1)).sum()
            prob_map = z.softmax(-1)
        pred = int(z.argmax())
        # update_knowledge_banks
        start = pred * L
        existing = int((labels_all == pred).sum())
        update = False
        if existing < L:
            insert, update = start + existing, True
        else:
            worst, where = loss_all[start:start + L].max(dim=0)
            if loss < worst:
                insert, update = start + int(where), True
        if update:
            vecs_all[insert], labels_all[insert], pro_all[insert], loss_all[insert] = f, pred, prob_map, loss
        if mean is None:
            mean = clip_weights.T.clone()
        if update:
            valid = labels_all != -1
            vecs, labels, cache_pro = vecs_all[valid], labels_all[valid], pro_all[valid]
            mus = mean.clone()
            mask = labels == pred
            sel, sel_pro = vecs[mask], cache_pro[mask, pred][:, None]
            new_mu = ((sel_pro * sel).sum(0) + prob_map[pred] * f) / (sel_pro.sum() + prob_map[pred])
            mus[pred] = alpha * new_mu + (1 - alpha) * initial_mean[pred]
            center = torch.cat([vecs[labels == i] - mus[i][None] for i in torch.unique(labels)])
            n = center.shape[0]
            sigma = torch.eye(d, dtype=dtype) if n == 1 else center.T.cov()
            cov_inv = d * torch.linalg.pinv((n - 1) * sigma + sigma.trace() * torch.eye(d, dtype=dtype))
            W = torch.einsum("nd,dc->cn", mus, cov_inv)
            b = math.log(1.0 / K) - torch.einsum("nd,dc,nc->n", mus, cov_inv, mus) / 2
            mean = mus
            similarity = f @ vecs.T
            cache_logits = cache_pro * F.one_hot(labels, K).to(dtype)
        gda = torch.log_softmax(f @ W + b, 0)
        inter = gda + (scale / (len(cache_logits) * 2)) * (similarity @ cache_logits)
        inter = inter - inter.max()
        posts.append(torch.softmax(z * torch.exp(inter / scale), 0))
        preds.append(pred)
        updates.append(update)
    return torch.stack(posts), preds, updates
