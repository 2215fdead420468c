"""zhangce01/DPE-CLIP's per-sample loop (main_dpe.py run_test_dpe with utils.py get_clip_logits: the visual cache,
one AdamW step on the textual and visual residuals, the global prototype average), transcribed one sample at a time
with autograd for the gradients: the reference that tests/test_dpe.py and tests/test_lockstep_dpe.py hold `dpe` to
and `benchmarks.methods`' "official" column times.
"""

from __future__ import annotations

import math

import torch

# The card's defaults: the official ImageNet config (configs/imagenet.yaml), float32 residuals (the official code's
# are float16: state_dtype).
DEFAULTS = {"alpha": 6.0, "beta": 5.0, "lr_text": 6e-4, "lr_image": 6e-4, "align": 0.5, "shot": 3, "keep": 0.1,
            "tau_global": 0.1, "logit_scale": 100.0, "predict_views": "original", "state_dtype": "float32"}


def adamw_first_step(grad: torch.Tensor, lr: float, eps: float, weight_decay: float) -> torch.Tensor:
    """torch's AdamW update from a zero parameter with fresh moments (betas 0.9, 0.999), by its formula."""
    b1, b2 = 0.9, 0.999
    param = torch.zeros_like(grad) * (1 - lr * weight_decay)
    m_hat = (1 - b1) * grad / (1 - b1)
    v_hat = (1 - b2) * grad ** 2 / (1 - b2)
    return param - lr * m_hat / (v_hat.sqrt() + eps)


def adamw_first_step_float16(grad: torch.Tensor, lr: float, eps: float, weight_decay: float) -> torch.Tensor:
    """torch's single-tensor AdamW first step on a float16 parameter, operation by operation, each result rounded
    to float16 (the official residuals' dtype): (1 - beta2) g^2 underflows to 0 for |g| below about 5e-3, and the
    step becomes lr g / eps."""
    b1, b2, half = 0.9, 0.999, torch.float16
    g = grad.to(half).float()
    m = ((1 - b1) * g).to(half).float()                                     # exp_avg.lerp_(grad, 1 - beta1)
    v = ((1 - b2) * g * g).to(half).float()                                 # exp_avg_sq.addcmul_(grad, grad, 1 - b2)
    denom = ((v.sqrt().to(half).float() / math.sqrt(1 - b2)).to(half).float() + eps).to(half).float()
    param = torch.zeros_like(g) * (1 - lr * weight_decay)
    return (param - lr / (1 - b1) * (m / denom)).to(half)


def entropy_of_mean_prob(logits: torch.Tensor) -> torch.Tensor:
    """The entropy of the mean softmax of rows of logits (TPT's avg_entropy, as DPE's get_clip_logits uses it)."""
    p = torch.softmax(logits, dim=-1).mean(0)
    return -torch.special.xlogy(p, p).sum()


def softmax_entropy(z: torch.Tensor) -> torch.Tensor:
    """The entropy of softmax(z) over its one axis."""
    return -(torch.softmax(z, 0) * torch.log_softmax(z, 0)).sum()


def official_dpe(views: torch.Tensor, class_embeddings: torch.Tensor, dtype: torch.dtype = torch.float64, **hp):
    """The official loop over views [n, V, d] (view 0 the original), one embedding per class [K, d], in `dtype`
    (float64 for the tests; hp over DEFAULTS): W is [d, K] (columns), the cache a dict of (feature, entropy)
    lists. Returns (posteriors, pseudo-labels, admitted to the cache, global updates, final W [K, d], whether
    the step changed the prediction)."""
    hp = {**DEFAULTS, **hp}
    views = views.to(dtype)
    W = torch.nn.functional.normalize(class_embeddings.to(dtype), dim=1).T.clone()
    d, K = W.shape
    scale, keep = hp["logit_scale"], hp["keep"]
    cache: dict[int, list] = {}
    num_avg = 0
    posts, preds, admitted, stepped = [], [], [], []

    def confident(x, weights):
        out = scale * x @ weights
        if x.shape[0] == 1:
            return x[0], out[0], entropy_of_mean_prob(out)
        ent = -(torch.softmax(out, 1) * torch.log_softmax(out, 1)).sum(1).detach()
        idx = torch.argsort(ent, stable=True)[:max(1, int(x.shape[0] * keep))]
        return x[idx].mean(0), out[idx].mean(0), entropy_of_mean_prob(out[idx])

    for x in views:
        # get_clip_logits runs under the graph of the zero text residual: selection, f, pred and h come from it.
        W_local = W.clone()
        r_t = torch.zeros(d, K, dtype=dtype, requires_grad=True)
        W_new = (W_local + r_t) / (W_local + r_t).norm(dim=0)
        f, clip_logits, h = confident(x, W_new)
        pred = int(clip_logits.argmax())
        item = (f.detach(), float(h.detach()) / math.log2(K))
        entered = True
        if pred in cache:
            if len(cache[pred]) < hp["shot"]:
                cache[pred].append(item)
            elif item[1] < cache[pred][-1][1]:
                cache[pred][-1] = item
            else:
                entered = False
            cache[pred] = sorted(cache[pred], key=lambda e: e[1])
        else:
            cache[pred] = [item]
        classes = sorted(cache)
        keys = torch.stack([sum(e[0] / len(cache[c]) for e in cache[c]) for c in classes], dim=1)   # [d, C]
        onehot = torch.nn.functional.one_hot(torch.tensor(classes), K).to(dtype)

        def final_logits(x_feat, clip_part, r_v):
            keys_new = (keys + r_v) / (keys + r_v).norm(dim=0)
            return clip_part + hp["alpha"] * torch.exp(-hp["beta"] * (1 - x_feat @ keys_new)) @ onehot

        r_v = torch.zeros(d, len(classes), dtype=dtype, requires_grad=True)
        loss = softmax_entropy(final_logits(f, clip_logits, r_v))
        keys_new = (keys + r_v) / (keys + r_v).norm(dim=0)
        sims = keys_new.T @ W_new[:, classes] / 0.01
        loss = loss + hp["align"] * torch.nn.functional.cross_entropy(sims, torch.arange(len(classes)))
        g_t, g_v = torch.autograd.grad(loss, [r_t, r_v])
        step = adamw_first_step_float16 if hp["state_dtype"] == "float16" else adamw_first_step
        r_t = step(g_t, hp["lr_text"], 1e-3, 0.1).to(dtype)
        r_v = step(g_v, hp["lr_image"], 1e-3, 0.1).to(dtype)

        W_new = (W_local + r_t) / (W_local + r_t).norm(dim=0)
        if hp["predict_views"] == "original":
            f_pred, clip_pred = x[0], scale * x[0] @ W_new
        else:
            f_pred, clip_pred, _ = confident(x, W_new)
        z = final_logits(f_pred, clip_pred, r_v)
        p = torch.softmax(z, 0)
        if float(softmax_entropy(z)) / math.log2(K) < hp["tau_global"]:
            num_avg += 1
            W = W * (num_avg / (num_avg + 1)) + W_new * (1 / (num_avg + 1))
        unstepped = torch.softmax(final_logits(f_pred, scale * f_pred @ (W_local / W_local.norm(dim=0)), 0.0), 0)
        posts.append(p)
        preds.append(pred)
        admitted.append(entered)
        stepped.append(bool(p.argmax() != unstepped.argmax()))
    return torch.stack(posts), torch.tensor(preds), torch.tensor(admitted), num_avg, W.T, torch.tensor(stepped)
