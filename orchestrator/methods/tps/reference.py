"""elaine-sui/TPS's per-sample test-time prototype shift (shift_classification.py test_time_adapt_eval,
model/shifter.py: autograd and a fresh torch.optim.AdamW per sample), transcribed one sample at a time: the reference
that tests/test_tps.py holds `tps` to and `benchmarks.methods`' "official" column times.
"""

from __future__ import annotations

import torch


def official_tps(views: torch.Tensor, class_embeddings: torch.Tensor, lr: float = 5e-3, keep: float = 0.1,
                 scale: float = 100.0, dtype: torch.dtype = torch.float64):
    """Per sample of views [n, V, d] (view 0 the original), in `dtype`, as the official code: zero shifts, TPT's confident views (lowest softmax entropy, ties to the
    earlier view) and avg_entropy, one step of a fresh torch.optim.AdamW, then the original view against the
    shifted prototypes. Returns the posteriors and whether the step changed the prediction."""
    protos = torch.nn.functional.normalize(class_embeddings.to(dtype), dim=1)
    posts, changed = [], []
    for x in views.to(dtype):
        shift = torch.zeros_like(protos, requires_grad=True)
        optimizer = torch.optim.AdamW([shift], lr=lr)
        out = scale * x @ torch.nn.functional.normalize(protos + shift, dim=1).T
        ent = -(torch.softmax(out, 1) * torch.log_softmax(out, 1)).sum(1).detach()
        idx = torch.argsort(ent, stable=True)[:max(1, int(x.shape[0] * keep))]
        mean_p = torch.softmax(out[idx], 1).mean(0)
        loss = -torch.special.xlogy(mean_p, mean_p).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        post = torch.softmax(scale * torch.nn.functional.normalize(protos + shift.detach(), dim=1) @ x[0], 0)
        posts.append(post)
        changed.append(bool(post.argmax() != (protos @ x[0]).argmax()))
    return torch.stack(posts), torch.tensor(changed)
