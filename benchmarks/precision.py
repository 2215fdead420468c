"""What the official float16 changes: each method with a `state_dtype: float16` option (TDA, Zero, DPE) run in
float32 and in float16 on the same CLIP-like streams, printing the share of predictions that agree and both
accuracies.

    python -m benchmarks.precision            # the log in benchmarks/logs/precision-*.txt
    python -m benchmarks.precision --n 200    # a quick look

The streams are the CLIP-like synthetic presets (orchestrator.data.synthetic.make_clip_like: CLIP's cosine
geometry, no images) with views made by jittering each sample's feature (view 0 the feature itself): they
say how much float16 moves predictions where the method's arithmetic is exercised, not what it does on a
real benchmark, which needs CLIP features (docs/real-data.md) and the same script's functions.
"""

from __future__ import annotations

import argparse
import math

import torch

from orchestrator.data.synthetic import make_clip_like
from orchestrator.methods import make_method

VIEW_JITTER = 0.6  # per-view noise (relative to the feature, per dimension / sqrt(d)): views that disagree


def jittered_views(features: torch.Tensor, views: int, seed: int) -> torch.Tensor:
    """[n, d] -> [n, views, d]: view 0 the feature, the others it plus unit-scale noise, renormalised."""
    gen = torch.Generator().manual_seed(seed)
    n, d = features.shape
    noise = torch.randn(n, views, d, generator=gen) * VIEW_JITTER / math.sqrt(d)
    noise[:, 0] = 0
    return torch.nn.functional.normalize(features[:, None] + noise, dim=-1)


def compare(method: str, features: torch.Tensor, bench, **hparams) -> tuple[float, float, float]:
    """(agreement of float32 and float16 predictions, float32 accuracy, float16 accuracy), in %."""
    k = int(bench.class_ids.max()) + 1
    preds = {}
    for dtype in ("float32", "float16"):
        post = make_method(method, bench.class_embeddings, bench.class_ids, k, state_dtype=dtype,
                           **hparams).run(features).posteriors
        preds[dtype] = post.argmax(1)
    agree = 100 * (preds["float32"] == preds["float16"]).float().mean().item()
    acc = [100 * (preds[d] == bench.labels).float().mean().item() for d in ("float32", "float16")]
    return agree, acc[0], acc[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="samples per stream")
    parser.add_argument("--views", type=int, default=64, help="views per sample (the original included)")
    parser.add_argument("--dpe-n", type=int, default=500, help="samples of DPE's streams (its loop is slow)")
    args = parser.parse_args(argv)
    print(f"float32 vs float16 (state_dtype), CLIP-like streams, n = {args.n} (DPE {args.dpe_n}), "
          f"{args.views} views, seed 1")
    print("| method | stream | K | agree % | acc f32 | acc f16 |")
    print("|---|---|---:|---:|---:|---:|")
    for preset in ("imagenet_like", "fine_grained"):
        bench = make_clip_like(preset, seed=1, n=args.n)
        views = jittered_views(bench.features, args.views, seed=2)
        k = int(bench.class_ids.max()) + 1
        rows = [("tda", f"{preset} single", bench.features, {}),
                ("tda", f"{preset} views", views, {}),
                ("zero", f"{preset} views", views, {}),
                ("dpe", f"{preset} views", views[:args.dpe_n], {})]
        for method, stream, features, hparams in rows:
            n = features.shape[0]
            part = bench if n == args.n else _head(bench, n)
            agree, acc32, acc16 = compare(method, features, part, **hparams)
            print(f"| {method} | {stream} | {k} | {agree:.2f} | {acc32:.2f} | {acc16:.2f} |", flush=True)


def _head(bench, n: int):
    """The benchmark's first n samples (labels only; the class side is shared)."""
    from dataclasses import replace

    return replace(bench, features=bench.features[:n], labels=bench.labels[:n], image_ids=bench.image_ids[:n])


if __name__ == "__main__":
    main()
