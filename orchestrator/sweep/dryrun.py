"""`bca sweep SPEC --dry-run`: what a sweep would do, without running or writing anything.

Besides the spec's own checks (every value, the data root's dataset folders, label spaces of continual streams),
it checks this machine where the sweep would run on it (no --address): the pretrained weights each backbone
names are on disk, and the resources a trial asks for exist here (`machine_issues`). A problem is an error
(exit 2), not a line of the plan.

Runs and trials per backbone / dataset / method (and batch size, where some run adapts on batches; the batch
sizes a per-sample method skips are named), with how many are finished already, the real data sources
the trials will encode and whether the feature cache holds them, and the cost in online steps (samples streamed
through a method, summed over the runs to run) and images to encode, and the projected CPU- and GPU-hours
(`cost.projected_hours`: the GPU's include encoding at the backbone's measured rate). Cache entries are
recognised by their manifest (backbone, dataset, image-list fingerprint, views and seed), without loading any
weights.

A spec whose data_root is not on this machine is planned for the machine that holds it: stream lengths are the
registry's test-set sizes, the cache is not consulted, and this machine's checks (weights, resources) are left
to that machine, as when the dry run joins a cluster.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from orchestrator.sweep.load import SpecError
from orchestrator.sweep.plan import DataSource, Run, Trial, computed_runs, make_trials, teacher_source
from orchestrator.sweep.record import check_sweep_record
from orchestrator.registry import MethodCard, method_card
from orchestrator.registry.backbones import TEACHER, names_teacher
from orchestrator.sweep.spec import OFFICIAL_BATCH, RANDOM_WEIGHTS, SweepSpec, method_grid
from orchestrator.sweep.cost import (projected_hours, registry_length, sweep_cost, sweep_memory, trial_device_bytes,
                                     unknown_device_note)
from orchestrator.sweep.status import recorded_rows, run_status


def data_elsewhere(spec: SweepSpec) -> bool:
    """The spec reads real datasets from a data_root that is not on this machine."""
    return spec.has_real_datasets and not (spec.data_root and Path(spec.data_root).is_dir())


def _stream_length(spec: SweepSpec, source: DataSource) -> int:
    if source.is_synthetic:
        return int(source.params()["n"])
    if data_elsewhere(spec):
        return registry_length(source.dataset)
    from orchestrator.sweep.catalog import dataset_listing

    return len(dataset_listing(source.dataset, spec.data_root))


def _cache_manifests(cache_dir: str | None) -> list[dict]:
    manifests = []
    for path in sorted(Path(cache_dir).glob("features/*/manifest.json")) if cache_dir else []:
        try:
            manifests.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # a damaged entry is as good as missing: the trial re-encodes it
    return manifests


def _aux_cached(spec: SweepSpec, aux: dict, source: DataSource, manifests: list[dict]) -> bool:
    from orchestrator.clip.auxiliary import AuxiliarySpec
    from orchestrator.clip.views import parse_views
    from orchestrator.sweep.catalog import dataset_listing

    identity = AuxiliarySpec(aux["name"], aux["arch"], aux["checkpoint"]).identity()
    views = parse_views(source.views, source.seed)
    listing = dataset_listing(source.dataset, spec.data_root).fingerprint()
    return any(m.get("key_fields", {}).get("auxiliary") == identity and m.get("dataset") == source.dataset
               and m.get("views") == views.name and (views.num_views == 1 or m.get("seed") == views.seed)
               and m.get("key_fields", {}).get("listing_sha256") == listing for m in manifests)


def _cached(spec: SweepSpec, source: DataSource, manifests: list[dict]) -> bool:
    from orchestrator.clip.backbone import BackboneSpec
    from orchestrator.clip.views import parse_views
    from orchestrator.sweep.catalog import dataset_listing

    views = parse_views(source.views, source.seed)
    label = BackboneSpec(source.model, source.weights, source.quick_gelu).label
    listing = dataset_listing(source.dataset, spec.data_root).fingerprint()
    return any(m.get("backbone") == label and m.get("dataset") == source.dataset and m.get("views") == views.name
               and m.get("num_views") == views.num_views and (views.num_views == 1 or m.get("seed") == views.seed)
               and m.get("key_fields", {}).get("listing_sha256") == listing
               and m.get("key_fields", {}).get("context_sha256") == source.image_context_sha256 for m in manifests)


def _known_classes(dataset: Any) -> int | None:
    """A registered dataset's K (a folder dataset's is unknown before its listing: None)."""
    from orchestrator.registry.datasets import DATASETS, dataset_key

    key = dataset_key(dataset)
    return DATASETS[key].num_classes if key in DATASETS else None


def _text_encoder_lines(runs: list[Run]) -> list[str]:
    """The methods that run CLIP's text encoder at test time, with the device they want and their memory per
    sample at each dataset's K (a folder dataset's K is unknown before its listing: per class only)."""
    from orchestrator.registry import method_card

    uses = {m: method_card(m).text_encoder is not None for m in {r.method for r in runs}}  # a card per method
    pairs = dict.fromkeys((r.method, r.source.dataset) for r in runs if uses[r.method])
    lines = ["methods running CLIP's text encoder at test time (the trial loads the backbone's text tower):"] if pairs \
        else []
    for method, dataset in pairs:
        lines.append(f"  {method} on {dataset}: {method_card(method).text_encoder.describe(_known_classes(dataset))}")
    return lines


def _image_encoder_lines(runs: list[Run]) -> list[str]:
    """The methods that adapt CLIP's image encoder on the images, one trial per run (never packed: each adapts its
    own copy), with the device they want and their activation memory at each run's batch size (and classes, for a
    method adapting the text tower too)."""
    from orchestrator.registry import method_card

    uses = {m: method_card(m).image_encoder for m in {r.method for r in runs}}
    keys = dict.fromkeys((r.method, r.batch_size, r.source.dataset if uses[r.method].text_mb_per_class else None)
                         for r in runs if uses[r.method])
    lines = ["methods adapting CLIP's image encoder on the images (one trial per run, never packed; the trial "
             "decodes the stream's images and loads the backbone's vision tower):"] if keys else []
    for method, batch, dataset in keys:
        k = None if dataset is None else _known_classes(dataset)
        at = f" on {k} classes" if k else ""
        card = method_card(method)
        views = card.views.count if card.takes_views else 1
        lines.append(f"  {method} at batch size {batch}{at}: {card.image_encoder.describe(batch, k, views)}")
    return lines


def _teacher_lines(spec: SweepSpec, teachers) -> list[str]:
    """The CLIP teachers the runs read (their feature-cache entries are listed and priced with the backbones'):
    the memory a trial holds for a teacher's features of every view, beside the student's."""
    import open_clip

    from orchestrator.clip.views import parse_views

    lines = ["CLIP teachers the runs read (frozen: their features of every view and their class prompts come from the "
             "feature cache, encoded once; each trial holds them beside the student's):"] if teachers else []
    for run, source in teachers:
        dim = open_clip.get_model_config(source.model)["embed_dim"]
        n, views = _stream_length(spec, source), parse_views(source.views, source.seed).num_views
        mb = n * views * dim * 4 / 2**20
        held = f"{mb / 1024:,.2f} GB" if mb >= 1024 else f"{mb:,.2f} MB"
        lines.append(f"  {run.method} on {source.dataset}: teacher {source.model} ({source.weights or 'random weights'})"
                     f", {n:,} samples x {views} views x {dim} float32 = {held} in the trial")
    return lines


def _sigmoid_lines(spec: SweepSpec, runs: list[Run]) -> list[str]:
    """The backbones that score with a sigmoid and a bias (SigLIP): the learned scale and bias read from their
    weights, and which methods run at that scale (their cards' sigmoid rules)."""
    if not spec.has_real_datasets:
        return []
    from orchestrator.registry import method_card
    from orchestrator.sweep.catalog import sigmoid_logits

    lines = []
    methods = list(dict.fromkeys(r.method for r in runs))
    for backbone in spec.backbones:
        tag = None if backbone.pretrained == RANDOM_WEIGHTS else backbone.pretrained
        logits = sigmoid_logits(backbone.model, tag, backbone.checkpoint)
        if logits is None:
            continue
        scaled = [m for m in methods if method_card(m).sigmoid_rule.rule == "backbone_scale"]
        same = [m for m in methods if m not in scaled]
        lines.append(f"{backbone.model} scores with a sigmoid: logit scale {logits[0]:.4g}, bias {logits[1]:.4g} (read "
                     f"from its weights); " + (f"{', '.join(scaled)} run a softmax at that scale (bias dropped: shared "
                                               f"by every class)" if scaled else "")
                     + ("; " if scaled and same else "") + (f"{', '.join(same)} run unchanged" if same else ""))
    return lines


def plan_lines(spec: SweepSpec, runs: list[Run], trials: list[Trial], status: dict[str, str | None]) -> list[str]:
    """The dry run's report, one line each."""
    finished = {rid for rid, state in status.items() if state == "finished"}
    todo = [r for r in runs if r.run_id not in finished]
    lines = [f"sweep {spec.name} (dry run: nothing is run or written): {len(runs):,} runs, {len(finished):,} "
             f"finished, {len(todo):,} to run in {len(trials):,} trials (pack {spec.pack}) -> {spec.results_dir}"]
    # a batch column where some run adapts on batches
    batched = any(r.batch_size != 1 for r in runs)

    def key(run: Run) -> tuple:
        return (run.backbone, run.source.dataset, run.method) + ((run.batch_size,) if batched else ())

    by_key = Counter(key(r) for r in runs)
    done = Counter(key(r) for r in runs if r.run_id in finished)
    # a trial counts under every row it holds runs of (a pack holds several methods' runs of one data source)
    trial_count = Counter(k for t in trials for k in {key(r) for r in t.runs})
    lines.append(f"  {'backbone':<20} {'dataset':<28} {'method':<10}" + (f" {'batch':>6}" if batched else "")
                 + f" {'runs':>9} {'finished':>9} {'trials':>9}")
    for k, n in by_key.items():
        backbone, dataset, method = k[:3]
        lines.append(f"  {backbone:<20} {dataset:<28} {method:<10}" + (f" {k[3]:>6}" if batched else "")
                     + f" {n:>9,} {done[k]:>9,} {trial_count[k]:>9,}")
    if sum(trial_count.values()) > len(trials):
        lines.append("  trials: those holding a run of the row; a trial packs runs of several rows, so the column "
                     f"adds up to more than the {len(trials):,} trials")
    lines += _skipped_batch_sizes(spec)
    lines += _text_encoder_lines(runs)
    lines += _image_encoder_lines(runs)
    lines += _sigmoid_lines(spec, runs)
    sharded: dict[str, dict[str, int]] = {}  # method -> run_id -> its shards
    for trial in trials:
        if trial.shard is not None:
            sharded.setdefault(trial.runs[0].method, {})[trial.runs[0].run_id] = trial.shard.count
    for method, counts in sharded.items():
        lines.append(f"  {method}: {len(counts):,} run(s) split into {'/'.join(map(str, sorted(set(counts.values()))))} "
                     f"shards each ({sum(counts.values()):,} trials, each with the spec's resources), merged into "
                     f"each run's own rows")
    lengths = {}
    for run in todo:
        if run.source not in lengths:
            lengths[run.source] = _stream_length(spec, run.source)
    computed = [run for trial in trials for run in computed_runs(trial)]
    steps = sum(lengths[r.source] for r in computed)
    entries: dict[tuple, DataSource] = {}  # one feature-cache entry per key (a single view whatever the seed)
    for trial in trials:
        source = trial.source
        if not source.is_synthetic:
            entries.setdefault((source.model, source.weights, source.quick_gelu, source.dataset, source.views,
                               None if source.views == "single" else source.seed, source.image_context_sha256), source)
    teachers: dict[tuple, tuple[Run, DataSource]] = {}  # per teacher entry, a run that reads it
    for trial in trials:
        for run in trial.runs:
            if names_teacher(method_card(run.method)) and not run.source.is_synthetic:
                source = teacher_source(run.source, run.hparams[TEACHER])
                key = (source.model, source.weights, source.quick_gelu, source.dataset, source.views,
                       None if source.views == "single" else source.seed, source.image_context_sha256)
                entries.setdefault(key, source)
                teachers.setdefault(key, (run, source))
    auxiliary: dict[tuple, tuple[dict, DataSource]] = {}  # the auxiliary encoders' entries, keyed alike
    for trial in trials:
        source = trial.source
        for aux in json.loads(source.auxiliary) if source.auxiliary and not source.is_synthetic else []:
            auxiliary.setdefault((aux["name"], aux["arch"], aux["checkpoint"], source.dataset, source.views,
                                  None if source.views == "single" else source.seed), (aux, source))
    encode: Counter = Counter()  # backbone (or auxiliary encoder) -> image views to encode
    elsewhere = data_elsewhere(spec)
    if elsewhere:
        lines.append(f"data_root {spec.data_root} is not on this machine: planned for the machine that holds it "
                     f"(stream lengths: the registry's test-set sizes; its cache, weights and resources are checked "
                     f"there)")
    if entries:
        manifests = [] if elsewhere else _cache_manifests(spec.cache_dir)
        lines.append(f"feature-cache entries the trials read ({len(entries)}), in {spec.cache_dir}:")
        for source in entries.values():
            state = "cached" if not elsewhere and _cached(spec, source, manifests) else "to encode"
            if state == "to encode":
                from orchestrator.clip.views import parse_views

                encode[source.model] += _stream_length(spec, source) * parse_views(source.views, source.seed).num_views
            prompted = "" if source.image_context_sha256 is None else f" (MaPLe context {source.context_sha256[:8]})"
            lines.append(f"  {source.model} {source.weights or 'random weights'}{prompted} {source.dataset} "
                         f"views={source.views}"
                         f"{'' if source.views == 'single' else f' seed={source.seed}'}: {state}")
    if auxiliary:
        manifests = [] if elsewhere else _cache_manifests(spec.cache_dir)
        lines.append(f"auxiliary-encoder entries the trials read ({len(auxiliary)}, beside the backbone's; each "
                     f"encoded once for every run that reads it):")
        for aux, source in auxiliary.values():
            state = "cached" if not elsewhere and _aux_cached(spec, aux, source, manifests) else "to encode"
            label = f"{aux['name']}:{aux['arch']}"
            if state == "to encode":
                from orchestrator.clip.views import parse_views

                encode[label] += _stream_length(spec, source) * parse_views(source.views, source.seed).num_views
            lines.append(f"  {label} {aux['checkpoint'] or 'random weights'} (the pixels of {source.model}) "
                         f"{source.dataset} views={source.views}"
                         f"{'' if source.views == 'single' else f' seed={source.seed}'}: {state}")
    lines += _teacher_lines(spec, teachers.values())
    lines.append(f"estimated cost: {steps:,} online steps (samples through a method, over the runs to run)"
                 + (f", {sum(encode.values()):,} image views to encode" if entries or auxiliary else ""))
    replayed = [trial for trial in trials if trial.replay]
    if replayed:
        lines.append(f"order-free runs computed once over their orders: {sum(len(t.runs) for t in replayed):,} runs of "
                     f"{', '.join(dict.fromkeys(r.method for t in replayed for r in t.runs))}, "
                     f"{sum(len(t.replay) for t in replayed):,} configurations computed (the cost counts those)")
    alone = stepping_alone(trials)
    if alone:
        lines.append(f"{sum(alone.values()):,} runs of {', '.join(alone)} are the only stream of their lockstep "
                     f"pass (one configuration per order where the runner steps one order at a time, or a trial of "
                     f"one run): the projected GPU-hours price them at their cards' rates, measured on packs of 32 "
                     f"configs, which overstate their speed")
    return lines + projected_hours(computed, lambda source: lengths[source], encode)


def stepping_alone(trials: list[Trial]) -> Counter:
    """Per method, the runs that a lockstep runner would step with no other stream beside them: a runner that
    does not step orders together on the features the run gets (`lockstep.steps_orders`) runs each order's
    streams of a pass in turn."""
    from orchestrator.methods.lockstep import steps_orders

    alone: Counter = Counter()
    cards: dict[str, MethodCard] = {}
    runners: dict[tuple[str, bool], tuple[Any, bool]] = {}  # (method, views) -> its runner, steps orders together
    for trial in trials:
        if trial.replay or trial.shard is not None:
            continue
        passes: dict[tuple, list[Run]] = {}
        for run in trial.runs:
            card = cards.get(run.method) or cards.setdefault(run.method, method_card(run.method))
            # as the trial feeds it (pieces.feature_kind): views, one view [n, 1, d] for a view method on a
            # single-view stream, else one feature per sample
            views = run.source.views != "single" and card.wants_views(run.hparams)
            found = runners.get((run.method, views))
            if found is None:
                runner = card.lockstep_runner(views or card.takes_views)
                found = runners[run.method, views] = (runner, runner is not None and steps_orders(runner, views))
            runner, together = found
            if runner is not None:  # a card without one states its single-stream rate
                order = None if together else run.source
                passes.setdefault((id(runner), run.batch_size, order), []).append(run)
        for runs in passes.values():
            if len(runs) == 1:
                alone[runs[0].method] += 1
    return alone


def _skipped_batch_sizes(spec: SweepSpec) -> list[str]:
    """What the spec's batch_size grid leaves out for per-sample methods (they run at batch size 1 only)."""
    skipped: dict[str, None] = {}
    for entry in spec.methods:
        asked = entry.batch_size if entry.batch_size is not None else spec.batch_size
        if method_card(entry.method).batch_size is None and any(v not in (1, OFFICIAL_BATCH) for v in asked):
            skipped[entry.method] = None
    if not skipped:
        return []
    sizes = ", ".join(str(v) for v in spec.batch_size if v not in (1, OFFICIAL_BATCH))
    return [f"batch_size {sizes}: skipped for {', '.join(skipped)} (per-sample methods run at batch size 1 only)"]


def weights_issues(spec: SweepSpec) -> list[tuple[str, str]]:
    """(field, message) for each backbone whose pretrained tag's weights are not on this machine (the message says
    where it looked and how to supply them)."""
    if not spec.has_real_datasets:
        return []
    from orchestrator.clip.backbone import BackboneSpec, WeightsNotFoundError, resolve_weights

    issues = []
    for i, backbone in enumerate(spec.backbones):
        if backbone.checkpoint is not None or backbone.pretrained in (None, RANDOM_WEIGHTS):
            continue  # a checkpoint's existence is a spec check; random weights need no file
        try:
            resolve_weights(BackboneSpec(backbone.model, backbone.pretrained, backbone.quick_gelu))
        except (WeightsNotFoundError, ValueError) as exc:
            issues.append((f"backbones[{i}].pretrained", str(exc)))
    from orchestrator.sweep.catalog import teacher_backbone

    for i, entry in enumerate(spec.methods):  # a CLIP teacher's published weights, as the backbones'
        card = method_card(entry.method)
        if not names_teacher(card):
            continue
        values = method_grid(entry).get(TEACHER, [card.hparam(TEACHER).default])
        for j, teacher in enumerate(values):
            model, tag = teacher_backbone(teacher)
            if tag is None or teacher not in card.hparam(TEACHER).choices:
                continue
            try:
                resolve_weights(BackboneSpec(model, tag))
            except (WeightsNotFoundError, ValueError) as exc:
                issues.append((f"methods[{i}].{TEACHER}" + (f"[{j}]" if len(values) > 1 else ""),
                               f"{entry.method}'s teacher: {exc}"))
    return issues


def resource_issues(spec: SweepSpec) -> list[tuple[str, str]]:
    """What a trial asks for that this machine (a local Ray's only node) does not have: trials would wait forever."""
    import torch

    issues = []
    gpus, cpus = torch.cuda.device_count(), os.cpu_count() or 1
    if spec.resources.gpu > 0 and gpus == 0:
        issues.append(("resources.gpu", f"each trial asks for {spec.resources.gpu:g} GPU but this machine has none; "
                                        f"expected resources.gpu: 0 to run on the CPU, or --address of a cluster "
                                        f"with GPUs"))
    if spec.resources.cpus > cpus:
        issues.append(("resources.cpus", f"each trial asks for {spec.resources.cpus:g} CPUs but this machine has "
                                         f"{cpus}; expected resources.cpus <= {cpus}, or --address of a cluster with "
                                         f"larger nodes"))
    return issues


def machine_issues(spec: SweepSpec, address: str | None) -> list[tuple[str, str]]:
    """This machine's checks for a sweep that runs on it; none when joining a cluster (its workers hold the
    weights, and its nodes' resources are checked once joined)."""
    return [] if address else weights_issues(spec) + resource_issues(spec)


def dry_run(spec: SweepSpec, runs: list[Run], source: str = "<spec>", address: str | None = None) -> list[str]:
    """The plan of a sweep as `bca sweep` would run it now; raises SpecError (every problem) when the sweep record
    refuses it or this machine cannot run it."""
    problem = check_sweep_record(spec, runs)
    issues = [("name", problem)] if problem else []
    if not data_elsewhere(spec):
        issues += machine_issues(spec, address or os.environ.get("RAY_ADDRESS") or None)
    if issues:
        raise SpecError(source, issues)
    status = run_status(spec, runs)
    device_bytes = trial_device_bytes(spec)
    trials = make_trials([r for r in runs if status[r.run_id] != "finished"], spec.pack,
                         sweep_cost(spec, recorded_rows(spec, runs)), sweep_memory(spec, device_bytes))
    return plan_lines(spec, runs, trials, status) + [f"note: {note}" for note in unknown_device_note(spec, device_bytes)]
