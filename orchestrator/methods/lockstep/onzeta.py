"""OnZeta in lockstep. The dual variables rho [G, K] per stream, the text logits once per call, and the
proxies W [G, K, d] in blocks of B samples so that W is read twice per block, not three times per sample: a
step's update is W <- diag(1 / |row|) (W + u x^T), so within a block W_t = diag(s_t) (W_a + C_t X^T) with X
the block's samples, and W_t x_t = s_t * (W_a x_t + C_t (X x_t)): the products W_a X^T and X X^T once per
block, per step a [G K, <B] product and the row norms from |W_t + u x^T|^2 = 1 + u (2 W_t x + u |x|^2) (the
rows are unit at every step); at the block's end W = diag(s) (W_a + C X) is formed, unit rows again. The
per-block buffers are sample-major, so a step reads and writes whole [G K] rows. The two block products are
2 G K d multiply-adds per sample, about half a step's time at G = 32 on a CPU (`benchmarks.methods`).

Precision: the row scale s_t is a running product of B factors, kept in float64 (in float32 its rounding
adds up to 25 times the loop's own error at K = 1000, measured); everything else is float32, as the loop's
own W and x are, the squared norm's change u (2 W_t x + u |x|^2) included (its rounding is relative to the
change, not to 1). The posteriors then differ from the loop's by the loop's own float32 rounding, which
OnZeta's large early steps amplify: at K = 100, d = 32, 400 samples, the float32 loop sits 1.2e-5 from a
float64 run of the same loop and this path 1.1e-5 or less; at K = 200 (`test_lockstep.py`) and at K = 1000,
d = 512 both are within 1e-5 and 1.5e-6 of each other and of the float64 loop. Below K ~ 100 the loop
amplifies rounding further (onzeta.py).
"""

from __future__ import annotations

import torch

from orchestrator.methods.base import Method, StageTimer, Trace, validate_features
from orchestrator.methods.lockstep.common import column, split_timings

ONZETA_BLOCK = 64  # samples per block of OnZeta's proxies (see the module docstring)


def run_onzeta_lockstep(methods: list[Method], features: torch.Tensor, *, block: int = ONZETA_BLOCK) -> list[Trace]:
    """G OnZeta streams over one feature stream [n, d]; trace g equals `methods[g].run(features)`."""
    first = methods[0]
    validate_features(first.name, features, first.class_embeddings, views=False)
    n, G, K, device = features.shape[0], len(methods), first.num_classes, features.device
    for method in methods:
        method.claim(n)
    # Per-step scalars in float64, rounded to float32 where they meet a tensor, as the loop's Python floats.
    col = {k: column(methods, k, torch.float64, device) for k in ("tau_t", "tau_i", "cw", "cr", "alpha", "beta")}
    n_total = torch.tensor([[float(m.n_total)] for m in methods], dtype=torch.float64, device=device)
    i = torch.arange(1, n + 1, dtype=torch.float64, device=device)[None, :]
    step = (-col["cw"] / i.sqrt() / col["tau_i"]).float()             # [G, n]: -lr / tau_i
    neg_rlr = (-col["cr"] / i.sqrt()).float()
    mix = (col["beta"] * torch.sqrt(i / n_total)).float()
    tau_t, tau_i = col["tau_t"].float(), col["tau_i"].float()
    target = (col["alpha"] / K).float()
    W = first.text.expand(G, -1, -1).clone()
    rho = torch.zeros(G, K, dtype=torch.float32, device=device)
    posteriors = torch.empty(G, n, K, dtype=torch.float32, device=device)         # every row is written
    timer = StageTimer()
    with timer("logits"):
        text_products = features @ first.text.T
    rows = W.view(G * K, -1)
    # Per-block buffers, written in place (fresh memory costs a page fault per first touch, a sizeable share).
    products = torch.empty(block, G * K, dtype=torch.float32, device=device)
    coef = torch.empty(block, G * K, dtype=torch.float32, device=device)
    for a in range(0, n, block):
        X = features[a:a + block]
        B = X.shape[0]
        with timer("logits"):
            torch.mm(X, rows.T, out=products[:B])                          # W_a x for the block's samples
            gram = X @ X.T
            sq_x = gram.diagonal().tolist()
            scale = torch.ones(G, K, dtype=torch.float64, device=device)
        for j in range(B):
            t = a + j
            with timer("logits"):
                # W_t x_t = s_t * (W_a x_t + C_t (X x_t))
                z = torch.addmv(products[j], coef[:j].T, gram[:j, j]) if j else products[0]
                scale32 = scale.float()
                z = torch.mul(z.view(G, K), scale32)
                q = torch.softmax(torch.div(text_products[t], tau_t).add_(rho), dim=1)   # T x / tau_t + rho
                p = torch.softmax(z / tau_i, dim=1)
            with timer("posterior"):
                diff = p - q
                torch.addcmul(q, mix[:, t:t + 1], diff, out=posteriors[:, t])
            with timer("update"):
                rho.addcmul_(q - target, neg_rlr[:, t:t + 1]).clamp_(min=0.0)
                u = step[:, t:t + 1] * diff
                torch.div(u, scale32, out=coef[j].view(G, K))
                # |W_t + u x^T|^2 = |W_t|^2 + u (2 W_t x + u |x|^2), with |W_t| = 1: the rows are unit at
                # every step (the text prototypes, then each step's and each block's renormalisation). The
                # change u (2 W_t x + u |x|^2) in float32 (its rounding is relative to it, not to 1), the
                # norm and the running scale in float64.
                change = torch.add(z, u, alpha=0.5 * sq_x[j]).mul_(u).mul_(2.0)
                scale.div_(change.double().add_(1.0).sqrt_().clamp_(min=1e-12))
        with timer("update"):
            # W_end = diag(scale) (W_a + C X): unit rows, as the loop's after its step.
            rows.addmm_(coef[:B].T, X)
            W.mul_(scale.float()[..., None])
    for method in methods:
        method.step = n
    timings = split_timings(timer, G)
    none = torch.full((n,), -1, dtype=torch.int64, device=device)
    off = torch.zeros(n, dtype=torch.bool, device=device)
    # The streams' final states are views of W and rho, which nothing changes after this.
    return [Trace(posteriors[g], none.clone(), off.clone(), off.clone(),
                  state={"W": W[g], "rho": rho[g], "step": torch.tensor(n)}, timings=dict(timings))
            for g in range(G)]
