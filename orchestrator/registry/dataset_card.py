"""The dataset card model: what a dataset card holds and checks (plain data, no torch).

The readers (`orchestrator.data.datasets`) and the registry's table of cards (`orchestrator.registry.datasets`)
both import this module; the table names the readers only as "module:function" strings, so neither imports
the other back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

OOD = "ood"
CROSS_DOMAIN = "cross_domain"
OTHER = "other"
GROUP_TITLES = {OOD: "OOD benchmark", CROSS_DOMAIN: "cross-domain benchmark"}  # the paper's two tables
GROUPS = (OOD, CROSS_DOMAIN, OTHER)
DATASET_VIEW_KINDS = ("single", "augmix")  # a dataset's own protocol (`views`); a method's may be crops too
DATASET_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# "module:function", or the bare name of a built-in reader of orchestrator.data.datasets (the built-in cards'
# readers are named so: the registry never names a module above it)
_READER_RE = re.compile(r"^([A-Za-z_][\w.]*:)?[A-Za-z_]\w*$")

# The generic class-folder layout (`folder_dataset`): these two files beside one sub-folder per class.
CLASSNAMES_FILE = "classnames.txt"
TEMPLATES_FILE = "templates.txt"

# Template sets a card may name instead of listing templates (open_clip ships both).
ENSEMBLE7 = "ensemble7"
CLIP80 = "clip80"


@dataclass(frozen=True)
class DatasetCard:
    """One dataset.

    name: canonical name (stored in run configs); title: as tables write it; group: OOD, cross-domain or other;
    num_classes / test_images: the test split the protocol uses (test_images None: not known, e.g. a folder
    dataset, whose completeness nothing can check); folder, image_dir, split_file, layout: where the reader
    finds it under a data root (layout is for error messages); reader: the function that lists its test
    images, `reader(data_root: Path, card) -> (image ids relative to the data root, labels, class names)`, as
    "module:function" (imported when a run reads the dataset), the function itself, or the name of a
    built-in reader of `orchestrator.data.datasets`; templates: the
    protocol's prompts (a named set or the templates themselves, one '{}' each); views: the protocol's views
    ('augmix' or 'single'); cupl: the file name of its CuPL class descriptions as DPE's and DMN's repositories
    ship them (None: the 'cupl' template set does not apply); paper: one of the paper's datasets, whose runs go
    into the paper's tables beside the published numbers (built-in cards only).
    """

    name: str
    title: str
    group: str
    num_classes: int
    test_images: int | None
    folder: str
    layout: str
    reader: str | Callable
    templates: str | tuple[str, ...]
    views: str = "single"
    image_dir: str = ""
    split_file: str | None = None
    aliases: tuple[str, ...] = ()
    cupl: str | None = None  # the CuPL prompt file DPE and DMN ship for it (template set 'cupl')
    paper: bool = False

    def __post_init__(self) -> None:
        where = f"dataset card {self.name!r}"
        if not isinstance(self.name, str) or not DATASET_NAME_RE.match(self.name):
            raise ValueError(f"dataset card name {self.name!r}: expected letters, digits, '_', '.' or '-', starting "
                             f"with a letter or digit")
        if self.group not in GROUPS:
            raise ValueError(f"{where}: group {self.group!r}; expected one of {', '.join(GROUPS)}")
        if self.paper and self.group == OTHER:
            raise ValueError(f"{where}: a paper dataset belongs to group {OOD!r} or {CROSS_DOMAIN!r}")
        if not isinstance(self.num_classes, int) or self.num_classes < 1:
            raise ValueError(f"{where}: num_classes {self.num_classes!r}; expected an int >= 1")
        if self.test_images is not None and (not isinstance(self.test_images, int) or self.test_images < 1):
            raise ValueError(f"{where}: test_images {self.test_images!r}; expected an int >= 1, or None if unknown")
        if self.views not in DATASET_VIEW_KINDS:
            raise ValueError(f"{where}: views {self.views!r}; expected one of {', '.join(DATASET_VIEW_KINDS)}")
        if isinstance(self.templates, str):
            if self.templates not in (ENSEMBLE7, CLIP80):
                raise ValueError(f"{where}: templates {self.templates!r}; expected {ENSEMBLE7!r}, {CLIP80!r} or a "
                                 f"tuple of templates with one '{{}}' each")
        else:
            object.__setattr__(self, "templates", tuple(self.templates))
            bad = [t for t in self.templates if not isinstance(t, str) or t.count("{}") != 1]
            if not self.templates or bad:
                raise ValueError(f"{where}: templates must be a non-empty tuple of strings with exactly one '{{}}' "
                                 f"(the class name); bad: {bad}")
        if not callable(self.reader) and not (isinstance(self.reader, str) and _READER_RE.match(self.reader)):
            raise ValueError(f"{where}: reader {self.reader!r}; expected a function, 'module:function' or a built-in reader's name")
