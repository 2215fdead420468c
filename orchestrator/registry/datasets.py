"""The dataset registry: one card per dataset, every fact about it in one place.

Plain data (no torch, no open_clip): the readers in `orchestrator.data.datasets`, the prompts in
`orchestrator.clip.prompts`, the report's paper tables, the methods' per-dataset defaults and the dashboard
all ask these cards. A name is looked up after lower-casing and dropping everything but letters and digits,
so "ImageNet-A", "imagenet_a" and "imageneta" are one dataset; the aliases add the public code's short codes
(TDA's `A`, `V`, `R`, `S`/`K`, `I`) and the usual folder and paper spellings. Run configs store `name`.

The paper's 15 datasets are built in (`paper=True`: the report's Table 1 and Table 2 hold them). Others come in
two ways (docs/adding-a-dataset.md):
- a folder under the data root holding `classnames.txt`, `templates.txt` and one sub-folder of images per class
  (CLIP_benchmark's self-describing layout): naming the folder in a spec registers it (`folder_dataset`), no code;
- a card with a reader of its own, `register_dataset(card)` in a plugin module that a spec names under `plugins:`.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from orchestrator.registry.corruptions import BENCHMARKS, generated_card, parse_generated, parse_variant, variant_card
from orchestrator.registry.dataset_card import (CLASSNAMES_FILE, CLIP80, CROSS_DOMAIN, DATASET_NAME_RE, ENSEMBLE7,
                                                  GROUP_TITLES, GROUPS, OOD, OTHER, TEMPLATES_FILE, DatasetCard)

FOLDER_READER = "read_class_folders"  # built-in readers are named, not imported: see dataset_card

_SPLIT_LAYOUT = "{folder}/{split} (CoOp split_zhou json) and the images under {folder}/{images}/"


def _split(name: str, title: str, classes: int, images: int, folder: str, split: str, image_dir: str,
           templates: str | tuple[str, ...], aliases: tuple[str, ...], cupl: str) -> DatasetCard:
    return DatasetCard(name, title, CROSS_DOMAIN, classes, images, folder,
                       _SPLIT_LAYOUT.format(folder=folder, split=split, images=image_dir or "."), "read_split_zhou",
                       templates, image_dir=image_dir, split_file=split, aliases=aliases,
                       cupl=f"CuPL_prompts_{cupl}.json")


_PAPER_CARDS: tuple[DatasetCard, ...] = tuple(replace(card, paper=True) for card in (
    DatasetCard("imagenet", "ImageNet", OOD, 1000, 50000, "imagenet",
                "imagenet/images/val/<wnid>/*.JPEG (1000 WordNet-id folders)", "read_imagenet", ENSEMBLE7,
                image_dir="images/val", cupl="CuPL_prompts_imagenet.json", aliases=("i", "in1k", "imagenet1k", "ilsvrc2012")),
    DatasetCard("imagenet-a", "ImageNet-A", OOD, 200, 7500, "imagenet-adversarial",
                "imagenet-adversarial/imagenet-a/<wnid>/*.jpg (200 WordNet-id folders)", "read_imagenet_a",
                ENSEMBLE7, views="augmix", image_dir="imagenet-a", cupl="CuPL_prompts_imagenet.json", aliases=("a", "imagenetadversarial")),
    DatasetCard("imagenet-v2", "ImageNet-V2", OOD, 1000, 10000, "imagenetv2",
                "imagenetv2/imagenetv2-matched-frequency-format-val/<0..999>/*.jpeg (class-index folders)",
                "read_imagenet_v2", ENSEMBLE7, views="augmix", image_dir="imagenetv2-matched-frequency-format-val",
                cupl="CuPL_prompts_imagenet.json", aliases=("v", "v2", "imagenetv2matchedfrequency")),
    DatasetCard("imagenet-r", "ImageNet-R", OOD, 200, 30000, "imagenet-rendition",
                "imagenet-rendition/imagenet-r/<wnid>/*.jpg (200 WordNet-id folders)", "read_imagenet_r", CLIP80,
                views="augmix", image_dir="imagenet-r", cupl="CuPL_prompts_imagenet.json", aliases=("r", "imagenetrendition")),
    DatasetCard("imagenet-sketch", "ImageNet-Sketch", OOD, 1000, 50889, "imagenet-sketch",
                "imagenet-sketch/images/<wnid>/*.JPEG (1000 WordNet-id folders)", "read_imagenet", CLIP80,
                views="augmix", image_dir="images", cupl="CuPL_prompts_imagenet.json", aliases=("s", "k", "sketch", "imagenets")),
    DatasetCard("aircraft", "Aircraft", CROSS_DOMAIN, 100, 3333, "fgvc_aircraft",
                "fgvc_aircraft/variants.txt, fgvc_aircraft/images_variant_test.txt ('<image id> <variant>' lines) "
                "and fgvc_aircraft/images/<image id>.jpg", "read_aircraft", ("a photo of a {}, a type of aircraft.",),
                image_dir="images", cupl="CuPL_prompts_fgvcaircraft.json", aliases=("fgvc", "fgvcaircraft")),
    _split("caltech101", "Caltech101", 100, 2465, "caltech-101", "split_zhou_Caltech101.json",
           "101_ObjectCategories", ENSEMBLE7, ("caltech",), "caltech101"),
    _split("cars", "Cars", 196, 8041, "stanford_cars", "split_zhou_StanfordCars.json", "", ENSEMBLE7,
           ("stanfordcars",), "stanfordcars"),
    _split("dtd", "DTD", 47, 1692, "dtd", "split_zhou_DescribableTextures.json", "images", ("{} texture.",),
           ("describabletextures",), "dtd"),
    _split("eurosat", "EuroSAT", 10, 8100, "eurosat", "split_zhou_EuroSAT.json", "2750",
           ("a centered satellite photo of {}.",), (), "eurosat"),
    _split("flowers102", "Flowers102", 102, 2463, "oxford_flowers", "split_zhou_OxfordFlowers.json", "jpg",
           ("a photo of a {}, a type of flower.",), ("flowers", "flower102", "oxfordflowers"), "flowers102"),
    _split("food101", "Food101", 101, 30300, "food-101", "split_zhou_Food101.json", "images",
           ("a photo of {}, a type of food.",), ("food",), "food101"),
    _split("pets", "Pets", 37, 3669, "oxford_pets", "split_zhou_OxfordPets.json", "images",
           ("a photo of a {}, a type of pet.",), ("oxfordpets",), "oxfordpets"),
    _split("sun397", "SUN397", 397, 19850, "sun397", "split_zhou_SUN397.json", "SUN397", ENSEMBLE7, ("sun",), "sun397"),
    _split("ucf101", "UCF101", 101, 3783, "ucf101", "split_zhou_UCF101.json", "UCF-101-midframes",
           ("a photo of a person doing {}.",), ("ucf",), "ucf101"),
))

# Every registered card by canonical name, the paper's first and in the paper's order (a live view: plugins and
# folder datasets add to it).
DATASETS: dict[str, DatasetCard] = {}
_LOOKUP: dict[str, str] = {}


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def register_dataset(card: DatasetCard) -> DatasetCard:
    """Add a card. The same name twice is refused unless it is the same card (a module imported again); so is a
    name, title, folder or alias that another dataset already answers to (a spelling names one dataset)."""
    if not isinstance(card, DatasetCard):
        raise TypeError(f"register_dataset takes a DatasetCard, got {type(card).__name__}")
    old = DATASETS.get(card.name)
    if old is not None:
        if old != card:
            raise ValueError(f"dataset {card.name!r} is already registered with another card; choose another name")
        return old
    if card.paper and card not in _PAPER_CARDS:
        raise ValueError(f"dataset card {card.name!r}: paper=True is for the paper's datasets, whose published "
                         f"numbers the report compares with; leave it False")
    keys = {}
    # a folder that is a path (a corruption variant's) is where it lies, not a name anyone spells it by
    for spelling in (card.name, card.title, *(() if "/" in card.folder else (card.folder,)), *card.aliases):
        key = _squash(spelling)
        owner = _LOOKUP.get(key)
        if owner is not None:
            raise ValueError(f"dataset card {card.name!r}: the spelling {spelling!r} already names dataset {owner!r}; "
                             f"choose another name, title, folder or alias")
        if key:
            keys[key] = card.name
    _LOOKUP.update(keys)
    DATASETS[card.name] = card
    return card


for _card in _PAPER_CARDS:
    register_dataset(_card)


def dataset_key(name: str) -> str | None:
    """The canonical name of a registered dataset in any known spelling, or None (e.g. a synthetic scenario). A
    corruption benchmark's (corruption, severity) variant is registered on first use (`corruptions`)."""
    if not isinstance(name, str):
        return None
    key = _LOOKUP.get(_squash(name))
    if key is None:
        card = variant_card(name) or _generated(name)
        key = None if card is None else register_dataset(card).name
    return key


def _generated(name: str) -> DatasetCard | None:
    """The card of a registered dataset's generated corruption (`<dataset>.<corruption>.<severity>`), or None."""
    parsed = parse_generated(name)
    clean = _LOOKUP.get(_squash(parsed[0])) if parsed else None
    return None if clean is None else generated_card(DATASETS[clean], parsed[1], parsed[2])


def canonical_dataset(name: str) -> str:
    """The canonical name of a registered dataset; an unknown name raises a ValueError listing the known ones."""
    key = dataset_key(name)
    if key is None:
        known = ", ".join(n for n in DATASETS if parse_variant(n) is None)
        raise ValueError(f"unknown dataset {name!r}; known datasets: {known} (any spelling of these, "
                         f"or an alias: {', '.join(sorted(a for c in DATASETS.values() for a in c.aliases))}), the "
                         f"corruption benchmarks {', '.join(BENCHMARKS)} with a corruption and severity, or a "
                         f"folder <data_root>/{name}/ holding {CLASSNAMES_FILE}, {TEMPLATES_FILE} and one sub-folder "
                         f"of images per class")
    return key


def dataset_card(name: str) -> DatasetCard:
    return DATASETS[canonical_dataset(name)]


def dataset_title(name: str) -> str:
    """A registered dataset's title; other names (synthetic scenarios, unregistered folders) as they are."""
    key = dataset_key(name)
    return DATASETS[key].title if key else name


def group_datasets(group: str) -> tuple[str, ...]:
    """The canonical names of one of the paper's benchmark groups, in the paper's column order."""
    return tuple(card.name for card in DATASETS.values() if card.paper and card.group == group)


def paper_datasets() -> tuple[str, ...]:
    return tuple(card.name for card in DATASETS.values() if card.paper)


def _lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def folder_dataset(name: str, data_root: str | Path) -> DatasetCard | None:
    """The card of a dataset in the generic class-folder layout, <data_root>/<name>/ with `classnames.txt` (one
    class name a line, in the sorted order of the class sub-folders) and `templates.txt` (one prompt a line, the
    class name written {c} or {}); None when the folder has no classnames.txt. A file that is there but unusable
    raises a ValueError naming it."""
    folder = Path(data_root) / name
    classnames, templates = folder / CLASSNAMES_FILE, folder / TEMPLATES_FILE
    if not DATASET_NAME_RE.match(name) or not classnames.is_file():
        return None
    if not templates.is_file():
        raise ValueError(f"dataset folder {folder}: {TEMPLATES_FILE} is missing; expected one prompt a line with "
                         f"{{c}} for the class name (e.g. 'a photo of a {{c}}.') beside {CLASSNAMES_FILE}")
    try:
        names, prompts = _lines(classnames), [t.replace("{c}", "{}") for t in _lines(templates)]
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"dataset folder {folder}: cannot read its {CLASSNAMES_FILE} or {TEMPLATES_FILE} ({exc})") \
            from None
    if not names:
        raise ValueError(f"dataset folder {folder}: {classnames} lists no class; expected one class name a line")
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"dataset folder {folder}: {classnames} lists {', '.join(map(repr, twice))} more than once; "
                         f"expected one line per class")
    bad = [t for t in prompts if t.count("{}") != 1]
    if not prompts or bad:
        raise ValueError(f"dataset folder {folder}: {templates} must hold one prompt a line, each with exactly one "
                         f"{{c}} for the class name; bad lines: {bad or 'none (the file is empty)'}")
    return DatasetCard(name, name, OTHER, len(names), None, name,
                       f"{name}/{CLASSNAMES_FILE}, {name}/{TEMPLATES_FILE} and {name}/<class folder>/<images> (one "
                       f"folder per line of {CLASSNAMES_FILE}, in sorted order)", FOLDER_READER, tuple(prompts))


def ensure_dataset(name: str, data_root: str | Path | None) -> DatasetCard:
    """A registered dataset's card, else that of a folder dataset under `data_root` (registered here, so every
    process that reads it, a Ray worker's included, knows it by the same card); a ValueError if neither."""
    key = dataset_key(name)
    if key is None and data_root is not None:
        card = folder_dataset(name, data_root)
        if card is not None:
            return register_dataset(card)
    return dataset_card(name)
