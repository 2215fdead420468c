"""A dataset's test images by its name: the registry's card, then its reader (`orchestrator.data.datasets`).

Apart from the readers, so that they never import the registry's table of cards, which names them; here too the
reader of a generated corruption's variant, which lists its clean dataset by name.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.data.datasets import ImageList, read_images
from orchestrator.data.generated import generated_id
from orchestrator.registry.corruptions import parse_generated
from orchestrator.registry.datasets import ensure_dataset


def read_dataset(name: str, data_root: str | os.PathLike) -> ImageList:
    """List a dataset's test images under `data_root` (a registered name, or a folder there in the generic
    layout); errors name the missing path and the expected layout."""
    return read_images(ensure_dataset(name, data_root), data_root)


def read_generated(data_root: Path, info) -> tuple[list[str], list[int], list[str]]:
    """The reader of a generated corruption's variant (`orchestrator.data.generated`): its clean dataset's images,
    each at its generated copy's id (written on first decode), with the clean labels and class names."""
    dataset, corruption, severity = parse_generated(info.name)
    clean = read_dataset(dataset, data_root)
    return ([generated_id(dataset, corruption, severity, i) for i in clean.image_ids], list(clean.labels),
            list(clean.class_names))
