"""Readers for the paper's datasets under a user's data root (REFERENCE.md section 4, TDA / CoOp layouts).

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

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

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


@dataclass(frozen=True)
class DatasetInfo:
    name: str  # canonical name
    title: str  # as the paper's tables write it
    folder: str  # under the data root
    layout: str  # what the reader expects, for error messages
    reader: Callable[[Path, "DatasetInfo"], tuple[list[str], list[int], list[str]]]
    split_file: str | None = None
    image_dir: str = ""  # relative to `folder`; split-file paths are relative to it
    protocol_views: str = "single"  # the public protocol's view setting (REFERENCE.md section 3)


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


def _require_dir(path: Path, info: DatasetInfo) -> None:
    if not path.is_dir():
        raise DatasetLayoutError(
            f"{info.title}: folder {path} does not exist. Expected layout under the data root: {info.layout}"
        )


def _require_file(path: Path, info: DatasetInfo) -> None:
    if not path.is_file():
        raise DatasetLayoutError(
            f"{info.title}: file {path} does not exist. Expected layout under the data root: {info.layout}"
        )


def _clean_name(name: str) -> str:
    return name.replace("_", " ").strip()


# --------------------------------------------------------------------------------------------- readers


def _folder_per_class(
    base: Path, info: DatasetInfo, class_of_folder: Callable[[str], int | None], rel_prefix: str
) -> tuple[list[str], list[int]]:
    """Images in class sub-folders; folders whose `class_of_folder` is None are an error naming them."""
    folders = _class_folders(base)
    if not folders:
        raise DatasetLayoutError(f"{info.title}: {base} has no class sub-folders. Expected layout: {info.layout}")
    unknown = [f for f in folders if class_of_folder(f) is None]
    if unknown:
        raise DatasetLayoutError(
            f"{info.title}: {base} holds folders that are not classes of this dataset: {unknown[:5]}"
            f"{' ...' if len(unknown) > 5 else ''}. Expected layout: {info.layout}"
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


def _read_wnid_folders(subset: str) -> Callable[[Path, DatasetInfo], tuple[list[str], list[int], list[str]]]:
    """ImageNet, -Sketch (1000 classes) and -A, -R (200 classes): one folder per WordNet id."""

    def read(data_root: Path, info: DatasetInfo) -> tuple[list[str], list[int], list[str]]:
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


def _read_imagenet_v2(data_root: Path, info: DatasetInfo) -> tuple[list[str], list[int], list[str]]:
    base = data_root / info.folder / info.image_dir
    _require_dir(base, info)

    def class_of(folder: str) -> int | None:
        return int(folder) if folder.isdigit() and int(folder) < 1000 else None

    ids, labels = _folder_per_class(base, info, class_of, f"{info.folder}/{info.image_dir}")
    return ids, labels, imagenet_classnames()


def _read_split_zhou(data_root: Path, info: DatasetInfo) -> tuple[list[str], list[int], list[str]]:
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
    num_classes = max(names) + 1
    missing = sorted(set(range(num_classes)) - set(names))
    if missing:
        raise DatasetLayoutError(f"{info.title}: {split_path} has no class name for labels {missing[:10]}")
    prefix = f"{info.folder}/{info.image_dir}".rstrip("/")
    ids = [f"{prefix}/{entry[0]}" for entry in test]
    labels = [int(entry[1]) for entry in test]
    return ids, labels, [names[k] for k in range(num_classes)]


def _read_aircraft(data_root: Path, info: DatasetInfo) -> tuple[list[str], list[int], list[str]]:
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


# --------------------------------------------------------------------------------------------- registry

_SPLIT_LAYOUT = "{folder}/{split} (CoOp split_zhou json) and the images under {folder}/{images}/"

_INFOS = [
    DatasetInfo("imagenet", "ImageNet", "imagenet", "imagenet/images/val/<wnid>/*.JPEG (1000 WordNet-id folders)",
                _read_wnid_folders("imagenet"), image_dir="images/val"),
    DatasetInfo("imagenet-a", "ImageNet-A", "imagenet-adversarial",
                "imagenet-adversarial/imagenet-a/<wnid>/*.jpg (200 WordNet-id folders)",
                _read_wnid_folders("imagenet-a"), image_dir="imagenet-a", protocol_views="augmix"),
    DatasetInfo("imagenet-v2", "ImageNet-V2", "imagenetv2",
                "imagenetv2/imagenetv2-matched-frequency-format-val/<0..999>/*.jpeg (class-index folders)",
                _read_imagenet_v2, image_dir="imagenetv2-matched-frequency-format-val", protocol_views="augmix"),
    DatasetInfo("imagenet-r", "ImageNet-R", "imagenet-rendition",
                "imagenet-rendition/imagenet-r/<wnid>/*.jpg (200 WordNet-id folders)",
                _read_wnid_folders("imagenet-r"), image_dir="imagenet-r", protocol_views="augmix"),
    DatasetInfo("imagenet-sketch", "ImageNet-Sketch", "imagenet-sketch",
                "imagenet-sketch/images/<wnid>/*.JPEG (1000 WordNet-id folders)",
                _read_wnid_folders("imagenet"), image_dir="images", protocol_views="augmix"),
    DatasetInfo("aircraft", "Aircraft", "fgvc_aircraft",
                "fgvc_aircraft/variants.txt, fgvc_aircraft/images_variant_test.txt ('<image id> <variant>' lines) "
                "and fgvc_aircraft/images/<image id>.jpg",
                _read_aircraft, image_dir="images"),
]
_SPLITS = [
    ("caltech101", "Caltech101", "caltech-101", "split_zhou_Caltech101.json", "101_ObjectCategories"),
    ("cars", "Cars", "stanford_cars", "split_zhou_StanfordCars.json", ""),
    ("dtd", "DTD", "dtd", "split_zhou_DescribableTextures.json", "images"),
    ("eurosat", "EuroSAT", "eurosat", "split_zhou_EuroSAT.json", "2750"),
    ("flowers102", "Flowers102", "oxford_flowers", "split_zhou_OxfordFlowers.json", "jpg"),
    ("food101", "Food101", "food-101", "split_zhou_Food101.json", "images"),
    ("pets", "Pets", "oxford_pets", "split_zhou_OxfordPets.json", "images"),
    ("sun397", "SUN397", "sun397", "split_zhou_SUN397.json", "SUN397"),
    ("ucf101", "UCF101", "ucf101", "split_zhou_UCF101.json", "UCF-101-midframes"),
]
_INFOS += [
    DatasetInfo(name, title, folder, _SPLIT_LAYOUT.format(folder=folder, split=split, images=images or "."),
                _read_split_zhou, split_file=split, image_dir=images)
    for name, title, folder, split, images in _SPLITS
]

DATASETS: dict[str, DatasetInfo] = {info.name: info for info in _INFOS}
OOD_DATASETS = ("imagenet", "imagenet-a", "imagenet-v2", "imagenet-r", "imagenet-sketch")
CROSS_DOMAIN_DATASETS = ("aircraft", "caltech101", "cars", "dtd", "eurosat", "flowers102", "food101", "pets",
                         "sun397", "ucf101")

# The public code's short names and the folder names, so specs written against TDA's scripts work unchanged.
_ALIASES = {
    "i": "imagenet", "imagenet-1k": "imagenet", "imagenet1k": "imagenet",
    "a": "imagenet-a", "imagenet-adversarial": "imagenet-a",
    "v": "imagenet-v2", "imagenetv2": "imagenet-v2", "v2": "imagenet-v2",
    "r": "imagenet-r", "imagenet-rendition": "imagenet-r",
    "s": "imagenet-sketch", "k": "imagenet-sketch", "sketch": "imagenet-sketch",
    "fgvc": "aircraft", "fgvc_aircraft": "aircraft", "fgvc-aircraft": "aircraft",
    "caltech-101": "caltech101", "stanford_cars": "cars", "stanfordcars": "cars",
    "describabletextures": "dtd", "oxford_flowers": "flowers102", "flowers": "flowers102",
    "food-101": "food101", "food": "food101", "oxford_pets": "pets", "oxfordpets": "pets",
    "sun": "sun397", "ucf": "ucf101",
}


def canonical_dataset_name(name: str) -> str:
    """The registry name for `name` (case-insensitive; TDA's short codes and folder names accepted)."""
    key = name.strip().lower().replace(" ", "")
    key = _ALIASES.get(key, key)
    if key not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)} "
                         f"(aliases: {', '.join(sorted(_ALIASES))})")
    return key


def protocol_views(name: str) -> str:
    """The public protocol's view setting for a dataset: 'augmix' for ImageNet-A/-V2/-R/-Sketch, else 'single'."""
    return DATASETS[canonical_dataset_name(name)].protocol_views


def read_dataset(name: str, data_root: str | os.PathLike) -> ImageList:
    """List a dataset's test images under `data_root`; errors name the missing path and the expected layout."""
    info = DATASETS[canonical_dataset_name(name)]
    root = Path(data_root).expanduser().resolve()
    if not root.is_dir():
        raise DatasetLayoutError(
            f"data root {root} does not exist (reading {info.title}; expected {root}/{info.layout})"
        )
    ids, labels, class_names = info.reader(root, info)
    if not ids:
        raise DatasetLayoutError(f"{info.title}: no test images found under {root / info.folder}. "
                                 f"Expected layout: {info.layout}")
    return ImageList(info.name, root, ids, labels, class_names)
