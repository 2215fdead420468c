"""MaxZanella/MTA's per-sample solve_mta (mta.py: the kNN bandwidths, the inlierness scores and the MeanShift
mode, 5 outer x 5 inner steps), transcribed one sample at a time: the reference that tests/test_mta.py holds `mta`
to and `benchmarks.methods`' "official" column times.
"""

from __future__ import annotations

import numpy as np
import torch

from orchestrator.methods.boostadapter.reference import softmax  # the same numpy softmax over the last axis


def official_mta(views: torch.Tensor, text: torch.Tensor, lambda_y: float = 0.2, lambda_q: float = 4.0,
                 scale: float = 100.0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Logits [n, K] over views [n, V, d] (view 0 the original) and one embedding per class [K, d]: the official
    solve_mta, one sample at a time, in numpy (fewer, cheaper ops than torch's) at `dtype` (float64 for the
    tests)."""
    text = text.to(dtype).numpy()
    out = []
    for feats in views.to(dtype).numpy():
        V = feats.shape[0]
        logits = scale * feats @ text.T
        k = int(0.3 * (V - 1))
        dist = np.sqrt(((feats[:, None] - feats[None]) ** 2).sum(-1))
        nearest = np.sort(dist, axis=1)[:, 1:k + 1]
        h = np.sqrt(0.5 * np.mean(nearest ** 2, axis=1))
        probs = softmax(logits)
        affinity = probs @ probs.T
        y = np.full(V, 1 / V, dtype=feats.dtype)
        mode = feats[0]

        def density(m):
            return np.exp(-np.linalg.norm(feats - m, axis=-1) ** 2 / (2 * h ** 2))

        for _ in range(5):
            g = density(mode)
            for _ in range(5):
                old = y
                y = softmax(1 / lambda_y * (g + lambda_q * np.sum(affinity * y[None], axis=1)))
                if np.linalg.norm(old - y) < 1e-6:
                    break
            for _ in range(5):
                old = mode
                w = density(mode) * y
                mode = np.sum(w[:, None] * feats, axis=0) / np.sum(w)
                mode = mode / np.linalg.norm(mode)
                if np.linalg.norm(old - mode) < 1e-6:
                    break
        out.append(scale * text @ mode)
    return torch.from_numpy(np.stack(out))
