"""The corruption benchmarks: ImageNet-C, CIFAR-10-C and CIFAR-100-C (Hendrycks & Dietterich, ICLR 2019), in
their released layouts (plain data, no torch).

Each (corruption, severity) of a benchmark is a dataset of its own, named `<benchmark>.<corruption>.<severity>`
(e.g. `cifar10-c.gaussian_noise.5`), so the feature cache, the stream protocols (a `continual` stream over the
corruptions), the results and the report treat it as any dataset. Its card is made on first use
(`variant_card`, which `orchestrator.registry.datasets.dataset_key` calls), not listed ahead: 225 cards would
drown the dataset listings. A spec addresses them as `{name: cifar10-c, corruption: gaussian_noise, severity:
5}`, with lists (or `all`) expanding into a grid axis (`expand_variants`).

Released layouts under the data root:
- ImageNet-C: `ImageNet-C/<corruption>/<severity>/<wnid>/*.JPEG` (ImageNet's 1000 classes and prompts);
- CIFAR-10-C / CIFAR-100-C: `CIFAR-10-C/<corruption>.npy`, uint8 [5 * N, 32, 32, 3] with severities 1..5
  stacked in order (rows (s - 1) * N to s * N - 1 are severity s), and `labels.npy` [5 * N].
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from orchestrator.registry.dataset_card import ENSEMBLE7, OTHER, DatasetCard

# The 15 corruptions of ImageNet-C, in the order CoTTA streams them (cotta's cfgs: CORRUPTION.TYPE), the order of
# the field's continual benchmark and of the report's columns.
CORRUPTIONS = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
               "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate",
               "jpeg_compression")
SEVERITIES = (1, 2, 3, 4, 5)
ALL = "all"  # a spec's `corruption: all`: the 15 above, in that order

# CLIP's class names and prompts for CIFAR-10 and CIFAR-100 (openai/CLIP data/prompts.md).
CIFAR_TEMPLATES = (
    "a photo of a {}.", "a blurry photo of a {}.", "a black and white photo of a {}.", "a low contrast photo of a {}.",
    "a high contrast photo of a {}.", "a bad photo of a {}.", "a good photo of a {}.", "a photo of a small {}.",
    "a photo of a big {}.", "a photo of the {}.", "a blurry photo of the {}.", "a black and white photo of the {}.",
    "a low contrast photo of the {}.", "a high contrast photo of the {}.", "a bad photo of the {}.",
    "a good photo of the {}.", "a photo of the small {}.", "a photo of the big {}.")
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR100_CLASSES = (
    "apple", "aquarium fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle", "bowl", "boy",
    "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle", "chair", "chimpanzee", "clock",
    "cloud", "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur", "dolphin", "elephant", "flatfish",
    "forest", "fox", "girl", "hamster", "house", "kangaroo", "keyboard", "lamp", "lawn mower", "leopard", "lion",
    "lizard", "lobster", "man", "maple tree", "motorcycle", "mountain", "mouse", "mushroom", "oak tree", "orange",
    "orchid", "otter", "palm tree", "pear", "pickup truck", "pine tree", "plain", "plate", "poppy", "porcupine",
    "possum", "rabbit", "raccoon", "ray", "road", "rocket", "rose", "sea", "seal", "shark", "shrew", "skunk",
    "skyscraper", "snail", "snake", "spider", "squirrel", "streetcar", "sunflower", "sweet pepper", "table", "tank",
    "telephone", "television", "tiger", "tractor", "train", "trout", "tulip", "turtle", "wardrobe", "whale",
    "willow tree", "wolf", "woman", "worm")

NPY = "npy"          # CIFAR-C: one array per corruption
FOLDERS = "folders"  # ImageNet-C: one WordNet-id folder tree per (corruption, severity)


@dataclass(frozen=True)
class CorruptionBenchmark:
    """One released corruption benchmark. images: test images per (corruption, severity); classes: the class
    names (None: ImageNet's, through the WordNet-id folders)."""

    name: str
    title: str
    folder: str
    kind: str
    num_classes: int
    images: int
    templates: str | tuple[str, ...]
    classes: tuple[str, ...] | None = None
    cupl: str | None = None

    def layout(self, corruption: str = "<corruption>", severity: Any = "<severity>") -> str:
        if self.kind == FOLDERS:
            return f"{self.folder}/{corruption}/{severity}/<wnid>/*.JPEG (1000 WordNet-id folders)"
        return (f"{self.folder}/{corruption}.npy (uint8 [5 x {self.images}, 32, 32, 3], severities 1..5 stacked in "
                f"order) and {self.folder}/labels.npy")


BENCHMARKS: dict[str, CorruptionBenchmark] = {b.name: b for b in (
    CorruptionBenchmark("imagenet-c", "ImageNet-C", "ImageNet-C", FOLDERS, 1000, 50000, ENSEMBLE7,
                        cupl="CuPL_prompts_imagenet.json"),
    CorruptionBenchmark("cifar10-c", "CIFAR-10-C", "CIFAR-10-C", NPY, 10, 10000, CIFAR_TEMPLATES, CIFAR10_CLASSES),
    CorruptionBenchmark("cifar100-c", "CIFAR-100-C", "CIFAR-100-C", NPY, 100, 10000, CIFAR_TEMPLATES,
                        CIFAR100_CLASSES),
)}


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


_BENCHMARK_KEYS = {_squash(spelling): b.name for b in BENCHMARKS.values() for spelling in (b.name, b.title, b.folder)}
# every spelling of every variant, squashed as the dataset registry squashes names
_VARIANTS = {f"{_squash(b)}{_squash(c)}{s}": (b, c, s)
             for b in _BENCHMARK_KEYS for c in CORRUPTIONS for s in SEVERITIES}


def benchmark_key(name: Any) -> str | None:
    """The canonical name of a corruption benchmark in any spelling (`CIFAR-10-C`, `cifar10c`), or None."""
    return _BENCHMARK_KEYS.get(_squash(name)) if isinstance(name, str) else None


def variant_name(benchmark: str, corruption: str, severity: int) -> str:
    return f"{benchmark}.{corruption}.{severity}"


def parse_variant(name: Any) -> tuple[str, str, int] | None:
    """(benchmark, corruption, severity) of a variant in any spelling (`cifar10-c.gaussian_noise.5`), or None."""
    found = _VARIANTS.get(_squash(name)) if isinstance(name, str) else None
    return None if found is None else (_BENCHMARK_KEYS[found[0]], found[1], found[2])


def variant_card(name: Any) -> DatasetCard | None:
    """The card of a (corruption, severity) variant named in any spelling, or None if `name` is not one."""
    parsed = parse_variant(name)
    if parsed is None:
        return None
    bench, corruption, severity = BENCHMARKS[parsed[0]], parsed[1], parsed[2]
    title = f"{bench.title} {corruption} {severity}"
    if bench.kind == FOLDERS:  # ImageNet's reader, pointed at the (corruption, severity) folder
        folder, reader = f"{bench.folder}/{corruption}/{severity}", "read_imagenet"
    else:
        folder, reader = f"{bench.folder}/{corruption}.npy", "read_cifar_c"
    return DatasetCard(variant_name(bench.name, corruption, severity), title, OTHER, bench.num_classes, bench.images,
                       folder, bench.layout(corruption, severity), reader, bench.templates, cupl=bench.cupl)


GENERATED_READER = "read_generated"  # orchestrator.data.datasets's


def parse_generated(name: Any) -> tuple[str, str, int] | None:
    """(dataset, corruption, severity) of a name of the form `<dataset>.<corruption>.<severity>` whose dataset is
    not a corruption benchmark (whether the dataset is registered is the registry's question), or None."""
    if not isinstance(name, str) or parse_variant(name) is not None:
        return None
    head, _, severity = name.rpartition(".")
    dataset, _, corruption = head.rpartition(".")
    if not dataset or corruption not in CORRUPTIONS or not severity.isdigit() or int(severity) not in SEVERITIES \
            or benchmark_key(dataset) is not None:
        return None
    return dataset, corruption, int(severity)


def generated_card(clean: DatasetCard, corruption: str, severity: int) -> DatasetCard:
    """The card of a dataset's corruption generated from its clean images (`orchestrator.data.generated`)."""
    return DatasetCard(variant_name(clean.name, corruption, severity),
                       f"{clean.title} {corruption} {severity} (generated)", OTHER, clean.num_classes,
                       clean.test_images, f"generated-c/{clean.name}/{corruption}/{severity}",
                       f"{clean.layout}; its corrupted copies are generated under generated-c/{clean.name}/"
                       f"{corruption}/{severity}/", GENERATED_READER, clean.templates, cupl=clean.cupl)


def _values(value: Any, allowed: tuple, field: str) -> list:
    values = list(allowed) if value == ALL else value if isinstance(value, list) else [value]
    bad = [v for v in values if v not in allowed or isinstance(v, bool)]
    if not values or bad:
        shown = ", ".join(map(str, allowed))
        extra = f" or {ALL!r}" if field == "corruption" else ""
        raise ValueError(f"{field} {bad[0] if bad else value!r}: expected one of {shown}{extra}, or a list of them")
    return list(dict.fromkeys(values))


def expand_variants(benchmark: str, corruption: Any, severity: Any) -> list[str]:
    """The variant names a spec's `{name, corruption, severity}` asks for, corruptions outermost (each a string,
    a list or `all`; severities an integer 1..5 or a list). A ValueError names the field and the allowed values."""
    if corruption is None or severity is None:
        missing = "corruption" if corruption is None else "severity"
        raise ValueError(f"{missing}: {benchmark} needs a corruption ({', '.join(CORRUPTIONS)} or {ALL!r}) and a "
                         f"severity ({', '.join(map(str, SEVERITIES))})")
    corruptions = _values(corruption, CORRUPTIONS, "corruption")
    severities = _values(severity, SEVERITIES, "severity")
    return [variant_name(benchmark, c, s) for c in corruptions for s in severities]


CONTINUAL = "continual"


def continual_name(datasets: tuple[str, ...]) -> str:
    """The dataset a continual run records: its datasets joined by '+', except one benchmark's 15 corruptions at
    one severity in CoTTA's order, `<benchmark>.continual.<severity>` (the joined names are too long for the
    results' folder names)."""
    parsed = [parse_variant(d) for d in datasets]
    if None not in parsed and len({(p[0], p[2]) for p in parsed}) == 1 and tuple(p[1] for p in parsed) == CORRUPTIONS:
        return variant_name(parsed[0][0], CONTINUAL, parsed[0][2])
    return "+".join(datasets)


def continual_variants(name: Any) -> tuple[str, ...] | None:
    """The variants a continual run's dataset (`continual_name`) streams when they are of one corruption benchmark
    at one severity, in stream order; else None."""
    text = str(name)
    head, _, severity = text.rpartition(".")
    bench, _, kind = head.rpartition(".")
    if kind == CONTINUAL and benchmark_key(bench) and severity.isdigit() and int(severity) in SEVERITIES:
        return tuple(variant_name(benchmark_key(bench), c, int(severity)) for c in CORRUPTIONS)
    parsed = [parse_variant(d) for d in text.split("+")] if "+" in text else [None]
    if None in parsed or len({(p[0], p[2]) for p in parsed}) != 1:
        return None
    return tuple(variant_name(*p) for p in parsed)
