"""The container every data source produces and every trial consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch


@dataclass(frozen=True)
class Benchmark:
    """One dataset's test stream as embeddings, in dataset order (the trial applies the stream permutation).

    features: [n, d] float32 (single view), or [n, V, d] for augmented views with view 0 the original image.
    class_embeddings: [M, d] float32, L2-normalised rows; class_ids: [M] int64 in [0, K).
    auxiliary: auxiliary encoder name -> [n, d'] float32 features of the original view, rows as `features`'
    (only where a run reads them).
    """

    name: str
    features: torch.Tensor
    labels: torch.Tensor
    image_ids: list[str]
    class_names: list[str]
    class_embeddings: torch.Tensor
    class_ids: torch.Tensor
    auxiliary: Mapping[str, torch.Tensor] = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def __len__(self) -> int:
        return int(self.labels.shape[0])
