"""idstcv/OnZeta's online loop (main_online.py lines 253-273: online label learning with the dual variable rho,
then online proxy learning), transcribed one sample at a time: the reference that tests/test_onzeta.py holds `onzeta`
to and `benchmarks.methods`' "official" column times.
"""

from __future__ import annotations

import math

import torch


def official_onzeta(X: torch.Tensor, T: torch.Tensor, n_total: int, tau_t: float, tau_i: float, cw: float,
                    cr: float, alpha: float, beta: float,
                    dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """main_online.py lines 253-273 for one stream [n, d] in the given order, one embedding per class [K, d], in
    `dtype` (float64 for the tests): (combo labels [n, K], w, rho)."""
    X, text = X.to(dtype), T.to(dtype).T                                  # text [d, K] as the official holds it
    n, K = X.shape[0], text.shape[1]
    w, rho = text.clone(), torch.zeros(K, dtype=dtype)
    combo = torch.zeros(n, K, dtype=dtype)
    for i in range(n):
        lr, rlr = cw / math.sqrt(i + 1), cr / math.sqrt(i + 1)
        b = beta * math.sqrt((i + 1) / n_total)
        x = X[i]
        tlabel = torch.softmax(x @ text / tau_t, dim=0)
        tlabel = tlabel * torch.exp(rho)
        tlabel /= tlabel.sum()
        rho -= rlr * (tlabel - alpha / K)
        rho[rho < 0] = 0
        vision = torch.softmax(x @ w / tau_i, dim=0)
        combo[i] = b * vision + (1 - b) * tlabel
        w -= (lr / tau_i) * torch.outer(x, vision - tlabel)
        w = torch.nn.functional.normalize(w, dim=0)
    return combo, w, rho
