"""The views vocabulary, in one home (plain data, no torch): what a value of `views` means, parsed once.

A views value names the images a run's features come from: 'single' (the backbone's eval transform),
'augmix' / 'crops' (the public protocols' 63 augmented views + the original; `orchestrator.clip.views` makes
the pixels) or 'augmixN' / 'cropsN' (N + the original). `parse_views` turns it into a `ViewConfig`; every layer
that takes a views string (a spec, a card, `bca cache`, the feature cache) parses it here, and writes back
`ViewConfig.name`.

Two choices defer to an official protocol, and they are two different things:

- METHOD_PROTOCOL ('protocol', a sweep's `views`): each method's official protocol on each dataset, from its
  card (`MethodCard.protocol_views`): BCA takes AugMix views on ImageNet-A/-V2/-R/-Sketch, MTA crops
  everywhere, TDA the single view on ImageNet.
- DATASET_PROTOCOL ('dataset', `bca cache --views` and `load_benchmark`): each dataset's own protocol, from
  its card (`DatasetCard.views`): AugMix on ImageNet-A/-V2/-R/-Sketch, the single view elsewhere, whatever
  method will read them. (To cache what a sweep's methods need, give `bca cache` the sweep spec.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

AUGMENTED_KINDS = ("augmix", "crops")  # the kinds a method card may name
VIEW_KINDS = ("single", *AUGMENTED_KINDS)
AUGMIX_VIEWS = 63  # augmented views per image in the public protocols (augmix and crops alike)
PIPELINE_VERSION = 1  # bump when orchestrator.clip.views' transforms change, so old cache entries are not reused

METHOD_PROTOCOL = "protocol"
DATASET_PROTOCOL = "dataset"
# What a spec's `views` accepts: a views value or METHOD_PROTOCOL (pydantic's first check; parse_views the second).
VIEWS_PATTERN = rf"^({METHOD_PROTOCOL}|single|augmix[0-9]*|crops[0-9]*)$"


@dataclass(frozen=True)
class ViewConfig:
    """A view protocol: 'single', or 'augmix' / 'crops' with n_aug augmented views (plus the original) and a
    seed; severity applies to 'augmix' only."""

    kind: str = "single"
    n_aug: int = AUGMIX_VIEWS
    severity: int = 1
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in VIEW_KINDS:
            raise ValueError(f"unknown view kind {self.kind!r}: expected one of {list(VIEW_KINDS)}")

    @property
    def num_views(self) -> int:
        return 1 if self.kind == "single" else 1 + self.n_aug

    @property
    def name(self) -> str:
        return self.kind if self.kind == "single" or self.n_aug == AUGMIX_VIEWS else f"{self.kind}{self.n_aug}"

    def identity(self) -> dict[str, Any]:
        """What decides the views' pixels; 'single' is deterministic, so its seed is left out (one cache entry)."""
        if self.kind == "single":
            return {"kind": "single", "pipeline": PIPELINE_VERSION}
        if self.kind == "crops":
            return {"kind": "crops", "n_aug": self.n_aug, "seed": self.seed, "crop": "RandomResizedCrop+hflip",
                    "pipeline": PIPELINE_VERSION}
        return {"kind": "augmix", "n_aug": self.n_aug, "severity": self.severity, "seed": self.seed,
                "crop": "RandomResizedCrop+hflip", "augmix": "torchvision all_ops=False width=3 depth=-1 alpha=1",
                "pipeline": PIPELINE_VERSION}


def parse_views(views: str | ViewConfig, seed: int | None = None) -> ViewConfig:
    """'single', 'augmix' / 'crops' (63 augmented views + the original) or 'augmixN' / 'cropsN' (N + the
    original)."""
    if isinstance(views, ViewConfig):
        return views
    key = views.strip().lower()
    if key == "single":
        return ViewConfig("single", seed=None)
    for kind in AUGMENTED_KINDS:
        if key.startswith(kind):
            rest = key[len(kind):].lstrip(":-_")
            if rest == "" or (rest.isdigit() and int(rest) > 0):
                return ViewConfig(kind, n_aug=int(rest) if rest else AUGMIX_VIEWS, seed=1 if seed is None else seed)
    if key in (METHOD_PROTOCOL, DATASET_PROTOCOL):
        raise ValueError(f"views {views!r} is a choice to resolve first (each method's protocol in a sweep: "
                         f"{METHOD_PROTOCOL!r}; each dataset's own: {DATASET_PROTOCOL!r}), not a views value")
    raise ValueError(f"unknown views {views!r}: expected 'single', 'augmix' (63 AugMix views + the original), "
                     f"'crops' (63 random resized crops with flips + the original) or 'augmixN' / 'cropsN' "
                     f"(N augmented views + the original)")
