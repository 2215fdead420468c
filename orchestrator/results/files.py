"""Finding the results' Parquet files and telling complete ones from bad ones.

A file is good when pyarrow can read its footer (a truncated or half-copied file has none), it has rows and
the columns its kind needs, and for a sample part its sample_idx statistics match the range its name claims.
Checks are cached by (path, mtime, size), so re-scanning a results dir costs one stat per file.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from orchestrator.results import schema


@dataclass(frozen=True)
class FileCheck:
    path: Path
    ok: bool
    error: str | None = None
    num_rows: int = 0
    columns: dict[str, str] = field(default_factory=dict)  # name -> arrow type, as written
    metadata: dict[str, str] = field(default_factory=dict)  # the file's bca.* key-value metadata


def _sample_idx_range(meta: pq.FileMetaData, col: int) -> tuple[int, int] | None:
    lo = hi = None
    for rg in range(meta.num_row_groups):
        stats = meta.row_group(rg).column(col).statistics
        if stats is None or not stats.has_min_max:
            return None
        lo = stats.min if lo is None else min(lo, stats.min)
        hi = stats.max if hi is None else max(hi, stats.max)
    return (lo, hi) if lo is not None else None


def check_file(path: Path, kind: str) -> FileCheck:
    """Read `path`'s footer and check it against what a `kind` ('samples' or 'runs') file must hold."""
    try:
        pf = pq.ParquetFile(path)
        meta = pf.metadata
        arrow_schema = pf.schema_arrow
    except Exception as e:  # any footer failure means the file is not a complete Parquet file
        return FileCheck(path, False, f"unreadable Parquet footer: {e}")
    columns = {f.name: str(f.type) for f in arrow_schema}
    kv = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in (arrow_schema.metadata or {}).items()
          if k.startswith(b"bca.")}
    required = schema.SAMPLE_REQUIRED if kind == "samples" else schema.RUN_REQUIRED
    missing = [c for c in required if c not in columns]
    if missing:
        return FileCheck(path, False, f"missing required column(s) {missing}", meta.num_rows, columns, kv)
    if meta.num_rows == 0:
        return FileCheck(path, False, "no rows", 0, columns, kv)
    if kind == "samples":
        start = schema.part_start(path.name)
        if start is None:
            return FileCheck(path, False, "name is not part-<start:09d>.parquet", meta.num_rows, columns, kv)
        span = _sample_idx_range(meta, arrow_schema.get_field_index("sample_idx"))
        expected = (start, start + meta.num_rows - 1)
        if span is not None and tuple(span) != expected:
            return FileCheck(path, False, f"sample_idx spans {span[0]}..{span[1]} but the name and row count "
                                          f"say {expected[0]}..{expected[1]}", meta.num_rows, columns, kv)
    return FileCheck(path, True, None, meta.num_rows, columns, kv)


class FileChecker:
    """check_file (and deep_check) with a cache keyed by (path, mtime_ns, size); safe to share between threads."""

    def __init__(self) -> None:
        self._cache: dict[Path, tuple[int, int, FileCheck]] = {}
        self._deep: dict[Path, tuple[int, int, FileCheck]] = {}
        self._lock = threading.Lock()

    def _cached(self, cache: dict, path: Path, compute) -> FileCheck | None:
        """compute((mtime_ns, size)) memoised in `cache` until the file changes; None when it vanished meanwhile
        (e.g. replaced by a resumed writer)."""
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        key = (st.st_mtime_ns, st.st_size)
        with self._lock:
            hit = cache.get(path)
        if hit is not None and hit[:2] == key:
            return hit[2]
        result = compute(key)
        with self._lock:
            cache[path] = (*key, result)
        return result

    def check(self, path: Path, kind: str) -> FileCheck | None:
        """The file's check (footer, columns, row range), or None when it vanished meanwhile."""
        return self._cached(self._cache, path, lambda key: check_file(path, kind))

    def deep_check(self, path: Path, kind: str) -> FileCheck | None:
        """check() plus reading every page of the file: finds damage the footer does not reveal. Cached."""
        shallow = self.check(path, kind)
        if shallow is None or not shallow.ok:
            return shallow

        def read_all(key: tuple[int, int]) -> FileCheck:
            try:
                pq.ParquetFile(path).read()
                return shallow
            except Exception as e:
                bad = FileCheck(path, False, f"unreadable data: {str(e).splitlines()[0]}")
                with self._lock:
                    self._cache[path] = (*key, bad)
                return bad

        return self._cached(self._deep, path, read_all)

    def mark_bad(self, path: Path, error: str) -> None:
        """Record a failure found while reading data (past the footer), until the file changes."""
        try:
            st = path.stat()
        except FileNotFoundError:
            return
        with self._lock:
            self._cache[path] = (st.st_mtime_ns, st.st_size, FileCheck(path, False, error))


def sample_parts(results_dir: Path) -> list[Path]:
    return sorted(Path(results_dir).glob(schema.SAMPLES_GLOB))


def run_files(results_dir: Path) -> list[Path]:
    return sorted(Path(results_dir).glob(schema.RUNS_GLOB))


def temp_files(results_dir: Path) -> list[Path]:
    """Leftovers of writes that never finished (a killed writer), anywhere under the results dir."""
    out = []
    for root, _dirs, names in os.walk(results_dir):
        out += [Path(root) / n for n in names if schema.is_temp_name(n)]
    return sorted(out)
