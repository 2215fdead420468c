"""On-disk image-feature cache shared by every trial of a sweep.

The image encoder is most of a run's time, so features are encoded once per
(backbone, dataset, views, seed, preprocessing) and reused by every trial. An entry lives in
<cache_dir>/features/<key>/ with
  features.npy   float16, [n, d] ('single') or [n, V, d] ('augmix' / 'crops', view 0 = the original image)
  labels.npy     int64 [n]
  manifest.json  key and its fields, the view kind and set name, counts, class names, image ids, skipped
                 images, timings, versions.
The key is a content hash of everything that decides the numbers (KEY FIELDS below); see `key_fields`. An
auxiliary encoder's features (`orchestrator.clip.auxiliary`) are entries of the same layout, keyed by
`auxiliary_key_fields`: the same images and views as the backbone's entry, through the backbone's preprocessing.

Concurrency: a file lock per key, so two trials asking for the same entry encode it once (the second
waits, then reads). An entry is written into a temporary folder and renamed into place only when
complete, so nobody ever reads half an entry; the manifest's presence marks completeness. Across nodes the
lock is only as good as the shared file system's locking (local disks and NFSv4 are fine); where that is in
doubt, pre-encode with `bca cache` before the sweep starts.

Corrupt or unreadable images (policy): recorded skip. The image is left out of the entry; the manifest
lists it under "skipped" with the reason (exception type and message), the entry's counts say how many,
`CachedFeatures.skipped` hands them to the caller and a warning is logged. With corrupt='error' the first
unreadable image fails the encode instead, naming the file. Skipped ids are part of the entry, so a
re-run reports the same skips without re-reading the files.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import platform
import shutil
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from filelock import FileLock
from torch.utils.data import DataLoader, Dataset

from orchestrator.clip.auxiliary import AuxiliaryEncoder, AuxiliarySpec, check_auxiliary
from orchestrator.clip.backbone import (
    Backbone,
    BackboneSpec,
    ResolvedWeights,
    eval_transform,
    precision_for,
    resolve_weights,
    shared_backbone,
)
from orchestrator.clip.context import MapleContext
from orchestrator.clip.maple import PromptedEncoder
from orchestrator.clip.views import ViewConfig, ViewTransform, parse_views
from orchestrator.data.datasets import ImageList, open_image
from orchestrator.data.listing import read_dataset
from orchestrator.device import auto_device

log = logging.getLogger(__name__)

CACHE_FORMAT = 1
CORRUPT_POLICIES = ("skip", "error")


class CorruptImageError(RuntimeError):
    """An image could not be read and the policy is corrupt='error'."""


# --------------------------------------------------------------------------------------------- keys


def key_fields(resolved: ResolvedWeights, precision: str, images: ImageList, views: ViewConfig,
               context: MapleContext | None = None) -> dict[str, Any]:
    """KEY FIELDS: the backbone (model, weights id: tag or file sha256, quick_gelu, preprocessing: size, mean,
    std, interpolation, resize mode), the encoder precision (fp32 / amp_fp16), the dataset and a hash of its
    image list, and the view protocol (kind; for augmix and crops also count, seed, pipeline version, and
    severity for augmix), so an AugMix and a crops view set of the same images are distinct entries; with a MaPLe
    context, whose prompts enter the image encoder, its file's sha256."""
    return {
        "format": CACHE_FORMAT,
        "backbone": resolved.identity(),
        "precision": precision,
        "dataset": images.name,
        "listing_sha256": images.fingerprint(),
        "views": views.identity(),
        **({"context_sha256": context.sha256} if context is not None else {}),
    }


def auxiliary_key_fields(auxiliary: AuxiliarySpec, resolved: ResolvedWeights, precision: str, images: ImageList,
                         views: ViewConfig) -> dict[str, Any]:
    """An auxiliary encoder's entry: its identity (kind, arch, weights), the CLIP backbone's preprocessing (the
    pixels it sees), the precision, the dataset and its image list, and the views, as `key_fields` has them."""
    return {
        "format": CACHE_FORMAT,
        "auxiliary": auxiliary.identity(),
        "pixels": resolved.preprocess,
        "precision": precision,
        "dataset": images.name,
        "listing_sha256": images.fingerprint(),
        "views": views.identity(),
    }


def entry_key(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]


# --------------------------------------------------------------------------------------------- results


@dataclass
class CachedFeatures:
    """One cache entry, read back; features are float32 on access (stored float16)."""

    key: str
    path: Path
    manifest: dict[str, Any]
    labels: torch.Tensor
    encoded: bool  # True when this call ran the encoder; False for a hit (or another process encoded it)

    @property
    def image_ids(self) -> list[str]:
        return self.manifest["image_ids"]

    @property
    def class_names(self) -> list[str]:
        return self.manifest["class_names"]

    @property
    def skipped(self) -> list[dict[str, str]]:
        return self.manifest["skipped"]

    def array(self) -> np.ndarray:
        """The stored float16 array, memory-mapped (no copy)."""
        return np.load(self.path / "features.npy", mmap_mode="r")

    @property
    def features(self) -> torch.Tensor:
        """[n, d] or [n, V, d] float32."""
        return torch.from_numpy(np.asarray(self.array(), dtype=np.float32))

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def _read_entry(path: Path, encoded: bool) -> CachedFeatures:
    with open(path / "manifest.json", encoding="utf-8") as f:
        manifest = json.load(f)
    labels = torch.from_numpy(np.load(path / "labels.npy").astype(np.int64))
    return CachedFeatures(manifest["key"], path, manifest, labels, encoded)


# --------------------------------------------------------------------------------------------- encoding


class _ImageViews(Dataset):
    """Decodes image i and returns (i, views [V, 3, H, W] or None, failure reason or None)."""

    def __init__(self, images: ImageList, transform: ViewTransform):
        self.images = images
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        try:
            with open_image(self.images.path(i)) as im:
                im.load()  # PIL decodes lazily; force it here so a truncated file fails inside the try
                return i, self.transform(im, self.images.image_ids[i]), None
        except Exception as e:  # noqa: BLE001 - any decode failure is a recorded skip (module docstring)
            return i, None, f"{type(e).__name__}: {e}"


def _collate(items):
    ok = [(i, v) for i, v, _ in items if v is not None]
    failed = [(i, reason) for i, v, reason in items if v is None]
    idx = torch.tensor([i for i, _ in ok], dtype=torch.int64)
    views = torch.stack([v for _, v in ok]) if ok else None
    return idx, views, failed


def _versions() -> dict[str, str]:
    import open_clip
    import PIL
    import torchvision

    try:
        from importlib.metadata import version

        bca = version("bca-orchestrator")
    except Exception:  # noqa: BLE001 - running from a source tree without the package installed
        bca = "unknown"
    return {"python": platform.python_version(), "torch": torch.__version__, "torchvision": torchvision.__version__,
            "open_clip": open_clip.__version__, "numpy": np.__version__, "pillow": PIL.__version__, "bca": bca}


def default_workers() -> int:
    return min(8, os.cpu_count() or 1)


def _encode_entry(
    tmp: Path,
    encoder: Backbone | PromptedEncoder | AuxiliaryEncoder,
    transform: ViewTransform,
    images: ImageList,
    views: ViewConfig,
    *,
    batch_size: int,
    num_workers: int,
    corrupt: str,
    progress: bool | Callable[[int, int], None],
) -> dict[str, Any]:
    """Encode every image into tmp/features.npy (+ labels.npy) with `encoder` (a CLIP backbone or an auxiliary
    encoder) on the views `transform` makes; returns the manifest's encode fields. progress: True for a console
    bar, or a callable given (images done, images) after each batch (a sweep trial forwards it to the driver)."""
    from tqdm.auto import tqdm

    n, V, d = len(images), views.num_views, encoder.embed_dim
    loader = DataLoader(
        _ImageViews(images, transform),
        batch_size=max(1, batch_size // V),
        num_workers=num_workers,
        collate_fn=_collate,
        pin_memory=encoder.device.type == "cuda",
    )
    shape = (n, d) if views.kind == "single" else (n, V, d)
    raw = np.lib.format.open_memmap(tmp / "raw.npy", mode="w+", dtype=np.float16, shape=shape)
    ok = np.zeros(n, dtype=bool)
    skipped: list[dict[str, str]] = []
    start = time.perf_counter()
    bar = tqdm(total=n, unit="img", desc=f"encode {images.name} [{encoder.spec.label}, {views.name}]",
               disable=progress is not True, dynamic_ncols=True, smoothing=0.1)
    report = progress if callable(progress) else None
    seen = 0
    try:
        for idx, pixels, failed in loader:
            for i, reason in failed:
                if corrupt == "error":
                    raise CorruptImageError(f"cannot read image {images.path(i)}: {reason} "
                                            f"(corrupt='skip' records such images and leaves them out)")
                skipped.append({"image_id": images.image_ids[i], "reason": reason})
            if pixels is not None:
                b = pixels.shape[0]
                feats = encoder.encode_images(pixels.flatten(0, 1)).view(b, V, d)
                raw[idx.numpy()] = (feats[:, 0] if views.kind == "single" else feats).numpy().astype(np.float16)
                ok[idx.numpy()] = True
            bar.update(len(idx) + len(failed))
            seen += len(idx) + len(failed)
            if report is not None:
                report(seen, n)
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    kept = np.flatnonzero(ok)
    if len(kept) == 0:
        raise CorruptImageError(f"none of the {n} images of {images.name} under {images.data_root} could be read; "
                                f"first failure: {skipped[0] if skipped else 'none'}")
    final = np.lib.format.open_memmap(tmp / "features.npy", mode="w+", dtype=np.float16, shape=(len(kept),) + shape[1:])
    for s in range(0, len(kept), 4096):  # compact away skipped rows chunk by chunk (entries can be GBs)
        final[s:s + 4096] = raw[kept[s:s + 4096]]
    final.flush()
    del final, raw
    os.remove(tmp / "raw.npy")
    np.save(tmp / "labels.npy", np.asarray(images.labels, dtype=np.int64)[kept])
    if skipped:
        log.warning("%s: skipped %d unreadable image(s), e.g. %s (%s)", images.name, len(skipped),
                    skipped[0]["image_id"], skipped[0]["reason"])
    return {
        "image_ids": [images.image_ids[i] for i in kept],
        "skipped": skipped,
        "encode_seconds": seconds,
        "images_per_second": n / seconds if seconds > 0 else None,
        "device": str(encoder.device),
        "num_workers": num_workers,
    }


# --------------------------------------------------------------------------------------------- cache


class FeatureCache:
    """Feature cache rooted at `cache_dir` (entries under <cache_dir>/features/)."""

    def __init__(self, cache_dir: str | os.PathLike):
        self.cache_dir = Path(cache_dir).expanduser().resolve()
        self.root = self.cache_dir / "features"

    def entry_dir(self, key: str) -> Path:
        return self.root / key

    def get_or_encode(
        self,
        backbone: Backbone | BackboneSpec,
        dataset: str,
        data_root: str | os.PathLike,
        views: str | ViewConfig = "single",
        seed: int = 1,
        *,
        device: str | torch.device | None = None,
        batch_size: int = 256,
        num_workers: int | None = None,
        corrupt: str = "skip",
        progress: bool | Callable[[int, int], None] = False,
        force: bool = False,
        weights_dir: str | None = None,
        allow_download: bool = False,
        context: MapleContext | None = None,
    ) -> CachedFeatures:
        """The entry for these arguments, encoding it first if no process has (at most once per key).

        backbone: a loaded Backbone, or a BackboneSpec (the model is loaded only on a miss).
        views: 'single' | 'augmix' | 'augmixN' | 'crops' | 'cropsN'; seed matters for augmix and crops only.
        batch_size counts views per encoder call. corrupt: 'skip' (recorded) or 'error'. force: re-encode even
        if the entry exists. context: a MaPLe context the images are encoded through (`orchestrator.clip.maple`).
        """
        if corrupt not in CORRUPT_POLICIES:
            raise ValueError(f"corrupt must be one of {CORRUPT_POLICIES}; got {corrupt!r}")
        device = auto_device(device)  # once, here: the key's precision and the backbone take it as it is
        vc = parse_views(views, seed)
        images = read_dataset(dataset, data_root)
        if isinstance(backbone, Backbone):
            resolved, precision = backbone.resolved, backbone.precision
        else:
            resolved = resolve_weights(backbone, weights_dir=weights_dir, allow_download=allow_download)
            precision = precision_for(device)
        fields = key_fields(resolved, precision, images, vc, context)

        def encoder() -> tuple[Backbone | PromptedEncoder, ViewTransform]:
            model = backbone if isinstance(backbone, Backbone) else shared_backbone(
                backbone, device, weights_dir=weights_dir, allow_download=allow_download)
            transform = ViewTransform(vc, model.preprocess, model.resolved.preprocess)
            return (model if context is None else PromptedEncoder(model, context)), transform

        return self._entry(fields, images, vc, encoder, force=force, batch_size=batch_size,
                           num_workers=num_workers, corrupt=corrupt, progress=progress)

    def get_or_encode_auxiliary(
        self,
        auxiliary: AuxiliarySpec,
        backbone: BackboneSpec,
        dataset: str,
        data_root: str | os.PathLike,
        views: str | ViewConfig = "single",
        seed: int = 1,
        *,
        device: str | torch.device | None = None,
        batch_size: int = 256,
        num_workers: int | None = None,
        corrupt: str = "skip",
        progress: bool | Callable[[int, int], None] = False,
        force: bool = False,
        weights_dir: str | None = None,
    ) -> CachedFeatures:
        """The auxiliary encoder's entry for the images and views that `get_or_encode` gives `backbone` (the same
        pixels: the backbone's own preprocessing and views), encoding it first if no process has. Its key holds
        the auxiliary encoder's identity and the backbone's preprocessing, not the backbone's weights, so every
        backbone that preprocesses alike shares it."""
        if corrupt not in CORRUPT_POLICIES:
            raise ValueError(f"corrupt must be one of {CORRUPT_POLICIES}; got {corrupt!r}")
        check_auxiliary(auxiliary)
        vc = parse_views(views, seed)
        images = read_dataset(dataset, data_root)
        resolved = resolve_weights(backbone, weights_dir=weights_dir)
        fields = auxiliary_key_fields(auxiliary, resolved, precision_for(auto_device(device)), images, vc)

        def encoder() -> tuple[AuxiliaryEncoder, ViewTransform]:
            size = resolved.preprocess["size"]
            model = AuxiliaryEncoder(auxiliary, size[0] if isinstance(size, list) else size, device)
            return model, ViewTransform(vc, eval_transform(resolved), resolved.preprocess)

        return self._entry(fields, images, vc, encoder, force=force, batch_size=batch_size,
                           num_workers=num_workers, corrupt=corrupt, progress=progress)

    def _entry(self, fields: dict[str, Any], images: ImageList, vc: ViewConfig,
               encoder: Callable[[], tuple[Backbone | PromptedEncoder | AuxiliaryEncoder, ViewTransform]], *, force: bool,
               batch_size: int, num_workers: int | None, corrupt: str,
               progress: bool | Callable[[int, int], None]) -> CachedFeatures:
        """The entry of `fields`, encoded with `encoder()` (called only on a miss) at most once per key."""
        key = entry_key(fields)
        entry = self.entry_dir(key)
        if not force and (entry / "manifest.json").is_file():
            return _read_entry(entry, encoded=False)

        self.root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.root / f"{key}.lock")):
            if (entry / "manifest.json").is_file():
                if not force:
                    return _read_entry(entry, encoded=False)  # another process encoded it while we waited
                shutil.rmtree(entry)
            for stale in self.root.glob(f".tmp-{key}-*"):  # left by a crashed writer; we hold the lock
                shutil.rmtree(stale, ignore_errors=True)
            model, transform = encoder()
            tmp = self.root / f".tmp-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir()
            try:
                encoded = _encode_entry(tmp, model, transform, images, vc, batch_size=batch_size,
                                        num_workers=default_workers() if num_workers is None else num_workers,
                                        corrupt=corrupt, progress=progress)
                shape = list(np.load(tmp / "features.npy", mmap_mode="r").shape)
                manifest = {
                    "key": key,
                    "key_fields": fields,
                    "dataset": images.name,
                    "backbone": model.spec.label,
                    "views": vc.name,
                    "view_kind": vc.kind,
                    "seed": vc.seed,
                    "num_views": vc.num_views,
                    "embed_dim": model.embed_dim,
                    "shape": shape,
                    "dtype": "float16",
                    "count": shape[0],
                    "listed": len(images),
                    "skipped_count": len(encoded["skipped"]),
                    "num_classes": images.num_classes,
                    "class_names": images.class_names,
                    **encoded,
                    "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    "host": socket.gethostname(),
                    "versions": _versions(),
                }
                with open(tmp / "manifest.json", "w", encoding="utf-8") as f:
                    json.dump(manifest, f)
                os.rename(tmp, entry)  # atomic: the entry appears complete or not at all
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
        return _read_entry(entry, encoded=True)
