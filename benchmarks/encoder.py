"""The encoder-updating methods' cost: `python -m benchmarks.encoder` (`--quick`: the tiny test towers, a smoke run).

Tent, SAR, DeYO, BATCLIP, CLIPArTT and WATT adapt CLIP's image encoder on the images (`orchestrator.methods.encoder`):
each batch costs forward and backward passes through the vision tower (BATCLIP's also through the text tower),
as many as the method's steps, so their cost is the encoder's, not a method's arithmetic on features. For each
vision tower (random weights: the cost does not depend on them) and method at its card's defaults, on random
images at its official batch size (`--batch` overrides it), after one warm-up batch:

- images/s over `--batches` timed batches (each batch adapted, then predicted, as a sweep's trial runs it);
- peak memory: the device's peak allocation on a GPU (reset per method), the process's peak resident set on a CPU
  (which only grows, so read it per method on a GPU);
- the card's `mb_per_image` times the batch (plus `text_mb_per_class` times K where the method adapts the text
  tower too, BATCLIP), the memory plan's figure, beside it.

A method its card refuses on a tower (WATT on RN50: it adapts LayerNorms only) says so. Timings are wall-clock on a
possibly shared machine: compare within one run. `docs/performance.md` says what bounds each.
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from benchmarks.prompt import random_backbone

QUICK = {"towers": ("bca-tiny-vit", "bca-tiny-rn"), "K": 10, "batch": 2, "batches": 1}
FULL = {"towers": ("ViT-B-16", "RN50"), "K": 1000, "batch": None, "batches": 3}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_mb(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def encoder_cards() -> list:
    from orchestrator.registry import method_cards

    return [c for c in method_cards() if c.image_encoder is not None]


def measure(card, tower: str, K: int, batch: int | None, batches: int, device: str) -> str:
    """One line: the method's images/s and peak memory on the tower (or why it does not run there)."""
    from orchestrator.clip.prompts import prompt_text
    from orchestrator.methods import make_method

    backbone = random_backbone(tower, device)
    size = backbone.resolved.preprocess["size"]
    size = size if isinstance(size, int) else size[0]
    b = batch or card.batch_size or 1
    generator = torch.Generator().manual_seed(0)
    images = torch.randn((batches + 1) * b, 3, size, size, generator=generator).to(device)
    names = [f"class {k}" for k in range(K)]
    emb = torch.nn.functional.normalize(torch.randn(K, backbone.embed_dim, generator=generator), dim=-1).to(device)
    text = prompt_text(backbone, names) if card.takes_text else None
    try:
        method = make_method(card.name, emb, torch.arange(K, device=device), K, batch_size=b, text=text,
                             vision=backbone.model.visual)
    except ValueError as exc:
        return f"  {card.name:<9} {tower:<13} refused: {exc}"
    method.run(images[:b])  # warm-up: lazy initialisation, the optimiser's state
    _sync(device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    method.run(images[b:])
    _sync(device)
    rate = batches * b / (time.perf_counter() - start)
    use = card.image_encoder
    plan = use.mb_per_image * b + (use.text_mb_per_class or 0) * K
    text = f" + {use.text_mb_per_class:g} MB per class for the text tower" if use.text_mb_per_class else ""
    kind = "GPU peak" if device.startswith("cuda") else "process peak RSS"
    return (f"  {card.name:<9} {tower:<13} batch {b:>3}: {rate:,.1f} images/s, {_peak_mb(device):,.0f} MB ({kind}); "
            f"card's plan {plan:,.0f} MB ({use.mb_per_image:g} MB per image{text}, ViT-B/16)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.encoder", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the tiny test towers, a batch of 2 (a smoke run)")
    parser.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--methods", nargs="+", help="these methods only (default: every encoder-updating one)")
    parser.add_argument("--batch", type=int, help="images per batch (default: each method's official batch size)")
    parser.add_argument("--batches", type=int, help="timed batches per method")
    args = parser.parse_args(argv)
    preset = QUICK if args.quick else FULL
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    batch = args.batch or preset["batch"]
    batches = args.batches or preset["batches"]
    cards = [c for c in encoder_cards() if args.methods is None or c.name in args.methods]
    print(f"encoder-updating methods on {device}, K = {preset['K']}, random weights, float32:")
    for tower in preset["towers"]:
        for card in cards:
            print(measure(card, tower, preset["K"], batch, batches, device), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
