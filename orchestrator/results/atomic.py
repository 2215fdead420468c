"""Atomic file replacement: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import errno as errno_mod
import os
import uuid
from pathlib import Path
from typing import Callable

from orchestrator.results import schema


class ResultsWriteError(OSError):
    """A results file could not be written; names the file and the OS reason. Earlier files are untouched."""

    def __init__(self, path: Path, what: str, cause: BaseException) -> None:
        code = getattr(cause, "errno", None) or errno_mod.EIO
        reason = getattr(cause, "strerror", None) or str(cause) or type(cause).__name__
        super().__init__(code, reason, str(path))
        self.message = f"cannot write {what} {path}: {reason}"

    def __str__(self) -> str:
        return self.message


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; some filesystems refuse fsync on a directory, which costs durability only.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def ensure_dir(directory: Path, what: str) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ResultsWriteError(directory, f"directory for {what}", e) from e


def atomic_write(path: Path, write: Callable[[str], None], what: str, *, durable: bool = True) -> None:
    """Call write(temp_path) for a temp file beside `path`, fsync it, then os.replace it onto `path` (and fsync
    the folder). durable=False skips both fsyncs: still atomic for every reader, only a power cut may lose it
    (for transient files whose loss the next writer repairs, e.g. a run's 'running' row).

    On any failure the temp file is removed and a ResultsWriteError naming `path` is raised.
    """
    path = Path(path)
    ensure_dir(path.parent, what)
    tmp = path.parent / schema.temp_name(path.name, f"{os.getpid()}.{uuid.uuid4().hex[:8]}")
    try:
        write(str(tmp))
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        if isinstance(e, OSError):
            raise ResultsWriteError(path, what, e) from e
        raise
    if durable:
        _fsync_dir(path.parent)
