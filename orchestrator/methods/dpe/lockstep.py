"""DPE in lockstep. A DPE stream shares no state with a stream of another config: every hparam moves its text
prototypes W (through the residual step, the predictions and the gate of the global update), W decides the
cache classes, and the cache feeds back into the step. So G streams keep G states: W [G, K, d], a TDA cache
each (`LockstepCaches`, float64 losses as the loop's Python floats) and each cached class's mean entry [G, K, d].

Over stream orders (orders [G, n]: stream g is features[orders[g]]) nothing changes but the inputs: a step's
views are each stream's own [G, V, d] instead of one sample's [V, d] shared by all.

What the lockstep saves is passes over [K, d] tensors. Per sample the loop builds an autograd graph over
normalize(W + R_t) and runs torch.optim.AdamW on R_t: some thirty elementwise passes over [K, d], each
leaving the core's cache. Here a step reads the G states in two sweeps over blocks of rows (BLOCK_ROWS of
one stream on a CPU, whose operands stay in the core's cache across the block's operations; one block of
all G x K rows on a GPU), ten passes in all:

- select: the previous sample's global update, the norms and the view products X W^T (for the confident
  views, their mean f and the cache class);
- residual: the stepped prototypes Y = W + R_t, |Y| and the products X Y^T (for the posterior).

W is kept as the sum S = W_0 + sum of normalize(Y) over the samples the update fired on, W = S / (N + 1)
after N updates: that is the official cumulative average W <- W n / (n + 1) + normalize(Y) / (n + 1), and
makes the update one pass, S += normalize(Y). Y is kept in S's units, (N + 1) Y; every use is normalised.

The text residual's step, written out. With U = W / |W|, t = U f and q = dH/dz = -p (log p + H), the
gradient of the entropy loss in R_t (at R_t = 0) on the row of an uncached class k is a_k (f - t_k U_k),
a_k = s q_k / |W_k|. AdamW's first step from zero with fresh moments is -lr g / (|g| + eps) (weight decay
scales the zero parameter, the bias corrections cancel the moments' factors), so with
h = f - (t_k / |W_k|) W_k the stepped row is Y_k = W_k - lr sign(a_k) h / (|h| + eps / |a_k|): five
elementwise passes. The rows of cached classes (whose text gradient gains the InfoNCE term) and the cache
residual R_v are computed whole, as [G, C, d] with C the most classes any stream has cached (the other
streams' absent classes masked out of the InfoNCE logits and rows), by the same gradient through
F.normalize and `adamw.first_step` (torch's step, operation for operation); their rows replace the sweep's.

Exactness: the analytic gradient and the closed-form step differ from autograd and AdamW by float32
rounding (at K = 1000, d = 512 either text residual lies within 5e-10 of a float64 step, R_t being at most lr
in size), and the products and norms sum in another order than the loop's. Predictions, cache classes and
gates are the loop's; posteriors and W within 1e-5 of the loop's where the loop itself holds float32
rounding, and where the method amplifies it (the card's logit_scale 100, lr / eps of 10) both sit up to
~1e-4 from a float64 run of the official code (tests/test_lockstep_dpe.py, tests/test_dpe.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from orchestrator.methods.adamw import first_step
from orchestrator.methods.base import Method, StageTimer, Trace, validate_features
from orchestrator.methods.dpe.method import ADAM_EPS, ALIGN_TEMPERATURE
from orchestrator.methods.lockstep import column, split_timings, takes_orders
from orchestrator.methods.caches import LockstepCaches
from orchestrator.methods.prototypes import mean_prob_entropy_grad
from orchestrator.methods.views import gather_views, kept_count

BLOCK_ROWS = 256  # rows per block of the sweeps on a CPU (`python -m benchmarks.methods --methods dpe`)
NORM_EPS = 1e-12  # F.normalize's floor on the norm


def _normalize_backward(grad: torch.Tensor, unit: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """The gradient in x of a loss with gradient `grad` in unit = x / norm (F.normalize's chain rule)."""
    return (grad - unit * (unit * grad).sum(-1, keepdim=True)) / norm


def _own(views: torch.Tensor, streams: slice | torch.Tensor) -> torch.Tensor:
    """The views of these streams: one sample's [V, d] shared by every stream, or each stream's own [G, V, d]."""
    return views if views.ndim == 2 else views[streams]


def _confident(logits: torch.Tensor, views: torch.Tensor, kept: torch.Tensor,
               log_kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DPE._confident per stream: logits [G, V, K] of the views [V, d] (or [G, V, d]); the kept[g] views of lowest
    softmax entropy (confident_views' stable ranks), their mean feature [G, d], mean logits [G, K] and the entropy
    of their mean probability [G], each summed in rank order as the loop's views[idx].mean(0)."""
    V = logits.shape[1]
    log_probs = torch.log_softmax(logits, dim=-1)
    order = torch.argsort(-(torch.softmax(logits, dim=-1) * log_probs).sum(-1), dim=1, stable=True)
    keep = (torch.arange(V, device=logits.device)[None, :] < kept[:, None])[..., None]   # [G, V, 1] by rank
    ranked = views[order] if views.ndim == 2 else gather_views(views, order)
    f = torch.where(keep, ranked, 0.0).sum(1) / kept[:, None]
    mean_logits = torch.where(keep, gather_views(logits, order), 0.0).sum(1) / kept[:, None]
    log_mean = torch.logsumexp(torch.where(keep, gather_views(log_probs, order), -math.inf), dim=1) - log_kept
    log_mean = log_mean.clamp_min(torch.finfo(log_mean.dtype).min)
    return f, mean_logits, -(log_mean * log_mean.exp()).sum(-1)


class _Text:
    """The G text states as sums S [G, K, d] (W = S / (N + 1)) with their row norms, the stepped prototypes
    in S's units ((N + 1) Y) with theirs, and the two sweeps."""

    def __init__(self, text: torch.Tensor, G: int, views: int, block_rows: int) -> None:
        K, d = text.shape
        device = text.device
        self.S = text.expand(G, -1, -1).clone()
        self.norm = torch.linalg.vector_norm(self.S, dim=-1).clamp_min_(NORM_EPS)
        self.Y = torch.empty_like(self.S)
        self.norm_y = torch.empty(G, K, dtype=torch.float32, device=device)
        self.products = torch.empty(G, views, K, dtype=torch.float32, device=device)   # X S^T
        rows = K if device.type != "cpu" else min(K, block_rows)
        per = G if device.type != "cpu" else max(1, block_rows // rows)
        self.blocks = [(slice(g, g + per), slice(k, k + rows)) for g in range(0, G, per) for k in range(0, K, rows)]
        self.h = torch.empty(min(per, G), rows, d, dtype=torch.float32, device=device)
        self.denom = torch.empty_like(self.h)

    def select(self, views: torch.Tensor | None, fire: torch.Tensor | None) -> None:
        """The pending global update S += fire Y (fire [G, K, 1]: 1 / |Y| where it fired, else 0), then the
        products of `views` with S."""
        for gs, ks in self.blocks:
            w = self.S[gs, ks]
            if fire is not None:
                w.addcmul_(self.Y[gs, ks], fire[gs, ks])
                torch.linalg.vector_norm(w, dim=-1, out=self.norm[gs, ks])
            if views is not None:
                torch.matmul(_own(views, gs), w.transpose(1, 2), out=self.products[gs, :, ks])
        if fire is not None:
            self.norm.clamp_min_(NORM_EPS)

    def residual(self, f: torch.Tensor, along: torch.Tensor, soft: torch.Tensor, step: torch.Tensor,
                 views: torch.Tensor, products: torch.Tensor) -> None:
        """Y = S + step h / (|h| + soft) (module docstring, in S's units; along = t / |S|, all [G, K]), |Y|
        and the products of `views` with Y into `products` [G, V', K]."""
        for gs, ks in self.blocks:
            w, y = self.S[gs, ks], self.Y[gs, ks]
            h = self.h[:w.shape[0], :w.shape[1]]
            denom = self.denom[:w.shape[0], :w.shape[1]]
            torch.addcmul(f[gs, None, :], w, along[gs, ks, None], value=-1.0, out=h)
            h.div_(torch.abs(h, out=denom).add_(soft[gs, ks, None]))
            torch.addcmul(w, h, step[gs, ks, None], out=y)
            torch.linalg.vector_norm(y, dim=-1, out=self.norm_y[gs, ks])
            torch.matmul(_own(views, gs), y.transpose(1, 2), out=products[gs, :, ks])


@takes_orders(single=True, views=True)
def run_dpe_lockstep(methods: list[Method], features: torch.Tensor, *, block_rows: int = BLOCK_ROWS,
                     orders: torch.Tensor | None = None) -> list[Trace]:
    """G DPE streams over one stream of views [n, V, d], or stream g = features[orders[g]] (a step's views are
    then each stream's own [G, V, d]); trace g equals `methods[g].run(stream g)`."""
    if any(m.hp["state_dtype"] == "float16" for m in methods):
        # the closed-form step below is float32's AdamW; float16 residuals run torch's float16 AdamW, one loop each
        fast = [g for g, m in enumerate(methods) if m.hp["state_dtype"] == "float32"]
        done = iter(run_dpe_lockstep([methods[g] for g in fast], features, block_rows=block_rows,
                                     orders=None if orders is None else orders[fast]) if fast else [])
        return [m.run(features if orders is None else features[orders[g]]) if m.hp["state_dtype"] == "float16"
                else next(done) for g, m in enumerate(methods)]
    first = methods[0]
    validate_features(first.name, features, first.class_embeddings, views=True)
    (_, V, d), G, K, device = features.shape, len(methods), first.num_classes, features.device
    n = features.shape[0] if orders is None else orders.shape[1]
    f32, f64 = torch.float32, torch.float64
    scale, alpha, beta, align = (column(methods, k, f32, device) for k in ("logit_scale", "alpha", "beta", "align"))
    lr_text, lr_image = (column(methods, k, f64, device) for k in ("lr_text", "lr_image"))
    tau = column(methods, "tau_global", f64, device).flatten()
    kept_counts = [kept_count(V, m.hp["keep"]) for m in methods]
    kept = torch.tensor(kept_counts, device=device)
    log_kept = torch.tensor([[math.log(k)] for k in kept_counts], dtype=f32, device=device)
    confident = torch.tensor([m.hp["predict_views"] == "confident" for m in methods], device=device)
    # The posterior needs every view's product with Y only where some stream predicts on confident views.
    predict_views = V if any(m.hp["predict_views"] == "confident" for m in methods) else 1
    cache = LockstepCaches([m.hp["shot"] for m in methods], K, d, device, with_values=False, loss_dtype=f64)
    text = _Text(first.text, G, V, block_rows)
    cache_mean = torch.zeros(G, K, d, dtype=f32, device=device)
    cached = torch.zeros(G, K, dtype=torch.bool, device=device)
    updates = torch.zeros(G, dtype=torch.int64, device=device)
    products_y = torch.empty(G, predict_views, K, dtype=f32, device=device)
    streams = torch.arange(G, device=device)
    always = torch.ones(G, dtype=torch.bool, device=device)
    posteriors = torch.zeros(G, n, K, dtype=f32, device=device)
    selected = torch.full((G, n), -1, dtype=torch.int64, device=device)
    gated = torch.zeros(G, n, dtype=torch.bool, device=device)
    log2_k = math.log2(K)
    tiny = torch.finfo(f32).min
    fire = None
    timer = StageTimer()
    for i in range(n):
        views = features[i] if orders is None else features[orders[:, i]]
        with timer("logits"):
            text.select(views, fire)
            logits = scale[:, :, None] * (text.products / text.norm[:, None, :])
            f, mean_logits, entropy = _confident(logits, views, kept, log_kept)
            pred = mean_logits.argmax(dim=1)
        with timer("update"):
            entered = cache.offer(i, always, pred, entropy.double() / log2_k, f)
            selected[:, i], gated[:, i] = pred, entered
            # The admitting class's prototype: the mean of its filled entries in slot order (the loop's).
            count = cache.count[streams, pred]
            entries = cache.keys[streams[:, None], cache.slot_pool[streams, pred]]
            filled = (cache.slots[None, :] < count[:, None])[..., None]
            mean = torch.where(filled, entries, 0.0).sum(1) / count.clamp(min=1)[:, None]
            cache_mean[streams, pred] = torch.where(entered[:, None], mean, cache_mean[streams, pred])
            cached[streams, pred] |= entered
            # The cached classes in ascending order, then (padding) uncached ones: rows of the general formula.
            n_cached = cached.sum(1)
            C = int(n_cached.max())
            cidx = torch.argsort((~cached).to(torch.uint8), dim=1, stable=True)[:, :C]
            valid = torch.arange(C, device=device)[None, :] < n_cached[:, None]
            rows = cidx[..., None].expand(-1, -1, d)
            keys = cache_mean.gather(1, rows)
            key_norm = torch.linalg.vector_norm(keys, dim=-1, keepdim=True).clamp_min(NORM_EPS)
            unit_keys = keys / key_norm
            terms = (updates + 1).float()[:, None]                       # N + 1: W = S / (N + 1)
            text_c = text.S.gather(1, rows)
            norm_c = text.norm.gather(1, cidx)[..., None]
            unit_text_c = text_c / norm_c
            # The loss at zero residuals and its gradients.
            affinity = torch.exp(-beta * (1.0 - torch.bmm(unit_keys, f[:, :, None])[..., 0]))
            affinity = torch.where(valid, affinity, 0.0)
            z = mean_logits + torch.zeros_like(mean_logits).scatter_(1, cidx, alpha * affinity)
            q = mean_prob_entropy_grad(z[:, None, :])[:, 0]                # dH/dz
            pairs = torch.bmm(unit_keys, unit_text_c.transpose(1, 2)) / ALIGN_TEMPERATURE
            pairs = pairs.masked_fill(~valid[:, None, :], -math.inf)
            row_weight = torch.where(valid, align / n_cached[:, None], 0.0)[..., None]
            d_pairs = (torch.softmax(pairs, dim=2) - torch.eye(C, device=device)) * row_weight
            q_c = q.gather(1, cidx)
            grad_text_c = (scale * q_c)[..., None] * f[:, None, :] \
                + torch.bmm(d_pairs.transpose(1, 2), unit_keys) / ALIGN_TEMPERATURE
            grad_keys = (alpha * beta * affinity * q_c)[..., None] * f[:, None, :] \
                + torch.bmm(d_pairs, unit_text_c) / ALIGN_TEMPERATURE
            r_image = first_step(_normalize_backward(grad_keys, unit_keys, key_norm), lr_image[:, :, None], ADAM_EPS)
            r_text_c = first_step(_normalize_backward(grad_text_c, unit_text_c, norm_c / terms[..., None]),
                                  lr_text[:, :, None], ADAM_EPS)
            y_c = text_c + r_text_c * terms[..., None]
            a = scale * q * terms / text.norm
            step = torch.copysign(lr_text.float() * terms, -a)
            x_pred = views[..., :predict_views, :]
            text.residual(f, mean_logits / scale / text.norm, ADAM_EPS / a.abs(), step, x_pred, products_y)
            text.Y.scatter_(1, rows, y_c)
            text.norm_y.scatter_(1, cidx, torch.linalg.vector_norm(y_c, dim=-1))
            products_y.scatter_(2, cidx[:, None, :].expand(-1, predict_views, -1), x_pred @ y_c.transpose(1, 2))
        with timer("posterior"):
            text.norm_y.clamp_min_(NORM_EPS)
            logits_y = scale[:, :, None] * (products_y / text.norm_y[:, None, :])
            clip, f_pred = logits_y[:, 0], views[..., 0, :].expand(G, -1)
            if predict_views > 1:
                f_conf, clip_conf, _ = _confident(logits_y, views, kept, log_kept)
                clip = torch.where(confident[:, None], clip_conf, clip)
                f_pred = torch.where(confident[:, None], f_conf, f_pred)
            keys_y = F.normalize(keys + r_image, dim=2)
            affinity_y = torch.exp(-beta * (1.0 - torch.bmm(keys_y, f_pred[:, :, None])[..., 0]))
            cache_logits = torch.zeros_like(clip).scatter_(1, cidx, torch.where(valid, alpha * affinity_y, 0.0))
            final = clip + cache_logits
            posteriors[:, i] = torch.softmax(final, dim=1)
        with timer("update"):
            log_p = torch.log_softmax(final, dim=1).clamp_min(tiny)
            fires = -(log_p * log_p.exp()).sum(1).double() / log2_k < tau
            updates += fires
            # W <- W n / (n + 1) + normalize(Y) / (n + 1) is S <- S + normalize(Y) in S's units.
            fire = torch.where(fires[:, None], 1.0 / text.norm_y, 0.0)[..., None] if bool(fires.any()) else None
    with timer("update"):
        text.select(None, fire)
    timings = split_timings(timer, G)
    none = torch.zeros(n, dtype=torch.bool, device=device)
    return [Trace(posteriors[g], selected[g], gated[g], none.clone(),
                  state={"text": text.S[g] / (updates[g] + 1).float(), "text_updates": updates[g].clone(),
                         **cache.state(g, m.hp["shot"], "cache")}, timings=dict(timings))
            for g, m in enumerate(methods)]
