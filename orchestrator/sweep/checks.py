"""The meaning of a structurally valid sweep spec: every value against what it names, every problem at once.

Hyperparameter values are checked against their method's registry card (type and range: the spec accepts
exactly what `run_stream` accepts); synthetic parameters through their generator's own checks; cross-field
rules (select_on posterior needs M == K; view methods need augmented views; real datasets need a data root that
holds their folders, a cache dir and a known backbone with weights said explicitly; distinct dataset names and
seeds; results and cache dirs that are not files).

`spec_warnings` says what is valid but probably not meant: grid values of an hparam that cannot affect some of
the runs (its card's `when`), which the plan collapses into one run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from orchestrator.registry.corruptions import benchmark_key, parse_generated, parse_variant
from orchestrator.data.streams import (HELD_OUT_CLASSES, Contaminated, Continual, Protocol, Realtime,
                                       protocol_from_spec)
from orchestrator.data.synthetic import synthesize
from orchestrator.registry import MethodCard, dataset_key, method_card, method_cards
from orchestrator.registry.backbones import TEACHER, names_teacher
from orchestrator.registry.templates import METHOD_TEMPLATES, TEMPLATE_SET_NAMES
from orchestrator.sweep.cost import GPU_ENCODER_IMAGES_PER_S
from orchestrator.sweep.spec import (
    OFFICIAL_BATCH,
    RANDOM_WEIGHTS,
    STATISTICS_FIELDS,
    RealDataset,
    SweepSpec,
    SyntheticDataset,
    dataset_name,
    dataset_views,
    entry_datasets,
    method_grid,
    method_templates,
)


def embeddings_per_class(spec: SweepSpec, dataset: RealDataset | SyntheticDataset, template_set: str) -> int:
    """M / K: class embeddings per class (synthetic: its templates_per_class; real: 1 for ensembled sets)."""
    if isinstance(dataset, SyntheticDataset):
        return dataset.params["templates_per_class"]
    from orchestrator.sweep.catalog import template_counts

    return template_counts(template_set, dataset.name)[1]


def semantic_issues(spec: SweepSpec, *, data_elsewhere: bool = False) -> list[tuple[str, str]]:
    """data_elsewhere: a data_root absent from this machine is no issue (`load_spec`)."""
    issues: list[tuple[str, str]] = []
    issues += _path_issues(spec)
    issues += _dataset_issues(spec, data_elsewhere)
    issues += _template_issues(spec)
    issues += _method_issues(spec)
    issues += _batch_issues(spec)
    issues += _stream_issues(spec)
    issues += _synthetic_only_issues(spec)
    if spec.order is not None and spec.order >= spec.orders:
        issues.append(("order", f"order {spec.order} is not one of the {spec.orders} orders; expected 0 to "
                                f"{spec.orders - 1}"))
    seen = set()
    for i, seed in enumerate(spec.seeds):
        if seed in seen:
            issues.append((f"seeds[{i}]", f"seed {seed} is listed twice; expected distinct seeds"))
        seen.add(seed)
    return issues


def _path_issues(spec: SweepSpec) -> list[tuple[str, str]]:
    """A results or cache dir that is a file (or lies under one) cannot be created: say so by its field."""
    issues = []
    for field, value in (("results_dir", spec.results_dir), ("cache_dir", spec.cache_dir)):
        if value is None:
            continue
        path = Path(value)
        blocker = next((p for p in (path, *path.parents) if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            where = "is a file" if blocker == path else f"lies under {blocker}, which is a file"
            issues.append((field, f"{value} {where}; expected a directory (created if missing)"))
    return issues


def _synthetic_only_issues(spec: SweepSpec) -> list[tuple[str, str]]:
    """Settings that act on images, asked of a spec whose datasets are all synthetic (generated embeddings: no
    image, no encoder, no prompt): they would change nothing, so a spec that names them is refused."""
    if spec.has_real_datasets:
        return []
    why = "every dataset of this spec is synthetic (its embeddings are generated: no images, encoder or prompts)"
    issues = []
    if spec.views not in ("protocol", "single"):
        issues.append(("views", f"views {spec.views!r} would change nothing: {why}; expected views: protocol or "
                                f"single, or a real dataset to run it on"))
    changed = [t for t in spec.templates if t != "dataset" and t in TEMPLATE_SET_NAMES]
    if changed:
        issues.append(("templates", f"template set(s) {', '.join(map(repr, changed))} would change nothing: {why}; "
                                    f"expected templates: {METHOD_TEMPLATES} (the default) or dataset (a synthetic "
                                    f"scenario sets templates_per_class instead), or a real dataset to run them on"))
    if spec.backbones:
        names = ", ".join(b.model for b in spec.backbones)
        issues.append(("backbones", f"backbone(s) {names} would change nothing: {why}; expected no backbones, or a "
                                    f"real dataset to encode with them"))
    return issues


def _template_issues(spec: SweepSpec) -> list[tuple[str, str]]:
    """Template set names, for every spec (a synthetic-only sweep records them too)."""
    return [(f"templates[{i}]", f"unknown template set {t!r}; expected {METHOD_TEMPLATES} (each method's official "
                                f"set, the default) or one of: {', '.join(TEMPLATE_SET_NAMES)}")
            for i, t in enumerate(spec.templates) if t not in (METHOD_TEMPLATES, *TEMPLATE_SET_NAMES)]


def _dataset_issues(spec: SweepSpec, data_elsewhere: bool = False) -> list[tuple[str, str]]:
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
        issues += _real_source_issues(spec, data_elsewhere)
    return issues


def _real_source_issues(spec: SweepSpec, data_elsewhere: bool = False) -> list[tuple[str, str]]:
    """Data root and its dataset folders, cache dir, backbones: only needed (and only imported) for real datasets."""
    from orchestrator.sweep.catalog import backbone_issue, dataset_listing_issue

    issues: list[tuple[str, str]] = []
    if spec.data_root is None:
        issues.append(("data_root", "required when a real dataset is named; expected the directory that "
                                    "holds the dataset folders (see docs/real-data.md for the layouts)"))
    elif not Path(spec.data_root).is_dir():
        if not data_elsewhere:
            issues.append(("data_root", f"directory {spec.data_root} does not exist; expected the directory "
                                        f"that holds the dataset folders"))
    else:
        for i, ds in enumerate(spec.datasets):
            problem = dataset_listing_issue(ds.name, spec.data_root) if isinstance(ds, RealDataset) else None
            if problem:
                issues.append((f"datasets[{i}]", problem))
    if spec.cache_dir is None:
        issues.append(("cache_dir", "required when a real dataset is named; expected a directory for the "
                                    "feature cache (created if missing)"))
    if not spec.backbones:
        issues.append(("backbones", "required when a real dataset is named; expected a list such as "
                                    "[{model: ViT-B-16, pretrained: openai}]"))
    for i, backbone in enumerate(spec.backbones):
        if backbone.pretrained is None and backbone.checkpoint is None:
            issues.append((f"backbones[{i}].pretrained", f"{backbone.model} has neither pretrained nor checkpoint, so "
                                                         f"it would run with random weights; expected a tag (e.g. "
                                                         f"openai), a checkpoint file, or pretrained: {RANDOM_WEIGHTS} "
                                                         f"to mean random weights"))
        tag = None if backbone.pretrained == RANDOM_WEIGHTS else backbone.pretrained
        problem = backbone_issue(backbone.model, tag, backbone.checkpoint, backbone.config)
        if problem:
            issues.append((f"backbones[{i}].{problem[0]}", problem[1]))
        else:
            issues += _sigmoid_issues(spec, i, backbone, tag)
        issues += _auxiliary_issues(spec, i, backbone)
    return issues


def _sigmoid_issues(spec: SweepSpec, i: int, backbone, tag: str | None) -> list[tuple[str, str]]:
    """On a backbone scoring with a sigmoid (SigLIP): its learned logit scale and bias must be readable (the plan
    records them, and 'backbone_scale' methods run at that scale), and no method entry whose card refuses such a
    backbone may run on it."""
    from orchestrator.clip.backbone import WeightsNotFoundError
    from orchestrator.sweep.catalog import sigmoid_logits

    try:
        if sigmoid_logits(backbone.model, tag, backbone.checkpoint) is None:
            return []
    except (WeightsNotFoundError, ValueError, OSError, RuntimeError) as exc:
        return [(f"backbones[{i}]", f"{backbone.model} scores with a sigmoid and a bias, which the runs read from its "
                                    f"weights when the sweep is planned: {exc}")]
    issues = []
    for j, entry in enumerate(spec.methods):
        card = method_card(entry.method)
        if card.sigmoid_rule.rule == "refuse":
            issues.append((f"methods[{j}]", f"{entry.method} does not run on {backbone.model} (backbones[{i}]), "
                                            f"which scores with a sigmoid and a bias: {card.sigmoid_rule.text()}; expected "
                                            f"a softmax-scored backbone (CLIP) for it, or another method"))
    return issues


def _auxiliary_issues(spec: SweepSpec, i: int, backbone: Any) -> list[tuple[str, str]]:
    """The backbone's auxiliary encoders exist as named, and it names every one its datasets' methods read."""
    from orchestrator.clip.auxiliary import ARCHS

    issues = []
    for j, aux in enumerate(backbone.auxiliary):
        where = f"backbones[{i}].auxiliary[{j}]"
        if aux.arch not in ARCHS:
            issues.append((f"{where}.arch", f"{aux.arch!r} is not a {aux.name} architecture; expected one of "
                                            f"{', '.join(sorted(ARCHS))}"))
        if aux.checkpoint is not None and not Path(aux.checkpoint).is_file():
            issues.append((f"{where}.checkpoint", f"file {aux.checkpoint} does not exist; expected a {aux.name} "
                                                  f"checkpoint in the official format"))
    named = {aux.name for aux in backbone.auxiliary}
    for k, entry in enumerate(spec.methods):
        wanted = [a for a in method_card(entry.method).auxiliary if a not in named]
        if wanted and any(isinstance(d, RealDataset) for d in entry_datasets(spec, entry)):
            issues.append((f"backbones[{i}].auxiliary", f"methods[{k}] ({entry.method}) reads the {wanted[0]} "
                                                        f"auxiliary encoder's features, which {backbone.model} does "
                                                        f"not name; expected e.g. auxiliary: [{{name: {wanted[0]}, "
                                                        f"arch: vitl14_reg, checkpoint: <file>}}]"))
    return issues


def _synthetic_issues(ds: SyntheticDataset) -> list[tuple[str, str]]:
    """Run the generator's own argument checks on a small stream (cheap), mapping its message to a field."""
    params = ds.given
    probe = dict(params)
    if isinstance(params.get("n"), int) and params["n"] >= 1:
        probe["n"] = min(params["n"], 64)
    try:
        synthesize(ds.synthetic, seed=0, **probe)
    except (ValueError, TypeError) as exc:
        text = str(exc)
        field = next((k for k in sorted(params, key=len, reverse=True) if re.search(rf"\b{k}\b", text)), "")
        return [(field or "synthetic", text)]
    return []


def _stream_issues(spec: SweepSpec) -> list[tuple[str, str]]:
    """Each protocol's own checks, and the datasets it reads: real ones the spec's backbones can encode."""
    synthetic = [dataset_name(d) for d in spec.datasets if isinstance(d, SyntheticDataset)]
    issues = []
    for i, value in enumerate(spec.streams):
        where = f"stream[{i}]" if isinstance(spec.stream, list) else "stream"
        if value is None:
            if spec.orders > 1 and synthetic:
                issues.append(("orders", f"a synthetic scenario ({synthetic[0]}) streams in its own fixed order, so "
                                         f"{spec.orders} orders would be {spec.orders} copies of one run; expected a "
                                         f"`stream:` that draws orders (e.g. iid or dirichlet)"))
            continue
        try:
            protocol = protocol_from_spec(value)
        except ValueError as exc:
            issues.append((where, str(exc)))
            continue
        issues += [(where, message) for message in _protocol_issues(spec, protocol, synthetic)]
    return issues


def _protocol_issues(spec: SweepSpec, protocol: Protocol, synthetic: list[str]) -> list[str]:
    reads = []
    if isinstance(protocol, Contaminated) and protocol.pool != HELD_OUT_CLASSES:
        if synthetic:
            return [f"a synthetic dataset ({synthetic[0]}) can only be contaminated with {HELD_OUT_CLASSES!r}, not "
                    f"with dataset {protocol.pool!r}"]
        reads = [protocol.pool]
    if isinstance(protocol, Continual):
        if synthetic:
            return [f"continual streams read real datasets; the synthetic scenario 'continual' is the synthetic one "
                    f"(got synthetic dataset {synthetic[0]})"]
        if dataset_key(protocol.datasets[0]) not in {dataset_name(d) for d in spec.datasets}:
            return [f"the continual stream starts with {protocol.datasets[0]!r}, which is not among the spec's "
                    f"datasets; expected it listed under datasets"]
        reads = list(protocol.datasets)
    unknown = [f"unknown dataset {name!r}; expected a benchmark dataset (e.g. imagenet-v2)"
               for name in reads if dataset_key(name) is None]
    if isinstance(protocol, Continual) and not unknown:
        unknown += _label_space_issues(spec, protocol)
    return unknown


def _label_space_issues(spec: SweepSpec, protocol: Continual) -> list[str]:
    """Continual runs one method state over its datasets in turn: they must predict over the same classes, which
    their image lists (under an existing data root) say before anything runs."""
    if spec.data_root is None or not Path(spec.data_root).is_dir():
        return []  # reported by the data root's own check
    from orchestrator.sweep.catalog import dataset_listing

    spaces = {}
    for name in protocol.datasets:
        try:
            spaces[dataset_key(name)] = dataset_listing(dataset_key(name), spec.data_root).class_names
        except (OSError, ValueError):
            return []  # an unreadable dataset folder is reported by the dataset checks
    first, classes = next(iter(spaces.items()))
    issues = []
    for name, other in spaces.items():
        if len(other) != len(classes):
            differ = f"{name} has {len(other)} classes where {first} has {len(classes)}"
        elif other != classes:
            k = next(k for k, (a, b) in enumerate(zip(other, classes)) if a != b)
            differ = f"class {k} is {other[k]!r} in {name} but {classes[k]!r} in {first}"
        else:
            continue
        issues.append(f"continual runs one method state over datasets that share a label space, but {differ}; "
                      f"expected datasets with the same classes in the same order (e.g. imagenet, imagenet-v2, "
                      f"imagenet-sketch)")
    return issues


def _method_issues(spec: SweepSpec) -> list[tuple[str, str]]:
    issues: list[tuple[str, str]] = []
    known = {dataset_name(d) for d in spec.datasets}
    # a benchmark names all its variants, a dataset its generated corruptions
    known |= {parsed[0] for name in known for parsed in (parse_variant(name), parse_generated(name)) if parsed}
    for i, entry in enumerate(spec.methods):
        card = method_card(entry.method)
        for j, name in enumerate(entry.datasets or []):
            if (dataset_key(name) or benchmark_key(name) or name) not in known:
                issues.append((f"methods[{i}].datasets[{j}]", f"{name!r} is not among the spec's datasets; expected "
                                                              f"one of: {', '.join(sorted(known))}"))
        datasets = entry_datasets(spec, entry)
        views = {dataset_views(spec, ds, entry.method) for ds in datasets}
        try:
            max_per_class = max([embeddings_per_class(spec, ds, t) for ds in datasets
                                 for t in method_templates(spec, entry.method)] + [1])
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
        synthetic = [dataset_name(d) for d in datasets if isinstance(d, SyntheticDataset)]
        tower = _tower_use(card)
        if tower is not None and synthetic:
            does, lacks = tower
            issues.append((f"methods[{i}].method", f"{entry.method!r} {does}, and the synthetic dataset "
                                                   f"{synthetic[0]!r} has generated embeddings only ({lacks}); "
                                                   f"expected real datasets for it (with `datasets:` on the method "
                                                   f"entry; the tiny test backbones run it on image fixtures)"))
        if card.image_encoder is not None and "amp_fp16" in grid.get("precision", []) and spec.resources.gpu == 0:
            issues.append((f"methods[{i}].precision", f"'amp_fp16' runs {entry.method!r}'s encoder under CUDA fp16 "
                                                      f"autocast, and resources.gpu is 0 (its trials run on the CPU); "
                                                      f"expected precision 'fp32', or resources.gpu > 0"))
        if card.text_encoder is not None:
            issues += _selection_issues(spec, i, entry.method, datasets, grid)
        if names_teacher(card):
            issues += _teacher_issues(i, entry.method, grid)
        if entry.context is not None:
            issues += _context_issues(spec, i, entry.method, entry.context)
        if card.tunes_maple:
            issues += _maple_tuning_issues(spec, i, entry, grid)
        if entry.shards is not None and entry.shards > 1:
            issues += _shard_issues(i, entry.method, grid)
        issues += _realtime_issues(spec, i, entry)
        if card.views_everywhere and "single" in views:
            issues.append((f"methods[{i}].method", f"{entry.method!r} works on augmented views of every image, so "
                                                   f"each of its datasets needs views (got single); expected views: "
                                                   "protocol (its official views), augmix or crops"))
    return issues


def _teacher_issues(i: int, method: str, grid: dict[str, list]) -> list[tuple[str, str]]:
    """Each teacher a method entry names loads as its student would (its config known, its published tag one
    open_clip knows); whether the weights are on disk is checked where they are loaded, as for the student."""
    from orchestrator.sweep.catalog import backbone_issue, teacher_backbone

    card, issues = method_card(method), []
    values = grid.get(TEACHER, [card.hparam(TEACHER).default])
    for j, teacher in enumerate(values):
        if teacher not in card.hparam(TEACHER).choices:
            continue  # refused above, naming the choices
        problem = backbone_issue(*teacher_backbone(teacher), None, None)
        if problem:
            issues.append((f"methods[{i}].{TEACHER}" + (f"[{j}]" if len(values) > 1 else ""),
                           f"{method}'s teacher {teacher} cannot be loaded: {problem[1]}"))
    return issues


def _tower_use(card: MethodCard) -> tuple[str, str] | None:
    """What a method does with one of CLIP's towers at test time, and what a synthetic dataset (generated
    embeddings) lacks for it; None for a method on the features alone."""
    if card.image_encoder is not None:
        return "adapts CLIP's image encoder on the images at test time", "no images, no encoder"
    if card.text_encoder is not None:
        return "tunes the prompt through CLIP's text encoder at test time", "no text encoder, no class prompts"
    return None


def _context_issues(spec: SweepSpec, i: int, method: str, path: str) -> list[tuple[str, str]]:
    """A learned context: for a prompt-tuning method a CoOp file, for a frozen-feature method a CoOp file (its
    prompts give the class embeddings) or a MaPLe file (its prompted encoders give the features), fitting each
    backbone; none for a method adapting the image encoder."""
    import open_clip

    from orchestrator.clip.context import MAPLE, context_issue, load_learned
    from orchestrator.clip.maple import fit_issue

    where = f"methods[{i}].context"
    card = method_card(method)
    if card.image_encoder is not None and not card.tunes_maple:
        return [(where, f"{method!r} adapts CLIP's image encoder at test time, which a learned context's prompts do "
                        f"not enter; expected no context (for fine-tuned weights give the backbone's checkpoint)")]
    maple = None
    if card.text_encoder is None:
        try:
            context = load_learned(path)
        except ValueError as exc:
            return [(where, str(exc))]
        source = context.source
        maple = context if source == MAPLE else None
        if card.tunes_maple and maple is None:
            return [(where, f"context file {path} is CoOp's; {method!r} tunes MaPLe's prompts in both towers, so it "
                            f"starts from MaPLe's MultiModalPromptLearner/model.pth.tar-<epoch>")]
        sets = method_templates(spec, method)
        if len(sets) > 1:  # each set would be a run of its own, all of the same numbers
            return [(where, f"a {source} context's prompts replace the class templates, so the spec's {len(sets)} "
                            f"template sets ({', '.join(sets)}) would give {len(sets)} runs of the same numbers; "
                            f"expected one template set (`templates:`) in a spec with a {source} context")]
        synthetic = [dataset_name(d) for d in entry_datasets(spec, spec.methods[i])
                     if isinstance(d, SyntheticDataset)]
        if synthetic:
            return [(where, f"the synthetic dataset {synthetic[0]!r} has generated embeddings, no encoders for a "
                            f"{source} context to prompt; expected real datasets for this entry (`datasets:`)")]
    for backbone in spec.backbones:
        cfg = open_clip.get_model_config(backbone.model.replace("/", "-"))
        if cfg is None:  # an unknown model: reported by the backbone's own check
            continue
        text = cfg.get("text_cfg", {})
        problem = fit_issue(maple, backbone.model, cfg) if maple is not None else context_issue(
            path, backbone.model, int(text.get("width", 512)), int(text.get("context_length", 77)) - 2)
        if problem:
            return [(where, problem)]
    return []


def _maple_tuning_issues(spec: SweepSpec, i: int, entry: Any, grid: dict[str, list]) -> list[tuple[str, str]]:
    """A method tuning MaPLe's prompts starts from a MaPLe context (`_context_issues` checks the file) and, where
    any of its runs aligns (align_weight > 0), reads PromptAlign's source statistics of the shape each backbone's
    vision tower gives (layers, 1 + patches + the file's n_ctx tokens, width)."""
    import open_clip

    from orchestrator.clip.context import load_maple, load_statistics

    card = method_card(entry.method)
    if entry.context is None:
        return [(f"methods[{i}].context", f"{entry.method!r} tunes MaPLe's prompts in both towers from a MaPLe "
                                          f"context; expected context: <MaPLe's MultiModalPromptLearner/"
                                          f"model.pth.tar-<epoch>>")]
    weights = grid.get("align_weight", [card.hparam("align_weight").default])
    aligned = any(isinstance(w, (int, float)) and w > 0 for w in weights)
    given = [name for name in STATISTICS_FIELDS if getattr(entry, name) is not None]
    if not aligned:
        return []
    missing = [name for name in STATISTICS_FIELDS if name not in given]
    if missing:
        return [(f"methods[{i}].{missing[0]}", f"{entry.method!r} with align_weight > 0 aligns with PromptAlign's "
                                               f"source statistics; expected {missing[0]}: <its "
                                               f"ImgNetpre_{missing[0]}.pt> (or align_weight 0: MaPLe + TPT)")]
    try:
        n_ctx = load_maple(entry.context).n_ctx
    except ValueError:
        return []  # the context's own check names it
    for backbone in spec.backbones:
        cfg = open_clip.get_model_config(backbone.model.replace("/", "-"))
        vision = (cfg or {}).get("vision_cfg", {})
        if cfg is None or not isinstance(vision.get("layers", 12), int):
            continue  # an unknown model or not a ViT: the backbone's and the context's checks name it
        grid_side = int(vision.get("image_size", 224)) // int(vision.get("patch_size", 16))
        shape = (int(vision["layers"]), 1 + grid_side ** 2 + n_ctx, int(vision.get("width", 768)))
        try:
            load_statistics(entry.vis_means, entry.vis_vars, shape)
        except ValueError as exc:
            field = "vis_vars" if str(exc).startswith("vis_vars") else "vis_means"
            return [(f"methods[{i}].{field}", f"{exc} for {backbone.model}")]
    return []


def _batch_issues(spec: SweepSpec) -> list[tuple[str, str]]:
    """A per-sample method runs at batch size 1 only: its own entry asking for more is refused; the spec's grid
    crossing it with larger sizes skips those (documented), unless no size is left for it at all."""
    issues = []
    for i, entry in enumerate(spec.methods):
        if method_card(entry.method).batch_size is not None:
            continue
        why = (f"{entry.method!r} adapts per sample (its card has no batch size), so it runs at batch size 1 only")
        if entry.batch_size is not None:
            for j, value in enumerate(entry.batch_size):
                if value not in (1, OFFICIAL_BATCH):
                    where = f"methods[{i}].batch_size" + (f"[{j}]" if len(entry.batch_size) > 1 else "")
                    issues.append((where, f"{why}; expected 1 or 'official', got {value}"))
        elif not spec.entry_batch_sizes(entry):
            issues.append(("batch_size", f"{why}, but batch_size {spec.batch_size} leaves methods[{i}] no run; "
                                         f"expected 1 or 'official' among the values (they are skipped for a "
                                         f"per-sample method), or batch_size: 1 on the method entry"))
    return issues


def _selection_issues(spec: SweepSpec, i: int, method: str, datasets: list, grid: dict) -> list[tuple[str, str]]:
    """Prompt tuning's loss reads int(V * keep) of a sample's V views, as its official code counts them; a run where
    that is none is refused (`orchestrator.methods.prompt.selected_views` says why), one line per dataset and keep."""
    from orchestrator.methods.prompt import selected_views
    from orchestrator.registry.views import parse_views

    card, issues = method_card(method), []
    keeps = grid.get("keep")
    for ds in datasets:
        if isinstance(ds, SyntheticDataset):       # refused for prompt tuning on its own
            continue
        views = dataset_views(spec, ds, method)
        for j, keep in enumerate(keeps or [card.defaults(dataset_name(ds))["keep"]]):
            try:
                keep = card.hparam("keep").check(method, keep)
            except ValueError:                     # an invalid keep, reported on its own
                continue
            try:
                selected_views(method, parse_views(views).num_views, keep)
            except ValueError as exc:
                where = f"methods[{i}].keep" + (f"[{j}]" if keeps and len(keeps) > 1 else "") if keeps else \
                    f"methods[{i}].method"
                issues.append((where, f"on {dataset_name(ds)} with views {views}: {exc}"))
    return issues


def _shard_issues(i: int, method: str, grid: dict[str, list]) -> list[tuple[str, str]]:
    """Shards run apart, each from a fresh state: only an episodic method (state reset every sample) gives the
    rows of the unsharded run; a method adapting the image encoder where every run of the entry resets it before
    every batch (its card's `image_encoder.episodic`)."""
    from orchestrator.methods.episodic import order_free
    from orchestrator.registry import method_names

    if order_free(method):
        return []
    encoder = method_card(method).image_encoder
    if encoder is not None:
        chooser = encoder.episodic
        values = grid.get(chooser, [method_card(method).defaults()[chooser]]) if isinstance(chooser, str) else [chooser]
        if all(values):
            return []
        if isinstance(chooser, str):
            return [(f"methods[{i}].shards", f"{method!r} carries the adapted encoder from batch to batch unless "
                                             f"{chooser}: true, so its stream cannot be split into shards run apart; "
                                             f"expected {chooser}: true on the entry, or no shards")]
    free = [name for name in method_names() if order_free(name)]
    return [(f"methods[{i}].shards", f"{method!r} carries its state from sample to sample, so its stream cannot be "
                                     f"split into shards run apart; expected no shards (or shards: 1) for it, or "
                                     f"an order-free (episodic) method: {', '.join(free)}")]


def spec_warnings(spec: SweepSpec) -> list[str]:
    """One line per method entry hparam whose grid values cannot affect some of its runs (the card's `when` is
    not met there): those runs take the default instead, so the grid does not repeat them; and one per method
    entry that wants a GPU for its text encoder in a sweep whose trials take none."""
    lines = []
    for i, entry in enumerate(spec.methods):
        card = method_card(entry.method)
        if card.text_encoder is not None and card.text_encoder.device == "gpu" and spec.resources.gpu == 0:
            lines.append(f"methods[{i}].method: {entry.method!r} runs CLIP's text encoder forward and backward for "
                         f"every sample and wants a GPU ({card.text_encoder.mb_per_class:g} MB per class per sample); "
                         f"resources.gpu is 0, so its trials run on the CPU")
        grid = method_grid(entry)
        defaults = card.defaults()
        for h in card.hparams:
            if h.name not in grid or not h.when:
                continue
            unmet = {other: [v for v in grid.get(other, [defaults[other]]) if v not in allowed]
                     for other, allowed in h.when.items()}
            unmet = {k: v for k, v in unmet.items() if v}
            if unmet:
                needs = " and ".join(f"{k}: {' or '.join(map(str, allowed))}" for k, allowed in h.when.items())
                where = ", ".join(f"{k}: {' or '.join(map(str, v))}" for k, v in unmet.items())
                lines.append(f"methods[{i}].{h.name}: matters only with {needs}; the runs with {where} take its "
                             f"default ({defaults[h.name]}) and are not repeated per {h.name} value")
    return lines


def _realtime_issues(spec: SweepSpec, i: int, entry: Any) -> list[tuple[str, str]]:
    """A method entry on a realtime stream: the method must predict without adapting (`Method.offers_frozen`),
    adapt one sample a step, and, where the stream gives no k, have the measured GPU rate its k comes from
    (`cost.realtime_k`)."""
    realtime = []
    for value in spec.streams:
        try:
            protocol = protocol_from_spec(value) if value is not None else None
        except ValueError:
            continue  # reported with the streams
        if isinstance(protocol, Realtime):
            realtime.append(protocol)
    if not realtime:
        return []
    card, where = method_card(entry.method), f"methods[{i}].method"
    if not card.implementation().offers_frozen():
        able = [c.name for c in method_cards() if c.implementation().offers_frozen()]
        return [(where, f"{entry.method!r} cannot predict a sample without adapting on it, which a realtime stream "
                        f"asks of every method for the samples that pass while it adapts; methods that can: "
                        f"{', '.join(able)}")]
    if max(spec.entry_batch_sizes(entry)) > 1:
        return [(where, f"a realtime stream adapts on every k-th sample, one sample a step; {entry.method!r} runs at "
                        f"batch size {max(spec.entry_batch_sizes(entry))} here; expected batch size 1")]
    if all(p.k is not None for p in realtime):
        return []
    give = "expected the stream to give k, e.g. {realtime: {base: iid, k: 2}}"
    if card.cost.gpu_samples_per_s is None:
        return [(where, f"{entry.method!r} has no measured GPU cost (its card's gpu_samples_per_s) to derive the "
                        f"realtime stream's k from; {give}")]
    real = any(isinstance(d, RealDataset) for d in entry_datasets(spec, entry))
    unpriced = [b.model for b in spec.backbones if b.model.replace("/", "-") not in GPU_ENCODER_IMAGES_PER_S]
    if real and unpriced:
        return [(where, f"backbone {unpriced[0]!r} has no measured image-encoder rate to derive the realtime "
                        f"stream's k from; {give}")]
    return []
