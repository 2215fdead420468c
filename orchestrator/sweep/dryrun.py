"""`bca sweep SPEC --dry-run`: what a sweep would do, without running or writing anything.

Runs and trials per backbone / dataset / method (with how many are finished already), the real data sources
the trials will encode and whether the feature cache holds them, and the cost in online steps (samples streamed
through a method, summed over the runs to run) and images to encode. Cache entries are recognised by their
manifest (backbone, dataset, image-list fingerprint, views and seed), without loading any weights.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from orchestrator.sweep.plan import DataSource, Run, Trial, make_trials
from orchestrator.sweep.record import check_sweep_record
from orchestrator.sweep.spec import SweepSpec
from orchestrator.sweep.cost import sweep_cost
from orchestrator.sweep.status import recorded_rows, run_status


def _stream_length(spec: SweepSpec, source: DataSource) -> int:
    if source.is_synthetic:
        return int(source.params()["n"])
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


def _cached(spec: SweepSpec, source: DataSource, manifests: list[dict]) -> bool:
    from orchestrator.clip.backbone import BackboneSpec
    from orchestrator.clip.views import parse_views
    from orchestrator.sweep.catalog import dataset_listing

    views = parse_views(source.views, source.seed)
    label = BackboneSpec(source.model, source.weights, source.quick_gelu).label
    listing = dataset_listing(source.dataset, spec.data_root).fingerprint()
    return any(m.get("backbone") == label and m.get("dataset") == source.dataset and m.get("views") == views.name
               and m.get("num_views") == views.num_views and (views.num_views == 1 or m.get("seed") == views.seed)
               and m.get("key_fields", {}).get("listing_sha256") == listing for m in manifests)


def plan_lines(spec: SweepSpec, runs: list[Run], trials: list[Trial], status: dict[str, str | None]) -> list[str]:
    """The dry run's report, one line each."""
    finished = {rid for rid, state in status.items() if state == "finished"}
    todo = [r for r in runs if r.run_id not in finished]
    lines = [f"sweep {spec.name} (dry run: nothing is run or written): {len(runs):,} runs, {len(finished):,} "
             f"finished, {len(todo):,} to run in {len(trials):,} trials (pack {spec.pack}) -> {spec.results_dir}"]
    by_key = Counter((r.config["backbone"], r.source.dataset, r.method) for r in runs)
    done = Counter((r.config["backbone"], r.source.dataset, r.method) for r in runs if r.run_id in finished)
    trial_count = Counter((t.runs[0].config["backbone"], t.source.dataset, t.runs[0].method) for t in trials)
    lines.append(f"  {'backbone':<20} {'dataset':<28} {'method':<10} {'runs':>9} {'finished':>9} {'trials':>9}")
    for (backbone, dataset, method), n in by_key.items():
        lines.append(f"  {backbone:<20} {dataset:<28} {method:<10} {n:>9,} {done[(backbone, dataset, method)]:>9,} "
                     f"{trial_count[(backbone, dataset, method)]:>9,}")
    lengths = {}
    for run in todo:
        if run.source not in lengths:
            lengths[run.source] = _stream_length(spec, run.source)
    steps = sum(lengths[r.source] for r in todo)
    entries: dict[tuple, DataSource] = {}  # one feature-cache entry per key (a single view whatever the seed)
    for trial in trials:
        source = trial.source
        if not source.is_synthetic:
            entries.setdefault((source.model, source.weights, source.quick_gelu, source.dataset, source.views,
                                None if source.views == "single" else source.seed), source)
    encode = 0
    if entries:
        manifests = _cache_manifests(spec.cache_dir)
        lines.append(f"feature-cache entries the trials read ({len(entries)}), in {spec.cache_dir}:")
        for source in entries.values():
            state = "cached" if _cached(spec, source, manifests) else "to encode"
            if state == "to encode":
                from orchestrator.clip.views import parse_views

                encode += _stream_length(spec, source) * parse_views(source.views, source.seed).num_views
            lines.append(f"  {source.model} {source.weights or 'random weights'} {source.dataset} views={source.views}"
                         f"{'' if source.views == 'single' else f' seed={source.seed}'}: {state}")
    lines.append(f"estimated cost: {steps:,} online steps (samples through a method, over the runs to run)"
                 + (f", {encode:,} image views to encode" if entries else ""))
    return lines


def dry_run(spec: SweepSpec, runs: list[Run]) -> list[str]:
    """The plan of a sweep as `bca sweep` would run it now; raises ValueError when the sweep record refuses it."""
    problem = check_sweep_record(spec, runs)
    if problem:
        raise ValueError(problem)
    status = run_status(spec, runs)
    trials = make_trials([r for r in runs if status[r.run_id] != "finished"], spec.pack,
                         sweep_cost(spec, recorded_rows(spec, runs)))
    return plan_lines(spec, runs, trials, status)
