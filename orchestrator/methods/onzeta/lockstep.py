"""OnZeta in lockstep. The dual variables rho [G, K] per stream, the text logits once per call, and the
proxies W [G, K, d] in blocks of B samples so that W is read twice per block, not three times per sample: a
step's update is W <- diag(1 / |row|) (W + u x^T), so within a block W_t = diag(s_t) (W_a + C_t X^T) with X
the block's samples, and W_t x_t = s_t * (W_a x_t + C_t (X x_t)): the products W_a X^T and X X^T once per
block (the first block's W_a X^T are the text logits), C_t (X x_t) a sub-block of 16 samples at a time (the
earlier sub-blocks' part added to a sub-block's rows at its start in one product, then per step a [G K, <16]
product), and the row norms from |W_t + u x^T|^2 = 1 + u (2 W_t x + u |x|^2) (the rows are unit at every
step); at the block's end W_a + C X is formed. The scale s runs on across blocks (W is kept as diag(s) W', the
rows made unit only when a scale leaves [1/64, 64], and at the end), which spares a pass over W per block. The
per-block buffers are sample-major, so a step reads and writes whole [G K] rows; on a CPU the streams run in
passes of CPU_TILE. On a CPU a step's elementwise work runs in two compiled passes (numba) around torch's two
softmaxes, rather than some twenty torch operations over [G, K]; elsewhere as those torch operations
(`fused=False`, tested against the loop on the CPU as well). The two block products are 2 G K d multiply-adds
per sample, most of a step's time at G = 32 on a CPU (`benchmarks.methods`).

Precision: the row scale s_t is a running product, kept in float64 (in float32 its rounding adds up to 25
times the loop's own error at K = 1000, measured); everything else is float32, as the loop's own W and x
are, the squared norm's change u (2 W_t x + u |x|^2) included (its rounding is relative to the change, not
to 1). The posteriors then differ from the loop's by the loop's own float32 rounding, which OnZeta's large
early steps amplify: at K = 100, d = 32, 400 samples, the float32 loop sits 1.2e-5 from a float64 run of the
same loop and this path 1.1e-5 or less; at K = 200 (`test_lockstep.py`) and at K = 1000, d = 512 both are
within 1e-5 and 1.5e-6 of each other and of the float64 loop. Below K ~ 100 the loop amplifies rounding
further (onzeta.py).
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch

from orchestrator.methods.base import Method, StageTimer, Trace, validate_features
from orchestrator.methods.lockstep import column, split_timings, takes_orders

ONZETA_BLOCK = 64  # samples per block of OnZeta's proxies (see the module docstring)
SUB_BLOCK = 16  # a block's coefficients are added to the products a sub-block at a time
# Streams per pass on a CPU: a pass over 8 streams keeps each step's [8, K] rows and the block's coefficients
# in the core's caches, and 32 streams run faster as four such passes (`benchmarks.methods`).
CPU_TILE = 8


@numba.njit(cache=True, nogil=True)
def _fused_logits(z, scale, text, rho, tau_t, tau_i, a, b):
    """z *= float32(scale); a = text / tau_t + rho; b = z / tau_i ([G, K] rows; text [1, K] for every stream
    or [G, K], one row each; the torch path's operations one element at a time, in float32)."""
    G, K = z.shape
    shared = text.shape[0] == 1
    for g in range(G):
        row = 0 if shared else g
        for k in range(K):
            zk = z[g, k] * np.float32(scale[g, k])
            z[g, k] = zk
            a[g, k] = text[row, k] / tau_t[g] + rho[g, k]
            b[g, k] = zk / tau_i[g]


@numba.njit(cache=True, nogil=True)
def _fused_update(z, q, p, rho, scale, mix, neg_rlr, step, target, half_sq_x, posteriors, t, coef):
    """The step after the two softmaxes (the torch path's operations one element at a time): the posterior
    q + mix (p - q), rho's update, the block coefficient u / s and the running row scale (float64).
    half_sq_x [1] for every stream or [G]: |x|^2 / 2 of the stream's sample."""
    G, K = z.shape
    two = np.float32(2.0)
    shared = half_sq_x.shape[0] == 1
    for g in range(G):
        half = half_sq_x[0 if shared else g]
        for k in range(K):
            diff = p[g, k] - q[g, k]
            posteriors[g, t, k] = q[g, k] + mix[g] * diff
            r = rho[g, k] + (q[g, k] - target[g]) * neg_rlr[g]
            rho[g, k] = r if r > 0 else np.float32(0.0)
            u = step[g] * diff
            coef[g, k] = u / np.float32(scale[g, k])
            change = (z[g, k] + half * u) * u * two
            scale[g, k] /= max(math.sqrt(np.float64(change) + 1.0), 1e-12)


@takes_orders(single=True, views=False)
def run_onzeta_lockstep(methods: list[Method], features: torch.Tensor, *, block: int = ONZETA_BLOCK,
                        fused: bool | None = None, orders: torch.Tensor | None = None) -> list[Trace]:
    """G OnZeta streams over one feature stream [n, d], or stream g = features[orders[g]]; trace g equals
    `methods[g].run(stream g)`. fused: each step's elementwise work in two compiled passes over [G, K] around
    torch's softmax (default: on a CPU, where the ~20 separate torch operations per step cost more than the
    arithmetic), or as torch operations (any device)."""
    first = methods[0]
    validate_features(first.name, features, first.class_embeddings, views=False)
    if features.device.type == "cpu" and len(methods) > CPU_TILE:
        return [trace for i in range(0, len(methods), CPU_TILE)
                for trace in run_onzeta_lockstep(methods[i:i + CPU_TILE], features, block=block, fused=fused,
                                                 orders=None if orders is None else orders[i:i + CPU_TILE])]
    n = features.shape[0] if orders is None else orders.shape[1]
    G, K, device = len(methods), first.num_classes, features.device
    fused = device.type == "cpu" if fused is None else fused
    for method in methods:
        method.claim(n)
    # Per-step scalars in float64, rounded to float32 where they meet a tensor, as the loop's Python floats.
    col = {k: column(methods, k, torch.float64, device) for k in ("tau_t", "tau_i", "cw", "cr", "alpha", "beta")}
    n_total = torch.tensor([[float(m.n_total)] for m in methods], dtype=torch.float64, device=device)
    i = torch.arange(1, n + 1, dtype=torch.float64, device=device)[None, :]
    # [n, G]: a sample's G per-stream scalars contiguous
    step = (-col["cw"] / i.sqrt() / col["tau_i"]).float().T.contiguous()      # -lr / tau_i
    neg_rlr = (-col["cr"] / i.sqrt()).float().T.contiguous()
    mix = (col["beta"] * torch.sqrt(i / n_total)).float().T.contiguous()
    tau_t, tau_i = col["tau_t"].float().flatten(), col["tau_i"].float().flatten()
    target = (col["alpha"] / K).float().flatten()
    W = torch.empty(G, K, first.text.shape[1], dtype=torch.float32, device=device)   # W_0 = T, formed below
    rho = torch.zeros(G, K, dtype=torch.float32, device=device)
    posteriors = torch.empty(G, n, K, dtype=torch.float32, device=device)         # every row is written
    timer = StageTimer()
    with timer("logits"):
        text_products = features @ first.text.T
    rows = W.view(G * K, -1)
    # Per-block buffers, written in place (fresh memory costs a page fault per first touch, a sizeable share).
    products = torch.empty(block, G * K, dtype=torch.float32, device=device)
    coef = torch.empty(block, G * K, dtype=torch.float32, device=device)
    z = torch.empty(G, K, dtype=torch.float32, device=device)
    # The proxies are kept as diag(scale) W: the rows' renormalisations only update `scale` (float64), and W
    # is rescaled to unit rows only when a scale leaves [1/64, 64] (bounding its float32 magnitudes) and at
    # the end, rather than a pass over W per block.
    scale = torch.ones(G, K, dtype=torch.float64, device=device)
    if fused:
        a_buf, b_buf = torch.empty_like(z), torch.empty_like(z)
        np_ = {name: x.numpy() for name, x in dict(z=z, rho=rho, tau_t=tau_t, tau_i=tau_i,
                                                   step=step, neg_rlr=neg_rlr, mix=mix, target=target,
                                                   a=a_buf, b=b_buf, coef=coef, scale=scale,
                                                   posteriors=posteriors).items()}
    for a in range(0, n, block):
        # The block's samples: one [B, d] for every stream, or over orders each stream's [G, B, d]; their text
        # logits [B, 1, K] (or [B, G, K]), products with each other [B, B] (or [G, B, B]) and half squared
        # norms [B, 1] (or [B, G]; exact halves of float32 values, as the loop's 0.5 |x|^2).
        if orders is None:
            X, text_block = features[a:a + block], text_products[a:a + block, None]
        else:
            X, text_block = features[orders[:, a:a + block]], text_products[orders[:, a:a + block].T]
        B = X.shape[-2]
        with timer("logits"):
            if a:
                if orders is None:
                    torch.mm(X, rows.T, out=products[:B])                  # W_a x for the block's samples
                else:
                    products[:B].view(B, G, K).copy_(torch.bmm(X, W.transpose(1, 2)).transpose(0, 1))
            else:                                                          # W_0 = T in every stream
                products[:B].view(B, G, K).copy_(text_block)
            gram = X @ X.transpose(-1, -2)
            half_sq = 0.5 * (gram.diagonal()[:, None] if orders is None else gram.diagonal(dim1=1, dim2=2).T)
            half_sq = half_sq.contiguous()
            halves = half_sq[:, 0].tolist() if orders is None else None   # one read per block, not per step
            if fused:
                np_text, np_half = text_block.numpy(), half_sq.numpy()
        for j in range(B):
            t = a + j
            with timer("logits"):
                # W_t x_t = s_t * (W_a x_t + C_t (X x_t)): the coefficients of the sub-blocks before this
                # one added to its rows at its start, one product, then per step those since its start.
                j0 = j - j % SUB_BLOCK
                if j0 and j == j0:
                    end = min(j + SUB_BLOCK, B)
                    if orders is None:
                        products[j:end].addmm_(gram[:j, j:end].T, coef[:j])
                    else:
                        products[j:end].view(-1, G, K).add_(
                            torch.bmm(gram[:, j:end, :j], coef[:j].view(j, G, K).transpose(0, 1)).transpose(0, 1))
                if j > j0 and orders is None:
                    torch.addmv(products[j], coef[j0:j].T, gram[j0:j, j], out=z.view(-1))
                elif j > j0:
                    torch.add(products[j].view(G, K), torch.bmm(gram[:, j, None, j0:j],
                                                                coef[j0:j].view(-1, G, K).transpose(0, 1))[:, 0],
                              out=z)
                else:
                    z.view(-1).copy_(products[j])
                if fused:
                    _fused_logits(np_["z"], np_["scale"], np_text[j], np_["rho"], np_["tau_t"], np_["tau_i"],
                                  np_["a"], np_["b"])
                    q, p = torch.softmax(a_buf, dim=1), torch.softmax(b_buf, dim=1)
            if fused:
                with timer("update"):
                    _fused_update(np_["z"], q.numpy(), p.numpy(), np_["rho"], np_["scale"], np_["mix"][t],
                                  np_["neg_rlr"][t], np_["step"][t], np_["target"], np_half[j],
                                  np_["posteriors"], t, np_["coef"][j].reshape(G, K))
                continue
            with timer("logits"):
                scale32 = scale.float()
                zs = torch.mul(z, scale32)
                q = torch.softmax(torch.div(text_block[j], tau_t[:, None]).add_(rho), dim=1)   # T x / tau_t + rho
                p = torch.softmax(zs / tau_i[:, None], dim=1)
            with timer("posterior"):
                diff = p - q
                torch.addcmul(q, mix[t, :, None], diff, out=posteriors[:, t])
            with timer("update"):
                rho.addcmul_(q - target[:, None], neg_rlr[t, :, None]).clamp_(min=0.0)
                u = step[t, :, None] * diff
                torch.div(u, scale32, out=coef[j].view(G, K))
                # |W_t + u x^T|^2 = |W_t|^2 + u (2 W_t x + u |x|^2), with |W_t| = 1: the rows are unit at
                # every step (the text prototypes, then each step's and each block's renormalisation). The
                # change u (2 W_t x + u |x|^2) in float32 (its rounding is relative to it, not to 1), the
                # norm and the running scale in float64.
                change = (torch.add(zs, u, alpha=halves[j]) if orders is None
                          else torch.addcmul(zs, u, half_sq[j, :, None])).mul_(u).mul_(2.0)
                scale.div_(change.double().add_(1.0).sqrt_().clamp_(min=1e-12))
        with timer("update"):
            # W_end = diag(scale) (W_a + C X): unit rows, as the loop's after its step.
            C = coef[:B].view(B, G, K).permute(1, 2, 0)
            streams_X = X.expand(G, -1, -1) if orders is None else X
            if a and orders is None:
                rows.addmm_(coef[:B].T, X)
            elif a:
                W.baddbmm_(C, streams_X)
            else:
                torch.baddbmm(first.text, C, streams_X, out=W)
            if a + B >= n or not bool(((scale > 1 / 64) & (scale < 64)).all()):
                W.mul_(scale.float()[..., None])
                scale.fill_(1.0)
    for method in methods:
        method.step = n
    timings = split_timings(timer, G)
    none = torch.full((n,), -1, dtype=torch.int64, device=device)
    off = torch.zeros(n, dtype=torch.bool, device=device)
    # The streams' final states are views of W and rho, which nothing changes after this.
    return [Trace(posteriors[g], none.clone(), off.clone(), off.clone(),
                  state={"W": W[g], "rho": rho[g], "step": torch.tensor(n)}, timings=dict(timings))
            for g in range(G)]
