"""Fake-but-valid results dirs for tests and demos of the readers (views, report, dashboard) before real
sweeps exist. Everything is written through RunWriter, so the files are exactly what a sweep writes; the
returned FakeRun objects hold the written arrays, so a test can compute the answers it expects.

    runs = make_fake_results(tmp_path, datasets=("imagenet", "imagenet_a"), methods={"clip": {}, "bca": [
        {"tau": 0.3, "n1": 30000, "n2": 10}, {"tau": 0.5, "n1": 30000, "n2": 10}]}, seeds=(1, 2, 3))
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from orchestrator import registry
from orchestrator.results import metrics
from orchestrator.results.writer import RunWriter

DEFAULT_METHODS: dict[str, Any] = {"clip": {}, "bca": {"tau": 0.3, "n1": 30000, "n2": 10}}


@dataclass
class FakeRun:
    run_id: str
    config: dict[str, Any]
    labels: np.ndarray  # [rows written]
    preds: np.ndarray
    n_samples: int
    status: str
    is_ood: np.ndarray  # OOD rows: label -1, in no accuracy

    @property
    def correct(self) -> np.ndarray:
        return self.labels == self.preds

    @property
    def accuracy(self) -> float:
        return 100.0 * metrics.top1(self.correct[~self.is_ood])

    @property
    def last50_accuracy(self) -> float:
        second = slice(self.n_samples // 2, None)
        return 100.0 * metrics.top1(self.correct[second][~self.is_ood[second]])


def _base_accuracy(method: str) -> float:
    """A method's base accuracy (fraction): rising with its display order, so fake tables look plausible."""
    names = registry.method_names()
    return 0.55 + 0.015 * names.index(method) if method in names else 0.5


def _unit(seed_text: str) -> float:
    """A deterministic number in [0, 1) from text (Python's hash() is salted per process)."""
    return int(hashlib.sha256(seed_text.encode()).hexdigest()[:8], 16) / 2**32


def write_fake_run(results_dir: str | Path, config: Mapping[str, Any], *, n: int = 100, num_classes: int = 10,
                   accuracy: float = 0.6, rows: int | None = None, status: str = "finished", part_size: int = 40,
                   save_state: bool = True, embed_dim: int = 16, ood_every: int = 0) -> FakeRun:
    """Write one run through RunWriter: `rows` (default n) stream rows in parts of `part_size`, marked `status`.

    A 'finished' run must have rows == n. The stream's correctness is drawn with probability `accuracy`,
    seeded by the run id, so the same config always gives the same rows. `ood_every`: every so many stream
    positions hold an OOD sample (label -1, is_ood), as a contaminated stream does; the same positions in every
    run, so runs on one stream pair up as a sweep's do.
    """
    rows = n if rows is None else rows
    writer = RunWriter(results_dir, config)
    rng = np.random.default_rng(int(writer.run_id, 16) % 2**32)
    labels = rng.integers(0, num_classes, size=rows)
    hit = rng.random(rows) < accuracy
    preds = np.where(hit, labels, (labels + 1 + rng.integers(0, num_classes - 1, size=rows)) % num_classes)
    confidence = np.where(hit, rng.uniform(0.5, 1.0, rows), rng.uniform(0.1, 0.8, rows)).astype(np.float32)
    tau = writer.config.hparams.get("tau")
    gated = confidence > tau if tau is not None else np.zeros(rows, bool)
    is_ood = np.arange(rows) % ood_every == ood_every - 1 if ood_every else np.zeros(rows, bool)
    labels = np.where(is_ood, -1, labels)
    writer.mark("running", n_samples=n)
    for start in range(0, rows, part_size):
        stop = min(rows, start + part_size)
        writer.write_part(start, {
            "image_id": [f"img_{i:06d}" for i in range(start, stop)],
            "label": labels[start:stop], "pred": preds[start:stop], "confidence": confidence[start:stop],
            "gated": gated[start:stop], "gated_prior": gated[start:stop],
            "selected": np.where(gated[start:stop], preds[start:stop], -1), "is_ood": is_ood[start:stop]})
    run = FakeRun(writer.run_id, writer.config, labels, preds, n, status, is_ood)
    card = registry.find_method(writer.config.method)
    if save_state and card is not None and card.prior:
        num_templates = writer.config.num_templates or 1
        m = num_classes * num_templates
        class_ids = np.arange(m) % num_classes
        prior = 0.8 * np.eye(num_classes)[class_ids] + 0.2 * rng.dirichlet(np.ones(num_classes), size=m)
        u = rng.normal(size=(m, embed_dim))
        writer.save_state({"V": prior.astype(np.float32), "C1": np.full(m, 30000.0) + rng.integers(0, 50, m),
                           "C2": np.full(m, 10.0) + rng.integers(0, 50, m), "class_ids": class_ids,
                           "U": (u / np.linalg.norm(u, axis=1, keepdims=True)).astype(np.float32)})
    if status == "finished":
        writer.mark("finished", n_samples=n, accuracy=run.accuracy, last50_accuracy=run.last50_accuracy,
                    **({"n_ood": int(is_ood.sum())} if ood_every else {}),
                    samples_per_s=1000 + 500 * rng.random(), time_encoder_s=0.0, time_logits_s=0.01 * n / 100,
                    time_posterior_s=0.002 * n / 100, time_update_s=0.005 * n / 100, peak_mem_mb=300 + 10 * rng.random())
    elif status == "failed":
        writer.mark("failed", error="RuntimeError: injected failure (fake run)")
    elif status != "running":
        raise ValueError(f"status: expected running, finished or failed, got {status!r}")
    return run


def make_fake_results(results_dir: str | Path, *, sweep: str = "fake", backbones: Sequence[str] = ("RN50",),
                      datasets: Sequence[str] = ("imagenet",),
                      methods: Mapping[str, Mapping[str, Any] | Sequence[Mapping[str, Any]]] | None = None,
                      seeds: Sequence[int] = (1, 2, 3), n: int = 100, num_classes: int = 10,
                      templates: str = "ensemble7", num_templates: int = 1, views: str = "1",
                      part_size: int = 40, save_state: bool = True) -> list[FakeRun]:
    """Every backbone x dataset x method (x each hparam dict of a method's list) x seed as a finished run.

    A run's accuracy is its method's BASE_ACCURACY plus deterministic offsets per backbone, dataset and hparams,
    so tables and sensitivity plots show differences; seeds differ through the drawn stream.
    """
    methods = DEFAULT_METHODS if methods is None else methods
    runs = []
    for backbone in backbones:
        for dataset in datasets:
            for method, grid in methods.items():
                for hparams in ([grid] if isinstance(grid, Mapping) else list(grid)):
                    for seed in seeds:
                        config = {"sweep": sweep, "backbone": backbone, "pretrained": None, "dataset": dataset,
                                  "method": method, "seed": seed, "templates": templates,
                                  "num_templates": num_templates, "views": views, "hparams": dict(hparams)}
                        acc = (_base_accuracy(method) + 0.1 * _unit(backbone) - 0.2 * _unit(dataset)
                               + 0.04 * _unit(repr(sorted(hparams.items()))))
                        runs.append(write_fake_run(results_dir, config, n=n, num_classes=num_classes,
                                                   accuracy=min(max(acc, 0.05), 0.95), part_size=part_size,
                                                   save_state=save_state))
    return runs
