"""Loading a sweep spec: YAML (duplicate keys refused) -> structure (pydantic) -> paths -> meaning (`checks`).

Validation runs in two phases and reports every problem at once, each as `field.path: what was expected`:
1. Structure (pydantic, `extra='forbid'`): unknown keys (with the allowed keys), wrong types, empty grids,
   out-of-range resources.
2. Meaning (`orchestrator.sweep.checks`): every hyperparameter value against its method's registry card,
   synthetic parameters through their generator's own checks, cross-field rules.

Paths (`data_root`, `cache_dir`, `results_dir`, checkpoints) are made absolute relative to the directory of
the spec file, not the current directory, so `bca sweep experiments/demo.yaml` writes to the same place from
anywhere. Trials only ever see absolute paths (Ray Tune changes each trial's working directory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from orchestrator.registry import load_plugins, method_names
from orchestrator.sweep.checks import semantic_issues
from orchestrator.sweep.spec import STATISTICS_FIELDS, SweepSpec, current_spec_model, register_folder_datasets


class SpecError(ValueError):
    """An invalid sweep spec: `issues` holds (field path, message) pairs; str() lists them all."""

    def __init__(self, source: str, issues: list[tuple[str, str]]) -> None:
        self.source = source
        self.issues = issues
        lines = [f"  - {path}: {msg}" if path else f"  - {msg}" for path, msg in issues]
        noun = "problem" if len(issues) == 1 else "problems"
        super().__init__(f"{source}: invalid sweep spec ({len(issues)} {noun}):\n" + "\n".join(lines))


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
    tags = {"methods": set(method_names()), "datasets": {"real", "synthetic"}}
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


def load_spec(path: str | Path, *, data_elsewhere: bool = False) -> SweepSpec:
    """Read, validate and resolve a spec file; raise SpecError listing every problem.

    Relative paths are made absolute against the spec file's directory. data_elsewhere (a dry run): a data_root
    that does not exist on this machine is not a problem (the plan is for the machine that holds it).
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
    return validate_spec(data, source=source, base_dir=path.resolve().parent, data_elsewhere=data_elsewhere)


def validate_spec(data: Any, *, source: str = "<spec>", base_dir: str | Path | None = None,
                  data_elsewhere: bool = False) -> SweepSpec:
    """Validate a parsed spec (a dict) and return it with absolute paths (relative to `base_dir`, else cwd).

    The document only: whether the results dir already holds this sweep is the plan's question
    (`orchestrator.sweep.record`)."""
    if not isinstance(data, dict):
        raise SpecError(source, [("", f"a sweep spec is a mapping of keys (name, results_dir, datasets, "
                                      f"methods, seeds, ...), got {type(data).__name__}")])
    plugins = data.get("plugins") or []
    try:
        load_plugins(plugins if isinstance(plugins, list) else [plugins])
    except (ValueError, TypeError) as exc:
        raise SpecError(source, [("plugins", str(exc))]) from None
    folder_issues = register_folder_datasets(data, Path(base_dir) if base_dir is not None else Path.cwd())
    if folder_issues:
        raise SpecError(source, folder_issues)
    try:
        spec = current_spec_model().model_validate(data)
    except ValidationError as exc:
        raise SpecError(source, _pydantic_issues(exc)) from None
    spec = _absolute_paths(spec, Path(base_dir) if base_dir is not None else Path.cwd())
    issues = semantic_issues(spec, data_elsewhere=data_elsewhere)
    if issues:
        raise SpecError(source, issues)
    return spec


def _absolute_paths(spec: SweepSpec, base: Path) -> SweepSpec:
    def absolute(p: str | None) -> str | None:
        return None if p is None else str((base / Path(p).expanduser()).resolve())

    backbones = [b.model_copy(update={"checkpoint": absolute(b.checkpoint), "config": absolute(b.config),
                                      "auxiliary": [a.model_copy(update={"checkpoint": absolute(a.checkpoint)})
                                                    for a in b.auxiliary]})
                 for b in spec.backbones]
    methods = [m.model_copy(update={"context": absolute(m.context), **{k: absolute(getattr(m, k))
                                                                     for k in STATISTICS_FIELDS if hasattr(m, k)}})
               for m in spec.methods]
    return spec.model_copy(update={"results_dir": absolute(spec.results_dir), "cache_dir": absolute(spec.cache_dir),
                                   "data_root": absolute(spec.data_root), "backbones": backbones, "methods": methods})


