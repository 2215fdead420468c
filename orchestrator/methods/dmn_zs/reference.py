"""YBZh/DMN's zero-shot loop (dmn_main.py direct_inference with --n_shot 0, DualMem.update_memory_bank and
get_image_pred), transcribed one sample at a time: the reference that tests/test_dmn_zs.py holds `dmn_zs` to and
`benchmarks.methods`' "official" column times.
"""

from __future__ import annotations

import torch


def official_dmn_zs(views, class_embeddings, memory_size=50, beta=5.5, memory_weight=1.0, keep=0.1, scale=100.0,
                    dtype: torch.dtype = torch.float64):
    """The official loop over views [n, V, d] (view 0 the original), one embedding per class [K, d], in `dtype`
    (float64 for the tests): raw original-view features in the memory, normalised when read. Returns (posteriors,
    each sample's pseudo-label, whether it was written, the memory's per-class counts)."""
    text = torch.nn.functional.normalize(class_embeddings.to(dtype), dim=1)
    K, d = text.shape
    memory = torch.zeros(K, memory_size, d, dtype=dtype)
    entropy = torch.zeros(K, memory_size, dtype=dtype)
    count = [0] * K
    posts, labels, written = [], [], []
    for x in views.to(dtype):
        probs = torch.softmax(scale * x @ text.T, dim=1)
        view_entropy = -(probs * torch.log(probs + 1e-6)).sum(1)
        idx = torch.argsort(view_entropy, stable=True)[:max(1, int(x.shape[0] * keep))]
        mean_prob = probs[idx].mean(0)
        y = int(mean_prob.argmax())
        h = -(mean_prob * torch.log(mean_prob + 1e-8)).sum()
        wrote = True
        if count[y] == memory_size:
            if int((h < entropy[y]).sum()) == 0:
                wrote = False
            else:
                slot = int(torch.sort(entropy[y], stable=True).indices[-1])
                memory[y, slot], entropy[y, slot] = x[0], h
        else:
            memory[y, count[y]], entropy[y, count[y]] = x[0], h
            count[y] += 1
        keys = torch.cat([memory, text[:, None]], dim=1)                                  # [K, size + 1, d]
        empty = keys.sum(-1) == 0
        keys = keys / keys.norm(dim=-1, keepdim=True)
        keys[empty] = 0
        q = x[0] / x[0].norm()
        weights = torch.exp(-beta * (1 - (keys * q).sum(-1)))
        read = (keys * weights[..., None]).sum(1)
        read = read / read.norm(dim=-1, keepdim=True)
        p_memory = torch.softmax(scale * read @ x[0], dim=0)
        posts.append((probs[0] + memory_weight * p_memory) / (1 + memory_weight))
        labels.append(y)
        written.append(wrote)
    return torch.stack(posts), torch.tensor(labels), torch.tensor(written), torch.tensor(count)
