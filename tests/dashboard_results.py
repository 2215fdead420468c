"""Results of one real small sweep, shared by the dashboard's AppTest and browser tests.

`bca sweep` runs once per test session (Ray's start-up dominates its minute): both test modules call
real_sweep_results with the session's base temp dir, and the first call's results dir is reused.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

# Every method, a tau grid for the sensitivity view, two synthetic scenarios (so the comparison has an
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
    n2: 5
  - method: tda
  - method: tda_pa
    n2: 5
seeds: [1, 2]
pack: 7
part_rows: 200
"""
METHODS = ("clip", "la", "pa", "bca", "tda", "tda_pa")


def bca_executable() -> str:
    """The `bca` script of the interpreter running the tests (the venv's), not whatever is on PATH."""
    path = Path(sys.executable).parent / "bca"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: install the package into this environment (pip install -e .)")
    return str(path)


@functools.cache
def real_sweep_results(base: Path) -> Path:
    """Run the spec above with `bca sweep` under base/dashboard_sweep once; return its results dir."""
    root = Path(base) / "dashboard_sweep"
    root.mkdir(parents=True, exist_ok=True)
    spec = root / "spec.yaml"
    spec.write_text(SPEC)
    done = subprocess.run([bca_executable(), "sweep", str(spec)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"bca sweep {spec} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return root / "results"
