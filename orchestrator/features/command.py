"""`bca cache`: pre-encode feature-cache entries (and their text embeddings) before a sweep runs.

Each job is one (backbone, dataset, views, seed) entry plus the template sets whose text embeddings it
needs. A job whose entry exists is a no-op ("hit"); a run that is interrupted leaves no partial entry.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from orchestrator.clip.backbone import BackboneSpec, WeightsNotFoundError
from orchestrator.clip.context import image_prompts, load_learned
from orchestrator.clip.prompts import class_embeddings, console_progress
from orchestrator.registry.views import DATASET_PROTOCOL, parse_views
from orchestrator.data.datasets import DatasetLayoutError
from orchestrator.features.cache import CorruptImageError, FeatureCache
from orchestrator.registry import ensure_dataset


@dataclass(frozen=True)
class CacheJob:
    backbone: BackboneSpec
    dataset: str
    data_root: Path
    cache_dir: Path
    views: str
    seed: int
    templates: tuple[str, ...]
    context: str | None = None  # a learned context file: the class prompts' (CoOp) or both towers' (MaPLe) own entries


def jobs_from_args(
    model: str,
    pretrained: str | None,
    datasets: list[str],
    data_root: Path,
    cache_dir: Path,
    views: str,
    seeds: list[int],
    templates: list[str],
    quick_gelu: bool | None = None,
) -> list[CacheJob]:
    """One job per dataset and seed; 'dataset' views (DATASET_PROTOCOL) resolve to each dataset's own, and
    'single' needs one seed only."""
    spec = BackboneSpec(model, pretrained, quick_gelu)
    jobs: list[CacheJob] = []
    for name in datasets:
        card = ensure_dataset(name, data_root)
        ds = card.name
        ds_views = parse_views(card.views if views == DATASET_PROTOCOL else views).name  # fails before encoding
        for seed in (seeds[:1] if ds_views == "single" else seeds):
            jobs.append(CacheJob(spec, ds, data_root.resolve(), cache_dir.resolve(), ds_views, seed, tuple(templates)))
    return list(dict.fromkeys(jobs))


def run_jobs(
    jobs: list[CacheJob],
    *,
    device: str | None = None,
    batch_size: int = 256,
    num_workers: int | None = None,
    corrupt: str = "skip",
    force: bool = False,
    weights_dir: str | None = None,
    allow_download: bool = False,
    echo=print,
) -> int:
    """Run the jobs in order; returns a process exit code (0 ok, 2 on a user-facing error)."""
    load = {"weights_dir": weights_dir, "allow_download": allow_download}
    try:
        for n, job in enumerate(jobs, start=1):
            context = None if job.context is None else load_learned(job.context)
            cached = FeatureCache(job.cache_dir).get_or_encode(
                job.backbone, job.dataset, job.data_root, job.views, job.seed, device=device,
                batch_size=batch_size, num_workers=num_workers, corrupt=corrupt, progress=True, force=force,
                context=image_prompts(context), **load)
            m = cached.manifest
            state = "encoded" if cached.encoded else "hit"
            prompted = "" if image_prompts(context) is None else f" (MaPLe context {context.sha256[:8]})"
            echo(f"[{n}/{len(jobs)}] {state:7s} {job.backbone.label}{prompted} {job.dataset} views={job.views} "
                 f"seed={m['seed']}: {m['count']} images ({m['skipped_count']} skipped), "
                 f"features {tuple(m['shape'])} -> {cached.path}")
            for skip in m["skipped"][:5]:
                echo(f"    skipped {skip['image_id']}: {skip['reason']}")
            for templates in job.templates:
                emb, _ = class_embeddings(job.backbone, cached.class_names, templates, dataset=job.dataset,
                                          data_root=job.data_root, cache_dir=job.cache_dir, device=device,
                                          progress=console_progress(f"text embeddings '{templates}'"),
                                          context=context, **load)
                learned = "" if context is None else f" ({context.source} context {context.sha256[:8]})"
                echo(f"    text embeddings '{templates}'{learned}: {tuple(emb.shape)}")
    except (DatasetLayoutError, WeightsNotFoundError, CorruptImageError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
