"""FarinaMatteo/zero's per-sample `zero` (ttas/zero.py with ttas/base.py confidence_filter and utils/tools.py
greedy_break) as its official run computes it, in float32 or in its float16 (a half CLIP under autocast): the
reference tests/test_zero.py holds `zero`'s `state_dtype` against. One sample at a time, no batching.
"""

from __future__ import annotations

import torch

from orchestrator.methods.numerics import product  # a float16 product as a GPU computes it


def official_zero(views: torch.Tensor, weights: torch.Tensor, hp: dict,
                  dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Views [n, V, d] against one embedding per class [K, d], inputs rounded to `dtype`: (p_bar [n, K], the
    official output, float32: the kept views' summed softmaxes at the zero temperature finfo(dtype).eps, plus 1
    on the winner of a tie; tied [n] bool). Autocast's softmax is float32; the logits and their division by the
    model's temp (1 / logit_scale, rounded to `dtype`) are `dtype`. A tie goes to the first view of l[k:] whose
    argmax is a tied class (hp's tie_break: 'after_k' the loader's order as the code indexes it, 'discarded' the
    discarded views in confidence order), else (break_sample_tie as intended) the tied class with the highest
    logit in the first of them (the most confident view when every view is kept)."""
    views, weights = views.to(dtype), weights.to(dtype)
    temp = 1.0 / torch.tensor(hp["logit_scale"], dtype=dtype)
    zero_temp = torch.finfo(dtype).eps
    out, tied = [], []
    for sample in views:
        logits = product(sample, weights.T)                                    # l = z_img @ z_txt.t()
        p = torch.softmax((logits / temp).float(), dim=1)
        entropy = -(p * p.log()).sum(1)
        order = torch.argsort(entropy, stable=True)
        k = max(1, int(sample.shape[0] * hp["keep"]))
        p_bar = torch.softmax((logits[order[:k]] / zero_temp).float(), dim=1).sum(0)
        best = p_bar.max()
        ties = [c for c in range(p_bar.shape[0]) if p_bar[c] == best]
        if len(ties) > 1:
            if k >= len(order):
                rest = order[:1]
            elif hp["tie_break"] == "after_k":
                rest = torch.arange(k, len(order))                             # greedy_break(ties, l[k:])
            else:
                rest = order[k:]
            votes = [int(logits[v].argmax()) for v in rest]
            pred = next((c for c in votes if c in ties), None)
            if pred is None:
                pred = max(ties, key=lambda c: float(logits[rest[0], c]))
            p_bar[pred] += 1
        out.append(p_bar)
        tied.append(len(ties) > 1)
    return torch.stack(out), torch.tensor(tied)
