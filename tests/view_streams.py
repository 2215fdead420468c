"""Multi-view streams for the tests of view methods: the synthetic benchmark's features as view 0, plus stand-ins
for augmentations, so that the confident-view rules have something to choose: noisy copies of the original
(renormalised; they add no information about the class), or, with `class_views`, other samples of the same
class (independent observations of it, as informative crops would be)."""

from __future__ import annotations

import math

import torch

from orchestrator.data.synthetic import make_synthetic


def view_stream(scenario: str = "iid", *, num_classes: int = 10, dim: int = 32, n: int = 400, views: int = 8,
                view_noise: float = 0.3, class_views: bool = False, seed: int = 0, **synthetic):
    """(features [n, views, d], class_embeddings, class_ids, num_classes, labels)."""
    bench = make_synthetic(scenario, num_classes=num_classes, dim=dim, n=n, seed=seed, **synthetic)
    gen = torch.Generator().manual_seed(seed + 1)
    if class_views:
        same = [torch.nonzero(bench.labels == y).flatten() for y in bench.labels.tolist()]
        picks = torch.stack([s[torch.randint(len(s), (views - 1,), generator=gen)] for s in same])
        augmented = bench.features[picks]
    else:
        noise = torch.randn(n, views - 1, dim, generator=gen) * (view_noise / dim ** 0.5)
        augmented = torch.nn.functional.normalize(bench.features[:, None] + noise, dim=-1)
    feats = torch.cat([bench.features[:, None], augmented], dim=1)
    return feats, bench.class_embeddings, bench.class_ids, bench.num_classes, bench.labels


def accuracy(posteriors: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 accuracy (fraction) of posteriors [n, K] against labels [n]: the sanity checks' measure."""
    return float((posteriors.argmax(1) == labels).float().mean())


# Plain-Python helpers for the hand-worked one- and two-step cases (K = d = 2).
def unit(xs: list[float]) -> list[float]:
    n = math.sqrt(sum(x * x for x in xs))
    return [x / n for x in xs]


def softmax(xs: list[float]) -> list[float]:
    e = [math.exp(x - max(xs)) for x in xs]
    return [v / sum(e) for v in e]
