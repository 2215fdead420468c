"""One-command GPU check: `python -m benchmarks.gpu` (`--quick` on a CPU for CI).

Needs only torch, numpy, numba and pyarrow (the GPU machine has no Ray, DuckDB, open_clip or pydantic);
the parts that need more say what is missing and which wheels to carry. In order:

1. exact: the blocked BCA engine, every lockstep runner and every method without one (its own run, a batch
   method at its official batch size) on the device against the CPU reference (the per-sample BCA loop; each
   method's single-stream run on the CPU): predictions, selections and gates identical,
   the largest posterior difference (under 1e-4 on all but 0.2% of the samples and under 1e-3 on those
   passes: the device sums products in another order, which ill-conditioned samples amplify; a method whose
   float32 run drifts further from a float64 run of the case gets a multiple of that drift instead,
   `benchmarks.drift`);
2. samples/s of every method at K = M = 1000, d = 512, single-stream and lockstep (`benchmarks.methods`);
3. image encoders: images/s of the image tower of every backbone record (`orchestrator.registry.backbones`: RN50,
   ViT-B-16, ViT-B-32, ViT-L-14, ViT-B-16-SigLIP) at fp16 with random weights (no download), batch 64; open_clip
   comes as carried wheels (`--wheels` prints how), and SigLIP's tower (timm's) needs timm;
4. peak GPU memory of a pack trial's method pass (32 TDA configs and 32 BCA configs over 2000 samples);
5. one `execute_trial` end to end (a synthetic pack of BCA and TDA runs), where pydantic and PyYAML import
   (the sweep spec needs them), else a line saying so;
6. prompt tuning (TPT, C-TPT, R-TPT): s/sample and peak memory with the ViT-B/16 and RN50 text towers (random
   weights) at K = 1000 (`benchmarks.prompt`; --quick: the tiny test tower), where open_clip imports;
7. the encoder-updating methods (Tent, SAR, DeYO, BATCLIP, CLIPArTT, WATT): images/s and peak memory with the
   ViT-B/16 and RN50 vision towers (random weights) at their official batch sizes (`benchmarks.encoder`; --quick:
   the tiny test towers), where open_clip imports.

`--sections` runs some of them (a device lent for minutes). The exit status is 1 when an exactness check fails,
else 0.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

import torch

from benchmarks import methods as methods_benchmark
from benchmarks.drift import drift_tolerances
from orchestrator.registry.backbones import BACKBONES

# K >= 100 in the exactness check: below it OnZeta's proxy steps amplify rounding (onzeta.py).
QUICK = {"K": 120, "d": 16, "n": 200, "view_n": 200, "batch_n": 200, "encoder_batch": 2, "encoders": (), "peak_n": 200,
         "peak_g": 4}
FULL = {"K": 1000, "d": 512, "n": 2000, "view_n": 100, "batch_n": 256, "encoder_batch": 64,
        "encoders": tuple(BACKBONES), "peak_n": 2000, "peak_g": 32}
SECTIONS = ("exact", "rates", "encoders", "peak", "trial", "prompt", "encoder_methods")
TOLERANCE = 1e-4
RARE, RARE_TOLERANCE = 0.002, 1e-3
# What a GPU image with torch, torchvision, timm, huggingface_hub, safetensors, regex, tqdm and PyYAML (this
# workplace's, as its package list says) lacks: open_clip for the encoders, pydantic for the sweep spec.
# `--wheels` prints the pip commands, pinned to this environment's versions.
OPEN_CLIP_WHEELS = ("open_clip_torch", "ftfy", "wcwidth")
TRIAL_WHEELS = ("pydantic", "pydantic_core", "annotated_types", "typing_inspection", "typing_extensions")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def wheel_commands(python: str) -> str:
    """The pip download command (run here, where pip reaches the index) and the install line for the GPU
    machine, for the wheels of OPEN_CLIP_WHEELS and TRIAL_WHEELS at this environment's versions."""
    from importlib.metadata import PackageNotFoundError, version

    pinned = []
    for name in OPEN_CLIP_WHEELS + TRIAL_WHEELS:
        try:
            pinned.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            pinned.append(name)
    platforms = " ".join(f"--platform {p}" for p in PLATFORMS)
    return (f"python -m pip download --no-deps --only-binary=:all: --python-version {python} --implementation cp "
            f"{platforms} -d wheels {' '.join(pinned)}\n"
            "# then copy wheels/ into the repository root on the GPU machine, and there:\n"
            "python -m pip install --no-index --no-deps --target /tmp/site wheels/*.whl && "
            "PYTHONPATH=/tmp/site python -m benchmarks.gpu")


def _compare(name: str, reference, got, tolerance: float = TOLERANCE) -> tuple[str, bool]:
    """Predictions, selections and gates identical; posteriors within `tolerance` (TOLERANCE, or the case's
    float32 drift, `benchmarks.drift`), save on at most RARE of the samples, which may reach RARE_TOLERANCE as
    many times over (MTA's and TPS's ill-conditioned samples amplify rounding: their modules say where)."""
    same = all(torch.equal(getattr(reference, a).cpu(), getattr(got, a).cpu())
               for a in ("selected", "gated", "gated_prior")) and \
        torch.equal(reference.predictions.cpu(), got.predictions.cpu())
    gap = (reference.posteriors.cpu() - got.posteriors.cpu()).abs().amax(dim=1)
    diff, over = float(gap.max()), int((gap >= tolerance).sum())
    ok = same and diff < tolerance * RARE_TOLERANCE / TOLERANCE and over <= RARE * len(gap)
    return (f"  {name:<32} {'ok' if ok else 'FAILED'}  identical {same}, max dpost {diff:.1e}, "
            f"{over} of {len(gap)} samples over {tolerance:.1e}"), ok


def check_exact(device: str, K: int, d: int, n: int, view_n: int, batch_n: int) -> bool:
    """The engine, the lockstep runners and the methods without one on `device` against the CPU references (view
    methods over the first view_n samples, the others without a runner over batch_n: their CPU loops are the slow
    part)."""
    from orchestrator.methods import make_method
    from orchestrator.methods.engine import run_bca_blocked_many
    from orchestrator.methods.lockstep import run_lockstep
    from orchestrator.methods.bca.reference import bca_family_reference
    from orchestrator.registry import method_cards

    feats, view_feats, emb, ids = methods_benchmark.make_stream(K, d, n, 4, "cpu", seed=5)
    dev = [t.to(device) for t in (feats, emb, ids)]
    results = []
    bca = [{"tau": 0.3, "n1": 30000, "n2": 10}, {"tau": 0.4, "n1": 50, "n2": 5}]
    cpu_methods = [make_method("bca", emb, ids, K, **hp) for hp in bca]
    dev_methods = [make_method("bca", dev[1], dev[2], K, **hp) for hp in bca]
    got = run_bca_blocked_many(dev[0], [m.state for m in dev_methods], dev[2], K, [m.config for m in dev_methods])
    for i, (m, trace) in enumerate(zip(cpu_methods, got)):
        results.append(_compare(f"engine bca config {i}", bca_family_reference(feats, m.state, ids, K, m.config),
                                trace))
    for card in method_cards():
        if card.text_encoder is not None:
            continue  # prompt tuning runs a text tower: section 6 checks it
        if card.image_encoder is not None:
            continue  # it adapts the image tower on images, not features (tests/test_encoder_methods.py)
        if card.auxiliary:
            continue  # it reads an auxiliary encoder's features beside CLIP's, which these streams have not
        x = view_feats[:view_n] if card.takes_views else feats
        configs = methods_benchmark.differing_configs(card, 4, x.shape[0])
        if card.lockstep_runner(x.ndim == 3) is None:
            # its own run on the device (a batch method at its official size, over batch_n samples: a few batches)
            x = x[:batch_n]
            batch = card.batch_size or 1
            for i, config in enumerate(configs[:2]):
                config = {**config, **({card.stream_length: x.shape[0]} if card.stream_length else {})}
                single = make_method(card.name, emb, ids, K, batch_size=batch, **config).run(x)
                got = make_method(card.name, dev[1], dev[2], K, batch_size=batch, **config).run(x.to(device))
                tolerance = drift_tolerances(card.name, x, emb, config, single, TOLERANCE)["posteriors"]
                results.append(_compare(f"device {card.name} config {i}", single, got, tolerance))
            continue
        traces = run_lockstep([make_method(card.name, dev[1], dev[2], K, **c) for c in configs], x.to(device))
        for i, (config, trace) in enumerate(zip(configs, traces)):
            single = make_method(card.name, emb, ids, K, **config).run(x)
            tolerance = drift_tolerances(card.name, x, emb, config, single, TOLERANCE)["posteriors"]
            results.append(_compare(f"lockstep {card.name} config {i}", single, trace, tolerance))
    for line, _ in results:
        print(line)
    return all(ok for _, ok in results)


def encoder_rates(device: str, names: tuple[str, ...], batch: int) -> None:
    """images/s of open_clip image towers at fp16 (fp32 on a CPU) with random weights."""
    try:
        import open_clip
    except ImportError:
        print(f"  skipped: open_clip is not importable here; carry the wheels {', '.join(OPEN_CLIP_WHEELS)} "
              f"(`python -m benchmarks.gpu --wheels`)")
        return
    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    for name in names:
        model = open_clip.create_model(name, pretrained=None).visual.to(device, dtype).eval()
        size = model.image_size if isinstance(model.image_size, int) else model.image_size[0]
        images = torch.randn(batch, 3, size, size, device=device, dtype=dtype)
        with torch.inference_mode():
            model(images)
            _sync(device)
            start = time.perf_counter()
            for _ in range(3):
                model(images)
            _sync(device)
        print(f"  {name:<15} {3 * batch / (time.perf_counter() - start):,.0f} images/s ({dtype}, batch {batch})")
        del model


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_memory(device: str, K: int, d: int, n: int, g: int) -> None:
    """Peak memory of a pack's method pass: g TDA configs in lockstep, then g BCA configs on the engine."""
    from orchestrator.methods import run_traces_many
    from orchestrator.registry import method_card

    feats, _, emb, ids = methods_benchmark.make_stream(K, d, n, 1, device, seed=6)
    for name in ("tda", "bca"):
        configs = [{"method": name, **c} for c in methods_benchmark.differing_configs(method_card(name), g, n)]
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        run_traces_many(feats, emb, ids, K, configs)
        _sync(device)
        seconds = time.perf_counter() - start
        if device.startswith("cuda"):
            peak = f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**20:,.0f} MB"
        else:
            peak = f"process peak resident {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB"
        print(f"  {g} {name} configs x {n} samples (K={K}, d={d}): {peak}, {g * n / seconds:,.0f} cfg-samples/s")


def trial_end_to_end(K: int, d: int, n: int) -> None:
    """One execute_trial of a synthetic pack (BCA and TDA runs), results in a temporary directory."""
    try:
        from orchestrator.device import auto_device
        from orchestrator.sweep.load import validate_spec
        from orchestrator.sweep.plan import expand, make_trials
        from orchestrator.sweep.pieces import settings_of
        from orchestrator.sweep.trial import execute_trial
    except ImportError as exc:
        print(f"  skipped: the sweep needs {exc.name!r}, not importable here; carry the wheels "
              f"{', '.join(TRIAL_WHEELS)} (`python -m benchmarks.gpu --wheels`)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        spec = validate_spec({"name": "gpu-check", "results_dir": "results", "seeds": [0], "pack": 4,
                              "datasets": [{"synthetic": "iid", "n": n, "num_classes": K, "dim": d}],
                              "methods": [{"method": "bca", "tau": [0.3, 0.5]}, {"method": "tda", "pos_alpha": [1.0, 2.0]}]},
                             base_dir=tmp)
        trials = make_trials(expand(spec), 4)
        start = time.perf_counter()
        rows = [row for trial in trials for row in execute_trial(trial, settings_of(spec))]
        seconds = time.perf_counter() - start
    peak = max((row["peak_mem_mb"] or 0.0) for row in rows)
    print(f"  {len(trials)} trial(s), {len(rows)} runs finished in {seconds:.1f} s on {auto_device()}, "
          f"accuracies {', '.join(format(row['accuracy'], '.3f') for row in rows)}, peak memory {peak:,.0f} MB")


def prompt_tuning(device: str, quick: bool) -> None:
    """Section 6: `benchmarks.prompt` on this device (its quick preset under --quick)."""
    try:
        import open_clip  # noqa: F401
    except ImportError:
        print(f"  skipped: open_clip is not importable here; carry the wheels {', '.join(OPEN_CLIP_WHEELS)} "
              f"(`python -m benchmarks.gpu --wheels`)")
        return
    from benchmarks import prompt

    prompt.main((["--quick", "--n", "2"] if quick else []) + ["--device", device])


def encoder_methods(device: str, quick: bool) -> None:
    """Section 7: `benchmarks.encoder` on this device (its quick preset under --quick)."""
    try:
        import open_clip  # noqa: F401
    except ImportError:
        print(f"  skipped: open_clip is not importable here; carry the wheels {', '.join(OPEN_CLIP_WHEELS)} "
              f"(`python -m benchmarks.gpu --wheels`)")
        return
    from benchmarks import encoder

    encoder.main((["--quick"] if quick else []) + ["--device", device])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, no encoders (CI, on a CPU)")
    parser.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--wheels", metavar="PYTHON", nargs="?", const="3.12",
                        help="print the commands that fetch and install the wheels to carry for the GPU machine's "
                             "Python (default 3.12), then exit")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                        help="which of the numbered sections to run (default: all)")
    args = parser.parse_args(argv)
    if args.wheels:
        print(wheel_commands(args.wheels))
        return 0
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    preset = QUICK if args.quick else FULL
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else f"{os.cpu_count()} cpus"
    print(f"device {device} ({name}), torch {torch.__version__}, python {sys.version.split()[0]}")
    wanted = set(args.sections)
    exact = True
    if "exact" in wanted:
        print(f"1. exact against the CPU references (K={preset['K']}, d={preset['d']}, n={preset['n']}, view methods "
              f"{preset['view_n']} samples of 4 views, methods without a lockstep runner {preset['batch_n']}):")
        exact = check_exact(device, preset["K"], preset["d"], preset["n"], preset["view_n"], preset["batch_n"])
    if "rates" in wanted:
        print("2. methods' samples/s, single-stream and lockstep:")
        methods_benchmark.main((["--quick"] if args.quick else []) + ["--device", device])
    if "encoders" in wanted:
        print("3. image encoders, random weights:")
        if preset["encoders"]:
            encoder_rates(device, preset["encoders"], preset["encoder_batch"])
        else:
            print("  skipped in --quick")
    if "peak" in wanted:
        print("4. peak memory of a pack's method pass:")
        peak_memory(device, preset["K"], preset["d"], preset["peak_n"], preset["peak_g"])
    if "trial" in wanted:
        print("5. execute_trial end to end:")
        trial_end_to_end(preset["K"], preset["d"], preset["n"])
    if "prompt" in wanted:
        print("6. prompt tuning, text towers with random weights:")
        prompt_tuning(device, args.quick)
    if "encoder_methods" in wanted:
        print("7. encoder-updating methods, vision towers with random weights:")
        encoder_methods(device, args.quick)
    print("exact: " + ("all checks passed" if exact else "FAILED (see 1.)"))
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
