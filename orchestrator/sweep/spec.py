"""The sweep spec: a YAML file validated once, at load, into frozen pydantic models.

Validation runs in two phases and reports every problem at once, each as `field.path: what was expected`:

1. Structure (pydantic, `extra='forbid'`): unknown keys (with the allowed keys), wrong types, empty grids,
   out-of-range resources.
2. Meaning (`_semantic_issues`): every hyperparameter value through the method's own `check_hparams`
   (so the spec accepts exactly what the methods accept) plus the sweep's stricter rule that taus lie in
   [0, 1]; synthetic parameters through `make_synthetic`'s own checks; cross-field rules (select_on
   posterior needs M == K; `zero` needs AugMix views; real datasets need a data root, a cache dir and a
   backbone; a known open_clip model; the same sweep name may not be reused with a different configuration
   in one results dir).

Paths (`data_root`, `cache_dir`, `results_dir`, checkpoints) are made absolute relative to the directory of
the spec file, not the current directory, so `bca sweep experiments/demo.yaml` writes to the same place from
anywhere. Trials only ever see absolute paths (Ray Tune changes each trial's working directory).
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, StrictBool,
                      StrictFloat, StrictInt, StrictStr, Tag, ValidationError, create_model, model_validator)
from pydantic_core import PydanticCustomError

from orchestrator.data.datasets import canonical_dataset_name, protocol_views
from orchestrator.data.synthetic import SYNTHETIC_SCENARIOS, make_synthetic
from orchestrator.methods import METHODS, hparam_defaults
from orchestrator.results.schema import normalize_config

# 'augmix' is 63 AugMix views + the original; 'augmixN' N + the original; 'protocol' the public protocol's choice.
VIEWS_PATTERN = r"^(protocol|single|augmix[0-9]*)$"
TAU_KEYS = ("tau", "tau_likelihood", "tau_prior")


class SpecError(ValueError):
    """An invalid sweep spec: `issues` holds (field path, message) pairs; str() lists them all."""

    def __init__(self, source: str, issues: list[tuple[str, str]]) -> None:
        self.source = source
        self.issues = issues
        lines = [f"  - {path}: {msg}" if path else f"  - {msg}" for path, msg in issues]
        noun = "problem" if len(issues) == 1 else "problems"
        super().__init__(f"{source}: invalid sweep spec ({len(issues)} {noun}):\n" + "\n".join(lines))


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
    """Per trial: a fraction of one GPU (0 = CPU only) and CPU cores (both may be fractional)."""

    gpu: Annotated[Union[StrictInt, StrictFloat], Field(ge=0, le=1)] = 0
    cpus: Annotated[Union[StrictInt, StrictFloat], Field(gt=0)] = 1


class Backbone(_Strict):
    """An open_clip model with a pretrained tag (e.g. openai), a local checkpoint file, or neither (random
    weights). `config`: a custom open_clip model config JSON named <model>.json, registered in every trial
    process; `quick_gelu`: override the activation (None: decided by orchestrator.clip)."""

    model: StrictStr
    pretrained: StrictStr | None = None
    checkpoint: StrictStr | None = None
    config: StrictStr | None = None
    quick_gelu: StrictBool | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Backbone:
        if self.pretrained is not None and self.checkpoint is not None:
            raise PydanticCustomError("weights_source", "give either pretrained (a tag such as 'openai') or "
                                      "checkpoint (a file path), not both")
        return self


class RealDataset(_Strict):
    """A dataset read from data_root (a name or alias of orchestrator.data.datasets, stored canonical);
    `views` overrides the spec-level views for this dataset."""

    name: Annotated[StrictStr, AfterValidator(canonical_dataset_name)]
    views: Annotated[StrictStr, Field(pattern=VIEWS_PATTERN)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data


def _synthetic_parameters() -> dict[str, tuple[Any, Any]]:
    """make_synthetic's keyword parameters (except the seed, which comes from `seeds`) as pydantic fields."""
    strict = {int: StrictInt, float: Union[StrictInt, StrictFloat]}
    fields: dict[str, tuple[Any, Any]] = {}
    for name, param in inspect.signature(make_synthetic).parameters.items():
        if name in ("scenario", "seed"):
            continue
        kind = strict.get(type(param.default), Scalar)
        fields[name] = (kind | None, None)
    return fields


_SYNTHETIC_DEFAULTS = {name: p.default for name, p in inspect.signature(make_synthetic).parameters.items()
                       if name not in ("scenario", "seed")}


_SyntheticBase = create_model("_SyntheticBase", __base__=_Strict, **_synthetic_parameters())


class SyntheticDataset(_SyntheticBase):  # type: ignore[misc, valid-type]
    """A synthetic scenario; its own parameters are make_synthetic's. `name` defaults to synthetic-<scenario>."""

    synthetic: Literal[SYNTHETIC_SCENARIOS]
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
        """Every make_synthetic parameter (its defaults, then the spec's), so the run config pins the data."""
        return {**_SYNTHETIC_DEFAULTS, **self.given}


def _dataset_kind(value: Any) -> str:
    synthetic = isinstance(value, SyntheticDataset) or (isinstance(value, dict) and "synthetic" in value)
    return "synthetic" if synthetic else "real"


Dataset = Annotated[Union[Annotated[RealDataset, Tag("real")], Annotated[SyntheticDataset, Tag("synthetic")]],
                    Discriminator(_dataset_kind)]


def _method_model(name: str) -> type[BaseModel]:
    """A method entry: the method, optionally the datasets it runs on (default: all), and a grid per hparam."""
    fields = {hp: (Grid | None, None) for hp in hparam_defaults(name)}
    only = Annotated[list[StrictStr], BeforeValidator(_as_list), Field(min_length=1)] | None
    return create_model(f"MethodEntry_{name}", __base__=_Strict, method=(Literal[name], ...),
                        datasets=(only, None), **fields)


_METHOD_MODELS = {name: _method_model(name) for name in sorted(METHODS)}


def _method_tag(value: Any) -> str | None:
    name = value.get("method") if isinstance(value, dict) else getattr(value, "method", None)
    return name if name in _METHOD_MODELS else None


MethodEntry = Annotated[
    Union[tuple(Annotated[model, Tag(name)] for name, model in _METHOD_MODELS.items())],
    Discriminator(_method_tag, custom_error_type="unknown_method",
                  custom_error_message=f"method must be one of: {', '.join(_METHOD_MODELS)}",
                  custom_error_context={"field": "method"}),
]


def method_grid(entry: BaseModel) -> dict[str, list[Any]]:
    """The hyperparameter axes a method entry gives (unset ones take the method's defaults)."""
    return {k: v for k, v in entry.model_dump(exclude={"method", "datasets"}).items() if v is not None}


def dataset_name(dataset: RealDataset | SyntheticDataset) -> str:
    return dataset.dataset_name if isinstance(dataset, SyntheticDataset) else dataset.name


def entry_datasets(spec: SweepSpec, entry: BaseModel) -> list[RealDataset | SyntheticDataset]:
    """The datasets a method entry runs on: those it names (aliases of real datasets accepted), else all."""
    if entry.datasets is None:
        return list(spec.datasets)
    wanted = {_canonical_or_same(n) for n in entry.datasets}
    return [d for d in spec.datasets if dataset_name(d) in wanted]


def _canonical_or_same(name: str) -> str:
    try:
        return canonical_dataset_name(name)
    except ValueError:
        return name


class SweepSpec(_Strict):
    """One sweep: backbones x datasets x templates x methods (their grids expanded) x seeds."""

    name: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=80)]
    description: StrictStr = ""
    results_dir: StrictStr
    cache_dir: StrictStr | None = None
    data_root: StrictStr | None = None
    backbones: list[Backbone] = []
    datasets: Annotated[list[Dataset], Field(min_length=1)]
    templates: Annotated[list[StrictStr], BeforeValidator(_as_list), Field(min_length=1)] = ["dataset"]
    views: Annotated[StrictStr, Field(pattern=VIEWS_PATTERN)] = "protocol"
    methods: Annotated[list[MethodEntry], Field(min_length=1)]
    seeds: Annotated[list[Annotated[StrictInt, Field(ge=0)]], BeforeValidator(_as_list), Field(min_length=1)]
    resources: Resources = Resources()
    pack: PositiveInt = 1
    part_rows: PositiveInt = 5000
    max_failures: Annotated[StrictInt, Field(ge=0)] = 2

    @property
    def has_real_datasets(self) -> bool:
        return any(isinstance(d, RealDataset) for d in self.datasets)


# ----------------------------------------------------------------------------------------------- loading

class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys silently; a spec with a repeated key is almost always a mistake."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _path_of(loc: tuple[Any, ...]) -> str:
    """('methods', 0, 'bca', 'tau', 1) -> 'methods[0].tau[1]' (the discriminator tag after an index dropped)."""
    tags = {"methods": set(_METHOD_MODELS), "datasets": {"real", "synthetic"}}
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i >= 2 and isinstance(loc[i - 1], int) and part in tags.get(loc[i - 2], ()):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out


def _pydantic_issues(exc: ValidationError) -> list[tuple[str, str]]:
    issues = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        ctx = err.get("ctx") or {}
        if err["type"] == "unknown_key":
            loc = loc + (ctx["key"],)
        elif err["type"] == "unknown_method":
            loc = loc + ("method",)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] not in ("unknown_key", "missing", "unknown_method"):
            msg += f" (got {err['input']!r})"
        issues.append((_path_of(loc), msg))
    return issues


def load_spec(path: str | Path, *, check_existing: bool = True) -> SweepSpec:
    """Read, validate and resolve a spec file; raise SpecError listing every problem.

    Relative paths are made absolute against the spec file's directory. With `check_existing`, a results
    dir that already holds a sweep of this name with a different configuration is an error.
    """
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(source, [("", f"cannot read the spec file: {exc.strerror or exc}")]) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise SpecError(source, [("", f"not valid YAML: {exc}")]) from None
    return validate_spec(data, source=source, base_dir=path.resolve().parent, check_existing=check_existing)


def validate_spec(data: Any, *, source: str = "<spec>", base_dir: str | Path | None = None,
                  check_existing: bool = True) -> SweepSpec:
    """Validate a parsed spec (a dict) and return it with absolute paths (relative to `base_dir`, else cwd)."""
    if not isinstance(data, dict):
        raise SpecError(source, [("", f"a sweep spec is a mapping of keys (name, results_dir, datasets, "
                                      f"methods, seeds, ...), got {type(data).__name__}")])
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(source, _pydantic_issues(exc)) from None
    spec = _absolute_paths(spec, Path(base_dir) if base_dir is not None else Path.cwd())
    issues = _semantic_issues(spec)
    if issues:
        raise SpecError(source, issues)
    from orchestrator.sweep.plan import check_sweep_record, expand

    try:
        runs = expand(spec)
    except ValueError as exc:
        raise SpecError(source, [("methods", str(exc))]) from None
    problem = check_sweep_record(spec, runs) if check_existing else None
    if problem:
        raise SpecError(source, [("name", problem)])
    return spec


def _absolute_paths(spec: SweepSpec, base: Path) -> SweepSpec:
    def absolute(p: str | None) -> str | None:
        return None if p is None else str((base / Path(p).expanduser()).resolve())

    backbones = [b.model_copy(update={"checkpoint": absolute(b.checkpoint), "config": absolute(b.config)})
                 for b in spec.backbones]
    return spec.model_copy(update={"results_dir": absolute(spec.results_dir), "cache_dir": absolute(spec.cache_dir),
                                   "data_root": absolute(spec.data_root), "backbones": backbones})


# ------------------------------------------------------------------------------------- semantic checks

def dataset_views(spec: SweepSpec, dataset: RealDataset | SyntheticDataset) -> str:
    """'single' or 'augmix' for a dataset: its own setting, else the spec's, where 'protocol' means the
    public protocol (AugMix views for ImageNet-A/-V2/-R/-Sketch, a single view elsewhere)."""
    if isinstance(dataset, SyntheticDataset):
        return "single"
    choice = dataset.views or spec.views
    return protocol_views(dataset.name) if choice == "protocol" else choice


def embeddings_per_class(spec: SweepSpec, dataset: RealDataset | SyntheticDataset, template_set: str) -> int:
    """M / K: class embeddings per class (synthetic: its templates_per_class; real: 1 for ensembled sets)."""
    if isinstance(dataset, SyntheticDataset):
        return dataset.params["templates_per_class"]
    from orchestrator.sweep.catalog import template_counts

    return template_counts(template_set, dataset.name)[1]


def _semantic_issues(spec: SweepSpec) -> list[tuple[str, str]]:
    issues: list[tuple[str, str]] = []
    issues += _dataset_issues(spec)
    issues += _method_issues(spec)
    seen = set()
    for i, seed in enumerate(spec.seeds):
        if seed in seen:
            issues.append((f"seeds[{i}]", f"seed {seed} is listed twice; expected distinct seeds"))
        seen.add(seed)
    return issues


def _dataset_issues(spec: SweepSpec) -> list[tuple[str, str]]:
    issues: list[tuple[str, str]] = []
    names: dict[str, int] = {}
    for i, ds in enumerate(spec.datasets):
        label = dataset_name(ds)
        if label in names:
            issues.append((f"datasets[{i}]", f"dataset name {label!r} repeats datasets[{names[label]}]; expected "
                                             f"unique names (give a synthetic entry its own `name`)"))
        names[label] = i
        if isinstance(ds, SyntheticDataset):
            issues += [(f"datasets[{i}].{field}", msg) for field, msg in _synthetic_issues(ds)]
    if spec.has_real_datasets:
        issues += _real_source_issues(spec)
    return issues


def _real_source_issues(spec: SweepSpec) -> list[tuple[str, str]]:
    """Data root, cache dir, backbones and template sets: only needed (and only imported) for real datasets."""
    from orchestrator.sweep.catalog import backbone_issue, template_set_names

    issues: list[tuple[str, str]] = []
    if spec.data_root is None:
        issues.append(("data_root", "required when a real dataset is named; expected the directory that "
                                    "holds the dataset folders (see the README's data layout)"))
    elif not Path(spec.data_root).is_dir():
        issues.append(("data_root", f"directory {spec.data_root} does not exist; expected the directory "
                                    f"that holds the dataset folders"))
    if spec.cache_dir is None:
        issues.append(("cache_dir", "required when a real dataset is named; expected a directory for the "
                                    "feature cache (created if missing)"))
    if not spec.backbones:
        issues.append(("backbones", "required when a real dataset is named; expected a list such as "
                                    "[{model: ViT-B-16, pretrained: openai}]"))
    for i, backbone in enumerate(spec.backbones):
        problem = backbone_issue(backbone.model, backbone.pretrained, backbone.checkpoint, backbone.config)
        if problem:
            issues.append((f"backbones[{i}].{problem[0]}", problem[1]))
    for i, template_set in enumerate(spec.templates):
        if template_set not in template_set_names():
            issues.append((f"templates[{i}]", f"unknown template set {template_set!r}; expected one of: "
                                              f"{', '.join(template_set_names())}"))
    return issues


def _synthetic_issues(ds: SyntheticDataset) -> list[tuple[str, str]]:
    """Run make_synthetic's own argument checks on a one-sample stream (cheap), mapping its message to a field."""
    params = ds.given
    probe = dict(params)
    if isinstance(params.get("n"), int) and params["n"] >= 1:
        probe["n"] = 1
    try:
        make_synthetic(ds.synthetic, seed=0, **probe)
    except (ValueError, TypeError) as exc:
        text = str(exc)
        field = next((k for k in sorted(params, key=len, reverse=True) if re.search(rf"\b{k}\b", text)), "")
        return [(field or "synthetic", text)]
    return []


def _method_issues(spec: SweepSpec) -> list[tuple[str, str]]:
    issues: list[tuple[str, str]] = []
    known = {dataset_name(d) for d in spec.datasets}
    for i, entry in enumerate(spec.methods):
        cls = METHODS[entry.method]
        for j, name in enumerate(entry.datasets or []):
            if _canonical_or_same(name) not in known:
                issues.append((f"methods[{i}].datasets[{j}]", f"{name!r} is not among the spec's datasets; expected "
                                                              f"one of: {', '.join(sorted(known))}"))
        datasets = entry_datasets(spec, entry)
        views = {dataset_views(spec, ds) for ds in datasets}
        try:
            max_per_class = max([embeddings_per_class(spec, ds, t) for ds in datasets for t in spec.templates] + [1])
        except ValueError:  # an unknown template set, already reported by _dataset_issues
            max_per_class = 1
        grid = method_grid(entry)
        defaults = hparam_defaults(entry.method)
        for key, values in grid.items():
            for j, value in enumerate(values):
                where = f"methods[{i}].{key}" + (f"[{j}]" if len(values) > 1 else "")
                if key in TAU_KEYS and not (value is None and key != "tau") and (
                        isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1):
                    issues.append((where, f"must be a number in [0, 1] (a probability threshold), got {value!r}"))
                    continue
                try:
                    cls.check_hparams({**defaults, key: value}, 1, 1)
                    # the runs table's column type (e.g. n1 is an integer count)
                    normalize_config({"sweep": "s", "backbone": "b", "dataset": "d", "method": entry.method,
                                      "seed": 0, "hparams": {key: value}})
                except ValueError as exc:
                    issues.append((where, str(exc)))
        if "posterior" in grid.get("select_on", []) and max_per_class > 1:
            issues.append((f"methods[{i}].select_on", f"'posterior' selects a class, so it needs one class "
                                                      f"embedding per class (M == K), but the templates give "
                                                      f"M = {max_per_class}K; expected 'likelihood'"))
        if cls.takes_views and not all(v.startswith("augmix") for v in views):
            issues.append((f"methods[{i}].method", f"{entry.method!r} votes over augmented views, so each of its "
                                                   f"datasets needs views 'augmix' (got {', '.join(sorted(views))}); "
                                                   f"expected views: augmix, or `datasets:` naming AugMix ones"))
    return issues


def spec_fingerprint(spec: SweepSpec) -> str:
    """The spec as canonical JSON (for the sweep record and for humans reading it)."""
    return json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
