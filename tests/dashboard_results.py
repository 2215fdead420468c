"""Results of one real small sweep, shared by the dashboard's AppTest and browser tests.

`bca sweep` runs once per test session (Ray's start-up dominates its minute): both test modules call
real_sweep_results with the session's base temp dir, and the first call's results dir is reused. Set
BCA_DASHBOARD_SWEEP_DIR to keep the sweep between sessions (it is run again only when this spec changed).

`real_dataset_results` writes a small results dir as a sweep over a real dataset would leave it: a sweep record
naming the data root and cache dir, a feature-cache manifest with class names, and image files under the data
root at the rows' image ids (for the class names and thumbnails of the two-run comparison).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

from PIL import Image

from orchestrator.results.testing import write_fake_run

# Every method, a tau x n2 grid for the sensitivity, importance and parallel-coordinates views (n2 on a log axis), two synthetic scenarios (so the comparison has an
# average and a gain over CLIP), two seeds (mean ± std), several parts per run. Small running-mean counts
# (n1, n2) so that 600-sample streams adapt visibly; the paper's 30000 barely moves in 600 samples.
SPEC = """\
name: dashboard-test
results_dir: results
datasets:
  - synthetic: label_shift
    n: 600
  - synthetic: continual
    n: 600
methods:
  - method: clip
  - method: la
    n1: 100
  - method: pa
    n2: 5
  - method: bca
    tau: [0.2, 0.5]
    n1: 100
    n2: [5, 50]
  - method: tda
  - method: tda_pa
    n2: 5
seeds: [1, 2]
pack: 9
part_rows: 200
"""
METHODS = ("clip", "la", "pa", "bca", "tda", "tda_pa")
# The comparison's rows for this sweep: one per configuration, labelled as the report labels them.
CONFIG_ROWS = {"CLIP", "CLIP+LA", "CLIP+PA", "BCA (tau=0.2, n2=5)", "BCA (tau=0.2, n2=50)", "BCA (tau=0.5, n2=5)",
               "BCA (tau=0.5, n2=50)", "TDA", "TDA+PA"}


def bca_executable() -> str:
    """The `bca` script of the interpreter running the tests (the venv's), not whatever is on PATH."""
    path = Path(sys.executable).parent / "bca"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: install the package into this environment (pip install -e .)")
    return str(path)


@functools.cache
def real_sweep_results(base: Path) -> Path:
    """Run the spec above with `bca sweep` under base/dashboard_sweep once; return its results dir."""
    kept = os.environ.get("BCA_DASHBOARD_SWEEP_DIR")
    root = Path(kept) if kept else Path(base) / "dashboard_sweep"
    spec = root / "spec.yaml"
    if kept and spec.is_file() and spec.read_text() == SPEC and (root / "done").is_file():
        return root / "results"
    root.mkdir(parents=True, exist_ok=True)
    spec.write_text(SPEC)
    done = subprocess.run([bca_executable(), "sweep", str(spec)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"bca sweep {spec} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    (root / "done").write_text("")
    return root / "results"


# The fake real dataset's classes: what its feature-cache manifest lists.
CLASS_NAMES = [f"bird species {k}" for k in range(10)]
REAL_SWEEP = "realish"


def real_dataset_results(root: Path, dataset: str, methods: dict[str, dict]) -> Path:
    """Two runs per method (seeds 1, 2) on `dataset` whose rows name image files that exist under a data root,
    with the sweep record and a cache manifest a real sweep leaves; returns the results dir."""
    results, data_root, cache_dir = root / "results", root / "data", root / "cache"
    run_ids = []
    for method, hparams in methods.items():
        for seed in (1, 2):
            config = {"sweep": REAL_SWEEP, "backbone": "RN50", "pretrained": "openai", "dataset": dataset,
                      "method": method, "seed": seed, "templates": "ensemble7", "num_templates": 1, "views": "1",
                      "hparams": hparams}
            run_ids.append(write_fake_run(results, config, n=60, num_classes=len(CLASS_NAMES)).run_id)
    data_root.mkdir(parents=True)
    for i in range(60):  # write_fake_run's image ids: img_000000, ...
        colour = (20 * (i % 10), 120, 255 - 20 * (i % 10))
        Image.new("RGB", (24, 24), colour).save(data_root / f"img_{i:06d}", format="PNG")
    record = {"name": REAL_SWEEP, "run_ids": sorted(run_ids),
              "spec": {"name": REAL_SWEEP, "data_root": str(data_root), "cache_dir": str(cache_dir)}}
    (results / "sweeps").mkdir(parents=True, exist_ok=True)
    (results / "sweeps" / f"{REAL_SWEEP}.json").write_text(json.dumps(record))
    entry = cache_dir / "features" / "entry1"
    entry.mkdir(parents=True)
    (entry / "manifest.json").write_text(json.dumps({
        "key": "entry1", "dataset": dataset, "backbone": "RN50 (openai)", "views": "single", "seed": 1,
        "count": 60, "skipped_count": 0, "created_at": "2026-01-01T00:00:00+00:00", "class_names": CLASS_NAMES}))
    return results



# A demo-like sweep's shape (experiments/demo.yaml): an i.i.d. and a contaminated stream, three orders each, BCA at
# two n1. Accuracies per (protocol, setting) so that each protocol has its own best configuration.
PROTOCOLS = {"iid": "iid", "contaminated": {"contaminated": {"rate": 0.2}}}
PROTOCOL_ACCURACY = {("iid", "clip"): 0.55, ("iid", 100): 0.5, ("iid", 24000): 0.75,
                     ("contaminated", "clip"): 0.45, ("contaminated", 100): 0.6, ("contaminated", 24000): 0.35}
PROTOCOL_OOD_EVERY = 5  # 20% of a contaminated stream's positions are OOD


def protocol_results(root: Path, methods: dict[str, dict] | None = None) -> Path:
    """CLIP and BCA (n1 = 100 and 24000) on two datasets under both PROTOCOLS, three orders each, one seed, 200
    samples per stream (the contaminated ones with OOD rows); `methods` adds other methods' runs; returns the
    results dir."""
    results = root / "results"
    settings = [("clip", {}, "clip"), ("bca", {"tau": 0.3, "n1": 100}, 100), ("bca", {"tau": 0.3, "n1": 24000}, 24000),
                *((m, h, "clip") for m, h in (methods or {}).items())]
    for dataset in ("imagenet", "imagenet_a"):
        for name, stream in PROTOCOLS.items():
            for method, hparams, key in settings:
                for order in range(3):
                    config = {"sweep": "protocols", "backbone": "RN50", "pretrained": "openai", "dataset": dataset,
                              "method": method, "seed": 1, "templates": "ensemble7", "num_templates": 1,
                              "views": "1", "stream": stream, "order_index": order, "hparams": hparams}
                    write_fake_run(results, config, n=200, accuracy=PROTOCOL_ACCURACY[name, key], part_size=200,
                                   ood_every=PROTOCOL_OOD_EVERY if name == "contaminated" else 0, save_state=False)
    return results
