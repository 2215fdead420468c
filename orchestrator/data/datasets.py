"""Readers of datasets under a user's data root: the paper's (TDA / CoOp layouts) and the generic class-folder
layout (`read_class_folders`); a dataset card names its reader (`orchestrator.registry.datasets`).

A reader only lists the test images: (image id, label) pairs plus the class names. Images are decoded
later, by the feature cache's DataLoader, where an unreadable file becomes a recorded skip (see
`orchestrator.features.cache`). An image id is the file's path relative to the data root, in POSIX form,
so ids are stable across machines that mount the same data at different places.

Differences from the public reader, on purpose:
- files are listed by image extension only; the public helper's filter that drops every name containing
  "sh" (ImageNet-A 6,862 of 7,500 images, ImageNet-R without its sketch_* files) is not repeated;
- ImageNet-V2's class folders "0".."999" are ordered as numbers, not as strings;
- ImageNet-A / -R predict over their 200 classes, mapped to ImageNet's class names through the WordNet ids.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
from PIL import Image

from orchestrator.registry.corruptions import BENCHMARKS, parse_generated, parse_variant
from orchestrator.registry.dataset_card import CLASSNAMES_FILE, DatasetCard

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})

EUROSAT_RENAMES = {
    "AnnualCrop": "Annual Crop Land",
    "HerbaceousVegetation": "Herbaceous Vegetation Land",
    "Highway": "Highway or Road",
    "Industrial": "Industrial Buildings",
    "Pasture": "Pasture Land",
    "PermanentCrop": "Permanent Crop Land",
    "Residential": "Residential Buildings",
    "SeaLake": "Sea or Lake",
}


@dataclass(frozen=True)
class ImageList:
    """One dataset's test images in dataset order.

    image_ids: paths relative to the data root (POSIX); labels: class index per image in [0, K);
    class_names: the K names the classifier predicts over.
    """

    name: str
    data_root: Path
    image_ids: list[str]
    labels: list[int]
    class_names: list[str]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def __len__(self) -> int:
        return len(self.image_ids)

    def path(self, i: int) -> Path:
        return self.data_root / self.image_ids[i]

    def fingerprint(self) -> str:
        """sha256 of the image list (ids, labels, class names; file contents are not read): the feature cache's
        key and each run's record of which version of the dataset it streamed."""
        blob = json.dumps([self.image_ids, self.labels, self.class_names], separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


class DatasetLayoutError(FileNotFoundError):
    """The data root does not hold the dataset in the layout the reader expects."""


# --------------------------------------------------------------------------------------------- helpers


@cache
def imagenet_wnids() -> dict[str, list[str]]:
    """The 1000 ImageNet WordNet ids in class order (sorted), and the ImageNet-A / -R 200-id subsets."""
    with open(Path(__file__).with_name("imagenet_wnids.json"), encoding="utf-8") as f:
        table = json.load(f)
    return {k: v for k, v in table.items() if not k.startswith("_")}


def imagenet_classnames() -> list[str]:
    """CLIP's curated ImageNet class names, as open_clip ships them (index = ImageNet class index)."""
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

    return list(IMAGENET_CLASSNAMES)


def _list_images(folder: Path) -> list[str]:
    """Image file names directly inside `folder`, sorted; hidden files and non-images are left out."""
    return sorted(
        entry.name
        for entry in os.scandir(folder)
        if entry.is_file() and not entry.name.startswith(".") and Path(entry.name).suffix.lower() in IMAGE_EXTENSIONS
    )


def _class_folders(folder: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))


def _require_dir(path: Path, info: DatasetCard) -> None:
    if not path.is_dir():
        raise DatasetLayoutError(
            f"{info.title}: folder {path} does not exist. Expected layout under the data root: {info.layout}"
        )


def _require_file(path: Path, info: DatasetCard) -> None:
    if not path.is_file():
        raise DatasetLayoutError(
            f"{info.title}: file {path} does not exist. Expected layout under the data root: {info.layout}"
        )


def _clean_name(name: str) -> str:
    return name.replace("_", " ").strip()


# --------------------------------------------------------------------------------------------- readers


def _folder_per_class(
    base: Path, info: DatasetCard, class_of_folder: Callable[[str], int | None], rel_prefix: str
) -> tuple[list[str], list[int]]:
    """Images in class sub-folders; folders whose `class_of_folder` is None are an error naming them."""
    folders = _class_folders(base)
    if not folders:
        raise DatasetLayoutError(f"{info.title}: {base} has no class sub-folders. Expected layout: {info.layout}")
    unknown = [f for f in folders if class_of_folder(f) is None]
    if unknown:
        raise DatasetLayoutError(
            f"{info.title}: {base} holds {len(unknown)} folder(s) that are not classes of this dataset: "
            f"{', '.join(unknown[:5])}{f' and {len(unknown) - 5} more' if len(unknown) > 5 else ''}. Expected "
            f"layout: {info.layout}"
        )
    ordered = sorted(folders, key=lambda f: class_of_folder(f))  # class order, not string order
    ids: list[str] = []
    labels: list[int] = []
    for f in ordered:
        label = class_of_folder(f)
        for name in _list_images(base / f):
            ids.append(f"{rel_prefix}/{f}/{name}")
            labels.append(label)
    return ids, labels


def _read_wnid_folders(subset: str) -> Callable[[Path, DatasetCard], tuple[list[str], list[int], list[str]]]:
    """ImageNet, -Sketch (1000 classes) and -A, -R (200 classes): one folder per WordNet id."""

    def read(data_root: Path, info: DatasetCard) -> tuple[list[str], list[int], list[str]]:
        base = data_root / info.folder / info.image_dir
        _require_dir(base, info)
        table = imagenet_wnids()
        all_wnids = table["imagenet"]
        wnids = table[subset]
        index = {w: i for i, w in enumerate(wnids)}
        names = imagenet_classnames()
        position = {w: i for i, w in enumerate(all_wnids)}
        class_names = [names[position[w]] for w in wnids]  # 200-class subsets: ImageNet index via the wnid
        ids, labels = _folder_per_class(base, info, index.get, f"{info.folder}/{info.image_dir}".rstrip("/"))
        return ids, labels, class_names

    return read


read_imagenet = _read_wnid_folders("imagenet")
read_imagenet_a = _read_wnid_folders("imagenet-a")
read_imagenet_r = _read_wnid_folders("imagenet-r")


def read_imagenet_v2(data_root: Path, info: DatasetCard) -> tuple[list[str], list[int], list[str]]:
    base = data_root / info.folder / info.image_dir
    _require_dir(base, info)

    def class_of(folder: str) -> int | None:
        return int(folder) if folder.isdigit() and int(folder) < 1000 else None

    ids, labels = _folder_per_class(base, info, class_of, f"{info.folder}/{info.image_dir}")
    return ids, labels, imagenet_classnames()


def read_split_zhou(data_root: Path, info: DatasetCard) -> tuple[list[str], list[int], list[str]]:
    """CoOp's split files: {"train": [...], "val": [...], "test": [[relative_path, label, classname], ...]}."""
    folder = data_root / info.folder
    _require_dir(folder, info)
    split_path = folder / info.split_file
    _require_file(split_path, info)
    _require_dir(folder / info.image_dir, info)
    try:
        with open(split_path, encoding="utf-8") as f:
            split = json.load(f)
        test = split["test"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise DatasetLayoutError(
            f"{info.title}: {split_path} is not a split file with a 'test' list of [relative_path, label, "
            f"classname] entries ({type(e).__name__}: {e})"
        ) from e
    names: dict[int, str] = {}
    for part in ("train", "val", "test"):  # every split names classes, so a class absent from test keeps its name
        for entry in split.get(part, []):
            _, label, cname = entry
            cname = EUROSAT_RENAMES.get(cname, cname) if info.name == "eurosat" else cname
            cname = _clean_name(cname)
            if names.setdefault(int(label), cname) != cname:
                raise DatasetLayoutError(
                    f"{info.title}: {split_path} gives label {label} two class names: {names[int(label)]!r}, {cname!r}"
                )
    if not test:
        raise DatasetLayoutError(f"{info.title}: {split_path} has an empty 'test' list; expected [relative_path, "
                                 f"label, classname] entries for the test images")
    num_classes = max(names) + 1
    missing = sorted(set(range(num_classes)) - set(names))
    if missing:
        raise DatasetLayoutError(f"{info.title}: {split_path} has no class name for labels {missing[:10]}")
    prefix = f"{info.folder}/{info.image_dir}".rstrip("/")
    ids = [f"{prefix}/{entry[0]}" for entry in test]
    labels = [int(entry[1]) for entry in test]
    return ids, labels, [names[k] for k in range(num_classes)]


def read_aircraft(data_root: Path, info: DatasetCard) -> tuple[list[str], list[int], list[str]]:
    """FGVC-Aircraft: variants.txt (one class per line, class order) and images_variant_test.txt ('id variant')."""
    folder = data_root / info.folder
    _require_dir(folder, info)
    variants_path = folder / "variants.txt"
    test_path = folder / "images_variant_test.txt"
    _require_file(variants_path, info)
    _require_file(test_path, info)
    _require_dir(folder / info.image_dir, info)
    class_names = [line.strip() for line in variants_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    index = {name: i for i, name in enumerate(class_names)}
    ids: list[str] = []
    labels: list[int] = []
    for n, line in enumerate(test_path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        image, _, variant = line.strip().partition(" ")
        if variant not in index:
            raise DatasetLayoutError(
                f"{info.title}: {test_path} line {n} names variant {variant!r}, which {variants_path} does not list"
            )
        ids.append(f"{info.folder}/{info.image_dir}/{image}.jpg")
        labels.append(index[variant])
    return ids, labels, class_names


def read_class_folders(data_root: Path, info: DatasetCard) -> tuple[list[str], list[int], list[str]]:
    """The generic layout: <folder>/classnames.txt names the classes of the sub-folders in sorted order (as
    torchvision's ImageFolder numbers them); every image of sub-folder i is of class i."""
    base = data_root / info.folder
    _require_dir(base, info)
    names_path = base / CLASSNAMES_FILE
    _require_file(names_path, info)
    class_names = [line.strip() for line in names_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    folders = _class_folders(base)
    if len(folders) != len(class_names):
        raise DatasetLayoutError(
            f"{info.title}: {base} has {len(folders)} class sub-folders ({', '.join(folders) or 'none'}) but "
            f"{names_path} lists {len(class_names)} class names; expected one name a line per sub-folder, in the "
            f"sub-folders' sorted order")
    index = {f: i for i, f in enumerate(folders)}
    ids, labels = _folder_per_class(base, info, index.get, info.folder)
    return ids, labels, class_names


# An image id '<file>.npy:<row>' is row <row> of a uint8 [N, H, W, 3] array (CIFAR-C keeps its images so).
_NPY_ROW = re.compile(r"^(.*\.npy):(\d+)$")


@cache
def _npy_images(path: str) -> np.ndarray:
    return np.load(path, mmap_mode="r")  # memory-mapped: a worker reads only the rows it decodes


def open_image(path: Path) -> Image.Image:
    """The image at `path` (an `ImageList.path`): an image file, a row of a CIFAR-C array ('<file>.npy:<row>'), or
    a generated corruption's copy, written from its clean image on first use (`orchestrator.data.generated`)."""
    row = _NPY_ROW.match(str(path))
    if row is None:
        try:
            return Image.open(path)
        except FileNotFoundError:
            from orchestrator.data.generated import materialise

            if not materialise(Path(path)):
                raise
            return Image.open(path)
    return Image.fromarray(np.asarray(_npy_images(row.group(1))[int(row.group(2))]))


def read_generated(data_root: Path, info: DatasetCard) -> tuple[list[str], list[int], list[str]]:
    """A corruption generated from a dataset's clean images (`orchestrator.data.generated`): the clean dataset's
    images, each at its generated copy's id (written on its first decode, `open_image`), with the clean labels and
    class names."""
    from orchestrator.data.generated import generated_id
    from orchestrator.registry.datasets import ensure_dataset  # the clean dataset's card, registered or a folder

    dataset, corruption, severity = parse_generated(info.name)
    clean = read_images(ensure_dataset(dataset, data_root), data_root)
    return ([generated_id(dataset, corruption, severity, i) for i in clean.image_ids], list(clean.labels),
            list(clean.class_names))


def read_cifar_c(data_root: Path, info: DatasetCard) -> tuple[list[str], list[int], list[str]]:
    """CIFAR-10-C / CIFAR-100-C: the rows of one severity of `<folder>/<corruption>.npy` (uint8 [5 N, 32, 32, 3],
    severities 1..5 stacked in order) with their labels from `labels.npy` beside it."""
    bench, corruption, severity = parse_variant(info.name)
    folder = data_root / BENCHMARKS[bench].folder
    _require_dir(folder, info)
    array_path, labels_path = folder / f"{corruption}.npy", folder / "labels.npy"
    _require_file(array_path, info)
    _require_file(labels_path, info)
    try:
        images, labels = np.load(array_path, mmap_mode="r"), np.load(labels_path, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise DatasetLayoutError(f"{info.title}: cannot read {array_path} or {labels_path} as .npy arrays ({exc})") \
            from None
    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8 or len(images) % 5:
        raise DatasetLayoutError(f"{info.title}: {array_path} is {images.dtype} {list(images.shape)}; expected uint8 "
                                 f"[5 x N, H, W, 3] (the 5 severities stacked). Expected layout: {info.layout}")
    if labels.shape != (len(images),):
        raise DatasetLayoutError(f"{info.title}: {labels_path} has shape {list(labels.shape)}; expected "
                                 f"[{len(images)}], one label per row of {array_path}")
    per = len(images) // 5
    rows = range((severity - 1) * per, severity * per)
    rel = f"{BENCHMARKS[bench].folder}/{corruption}.npy"
    return [f"{rel}:{r}" for r in rows], labels[rows.start:rows.stop].astype(int).tolist(), \
        list(BENCHMARKS[bench].classes)


# ------------------------------------------------------------------------------------- reader per card


# The readers the built-in cards name (a card names a reader of this module by its name).
BUILTIN_READERS = {"read_imagenet": read_imagenet, "read_imagenet_a": read_imagenet_a, "read_imagenet_r": read_imagenet_r,
                   "read_imagenet_v2": read_imagenet_v2, "read_split_zhou": read_split_zhou,
                   "read_aircraft": read_aircraft, "read_class_folders": read_class_folders,
                   "read_cifar_c": read_cifar_c, "read_generated": read_generated}


def _reader(info: DatasetCard) -> Callable[[Path, DatasetCard], tuple[list[str], list[int], list[str]]]:
    if callable(info.reader):
        return info.reader
    if ":" not in info.reader:  # a built-in reader, by name
        found = BUILTIN_READERS.get(info.reader)
        if found is None:
            raise DatasetLayoutError(f"{info.title}: its card's reader {info.reader!r} is not a built-in reader; "
                                     f"expected one of {', '.join(BUILTIN_READERS)} or 'module:function'")
        return found
    module, _, function = info.reader.partition(":")
    try:
        return getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as exc:
        raise DatasetLayoutError(f"{info.title}: its card's reader {info.reader!r} cannot be imported ({exc}); "
                                 f"expected 'module:function' of a module on the Python path") from None


def read_images(info: DatasetCard, data_root: str | os.PathLike) -> ImageList:
    """List the test images of the dataset of card `info` under `data_root` (`orchestrator.data.listing.read_dataset`
    looks the card up by name); errors name the missing path and the expected layout."""
    root = Path(data_root).expanduser().resolve()
    if not root.is_dir():
        raise DatasetLayoutError(
            f"data root {root} does not exist (reading {info.title}; expected {root}/{info.layout})"
        )
    ids, labels, class_names = _reader(info)(root, info)
    if not ids:
        raise DatasetLayoutError(f"{info.title}: no test images found under {root / info.folder}. "
                                 f"Expected layout: {info.layout}")
    bad = sorted({label for label in labels if not 0 <= label < len(class_names)})
    if bad:
        raise DatasetLayoutError(f"{info.title}: its reader gave labels {bad[:10]} outside [0, {len(class_names)}) "
                                 f"for its {len(class_names)} class names")
    return ImageList(info.name, root, ids, labels, class_names)
