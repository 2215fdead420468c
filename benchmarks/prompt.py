"""Prompt tuning's cost per sample: `python -m benchmarks.prompt` (`--quick`: the tiny test tower, a smoke run).

TPT, C-TPT, R-TPT, O-TPT, A-TPT, RLCF, DynaPrompt and HisTPT run CLIP's text tower forward and backward over K
class prompts per sample (`orchestrator.methods.prompt`; RLCF's teacher features, which a sweep reads from the cache,
are the student's own here). For each text tower (random weights: the cost does not depend on them) and method, on
random unit view features near the class text features (64 views, view 0 the original):

- chunked s/sample: the episodic method as a sweep runs it, several samples' contexts in one text-tower pass;
- one-by-one s/sample: the same method with one sample per pass (its chunk forced to 1);
- stream s/sample: the online methods (no chunks) over the samples in order: DynaPrompt, its buffer of 12 prompts
  filling, and HisTPT, its memories filling;
- reference s/sample (`--reference`): the plain per-sample transcription of the official loop
  (`orchestrator.methods.tpt.reference`, and each online method's `reference.py`), TPT, DynaPrompt and HisTPT;
- MB per class: the activations autograd keeps per class prompt in one step (`TextTower.saved_bytes_per_prompt`,
  float32; the card's `text_encoder.mb_per_class` is this at the ViT-B/16 and RN50 towers);
- peak memory: the device's peak allocation on a GPU, the process's peak resident set on a CPU.

The paper's Table 3 (BCA, CVPR 2025) measured TPT on ImageNet with RN50 on one RTX 4070 Ti SUPER: 572 min for the
50,000 images (0.69 s/sample) and 21.4 GB, against BCA's 2.4 min and 757 MB; the official code runs in fp16
autocast, this in float32. Timings are wall-clock on a possibly shared machine: compare within one run.
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import time

import torch
import torch.nn.functional as F

QUICK = {"towers": ("bca-tiny-vit",), "K": 20, "n": 4, "views": 16}
FULL = {"towers": ("ViT-B-16", "RN50"), "K": 1000, "n": 4, "views": 64}
PAPER_TPT = "paper Table 3 (RN50, ImageNet, RTX 4070 Ti SUPER, fp16): TPT 0.69 s/sample, 21.4 GB"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak(device: str) -> str:
    if device.startswith("cuda"):
        return f"{torch.cuda.max_memory_allocated() / 2**20:,.0f} MB (GPU peak)"
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB (process peak RSS)"


@functools.lru_cache(maxsize=None)
def random_backbone(model: str, device: str):
    """An open_clip model with random weights (loaded once per process: the study asks for it per dataset)."""
    from orchestrator.clip.backbone import load_backbone
    from orchestrator.clip.testing import register_tiny_models

    register_tiny_models()
    return load_backbone(model, None, device)


def tower_inputs(model: str, K: int, n: int, views: int, device: str):
    """(text, class embeddings [K, d], view features [n, V, d]) for an open_clip model with random weights."""
    from orchestrator.clip.prompts import prompt_text

    text = prompt_text(random_backbone(model, device), [f"class {k}" for k in range(K)])
    with torch.no_grad():
        emb = F.normalize(text.tower(text.tower.embed(text.tokens), text.tokens.argmax(-1)), dim=-1)
    g = torch.Generator(device="cpu").manual_seed(0)
    labels = torch.randint(0, K, (n,), generator=g)
    noise = torch.randn(n, views, emb.shape[1], generator=g).to(device)
    return text, emb, F.normalize(noise + 3 * emb[labels.to(device)][:, None], dim=-1)


def measure(model: str, methods: tuple[str, ...], K: int, n: int, views: int, device: str,
            reference: bool) -> list[str]:
    from orchestrator.methods import make_method
    from orchestrator.methods.episodic import order_free
    from orchestrator.methods.prompt import TEACHER_CLASSES, TEACHER_VIEWS
    from orchestrator.methods.tpt.reference import run_reference
    from orchestrator.registry import method_card
    from orchestrator.registry.backbones import names_teacher

    text, emb, x = tower_inputs(model, K, n, views, device)
    ids = torch.arange(K, device=device)
    mb = text.tower.saved_bytes_per_prompt(text.tokens.shape[1]) / 2**20
    lines = [f"  {model} text tower (width {text.tower.width}), K = {K}, {views} views, {n} samples: "
             f"{mb:.1f} MB of activations per class in a step ({mb * K / 1024:.1f} GB per sample)"]
    for name in methods:
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        if not order_free(name):
            lines.append(_stream_line(name, text, emb, ids, x, device, reference) + f"; peak {_peak(device)}")
            continue
        timed = {}
        # a CLIP teacher's features (RLCF's) come from the cache: here the student's own stand in, at their cost
        teacher = {TEACHER_VIEWS: x, TEACHER_CLASSES: emb} if names_teacher(method_card(name)) else None
        for label, chunk in (("chunked", None), ("one-by-one", 1)):
            method = make_method(name, emb, ids, K, text=text)
            if chunk:
                method.chunk = chunk
            _sync(device)
            start = time.perf_counter()
            post = method.run(x, teacher).posteriors
            _sync(device)
            timed[label] = ((time.perf_counter() - start) / n, method.chunk, post)
        line = (f"    {name:<5} chunked {timed['chunked'][0]:.3f} s/sample (chunk {timed['chunked'][1]}), one-by-one "
                f"{timed['one-by-one'][0]:.3f} s/sample")
        if reference and name == "tpt":
            start = time.perf_counter()
            ref = run_reference(x, text, 5e-3, 1, 0.1, 100.0)
            _sync(device)
            line += _agreement(timed["chunked"][2], ref, (time.perf_counter() - start) / n)
        lines.append(line + f"; peak {_peak(device)}")
    return lines


def _agreement(post: torch.Tensor, ref: torch.Tensor, seconds: float) -> str:
    same = torch.equal(post.argmax(1), ref.argmax(1))
    return (f", reference {seconds:.3f} s/sample (predictions {'identical' if same else 'DIFFER'}, max dpost "
            f"{float((post - ref).abs().max()):.0e})")


def _stream_line(name: str, text, emb: torch.Tensor, ids: torch.Tensor, x: torch.Tensor, device: str,
                 reference: bool) -> str:
    """An online method's cost: one run over the samples in order (its state carries, so no chunks)."""
    import importlib

    from orchestrator.methods import make_method

    method = make_method(name, emb, ids, len(ids), text=text)
    _sync(device)
    start = time.perf_counter()
    post = method.run(x).posteriors
    _sync(device)
    line = f"    {name:<5} stream {(time.perf_counter() - start) / len(x):.3f} s/sample"
    if reference:
        # each online method's reference.py: run_reference(views, text, **hparams) -> (posteriors, log)
        run_reference = importlib.import_module(f"orchestrator.methods.{name}.reference").run_reference
        start = time.perf_counter()
        ref, _ = run_reference(x, text, **method.hp)
        _sync(device)
        line += _agreement(post, ref, (time.perf_counter() - start) / len(x))
    return line


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prompt", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the tiny test tower, K 20, 16 views, 4 samples")
    parser.add_argument("--towers", nargs="+", help="open_clip model names (default: ViT-B-16 RN50; quick: tiny)")
    parser.add_argument("--K", type=int, help="classes (default 1000; quick 20)")
    parser.add_argument("--n", type=int, help="samples per measurement (default 4)")
    parser.add_argument("--methods", nargs="+",
                        default=["tpt", "ctpt", "rtpt", "otpt", "atpt", "rlcf", "dynaprompt", "histpt"])
    parser.add_argument("--reference", action="store_true",
                        help="also time TPT's, DynaPrompt's and HisTPT's per-sample reference loops")
    parser.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads on a CPU")
    args = parser.parse_args(argv)
    preset = dict(QUICK if args.quick else FULL)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"machine: {os.cpu_count()} cpus, device {device}, torch threads {torch.get_num_threads()}; load average "
          f"at start {os.getloadavg()[0]:.1f}; {PAPER_TPT}")
    for model in args.towers or preset["towers"]:
        for line in measure(model, tuple(args.methods), args.K or preset["K"], args.n or preset["n"],
                            preset["views"], device, args.reference):
            print(line, flush=True)
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
