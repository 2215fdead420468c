"""The sweep spec's document: frozen pydantic models of a YAML sweep file, and what they answer directly.

Loading and validating a file is `orchestrator.sweep.load` (structure here, meaning in `checks`); expanding a
spec into runs is `orchestrator.sweep.plan`. Method entries are built from the method registry's cards: each
entry accepts the method's own hparams (a scalar or a grid of values), so a plugin's method is as welcome as
a built-in one once its card is registered (`plugins:` names the modules that register them).
"""

from __future__ import annotations

import json
from functools import cache
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    PlainValidator,
    Tag,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from orchestrator.data.synthetic import SYNTHETIC_KINDS, synthetic_defaults
from orchestrator.results.schema import RANDOM_WEIGHTS
from orchestrator.registry import canonical_dataset, dataset_key, ensure_dataset, method_card, method_names
from orchestrator.registry.corruptions import (ALL, CORRUPTIONS, SEVERITIES, benchmark_key, expand_variants,
                                              parse_generated, parse_variant)
from orchestrator.registry.templates import METHOD_TEMPLATES
from orchestrator.registry.views import METHOD_PROTOCOL, VIEWS_PATTERN

# A backbone's `pretrained: random` (RANDOM_WEIGHTS) asks for random weights on purpose; leaving out both pretrained
# and checkpoint is refused: it used to run random weights without a word.


# ------------------------------------------------------------------------------------------ model helpers

def _as_list(value: Any) -> Any:
    """A scalar is a one-point grid; lists stay lists (and may not be empty)."""
    return value if isinstance(value, list) else [value]


class _Strict(BaseModel):
    """Frozen, rejects unknown keys naming the allowed ones (pydantic's own message does not list them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            allowed = sorted(cls.model_fields)
            for key in data:
                if key not in cls.model_fields:
                    raise PydanticCustomError("unknown_key", "unknown key; allowed keys: {allowed}",
                                              {"key": str(key), "allowed": ", ".join(allowed)})
        return data


Scalar = Union[StrictBool, StrictInt, StrictFloat, StrictStr, None]
Grid = Annotated[list[Scalar], BeforeValidator(_as_list), Field(min_length=1)]
PositiveInt = Annotated[StrictInt, Field(ge=1)]


class Resources(_Strict):
    """Per trial: a fraction of one GPU (0 = CPU only) and CPU cores (both may be fractional); gpu_memory_gb: the
    memory of the GPU a trial runs on, which sizes packs where the driver has no GPU to ask (a CPU head node)."""

    gpu: Annotated[Union[StrictInt, StrictFloat], Field(ge=0, le=1)] = 0
    cpus: Annotated[Union[StrictInt, StrictFloat], Field(gt=0)] = 1
    gpu_memory_gb: Annotated[Union[StrictInt, StrictFloat], Field(gt=0)] | None = None


class Auxiliary(_Strict):
    """An auxiliary image encoder beside the backbone (`orchestrator.clip.auxiliary`): its kind (dinov2), its
    architecture, and its weights: a checkpoint file in the official format or `pretrained: random`."""

    name: Literal["dinov2"]
    arch: StrictStr
    checkpoint: StrictStr | None = None
    pretrained: Literal["random"] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Auxiliary:
        if (self.checkpoint is None) == (self.pretrained is None):
            raise PydanticCustomError("weights_source", "give either checkpoint (a DINOv2 checkpoint file in the "
                                      "official format) or pretrained: random, exactly one")
        return self


class Backbone(_Strict):
    """An open_clip model with a pretrained tag (e.g. openai), a local checkpoint file, or `pretrained: random`
    (random weights, said explicitly; giving neither is refused by the checks). `config`: a custom open_clip
    model config JSON named <model>.json, registered in every trial
    process; `quick_gelu`: override the activation (None: decided by orchestrator.clip); `auxiliary`: the
    auxiliary encoders whose features the cache stores beside this backbone's, for the methods that read them."""

    model: StrictStr
    pretrained: StrictStr | None = None
    checkpoint: StrictStr | None = None
    config: StrictStr | None = None
    quick_gelu: StrictBool | None = None
    auxiliary: list[Auxiliary] = []

    @model_validator(mode="after")
    def _one_source(self) -> Backbone:
        if self.pretrained is not None and self.checkpoint is not None:
            raise PydanticCustomError("weights_source", "give either pretrained (a tag such as 'openai') or "
                                      "checkpoint (a file path), not both")
        return self


def _dataset_or_benchmark(name: str) -> str:
    return benchmark_key(name) or canonical_dataset(name)


def _allowed(field: str, allowed: tuple, also: str = "") -> Any:
    def check(value: Any) -> Any:
        values = value if isinstance(value, list) else [value]
        bad = [v for v in values if v not in allowed and (v != also or isinstance(value, list)) or isinstance(v, bool)]
        if bad or not values:
            raise PydanticCustomError(field, "expected one of {allowed}, or a list of them",
                                      {"allowed": ", ".join(map(str, allowed)) + (f"; or {also!r}" if also else "")})
        return value
    return AfterValidator(check)


class RealDataset(_Strict):
    """A dataset read from data_root (a name or alias of orchestrator.data.datasets, stored canonical);
    `views` overrides the spec-level views for this dataset. A corruption benchmark (imagenet-c, cifar10-c,
    cifar100-c) takes `corruption` (a name, a list or 'all') and `severity` (1..5 or a list); the spec expands it
    into one dataset per (corruption, severity) (`orchestrator.registry.corruptions`). Any other dataset given them
    has those corruptions generated from its clean images (`orchestrator.data.generated`)."""

    name: Annotated[StrictStr, AfterValidator(_dataset_or_benchmark)]
    views: Annotated[StrictStr, Field(pattern=VIEWS_PATTERN)] | None = None
    corruption: Annotated[Union[StrictStr, list[StrictStr]], _allowed("corruption", CORRUPTIONS, ALL)] | None = None
    severity: Annotated[Union[StrictInt, list[StrictInt]], _allowed("severity", SEVERITIES)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _corruption_fields(self) -> RealDataset:
        asked = self.corruption is not None or self.severity is not None
        if benchmark_key(self.name) is not None or asked:
            for field in ("corruption", "severity"):
                if getattr(self, field) is None:
                    where = ("" if benchmark_key(self.name) is not None else
                             " (a dataset without a released corrupted copy has its corruptions generated)")
                    raise PydanticCustomError("corruption", f"{self.name} needs corruption ({', '.join(CORRUPTIONS)} "
                                              f"or {ALL!r}) and severity ({', '.join(map(str, SEVERITIES))}){where}; "
                                              f"{field} is missing")
        return self

    def variants(self) -> list[RealDataset]:
        """This entry as the datasets it names: one per (corruption, severity) of a corruption benchmark."""
        if self.corruption is None:
            return [self]
        return [RealDataset(name=v, views=self.views) for v in expand_variants(self.name, self.corruption,
                                                                               self.severity)]


def _synthetic_parameters() -> dict[str, tuple[Any, Any]]:
    """Every scenario's and preset's generative parameters (except the seed, which comes from `seeds`) as
    optional pydantic fields; which of them a kind takes is checked against it (`checks`)."""
    strict = {int: StrictInt, float: Union[StrictInt, StrictFloat]}
    fields: dict[str, tuple[Any, Any]] = {}
    for kind in SYNTHETIC_KINDS:
        for name, default in synthetic_defaults(kind).items():
            fields.setdefault(name, (strict.get(type(default), Scalar) | None, None))
    return fields


_SyntheticBase = create_model("_SyntheticBase", __base__=_Strict, **_synthetic_parameters())


class SyntheticDataset(_SyntheticBase):  # type: ignore[misc, valid-type]
    """A synthetic scenario (`make_synthetic`) or CLIP-like preset (`make_clip_like`) with its own parameters.
    `name` defaults to synthetic-<scenario>."""

    synthetic: Literal[SYNTHETIC_KINDS]
    name: StrictStr | None = None

    @property
    def dataset_name(self) -> str:
        return self.name or f"synthetic-{self.synthetic}"

    @property
    def given(self) -> dict[str, Any]:
        """The parameters the spec sets."""
        return {k: v for k, v in self.model_dump(exclude={"synthetic", "name"}).items() if v is not None}

    @property
    def params(self) -> dict[str, Any]:
        """Every generative parameter (the kind's defaults, then the spec's), so the run config pins the data."""
        return {**synthetic_defaults(self.synthetic), **self.given}


def _dataset_kind(value: Any) -> str:
    synthetic = isinstance(value, SyntheticDataset) or (isinstance(value, dict) and "synthetic" in value)
    return "synthetic" if synthetic else "real"


Dataset = Annotated[Union[Annotated[RealDataset, Tag("real")], Annotated[SyntheticDataset, Tag("synthetic")]],
                    Discriminator(_dataset_kind)]


# PromptAlign's source statistics files on a method entry (its official TPT.VIS_MEANS and TPT.VIS_VARS:
# `orchestrator.clip.context.load_statistics`); the run config records each path and its sha256 (`<field>_sha256`)
STATISTICS_FIELDS = ("vis_means", "vis_vars")


@cache
def _method_model(name: str) -> type[BaseModel]:
    """A method entry: the method, optionally the datasets it runs on (default: all), and a grid per hparam
    (values are checked against the card in `checks`, so every bad value of every entry is reported at once)."""
    fields = {h.name: (Grid | None, None) for h in method_card(name).hparams}
    only = Annotated[list[StrictStr], BeforeValidator(_as_list), Field(min_length=1)] | None
    # shards: split each run's stream into this many contiguous shards, each its own trial (order-free methods
    # only, checked in `checks`); not part of the run's config, so a sharded run keeps its run_id.
    # context: a learned context file a method starts from (`orchestrator.clip.context`): CoOp's for a prompt-tuning
    # method, CoOp's or MaPLe's for a frozen-feature one, MaPLe's for one tuning MaPLe's prompts (PromptAlign), whose
    # entry also takes its source statistics files (STATISTICS_FIELDS)
    use = method_card(name).image_encoder
    statistics = {k: (StrictStr | None, None) for k in STATISTICS_FIELDS} if use and use.params == "prompts" else {}
    return create_model(f"MethodEntry_{name}", __base__=_Strict, method=(Literal[name], ...),
                        datasets=(only, None), batch_size=(BatchSizes | None, None),
                        shards=(PositiveInt | None, None), context=(StrictStr | None, None), **statistics, **fields)


def _method_entry_type(names: tuple[str, ...]) -> Any:
    def tag(value: Any) -> str | None:
        name = value.get("method") if isinstance(value, dict) else getattr(value, "method", None)
        return name if name in names else None

    return Annotated[
        Union[tuple(Annotated[_method_model(n), Tag(n)] for n in names)],
        Discriminator(tag, custom_error_type="unknown_method",
                      custom_error_message=f"method must be one of: {', '.join(names)}",
                      custom_error_context={"field": "method"}),
    ]


def method_grid(entry: BaseModel) -> dict[str, list[Any]]:
    """The hyperparameter axes a method entry gives (unset ones take the method's defaults)."""
    return {k: v for k, v in entry.model_dump(exclude={"method", "datasets", "batch_size", "shards", "context",
                                                       *STATISTICS_FIELDS}).items()
            if v is not None}


def dataset_name(dataset: RealDataset | SyntheticDataset) -> str:
    return dataset.dataset_name if isinstance(dataset, SyntheticDataset) else dataset.name


def entry_datasets(spec: SweepSpec, entry: BaseModel) -> list[RealDataset | SyntheticDataset]:
    """The datasets a method entry runs on: those it names (aliases of real datasets accepted), else all."""
    if entry.datasets is None:
        return list(spec.datasets)
    wanted = {_canonical_or_same(n) for n in entry.datasets}
    return [d for d in spec.datasets
            if dataset_name(d) in wanted or (parse_variant(dataset_name(d)) or parse_generated(dataset_name(d))
                                             or ("",))[0] in wanted]


def _canonical_or_same(name: str) -> str:
    """A dataset's canonical name (a corruption benchmark's: all its variants), else the name as given."""
    return dataset_key(name) or benchmark_key(name) or name


OFFICIAL_BATCH = "official"  # a batch size meaning each method's card's (1 for a per-sample method)


def _batch_size(value: Any) -> int | str:
    if value == OFFICIAL_BATCH or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    # the value given is added by load._pydantic_issues, as to every message
    raise PydanticCustomError("batch_size", "expected an integer >= 1 (samples per adaptation step) or "
                                            "'official' (each method's own)")


BatchSize = Annotated[Union[int, str], PlainValidator(_batch_size)]
BatchSizes = Annotated[list[BatchSize], BeforeValidator(_as_list), Field(min_length=1)]


def batch_sizes(values: list[int | str], method: str) -> list[int]:
    """The batch sizes a method runs at from a spec's values (official: its card's, 1 for a per-sample method),
    distinct, in order; a per-sample method keeps only 1 (the plan skips its other values, the checks say when
    none is left)."""
    official = method_card(method).batch_size
    resolved = [(official or 1) if v == OFFICIAL_BATCH else v for v in values]
    return list(dict.fromkeys(b for b in resolved if official is not None or b == 1))


def _pack(value: Any) -> int | str:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise PydanticCustomError("pack", "expected 'auto' or an integer greater than or equal to 1 (runs per trial)")


class SweepSpec(_Strict):
    """One sweep: backbones x datasets x templates x methods (their grids expanded) x seeds."""

    name: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=80)]
    description: StrictStr = ""
    results_dir: StrictStr
    cache_dir: StrictStr | None = None
    data_root: StrictStr | None = None
    backbones: list[Backbone] = []
    datasets: Annotated[list[Dataset], Field(min_length=1)]
    # template sets, a grid axis; METHOD_TEMPLATES ('protocol'): each method's official set (method_templates)
    templates: Annotated[list[StrictStr], BeforeValidator(_as_list), Field(min_length=1)] = [METHOD_TEMPLATES]
    views: Annotated[StrictStr, Field(pattern=VIEWS_PATTERN)] = METHOD_PROTOCOL  # each method's own, per dataset
    methods: Annotated[list[BaseModel], Field(min_length=1)]
    seeds: Annotated[list[Annotated[StrictInt, Field(ge=0)]], BeforeValidator(_as_list), Field(min_length=1)]
    resources: Resources = Resources()
    # runs per trial: 'auto' sizes trials by the methods' cost (orchestrator.sweep.cost), G packs G runs
    pack: Annotated[Union[int, str], PlainValidator(_pack)] = "auto"
    part_rows: PositiveInt = 5000
    max_failures: Annotated[StrictInt, Field(ge=0)] = 2
    # the stream protocol, or a list of them as a grid axis (orchestrator.data.streams; None: a real dataset's
    # seeded shuffle, a synthetic scenario's own order), and how many independent orders each configuration runs
    stream: Union[StrictStr, dict[StrictStr, Any], Annotated[list[Union[StrictStr, dict[StrictStr, Any]]],
                                                             Field(min_length=1)]] | None = None
    orders: PositiveInt = 1
    # samples per adaptation step, a grid axis: integers >= 1 and 'official' (each method's card); a method
    # entry's own `batch_size` replaces it for that entry. A per-sample method runs at 1 only (other values are
    # skipped for it); a batch method's runs at B != 1 record it in their config
    batch_size: BatchSizes = [1]
    # only this one of the `orders` (0-based), e.g. the dashboard's "Reproduce this run"; None: all of them
    order: Annotated[StrictInt, Field(ge=0)] | None = None
    plugins: Annotated[list[StrictStr], BeforeValidator(_as_list)] = []

    @field_validator("datasets")
    @classmethod
    def _expand_corruptions(cls, datasets: list[Any]) -> list[Any]:
        """A corruption benchmark's entry as its (corruption, severity) datasets, a grid axis."""
        return [v for d in datasets for v in (d.variants() if isinstance(d, RealDataset) else [d])]

    @property
    def streams(self) -> list[Any]:
        """The stream values the grid runs (None: the datasets' own order)."""
        return self.stream if isinstance(self.stream, list) else [self.stream]

    def entry_batch_sizes(self, entry: BaseModel) -> list[int]:
        """The batch sizes a method entry runs at (its own `batch_size`, else the spec's)."""
        return batch_sizes(entry.batch_size if entry.batch_size is not None else self.batch_size, entry.method)

    @property
    def has_real_datasets(self) -> bool:
        return any(isinstance(d, RealDataset) for d in self.datasets)




@cache
def spec_model(names: tuple[str, ...]) -> type[SweepSpec]:
    """SweepSpec whose method entries are those of the registered methods `names` (plugins add to them)."""
    entry = _method_entry_type(names)
    return create_model("SweepSpec", __base__=SweepSpec, methods=(Annotated[list[entry], Field(min_length=1)], ...))


def current_spec_model() -> type[SweepSpec]:
    return spec_model(tuple(method_names()))


def dataset_views(spec: SweepSpec, dataset: RealDataset | SyntheticDataset, method: str) -> str:
    """The views a method runs on for a dataset: the dataset's own setting, else the spec's, where 'protocol'
    means the method's official protocol on that dataset (its card: e.g. AugMix for BCA on ImageNet-A/-V2/-R/
    -Sketch, crops for MTA everywhere, a single view for BCA on ImageNet). A method that adapts the image encoder on
    one image a sample takes the single view whatever the spec says: it decodes each image with the backbone's eval
    transform itself, and its source shares the single-view cache entry; one taking views (PromptAlign) decodes the
    views its source names, the same pixels as that source's cache entry."""
    card = method_card(method)
    if isinstance(dataset, SyntheticDataset) or (card.image_encoder is not None and not card.takes_views):
        return "single"
    choice = dataset.views or spec.views
    return method_card(method).protocol_views(dataset.name).name if choice == METHOD_PROTOCOL else choice


def method_templates(spec: SweepSpec, method: str) -> list[str]:
    """The template sets a method's runs embed: the spec's, where 'protocol' means the method's official set (its
    card's `templates`: e.g. MTA's single prompt `tpt1`), else the dataset's own templates."""
    official = method_card(method).templates or "dataset"
    return list(dict.fromkeys(official if t == METHOD_TEMPLATES else t for t in spec.templates))


def register_folder_datasets(data: dict[str, Any], base_dir: Any) -> list[tuple[str, str]]:
    """Register the datasets of a parsed spec that are folders in the generic layout under its data_root
    (relative to `base_dir`), before the spec is validated against the registry; returns (field, message) for
    each such folder that cannot be used (a name that is neither registered nor a folder is the validation's
    "unknown dataset")."""
    from pathlib import Path

    root, entries = data.get("data_root"), data.get("datasets")
    if not isinstance(root, str) or not isinstance(entries, list):
        return []
    root_path = Path(base_dir) / Path(root).expanduser()
    issues = []
    for i, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) and "synthetic" not in entry else entry
        if isinstance(name, str) and dataset_key(name) is None:
            try:
                ensure_dataset(name, root_path)
            except ValueError as exc:
                if (root_path / name).is_dir():
                    issues.append((f"datasets[{i}]", str(exc)))
    return issues


def spec_fingerprint(spec: SweepSpec) -> str:
    """The spec as canonical JSON (for the sweep record and for humans reading it)."""
    return json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
