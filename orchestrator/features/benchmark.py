"""load_benchmark: the one call a sweep trial makes for a real dataset.

Features come from the feature cache (encoded at most once per cache key, by whichever process gets there
first), class embeddings from the text cache; on a double hit no model is loaded at all. The result is in
dataset order; the trial applies the seeded stream permutation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from orchestrator.clip.auxiliary import AuxiliarySpec
from orchestrator.clip.backbone import BackboneSpec
from orchestrator.clip.context import LearnedContext, MapleContext, image_prompts
from orchestrator.clip.prompts import class_embeddings
from orchestrator.clip.selection import select_views
from orchestrator.data.types import Benchmark
from orchestrator.features.cache import FeatureCache
from orchestrator.methods.views import PROTOCOL_KEEP
from orchestrator.registry import dataset_card
from orchestrator.registry.views import DATASET_PROTOCOL
from orchestrator.methods.hparams import CLIP_LOGIT_SCALE


@dataclass(frozen=True)
class RealBenchmark(Benchmark):
    """A Benchmark read through the feature cache, with what the cache knows about it.

    encode_seconds: encoder time spent by this call (0.0 on a cache hit); cached_encode_seconds: the time the
    entry took when it was encoded; skipped: images left out as unreadable ({image_id, reason}).
    """

    encode_seconds: float = 0.0
    cached_encode_seconds: float = 0.0
    skipped: list[dict[str, str]] = field(default_factory=list)
    cache_key: str = ""
    cache_path: str = ""
    listing_sha256: str = ""  # the image list it was encoded from (ImageList.fingerprint)


def load_benchmark(
    dataset: str,
    data_root: str | os.PathLike,
    cache_dir: str | os.PathLike,
    backbone: str,
    pretrained: str | None = None,
    views: str = "single",
    templates: str | list[str] = "dataset",
    seed: int = 1,
    *,
    quick_gelu: bool | None = None,
    device: str | torch.device | None = None,
    reduce_views: bool = False,
    logit_scale: float = CLIP_LOGIT_SCALE,
    keep: float = PROTOCOL_KEEP,
    batch_size: int = 256,
    num_workers: int | None = None,
    corrupt: str = "skip",
    progress: bool | Callable[[int, int], None] = False,
    weights_dir: str | None = None,
    allow_download: bool = False,
    text_progress: Callable[[int, int], None] | None = None,
    auxiliary: tuple[AuxiliarySpec, ...] = (),
    context: LearnedContext | MapleContext | None = None,
) -> RealBenchmark:
    """A real dataset as a Benchmark (a RealBenchmark) in dataset order.

    backbone / pretrained: open_clip model name and tag or checkpoint file (None: random weights).
    views: 'single', 'augmix' ([n, 1+63, d] features, view 0 the original), 'augmixN', or 'dataset'
    (DATASET_PROTOCOL: the dataset's own protocol views, `orchestrator.registry.views`). reduce_views=True
    returns [n, d] instead: the confident-view mean (select_views) against this benchmark's class embeddings,
    computed without a float32 copy of every view. templates: a named set or a list (see orchestrator.clip.prompts).
    progress / text_progress: hear (done, total) images and prompts as they are encoded. auxiliary: encoders
    whose features (of the original view, [n, d']) come too, from their own cache entries for the same images
    and views (`FeatureCache.get_or_encode_auxiliary`). context: a learned context (`orchestrator.clip.context`):
    its prompts give the class embeddings (an entry of their own); MaPLe's prompt the image encoder too
    (`orchestrator.clip.maple`), so its images' features are an entry of their own as well.
    """
    name = dataset_card(dataset).name
    if views == DATASET_PROTOCOL:
        views = dataset_card(name).views
    spec = BackboneSpec(backbone, pretrained, quick_gelu)
    load_kwargs = {"weights_dir": weights_dir, "allow_download": allow_download}
    cached = FeatureCache(cache_dir).get_or_encode(
        spec, name, data_root, views, seed, device=device, batch_size=batch_size, num_workers=num_workers,
        corrupt=corrupt, progress=progress, context=image_prompts(context), **load_kwargs)
    emb, ids = class_embeddings(spec, cached.class_names, templates, dataset=name, data_root=data_root,
                                cache_dir=cache_dir, device=device, progress=text_progress, context=context,
                                **load_kwargs)
    array = cached.array()
    if array.ndim == 3 and reduce_views:
        num_classes = len(cached.class_names)
        features = torch.cat([
            select_views(torch.from_numpy(np.asarray(array[s:s + 2048], dtype=np.float32)), emb, ids, num_classes,
                         logit_scale=logit_scale, keep=keep)
            for s in range(0, array.shape[0], 2048)
        ])
    else:
        features = torch.from_numpy(np.asarray(array, dtype=np.float32))
    aux = {}
    for encoder in auxiliary:
        entry = FeatureCache(cache_dir).get_or_encode_auxiliary(
            encoder, spec, name, data_root, views, seed, device=device, batch_size=batch_size,
            num_workers=num_workers, corrupt=corrupt, progress=progress, weights_dir=weights_dir)
        if entry.image_ids != cached.image_ids:
            raise ValueError(f"{name}: the {encoder.name} entry {entry.path} holds other images than the CLIP entry "
                             f"{cached.path} (an image read by one and not the other); re-encode one of them")
        array = entry.array()
        aux[encoder.name] = torch.from_numpy(np.asarray(array[:, 0] if array.ndim == 3 else array, dtype=np.float32))
    manifest = cached.manifest
    return RealBenchmark(
        name=name,
        features=features,
        labels=cached.labels,
        image_ids=list(cached.image_ids),
        class_names=list(cached.class_names),
        class_embeddings=emb,
        class_ids=ids,
        auxiliary=aux,
        encode_seconds=float(manifest["encode_seconds"]) if cached.encoded else 0.0,
        cached_encode_seconds=float(manifest["encode_seconds"]),
        skipped=list(cached.skipped),
        cache_key=cached.key,
        cache_path=str(cached.path),
        listing_sha256=manifest["key_fields"]["listing_sha256"],
    )
