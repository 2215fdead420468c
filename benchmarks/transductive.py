"""Per-batch transductive methods on label-correlated streams: `python -m benchmarks.transductive`.

StatA's README reports TransCLIP and ZLaP collapsing on batches that hold few classes (ImageNet-scale averages:
TransCLIP +5.1 with all classes present, -26.3 with 1-4 classes per batch of 64; ZLaP +1.1 and -37.7) while
StatA keeps its gain. This benchmark runs zero-shot CLIP, StatA, TransCLIP and ZLaP on the CLIP-like synthetic
presets, first on the whole stream as one batch (the README's "All classes" column: the whole test set solved
transductively), then at their official batch size (128) under three stream orders:

- iid: every batch holds most classes;
- dirichlet: StatA's online stream (gamma 0.01, slots = min(n // 128, classes) as its main.py sets them);
- separate: one class after another, so a batch holds one or two classes;

and prints, per preset and order, the mean number of classes in a batch and each method's top-1 accuracy with
its gain over CLIP on the same samples. Methods are plain tensor code here (no sweep); the numbers describe the
synthetic benchmark, not the paper's datasets. `--quick` runs a smaller stream (the test's size).
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch

from benchmarks.tables import markdown_table

BATCH = 128
METHODS = ("clip", "stata", "transclip", "zlap")


def orders(labels: np.ndarray, seed: int) -> dict[str, tuple[np.ndarray, int]]:
    """stream name -> (order, batch size)."""
    from orchestrator.data.streams import Dirichlet, Iid, Separate

    slots = min(len(labels) // BATCH, len(np.unique(labels)))
    iid = Iid().order(labels, seed).index
    return {"all (one batch)": (iid, len(labels)), "iid": (iid, BATCH),
            "dirichlet": (Dirichlet(0.01, slots).order(labels, seed).index, BATCH),
            "separate": (Separate().order(labels, seed).index, BATCH)}


def classes_per_batch(labels: np.ndarray, batch: int) -> float:
    return float(np.mean([len(np.unique(labels[s:s + batch])) for s in range(0, len(labels), batch)]))


def measure(preset: str, n: int, seed: int = 0) -> list[dict]:
    """One row per stream order: mean classes per batch and each method's accuracy (%)."""
    from orchestrator.data.synthetic import make_clip_like
    from orchestrator.methods import run_stream

    bench = make_clip_like(preset, seed=seed, n=n)
    k = len(bench.class_names)
    labels = bench.labels.numpy()
    rows = []
    for name, (index, batch) in orders(labels, seed).items():
        idx = torch.from_numpy(index)
        feats, truth = bench.features[idx], bench.labels[idx]
        row = {"preset": preset, "stream": name, "batch": batch,
               "classes_per_batch": classes_per_batch(labels[index], batch)}
        for method in METHODS:
            post = run_stream(method, feats, bench.class_embeddings, bench.class_ids, k,
                              batch_size=1 if method == "clip" else batch)
            row[method] = 100.0 * float((post.argmax(1) == truth).float().mean())
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a 1,280-sample stream per preset")
    args = parser.parse_args(argv)
    n = 1280 if args.quick else 5120
    print(f"machine: {os.cpu_count()} cpus; load average at start {os.getloadavg()[0]:.1f}; n = {n}")
    heads = [m if m == "clip" else f"{m} (Δ CLIP)" for m in METHODS]
    lines = [["preset", "stream", "batch", "classes / batch", *heads]]
    for preset in ("imagenet_like", "fine_grained"):
        for row in measure(preset, n):
            cells = [f"{row['clip']:.2f}"] + [f"{row[m]:.2f} ({row[m] - row['clip']:+.2f})" for m in METHODS[1:]]
            lines.append([preset, row["stream"], str(row["batch"]), f"{row['classes_per_batch']:.1f}", *cells])
    print(markdown_table(lines, left_columns=2))


if __name__ == "__main__":
    main()
