"""`bca sweep SPEC [--resume] [--address ADDR] [--ray-dashboard] [--progress-every S] [--dry-run] [--yes]
[--rerun-changed]`: load and validate the spec, plan it, run it (or with --dry-run print the plan), set the exit
code.

Exit codes: 0 every run finished (or the dry run's plan printed); 1 some runs failed or were left unfinished (the
summary says which and how to resume), or the results dir cannot be written; 2 the spec is invalid (every
problem listed), asks for a GPU a local Ray lacks or more CPUs than a node has, names an --address that is no
Ray address, or a cluster whose head does not answer (after a bounded wait) or Ray cannot join, or joins with a
results/cache dir that is not absolute and writable, another `bca sweep` runs this sweep, or a sweep of more
than LARGE_SWEEP runs lacks --yes; 130 Ctrl-C.
"""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.sweep.load import SpecError, load_spec
from orchestrator.sweep.runner import (ClusterUnreachable, NeedsConfirmation, NoGPU, SharedStorageError, SweepLocked,
                                       run_sweep)


def _say(line: str) -> None:
    print(line, flush=True)


def _plan(spec_path: Path, data_elsewhere: bool = False) -> tuple | int:
    """(spec, runs), or the exit code: validation and expansion write nothing, so Ctrl-C here just stops."""
    from orchestrator.sweep.checks import spec_warnings
    from orchestrator.sweep.plan import expand

    try:
        spec = load_spec(spec_path, data_elsewhere=data_elsewhere)
        for line in spec_warnings(spec):
            print(f"warning: {line}", file=sys.stderr)
        return spec, expand(spec)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted while planning: nothing was run or written", file=sys.stderr)
        return 130


def sweep_command(spec_path: Path, *, resume: bool = False, address: str | None = None,
                  ray_dashboard: bool = False, progress_every_s: float = 30.0, dry_run: bool = False,
                  yes: bool = False, rerun_changed: bool = False) -> int:
    planned = _plan(spec_path, data_elsewhere=dry_run)  # a dry run plans for the machine that holds the data
    if isinstance(planned, int):
        return planned
    spec, runs = planned
    if dry_run:
        from orchestrator.sweep.dryrun import dry_run as plan_of

        try:
            lines = plan_of(spec, runs, source=str(spec_path), address=address)
        except SpecError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for line in lines:
            _say(line)
        return 0
    try:
        outcome = run_sweep(spec, resume=resume, address=address, out=_say, command=f"bca sweep {spec_path}",
                            ray_dashboard=ray_dashboard, progress_every_s=progress_every_s, yes=yes,
                            rerun_changed=rerun_changed, runs=runs)
    except (SpecError, NoGPU, SharedStorageError, SweepLocked, NeedsConfirmation, ClusterUnreachable) as exc:
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
    if outcome.interrupted or outcome.not_started:
        return 130
    return 0 if outcome.ok else 1
