"""Fault hooks for the processes of the reliability tests' Ray session (trial workers above all).

Python imports `sitecustomize` at start-up from any directory on PYTHONPATH; the reliability conftest puts this
directory there and sets BCA_RELIABILITY_HOOKS to a control directory before it starts Ray, so every worker
Ray forks carries the hook. Without that variable this module does nothing.

The hook wraps os.replace, the last step of every results write (temp file complete, not yet renamed). A test
arms a fault by writing <control>/armed-<name> as JSON {"action": ..., "match": [substrings]}; the first
process whose os.replace targets a results part (`part-*.parquet`) or segment file whose path holds every
substring claims it
(an atomic rename, so one process only), writes <control>/fired-<name> = {"pid", "src", "dst"} and then:

  pause   waits for <control>/release-<name>, then renames as usual (readers, a second sweep, or filling the
          disk meanwhile; or the test SIGKILLs this worker or SIGINTs the driver: a write cut off mid-way)
  tear    truncates the temp file to half its bytes (a part half on disk) and waits to be killed
  enospc  raises OSError(ENOSPC), as a full disk would (used where no tmpfs can be mounted)
"""

from __future__ import annotations

import errno
import json
import os
import time

_CONTROL = os.environ.get("BCA_RELIABILITY_HOOKS")
_WAIT_S = 600.0  # never outlive a test run: a forgotten pause ends in an error, not an orphaned worker


def _is_part(path: str) -> bool:
    """A results part, or a segment file (a pack's commit writes its rows as one)."""
    name = os.path.basename(path)
    segment = os.path.basename(os.path.dirname(path)) == "segments"
    return (name.startswith("part-") or segment) and name.endswith(".parquet")


def _claim(dst: str) -> tuple[str, dict] | None:
    try:
        names = sorted(n for n in os.listdir(_CONTROL) if n.startswith("armed-"))
    except OSError:
        return None
    for armed in names:
        path = os.path.join(_CONTROL, armed)
        try:
            with open(path) as f:
                fault = json.load(f)
        except (OSError, ValueError):
            continue
        if not all(s in dst for s in fault.get("match", [])):
            continue
        name = armed[len("armed-"):]
        try:
            os.rename(path, os.path.join(_CONTROL, f"claimed-{name}"))
        except OSError:
            continue  # another process claimed it first
        return name, fault
    return None


def _announce(name: str, src: str, dst: str) -> None:
    tmp = os.path.join(_CONTROL, f".fired-{name}.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "src": str(src), "dst": str(dst)}, f)
    _real_replace(tmp, os.path.join(_CONTROL, f"fired-{name}"))


def _wait_for_release(name: str) -> None:
    release = os.path.join(_CONTROL, f"release-{name}")
    deadline = time.monotonic() + _WAIT_S
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            raise OSError(errno.ETIMEDOUT, f"reliability hook {name!r} was never released")
        time.sleep(0.05)


def _replace(src, dst, *args, **kwargs):
    if _is_part(os.fspath(dst)):
        claimed = _claim(os.fspath(dst))
        if claimed is not None:
            name, fault = claimed
            action = fault["action"]
            if action == "enospc":
                _announce(name, src, dst)
                raise OSError(errno.ENOSPC, "No space left on device", os.fspath(dst))
            if action == "tear":
                size = os.path.getsize(src)
                os.truncate(src, size // 2)
            _announce(name, src, dst)
            _wait_for_release(name)
            if action == "tear":
                raise OSError(errno.EIO, "torn write released without a kill", os.fspath(dst))
    return _real_replace(src, dst, *args, **kwargs)


if _CONTROL:
    _real_replace = os.replace
    os.replace = _replace
