"""Atomic file replacement: a reader sees the old file or the new one, never half of one.

Durability: each durable write fsyncs its file and its folder before returning. A writer of many small files
(a pack's runs) may defer that inside `durable_batch()`: its durable writes then skip their own fsyncs, and the
batch's `barrier()` makes every file written so far durable at once, with one syncfs per filesystem instead of
two fsyncs per file. A caller puts a barrier wherever a later write must not outlive an earlier one in a power
cut (a run's parts and state before its 'finished' row); the batch ends with one. Where syncfs is missing (not
Linux) the batch is a no-op and every write fsyncs as before.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import errno as errno_mod
import os
import uuid
from pathlib import Path
from typing import Callable, Iterator

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


def _load_syncfs() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syncfs
    except (OSError, AttributeError):
        return None


_SYNCFS = _load_syncfs()


class DurableBatch:
    """Folders holding files written (durable) since the last barrier; see the module docstring."""

    def __init__(self) -> None:
        self.folders: dict[int, Path] = {}  # st_dev -> a folder on that filesystem

    def note(self, folder: Path) -> None:
        try:
            self.folders.setdefault(os.stat(folder).st_dev, folder)
        except OSError:
            self.folders.setdefault(-1 - len(self.folders), folder)

    def barrier(self) -> None:
        """Every file written in the batch so far is on stable storage when this returns (one syncfs each
        filesystem), or a ResultsWriteError names the folder."""
        folders, self.folders = list(self.folders.values()), {}
        for folder in folders:
            try:
                fd = os.open(folder, os.O_RDONLY)
            except OSError as e:
                raise ResultsWriteError(folder, "results folder (to make its files durable)", e) from e
            try:
                if _SYNCFS(fd) != 0:
                    code = ctypes.get_errno()
                    raise ResultsWriteError(folder, "results folder (syncfs)", OSError(code, os.strerror(code)))
            finally:
                os.close(fd)


_BATCH: contextvars.ContextVar[DurableBatch | None] = contextvars.ContextVar("bca_durable_batch", default=None)


@contextlib.contextmanager
def durable_batch() -> Iterator[DurableBatch | None]:
    """Defer the fsyncs of durable writes to the batch's barriers (the last one on leaving, also on an error,
    so nothing written inside stays volatile); None where syncfs is not available (writes fsync as usual)."""
    if _SYNCFS is None or _BATCH.get() is not None:
        yield _BATCH.get()
        return
    batch = DurableBatch()
    token = _BATCH.set(batch)
    try:
        yield batch
    except BaseException:
        _BATCH.reset(token)
        with contextlib.suppress(OSError):  # the error that ended the batch matters more
            batch.barrier()
        raise
    _BATCH.reset(token)
    batch.barrier()


def ensure_dir(directory: Path, what: str) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ResultsWriteError(directory, f"directory for {what}", e) from e


def atomic_write(path: Path, write: Callable[[str], None], what: str, *, durable: bool = True) -> None:
    """Call write(temp_path) for a temp file beside `path`, fsync it, then os.replace it onto `path` (and fsync
    the folder). durable=False skips both fsyncs: still atomic for every reader, only a power cut may lose it
    (for transient files whose loss the next writer repairs, e.g. a run's 'running' row). Inside a
    `durable_batch()` a durable write leaves its fsyncs to the batch's next barrier.

    On any failure the temp file is removed and a ResultsWriteError naming `path` is raised.
    """
    path = Path(path)
    ensure_dir(path.parent, what)
    batch = _BATCH.get() if durable else None
    if batch is not None:
        durable = False  # the batch's next barrier makes it durable
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
    elif batch is not None:
        batch.note(path.parent)
