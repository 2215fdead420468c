"""A dataset's test images by its name: the registry's card, then its reader (`orchestrator.data.datasets`).

Apart from the readers, so that they never import the registry's table of cards, which names them.
"""

from __future__ import annotations

import os

from orchestrator.data.datasets import ImageList, read_images
from orchestrator.registry.datasets import ensure_dataset


def read_dataset(name: str, data_root: str | os.PathLike) -> ImageList:
    """List a dataset's test images under `data_root` (a registered name, or a folder there in the generic
    layout); errors name the missing path and the expected layout."""
    return read_images(ensure_dataset(name, data_root), data_root)
