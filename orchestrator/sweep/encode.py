"""`bca cache SPEC`: the feature-cache entries a sweep will read, derived from the plan's data sources."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from orchestrator.clip.backbone import BackboneSpec
from orchestrator.features.command import CacheJob
from orchestrator.sweep.catalog import register_model_config
from orchestrator.sweep.load import load_spec
from orchestrator.sweep.plan import data_sources


def jobs_from_spec(path: Path) -> list[CacheJob]:
    """The feature-cache entries a sweep spec's trials will ask for: one job per real data source of the plan
    (a single view is one entry whatever the seed), with every template set the trials embed."""
    spec = load_spec(path)
    jobs: dict[tuple, CacheJob] = {}
    for source in data_sources(spec):
        if source.is_synthetic:
            continue
        if source.model_config is not None:  # a custom architecture: trials register it the same way
            register_model_config(source.model_config)
        key = (source.model, source.weights, source.quick_gelu, source.dataset, source.views,
               None if source.views == "single" else source.seed, source.context)
        job = jobs.get(key) or CacheJob(BackboneSpec(source.model, source.weights, source.quick_gelu),
                                        source.dataset, Path(spec.data_root), Path(spec.cache_dir), source.views,
                                        source.seed, (), source.context)
        if source.templates not in job.templates:
            job = replace(job, templates=(*job.templates, source.templates))
        jobs[key] = job
    return list(jobs.values())
