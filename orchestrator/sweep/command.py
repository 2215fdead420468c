"""`bca sweep SPEC [--resume] [--address ADDR] [--ray-dashboard] [--progress-every S]`: load and validate the
spec, run it, set the exit code.

Exit codes: 0 every run finished; 1 some runs failed or were left unfinished (the summary says which and how
to resume), or the results dir cannot be written; 2 the spec is invalid (every problem listed), asks for a GPU
a local Ray lacks, or joins a cluster with a results/cache dir that is not absolute and writable; 130 Ctrl-C.
"""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.sweep.load import SpecError, load_spec
from orchestrator.sweep.runner import NoGPU, SharedStorageError, run_sweep


def _say(line: str) -> None:
    print(line, flush=True)


def sweep_command(spec_path: Path, *, resume: bool = False, address: str | None = None,
                  ray_dashboard: bool = False, progress_every_s: float = 30.0) -> int:
    try:
        spec = load_spec(spec_path)
        outcome = run_sweep(spec, resume=resume, address=address, out=_say, command=f"bca sweep {spec_path}",
                            ray_dashboard=ray_dashboard, progress_every_s=progress_every_s)
    except (SpecError, NoGPU, SharedStorageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the results dir cannot be written (read-only, full, a file in the way)
        print(f"error: {exc}\nparts already written are intact; fix the results dir, then run "
              f"bca sweep {spec_path} again (finished runs are skipped, the others go on)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted: everything written so far is complete and queryable; continue with "
              f"bca sweep {spec_path} --resume", file=sys.stderr)
        return 130
    if outcome.interrupted:
        return 130
    return 0 if outcome.ok else 1
