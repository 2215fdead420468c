"""The meaning of a structurally valid sweep spec: every value against what it names, every problem at once.

Hyperparameter values are checked against their method's registry card (type and range: the spec accepts
exactly what `run_stream` accepts); synthetic parameters through `make_synthetic`'s own checks; cross-field
rules (select_on posterior needs M == K; view methods need augmented views; real datasets need a data root, a
cache dir and a known backbone; distinct dataset names and seeds).
"""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.data.synthetic import make_synthetic
from orchestrator.registry import dataset_key, method_card
from orchestrator.sweep.spec import (
    RealDataset,
    SweepSpec,
    SyntheticDataset,
    dataset_name,
    dataset_views,
    entry_datasets,
    method_grid,
)


def embeddings_per_class(spec: SweepSpec, dataset: RealDataset | SyntheticDataset, template_set: str) -> int:
    """M / K: class embeddings per class (synthetic: its templates_per_class; real: 1 for ensembled sets)."""
    if isinstance(dataset, SyntheticDataset):
        return dataset.params["templates_per_class"]
    from orchestrator.sweep.catalog import template_counts

    return template_counts(template_set, dataset.name)[1]


def semantic_issues(spec: SweepSpec) -> list[tuple[str, str]]:
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
    from orchestrator.clip import TEMPLATE_SET_NAMES
    from orchestrator.sweep.catalog import backbone_issue

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
        if template_set not in TEMPLATE_SET_NAMES:
            issues.append((f"templates[{i}]", f"unknown template set {template_set!r}; expected one of: "
                                              f"{', '.join(TEMPLATE_SET_NAMES)}"))
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
        card = method_card(entry.method)
        for j, name in enumerate(entry.datasets or []):
            if (dataset_key(name) or name) not in known:
                issues.append((f"methods[{i}].datasets[{j}]", f"{name!r} is not among the spec's datasets; expected "
                                                              f"one of: {', '.join(sorted(known))}"))
        datasets = entry_datasets(spec, entry)
        views = {dataset_views(spec, ds) for ds in datasets}
        try:
            max_per_class = max([embeddings_per_class(spec, ds, t) for ds in datasets for t in spec.templates] + [1])
        except ValueError:  # an unknown template set, already reported by _dataset_issues
            max_per_class = 1
        grid = method_grid(entry)
        for key, values in grid.items():
            for j, value in enumerate(values):
                try:
                    card.hparam(key).check(entry.method, value)
                except ValueError as exc:
                    issues.append((f"methods[{i}].{key}" + (f"[{j}]" if len(values) > 1 else ""), str(exc)))
        if "posterior" in grid.get("select_on", []) and max_per_class > 1:
            issues.append((f"methods[{i}].select_on", f"'posterior' selects a class, so it needs one class "
                                                      f"embedding per class (M == K), but the templates give "
                                                      f"M = {max_per_class}K; expected 'likelihood'"))
        if card.takes_views and not all(v.startswith("augmix") for v in views):
            issues.append((f"methods[{i}].method", f"{entry.method!r} votes over augmented views, so each of its "
                                                   f"datasets needs views 'augmix' (got {', '.join(sorted(views))}); "
                                                   f"expected views: augmix, or `datasets:` naming AugMix ones"))
    return issues
