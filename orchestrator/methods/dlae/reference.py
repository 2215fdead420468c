"""whynotcooper/dlae's per-sample loop (main_dlae.py run_test_dlae, update_cache, cache_key_value, check_doubt,
exp_loss; utils.py get_clip_logits_2 / get_clip_logits_3, logits_adjustment, avg_entropy) transcribed on features
with autograd for the gradients and AdamW's first step by its formula: the reference that tests/test_dlae.py holds
`dlae` to. The cache is a dict of Python lists as in the public code; nothing here is fast.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from orchestrator.methods.dpe.reference import adamw_first_step, entropy_of_mean_prob


def official_dlae(views: torch.Tensor, class_embeddings: torch.Tensor, hp: dict, dtype: torch.dtype = torch.float64):
    """The official loop over views [n, V, d] (view 0 the original), one embedding per class [K, d], in `dtype`:
    W is [d, K] (columns). Returns (posteriors, pseudo-labels, whether the cache changed, and how often the rules
    the tests want exercised fired: a reflection, a doubtful entry's loss grown, a replacement, a global update)."""
    views = views.to(dtype)
    W0 = F.normalize(class_embeddings.to(dtype), dim=1).T.clone()
    W = W0.clone()
    d, K = W.shape
    s, keep = hp["logit_scale"], hp["keep"]
    counter = torch.ones(K, dtype=torch.int32)
    count = torch.tensor(K)
    conf, conf_count = torch.zeros(K, dtype=dtype), torch.zeros(K, dtype=dtype)
    cache: dict[int, list] = {}
    num_avg = 0
    events = {"reflected": 0, "grown": 0, "replaced": 0, "global": 0}
    posts, preds, changed = [], [], []

    def select(logits):
        ent = -(logits.softmax(1) * logits.log_softmax(1)).sum(1).detach()
        return torch.argsort(ent, stable=True)[:max(1, int(logits.shape[0] * keep))]

    def clip_logits_adjusted(x, weights):
        """get_clip_logits_2 (and _3): the adjusted confident views; gradients flow through `weights`."""
        logits = s * x @ weights
        out2 = logits[select(logits)]
        prob_map2 = out2.softmax(1).mean(0)
        pred2 = int(out2.mean(0).argmax())
        dif = float(prob_map2[pred2].detach()) - float(conf[pred2])
        logits = logits * torch.exp(-(-hp["adjust_alpha"] * dif + hp["adjust_alpha"]) * (counter / count))
        idx = select(logits)
        out = logits[idx]
        return x[idx].mean(0), out.mean(0), entropy_of_mean_prob(out), out.softmax(1).mean(0), pred2

    def cache_logits(f, keys, values):
        return hp["alpha"] * (-(hp["beta"] - hp["beta"] * (f @ keys))).exp() @ values

    for i, x in enumerate(views):
        r_t = torch.zeros(d, K, dtype=dtype, requires_grad=True)
        W_new = F.normalize(W + r_t, dim=0)
        f, clip_logits, loss, prob_map, pred2 = clip_logits_adjusted(x, W_new)
        f = f.detach()
        pred = int(clip_logits.argmax())
        loss1 = loss.detach()
        if pred != pred2:
            sim = F.cosine_similarity(W_new.T[pred], W_new.T[pred2], dim=0).detach()
            loss1 = loss1 * torch.exp(-hp["reflect_alpha"] * sim)
            events["reflected"] += 1
        counter[pred] += 1
        count = count + 1
        conf[pred] = (conf[pred] * conf_count[pred] + float(prob_map[pred].detach())) / (conf_count[pred] + 1)
        conf_count[pred] += 1
        # update_cache
        entered = True
        if pred in cache:
            if len(cache[pred]) < hp["shot"]:
                cache[pred].append([f, loss1, i, True])
            else:
                for e in cache[pred]:
                    if e[-1] and e[0] @ W_new.detach().T[pred] < e[0] @ W0.T[pred]:
                        e[1] = e[1] * math.exp((i - e[2]) * hp["loss_decay"])
                        e[2] = i
                        events["grown"] += 1
                cache[pred] = sorted(cache[pred], key=lambda e: float(e[1]))
                entered = bool(loss1 < cache[pred][-1][1])
                if entered:
                    cache[pred][-1] = [f, loss1, i, True]
                    cache[pred] = sorted(cache[pred], key=lambda e: float(e[1]))
                    events["replaced"] += 1
        else:
            cache[pred] = [[f, loss1, i, True]]
        # cache_key_value
        classes = sorted(cache)
        keys = []
        for c in classes:
            proto = torch.zeros(d, dtype=dtype)
            for e in cache[c][:3]:
                proto = proto + e[0] / len(cache[c])
            keys.append(proto)
        keys = torch.stack(keys, dim=1)                                              # [d, C]
        values = F.one_hot(torch.tensor(classes), K).to(dtype)
        # one AdamW step on both residuals at learning_rate.text
        r_c = torch.zeros_like(keys, requires_grad=True)
        new_keys = F.normalize(keys + r_c, dim=0)
        final = clip_logits + cache_logits(f, new_keys, values)
        objective = entropy_of_mean_prob(final[None])
        a, b = F.normalize(new_keys.T, dim=1), F.normalize(W_new[:, classes].T, dim=1)
        objective = objective + hp["align"] * F.cross_entropy(a @ b.T / 0.01, torch.arange(len(classes)))
        g_t, g_c = torch.autograd.grad(objective, [r_t, r_c])
        step_t = adamw_first_step(g_t, hp["lr_text"], 1e-3, 0.1)
        step_c = adamw_first_step(g_c, hp["lr_text"], 1e-3, 0.1)
        with torch.no_grad():
            W_new = F.normalize(W + step_t, dim=0)
            query = x if hp["query"] == "confident" else x[:1]
            f_p, z_p, _, _, _ = clip_logits_adjusted(query, W_new)
            final = z_p + cache_logits(f_p, F.normalize(keys + step_c, dim=0), values)
            if float(entropy_of_mean_prob(final[None])) / math.log2(K) < hp["tau_global"]:
                num_avg += 1
                W = W * (num_avg / (num_avg + 1)) + W_new * (1 / (num_avg + 1))
                events["global"] += 1
        posts.append(final.softmax(0))
        preds.append(pred)
        changed.append(entered)
    return torch.stack(posts), preds, changed, events
