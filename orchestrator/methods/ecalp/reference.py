"""ECALP's per-sample algorithm written from its equations as the official code (`Yushu-Li/ECALP`
utils/iterative_label_propagation.py, main.py) evaluates them, recomputing the whole graph at every sample with
dense matrices: the reference that tests/test_ecalp.py compares the incremental `ecalp` against. Nothing here
is fast (O(n^3) over a stream).

At sample i the graph has C text nodes and i + 2 image nodes: the samples 0..i and, last, a second node of
sample i (the official main.py stacks features[:i+1] and features[i] again; the prediction is read off that
last node). The similarity of two image nodes at positions a < b is <r(f_a), u(f_b)>, with u(f) = f / |f| and
r(f) = u(f * w), w = u(var of the class texts over classes): the earlier node is the re-weighted one, which is
what the official incremental update computes (see method.py). Among equal similarities the earlier node comes
first, except that sample i's second node comes before sample i: the method's rule (the official torch.topk
leaves that tie open, and on CPU takes either node).

The image k-NN lists (`neighbours`): `exact` takes each row's k_image nearest nodes afresh at every sample;
`official` keeps the store the official dynamic_graph_expansion keeps, transcribed step by step: each row holds
`width` entries (k_image while sample i <= k_image, k_image + 1 at i = k_image + 1, k_image + 2 after), the
entries pointing at the last sample's second node are set to -1 when that index becomes the next sample, the new
sample and its second node enter every earlier row, each row keeps its best `width`, and a row's first
min(k_image, i + 2) entries are its list; ties are broken by the same rule as `exact`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

OUTPUT_SCALE = 10000.0  # the official posterior: softmax(10000 * propagated scores)
CARRY_DIVISOR = 5.0     # the official carried label: each image node's top score / 5


def neighbours(features: torch.Tensor, text: torch.Tensor, k_image: int, graph: str = "exact"):
    """Per sample i of features [n, d]: (S [i + 2, i + 2] the image nodes' similarities, near [i + 2, K] each
    image node's k-NN list), K = min(k_image, i + 2); `graph` 'exact' or 'official' (module docstring)."""
    weights = F.normalize(text.to(features.dtype).var(dim=0), dim=0)
    rw, un = F.normalize(features * weights, dim=1), F.normalize(features, dim=1)
    store: list[list[tuple[float, int]]] = []                        # official: each sample's (similarity, node)
    for i in range(features.shape[0]):
        nodes = list(range(i + 1)) + [i]                             # feature of each image node
        N = len(nodes)
        S = rw[:i + 1] @ un[:i + 1].T                                # S[a, b] = <r(f_a), u(f_b)>
        upper = torch.ones(i + 1, i + 1, dtype=torch.bool).triu()
        S = torch.where(upper, S, S.T)[nodes][:, nodes]              # the earlier node re-weighted; the second
        K = min(k_image, N)                                          # node's entries equal to sample i's

        def rank(entries: list[tuple[float, int]]) -> list[tuple[float, int]]:
            # nearest first; among equal similarities the earlier node, but sample i's second node before sample i
            return sorted(entries, key=lambda e: (-e[0], i - 0.5 if e[1] == i + 1 else e[1]))

        if graph == "exact":                                         # rank's order, as a stable sort
            order = torch.tensor(list(range(i)) + [i + 1, i])
            near = order[torch.sort(S[:, order], dim=1, descending=True, stable=True).indices[:, :K]]
        else:
            width = K + 1 if i == K + 1 else K + 2 if i > K else K
            for a in range(i):
                stale = [(-1.0 if b == i else v, b) for v, b in store[a]]   # the last second node's entries
                store[a] = rank(stale + [(float(S[a, i]), i), (float(S[a, i]), i + 1)])[:width]
            store.append(rank([(float(S[i, b]), b) for b in range(N)])[:width])
            near = torch.tensor([[b for _, b in store[a][:K]] for a in [*range(i + 1), i]])
        yield S, near


def ecalp_reference(features: torch.Tensor, text: torch.Tensor, k_image: int, k_text: int, edge_power: int,
                    alpha: float, iterations: int, graph: str = "exact") -> torch.Tensor:
    """features [n, d], text [C, d] (one unit embedding per class) -> posteriors [n, C], in the features' dtype
    (float64 for the tests)."""
    n, C = features.shape[0], text.shape[0]
    text = text.to(features.dtype)
    like = {"dtype": features.dtype}
    text_sims = features @ text.T
    eye = torch.eye(C, **like)
    carry_class = torch.zeros(0, dtype=torch.int64)                  # carried label of samples 0..i-1
    carry_value = torch.zeros(0, **like)
    out = torch.zeros(n, C, **like)
    for i, (S, near) in enumerate(neighbours(features, text, k_image, graph)):
        nodes = list(range(i + 1)) + [i]                             # feature of each image node
        N = len(nodes)
        texts = text_sims[nodes].topk(min(k_text, C), dim=1).indices
        A = torch.zeros(C + N, C + N, **like)
        rows = torch.arange(C, C + N)[:, None]
        A[rows, C + near] = S.gather(1, near) ** edge_power
        A[rows, texts] = text_sims[nodes].gather(1, texts) ** edge_power
        W = A + A.T
        scale = 1.0 / (W.sum(dim=1).sqrt() + 1e-6)
        W_tilde = scale[:, None] * W * scale[None, :]
        Y0 = torch.zeros(N, C, **like)
        Y0[torch.arange(i), carry_class] = carry_value
        Y = torch.cat([eye, Y0])
        for _ in range(iterations):
            Y = torch.cat([eye, alpha * (W_tilde[C:] @ Y) + (1 - alpha) * Y0])
        out[i] = torch.softmax(OUTPUT_SCALE * Y[-1], dim=0)
        top = Y[C:C + i + 1].max(dim=1)
        carry_class, carry_value = top.indices, top.values / CARRY_DIVISOR
    return out
