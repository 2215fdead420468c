"""The dataset registry: one record per benchmark dataset, every fact about it in one place.

Plain data (no torch, no open_clip): the readers in `orchestrator.data.datasets`, the prompts in
`orchestrator.clip.prompts`, the report's paper tables, the methods' per-dataset defaults and the dashboard
all ask these records. A name is looked up after lower-casing and dropping everything but letters and digits,
so "ImageNet-A", "imagenet_a" and "imageneta" are one dataset; the aliases add the public code's short codes
(TDA's `A`, `V`, `R`, `S`/`K`, `I`) and the usual folder and paper spellings. Run configs store `name`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OOD = "ood"
CROSS_DOMAIN = "cross_domain"
GROUP_TITLES = {OOD: "OOD benchmark", CROSS_DOMAIN: "cross-domain benchmark"}

# Template sets a card may name instead of listing templates (open_clip ships both).
ENSEMBLE7 = "ensemble7"
CLIP80 = "clip80"


@dataclass(frozen=True)
class DatasetCard:
    """One benchmark dataset (its protocol and layout: docs/real-data.md).

    name: canonical name (stored in run configs); title: as the paper's tables write it; group: OOD or
    cross-domain benchmark; num_classes / test_images: the test split the public protocol uses; folder,
    image_dir, split_file, layout: where the reader finds it under a data root (layout is for error messages);
    reader: which reader of `orchestrator.data.datasets` lists it; templates: the public protocol's prompts
    (a named set or the templates themselves); views: the public protocol's views ('augmix' or 'single');
    cupl: the file name of its CuPL class descriptions as DPE's and DMN's repositories ship them.
    """

    name: str
    title: str
    group: str
    num_classes: int
    test_images: int
    folder: str
    layout: str
    reader: str
    templates: str | tuple[str, ...]
    views: str = "single"
    image_dir: str = ""
    split_file: str | None = None
    aliases: tuple[str, ...] = ()
    cupl: str | None = None  # the CuPL prompt file DPE and DMN ship for it (template set 'cupl')


_SPLIT_LAYOUT = "{folder}/{split} (CoOp split_zhou json) and the images under {folder}/{images}/"


def _split(name: str, title: str, classes: int, images: int, folder: str, split: str, image_dir: str,
           templates: str | tuple[str, ...], aliases: tuple[str, ...], cupl: str) -> DatasetCard:
    return DatasetCard(name, title, CROSS_DOMAIN, classes, images, folder,
                       _SPLIT_LAYOUT.format(folder=folder, split=split, images=image_dir or "."), "split_zhou",
                       templates, image_dir=image_dir, split_file=split, aliases=aliases,
                       cupl=f"CuPL_prompts_{cupl}.json")


DATASET_CARDS: tuple[DatasetCard, ...] = (
    DatasetCard("imagenet", "ImageNet", OOD, 1000, 50000, "imagenet",
                "imagenet/images/val/<wnid>/*.JPEG (1000 WordNet-id folders)", "wnid:imagenet", ENSEMBLE7,
                image_dir="images/val", cupl="CuPL_prompts_imagenet.json", aliases=("i", "in1k", "imagenet1k", "ilsvrc2012")),
    DatasetCard("imagenet-a", "ImageNet-A", OOD, 200, 7500, "imagenet-adversarial",
                "imagenet-adversarial/imagenet-a/<wnid>/*.jpg (200 WordNet-id folders)", "wnid:imagenet-a",
                ENSEMBLE7, views="augmix", image_dir="imagenet-a", cupl="CuPL_prompts_imagenet.json", aliases=("a", "imagenetadversarial")),
    DatasetCard("imagenet-v2", "ImageNet-V2", OOD, 1000, 10000, "imagenetv2",
                "imagenetv2/imagenetv2-matched-frequency-format-val/<0..999>/*.jpeg (class-index folders)",
                "imagenet_v2", ENSEMBLE7, views="augmix", image_dir="imagenetv2-matched-frequency-format-val",
                cupl="CuPL_prompts_imagenet.json", aliases=("v", "v2", "imagenetv2matchedfrequency")),
    DatasetCard("imagenet-r", "ImageNet-R", OOD, 200, 30000, "imagenet-rendition",
                "imagenet-rendition/imagenet-r/<wnid>/*.jpg (200 WordNet-id folders)", "wnid:imagenet-r", CLIP80,
                views="augmix", image_dir="imagenet-r", cupl="CuPL_prompts_imagenet.json", aliases=("r", "imagenetrendition")),
    DatasetCard("imagenet-sketch", "ImageNet-Sketch", OOD, 1000, 50889, "imagenet-sketch",
                "imagenet-sketch/images/<wnid>/*.JPEG (1000 WordNet-id folders)", "wnid:imagenet", CLIP80,
                views="augmix", image_dir="images", cupl="CuPL_prompts_imagenet.json", aliases=("s", "k", "sketch", "imagenets")),
    DatasetCard("aircraft", "Aircraft", CROSS_DOMAIN, 100, 3333, "fgvc_aircraft",
                "fgvc_aircraft/variants.txt, fgvc_aircraft/images_variant_test.txt ('<image id> <variant>' lines) "
                "and fgvc_aircraft/images/<image id>.jpg", "aircraft", ("a photo of a {}, a type of aircraft.",),
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
)
DATASETS: dict[str, DatasetCard] = {card.name: card for card in DATASET_CARDS}


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _lookup_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for card in DATASET_CARDS:
        for spelling in (card.name, card.title, card.folder, *card.aliases):
            key = _squash(spelling)
            if table.setdefault(key, card.name) != card.name:
                raise ValueError(f"dataset registry: spelling {spelling!r} names both {table[key]!r} and {card.name!r}")
    return table


_LOOKUP = _lookup_table()


def dataset_key(name: str) -> str | None:
    """The canonical name of a benchmark dataset in any known spelling, or None (e.g. a synthetic scenario)."""
    return _LOOKUP.get(_squash(name)) if isinstance(name, str) else None


def canonical_dataset(name: str) -> str:
    """The canonical name of a benchmark dataset; an unknown name raises a ValueError listing the known ones."""
    key = dataset_key(name)
    if key is None:
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)} (any spelling of these, "
                         f"or an alias: {', '.join(sorted(a for c in DATASET_CARDS for a in c.aliases))})")
    return key


def dataset_card(name: str) -> DatasetCard:
    return DATASETS[canonical_dataset(name)]


def dataset_title(name: str) -> str:
    """The paper's spelling of a benchmark dataset; other names (synthetic scenarios) as they are."""
    key = dataset_key(name)
    return DATASETS[key].title if key else name


def group_datasets(group: str) -> tuple[str, ...]:
    """The canonical names of one benchmark group, in the paper's column order."""
    return tuple(card.name for card in DATASET_CARDS if card.group == group)
