"""The stream's images for the methods that adapt CLIP's image encoder (`orchestrator.methods.encoder`): decoded and
preprocessed in stream order on demand, by the view code that fills the feature cache (`ViewTransform`: the
backbone's eval transform as view 0, AugMix or crops after it), so an image the cache encoded and the pixels an
encoder method adapts on are one computation.

    StreamImages(image_ids, data_root, transform, device)[a:b] -> [b - a, 3, H, W] float32 on `device` (the single
    view), or [b - a, V, 3, H, W] for a transform with augmented views

Image ids are paths under the data root (`orchestrator.data.datasets.ImageList`: a file, a row of a CIFAR-C array, a
generated corruption's copy), the stream's own after its order and any unreadable images the cache skipped; an
image unreadable now is an error naming its file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from orchestrator.clip.views import ViewTransform
from orchestrator.data.datasets import open_image


class StreamImages:
    """A stream's images as a sliceable sequence (module docstring)."""

    def __init__(self, image_ids: list[str], data_root: str | Path, transform: ViewTransform,
                 device: torch.device) -> None:
        self.image_ids, self.data_root, self.transform, self.device = image_ids, Path(data_root), transform, device
        self.single = transform.config.kind == "single"

    def __len__(self) -> int:
        return len(self.image_ids)

    def dim(self) -> int:
        """Dimensions of a slice (a run's code path: `orchestrator.sweep.pieces.code_path`)."""
        return 4 if self.single else 5

    def _decode(self, image_id: str) -> torch.Tensor:
        path = self.data_root / image_id
        try:
            with open_image(path) as image:  # as the cache opens it: a CIFAR-C row, a generated corruption too
                image.load()
                return self.transform(image, image_id)
        except Exception as exc:  # noqa: BLE001 - any decode failure: the file and why
            raise ValueError(f"cannot read image {path} of the stream: {type(exc).__name__}: {exc}") from None

    def __getitem__(self, rows: Any) -> torch.Tensor:
        if not isinstance(rows, slice):
            raise TypeError(f"StreamImages takes a slice of stream positions, got {type(rows).__name__}")
        views = [self._decode(self.image_ids[i]) for i in range(*rows.indices(len(self)))]
        if not views:
            return torch.zeros((0, 3, 1, 1), dtype=torch.float32, device=self.device)
        batch = torch.stack(views)
        return (batch[:, 0] if self.single else batch).to(self.device)
