"""RunWriter: one run's per-sample parts, its runs-table row and its final state, written so that nothing
half-written is ever visible and a resumed run continues exactly where the complete parts end.

Free of Ray: the sweep calls it from inside trial actors. Parts of one run are written append-only under a
file lock in the run's folder, so two writers of the same run (a retried trial beside a zombie) cannot
interleave or duplicate rows.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import importlib.metadata
import json
import logging
import os
import platform
import socket
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from filelock import FileLock

from orchestrator.results import schema, store
from orchestrator.results.atomic import ResultsWriteError, atomic_write, ensure_dir
from orchestrator.results.files import FileChecker

log = logging.getLogger(__name__)

_VERSIONED = ("numpy", "torch", "open_clip_torch", "ray", "pyarrow", "duckdb", "bca-orchestrator")


@functools.lru_cache(maxsize=1)
def package_versions() -> str:
    """JSON of the versions that matter for reproducing a number, read without importing the packages."""
    out = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return json.dumps(out, sort_keys=True)


def _to_numpy(value: Any, name: str) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor, without importing torch here
        value = value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except Exception as e:
        raise ValueError(f"column {name!r}: cannot convert {type(value).__name__} to an array: {e}") from e


def _int_column(arr: np.ndarray, name: str, dtype: np.dtype) -> np.ndarray:
    if arr.dtype.kind == "b" or arr.dtype.kind not in "iu":
        raise ValueError(f"column {name!r}: expected integers, got dtype {arr.dtype}")
    info = np.iinfo(dtype)
    if arr.size and (arr.min() < info.min or arr.max() > info.max):
        raise ValueError(f"column {name!r}: values {arr.min()}..{arr.max()} do not fit {np.dtype(dtype).name}")
    return arr.astype(dtype)


def _bool_column(arr: np.ndarray, name: str) -> np.ndarray:
    if arr.dtype.kind != "b":
        raise ValueError(f"column {name!r}: expected booleans, got dtype {arr.dtype}")
    return arr


def _top5_column(arr: np.ndarray) -> pa.Array:
    """[n, k] class indices (k <= 5, best first) as a list column."""
    arr = _int_column(arr, "top5", np.int32)
    if not 1 <= arr.shape[1] <= 5:
        raise ValueError(f"column 'top5': expected 1..5 classes per sample, got {arr.shape[1]}")
    offsets = np.arange(0, arr.size + 1, arr.shape[1], dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(arr.reshape(-1)))


def _prob_column(arr: np.ndarray) -> pa.Array:
    """Probabilities of the true class; NaN (an OOD sample has none) is stored as null."""
    if arr.dtype.kind != "f":
        raise ValueError(f"column 'prob_true': expected floats, got dtype {arr.dtype}")
    arr = arr.astype(np.float32)
    return pa.array(arr, pa.float32(), mask=np.isnan(arr))


class RunWriter:
    """Writes one run: RunWriter(results_dir, run_config) (see schema.py for the config's keys)."""

    def __init__(self, results_dir: str | Path | None, run_config: Mapping[str, Any]) -> None:
        self.results_dir = schema.resolve_results_dir(results_dir)
        self.config = schema.RunConfig(run_config)
        self.run_id = self.config.run_id
        self.group_id = schema.group_id(self.config)
        self.setting_id = schema.setting_id(self.config)
        self.config_json = self.config.json
        self.samples_dir = schema.run_samples_dir(self.results_dir, self.config, self.run_id)
        self.run_path = schema.run_file(self.results_dir, self.config.sweep, self.run_id)
        self.state_path = schema.state_file(self.results_dir, self.run_id)
        self._checker = FileChecker()
        self._written: tuple[tuple, dict[str, Any]] | None = None  # (file stamp, row) of this writer's last row
        self.metadata = {
            schema.META_RUN_CONFIG: self.config_json.encode("utf-8"),
            schema.META_RUN_ID: self.run_id.encode("ascii"),
            schema.META_SCHEMA_VERSION: schema.SCHEMA_VERSION.encode("ascii"),
        }

    # ------------------------------------------------------------------------------------------ parts
    @staticmethod
    @contextlib.contextmanager
    def _file_lock(directory: Path, name: str, what: str) -> Iterator[None]:
        ensure_dir(directory, what)
        path = directory / name
        lock = FileLock(str(path))
        try:
            lock.acquire()
        except OSError as e:  # e.g. a read-only or permission-denied results dir: the lock file cannot be opened
            raise ResultsWriteError(path, f"lock file of {what}", e) from e
        try:
            yield
        finally:
            lock.release()

    def lock(self) -> contextlib.AbstractContextManager[None]:
        """The run's parts: held while they are written, scanned or removed."""
        return self._file_lock(self.samples_dir, ".lock", f"run {self.run_id}")

    def row_lock(self) -> contextlib.AbstractContextManager[None]:
        """The run's runs-table row: held while it is written or removed."""
        return self._file_lock(self.samples_dir, ".row.lock", "runs-table row")

    def _compacted(self) -> tuple[str, int] | None:
        """(segment, rows) when the run has been compacted (orchestrator.results.store), else None."""
        return store.load_catalog(self.results_dir).compacted().get(self.run_id)

    def _parts(self) -> list[tuple[int, int | None, Path]]:
        """(start, rows, path) of every part file in stream order, rows None for one that is not a complete,
        readable part. Removes temp files left by killed writers: callers hold the run's lock, so no live writer
        owns them."""
        parts = []
        for path in self.samples_dir.iterdir():
            if schema.is_temp_name(path.name):
                log.warning("removing unfinished temp file %s left by an interrupted writer", path)
                path.unlink(missing_ok=True)
            elif (start := schema.part_start(path.name)) is not None:
                check = self._checker.check(path, "samples")
                parts.append((start, check.num_rows if check is not None and check.ok else None, path))
        return sorted(parts, key=lambda part: part[0])

    def scan(self) -> tuple[int, list[Path]]:
        """(end of the complete contiguous parts from 0, part files outside that prefix)."""
        end, stray = 0, []
        for start, rows, path in self._parts():
            if not stray and rows is not None and start == end:
                end += rows
            else:
                stray.append(path)
        return end, stray

    def rows_done(self) -> int:
        """Rows in complete, readable parts contiguous from stream position 0: where a resumed run goes on."""
        if (compacted := self._compacted()) is not None:
            return compacted[1]
        if not self.samples_dir.is_dir():
            return 0
        with self.lock():
            return self.scan()[0]

    def _samples_table(self, start: int, columns: Mapping[str, Any]) -> pa.Table:
        known = {c.name for c in schema.SAMPLE_COLUMNS}
        unknown = sorted(set(columns) - known)
        if unknown:
            raise ValueError(f"write_part: unknown column(s) {unknown}; valid columns: {sorted(known)}")
        for name in ("image_id", "label", "pred", "confidence"):
            if name not in columns:
                raise ValueError(f"write_part: missing required column {name!r}")
        arrays = {name: _to_numpy(value, name) for name, value in columns.items() if name not in ("image_id", "source")}
        image_ids = list(columns["image_id"])
        lengths = {name: len(a) if a.ndim == (2 if name == "top5" else 1) else None for name, a in arrays.items()}
        lengths |= {"image_id": len(image_ids)} | ({"source": len(columns["source"])} if "source" in columns else {})
        bad_shape = [name for name, n in lengths.items() if n is None]
        if bad_shape:
            raise ValueError(f"write_part: column(s) {bad_shape} must be one-dimensional")
        n = lengths["label"]
        if n == 0 or any(v != n for v in lengths.values()):
            raise ValueError(f"write_part: columns must have the same non-zero length, got {lengths}")
        idx = np.arange(start, start + n, dtype=np.int64)
        label = _int_column(arrays["label"], "label", np.int32)
        pred = _int_column(arrays["pred"], "pred", np.int32)
        correct = label == pred
        if "sample_idx" in arrays and not np.array_equal(_int_column(arrays["sample_idx"], "sample_idx", np.int64),
                                                         idx):
            raise ValueError(f"write_part: sample_idx must be {start}..{start + n - 1} for a part starting at {start}")
        if "correct" in arrays and not np.array_equal(_bool_column(arrays["correct"], "correct"), correct):
            raise ValueError("write_part: column 'correct' disagrees with label == pred")
        if "run_id" in arrays and not (arrays["run_id"] == self.run_id).all():
            raise ValueError(f"write_part: run_id column must be {self.run_id!r} (this writer's run)")
        conf = arrays["confidence"]
        if conf.dtype.kind != "f" or not np.isfinite(conf).all():
            raise ValueError(f"write_part: confidence must be finite floats, got dtype {conf.dtype}")
        cols = {
            "run_id": pa.array([self.run_id] * n, pa.string()),
            "sample_idx": idx,
            "image_id": pa.array(image_ids, pa.string()),
            "label": label,
            "pred": pred,
            "correct": correct,
            "confidence": conf.astype(np.float32),
            "gated": _bool_column(arrays["gated"], "gated") if "gated" in arrays
            else np.full(n, schema.SAMPLE_DEFAULTS["gated"]),
            "gated_prior": _bool_column(arrays["gated_prior"], "gated_prior") if "gated_prior" in arrays
            else np.full(n, schema.SAMPLE_DEFAULTS["gated_prior"]),
            "selected": _int_column(arrays["selected"], "selected", np.int32) if "selected" in arrays
            else np.full(n, schema.SAMPLE_DEFAULTS["selected"], np.int32),
            "top5": _top5_column(arrays["top5"]) if "top5" in arrays else pa.nulls(n, pa.list_(pa.int32())),
            "prob_true": _prob_column(arrays["prob_true"]) if "prob_true" in arrays else pa.nulls(n, pa.float32()),
            "is_ood": _bool_column(arrays["is_ood"], "is_ood") if "is_ood" in arrays
            else np.full(n, schema.SAMPLE_DEFAULTS["is_ood"]),
            "source": pa.array(list(columns["source"]) if "source" in columns else [self.config.dataset] * n,
                               pa.string()),
        }
        table = pa.Table.from_pydict(cols, schema=schema.SAMPLE_ARROW_SCHEMA)
        return table.replace_schema_metadata({**self.metadata, schema.META_KIND: b"samples"})

    def write_part(self, start: int, columns: Mapping[str, Any]) -> int:
        """Write stream rows start..start+n-1 as one part; returns rows_done() after it.

        `columns` holds image_id, label, pred, confidence and optionally gated, gated_prior, selected (defaults
        False, False, -1); sample_idx, correct and run_id are derived (checked when given). Parts are
        append-only: `start` must equal rows_done(); an overlap with rows already written or a gap is refused.
        """
        if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or start < 0:
            raise ValueError(f"write_part: start must be a non-negative integer, got {start!r}")
        start = int(start)
        table = self._samples_table(start, columns)
        with self.lock():
            if (compacted := self._compacted()) is not None:
                raise ValueError(f"write_part: run {self.run_id} is complete and compacted ({compacted[1]} rows in "
                                 f"segment {compacted[0]}); discard_rows() first to write it again")
            end, stray = self.scan()
            n = table.num_rows
            if start < end:
                raise ValueError(f"write_part: rows {start}..{start + n - 1} overlap rows 0..{end - 1} already "
                                 f"written for run {self.run_id} in {self.samples_dir}")
            if start > end:
                raise ValueError(f"write_part: part starting at {start} would leave rows {end}..{start - 1} missing "
                                 f"for run {self.run_id} (rows_done() = {end}); parts must be written in order")
            for path in stray:
                # Only reachable by hand-made damage: a bad part or one past a gap. The resumed stream rewrites it.
                log.warning("removing %s: not part of the complete parts 0..%d of run %s", path, end - 1, self.run_id)
                path.unlink(missing_ok=True)
            path = self.samples_dir / schema.part_name(start)
            atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"), "results part")
            return end + n

    # ------------------------------------------------------------------------------ shards of one run
    # An order-free run may be written by several writers at once, each filling its own range of the stream
    # (orchestrator.sweep.shard): each writes only rows no complete part holds, so together they leave the
    # contiguous parts from 0 that `rows_done` and `complete` count, and a resumed shard fills what is missing.

    def missing(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The row ranges [a, b) within [lo, hi) that no complete part holds (none once compacted)."""
        if self._compacted() is not None:
            return []
        held = []
        if self.samples_dir.is_dir():
            with self.lock():
                held = [(start, start + rows) for start, rows, _ in self._parts() if rows is not None]
        gaps, at = [], lo
        for start, end in held:
            if start > at and at < hi:
                gaps.append((at, min(start, hi)))
            at = max(at, end)
        if at < hi:
            gaps.append((at, hi))
        return gaps

    def fill_part(self, start: int, columns: Mapping[str, Any]) -> None:
        """Write stream rows start..start+n-1 (columns as `write_part`) as one part where no complete part holds
        any of them: a shard's writer fills its own range while other shards fill theirs. An overlap with a
        complete part (a zombie writer of the same range got there first) is refused; a damaged part starting
        inside the range is replaced."""
        if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or start < 0:
            raise ValueError(f"fill_part: start must be a non-negative integer, got {start!r}")
        start = int(start)
        table = self._samples_table(start, columns)
        end = start + table.num_rows
        with self.lock():
            if (compacted := self._compacted()) is not None:
                raise ValueError(f"fill_part: run {self.run_id} is complete and compacted ({compacted[1]} rows in "
                                 f"segment {compacted[0]}); discard_rows() first to write it again")
            parts = self._parts()
            for first, rows, _ in parts:
                if rows is not None and first < end and start < first + rows:
                    raise ValueError(f"fill_part: rows {start}..{end - 1} overlap rows {first}..{first + rows - 1} "
                                     f"already written for run {self.run_id} in {self.samples_dir}")
            for first, rows, path in parts:
                if rows is None and start <= first < end:
                    log.warning("removing damaged part %s of run %s: rows %d..%d are written again", path,
                                self.run_id, start, end - 1)
                    path.unlink(missing_ok=True)
            path = self.samples_dir / schema.part_name(start)
            atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"), "results part")

    def read_columns(self, names: list[str]) -> pa.Table:
        """Columns `names` of the run's complete parts from 0, in stream order (live files: a run is compacted
        only once finished)."""
        if (compacted := self._compacted()) is not None:
            raise ValueError(f"read_columns: run {self.run_id} is compacted (segment {compacted[0]}); query it "
                             f"through orchestrator.results.db")
        if not self.samples_dir.is_dir():
            return schema.SAMPLE_ARROW_SCHEMA.empty_table().select(names)
        with self.lock():
            end, _ = self.scan()
            paths = [path for start, rows, path in self._parts() if rows is not None and start < end]
            tables = [pq.read_table(path, columns=names) for path in paths]
        return pa.concat_tables(tables) if tables else schema.SAMPLE_ARROW_SCHEMA.empty_table().select(names)

    # -------------------------------------------------------------------------------------- runs table
    def read_row(self) -> dict[str, Any] | None:
        """This run's current runs-table row, or None when none was written (or it is unreadable)."""
        return read_run(self.results_dir, self.config.sweep, self.run_id)

    def read_live_row(self) -> dict[str, Any] | None:
        # The row this writer wrote last, while its file is still that one (same inode, time and size: no other
        # writer replaced it since); else read from disk. Spares a pack's finishing runs a read each.
        if self._written is not None and self._written[0] == _file_stamp(self.run_path):
            return dict(self._written[1])
        return read_run_file(self.run_path, self.run_id)

    def status(self) -> str | None:
        """'running', 'finished', 'failed', or None for a run never marked: the sweep skips 'finished'."""
        row = self.read_row()
        return None if row is None else row.get("status")

    def complete(self) -> bool:
        """Finished with every row on disk (n_samples rows in complete parts from 0). A 'finished' run whose parts
        were truncated or removed since is not complete: `bca sweep --resume` re-runs what is missing."""
        if self._compacted() is not None:
            return True  # only finished, complete runs are compacted; `bca verify` checks the segments
        row = self.read_row()
        return (row is not None and row.get("status") == "finished"
                and (row.get("n_samples") is None or self.rows_done() == row["n_samples"]))

    def discard_rows(self) -> None:
        """Remove every part of the run (to run it again from the start, e.g. on a changed dataset)."""
        if self._compacted() is not None:
            store.restore(self, keep_rows=False)
        if not self.samples_dir.is_dir():
            return
        with self.lock():
            for path in self.samples_dir.iterdir():
                if schema.part_start(path.name) is not None:
                    path.unlink(missing_ok=True)

    def base_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {c.name: None for c in schema.run_columns()}
        row.update(run_id=self.run_id, config_hash=self.run_id, group_id=self.group_id, setting_id=self.setting_id,
                   config_json=self.config_json)
        row.update({c.name: schema.canonical_json(v) if isinstance(v := self.config.get(c.name, c.missing),
                                                                   (dict, list)) else v
                    for c in schema.IDENTITY_COLUMNS})
        for name, value in self.config.hparams.items():
            row[name] = json.dumps(value) if isinstance(value, (list, dict)) else value
        return row

    def mark(self, status: str, **fields: Any) -> None:
        """Set the run's status (running | finished | failed) and metrics, rewriting its row atomically.

        Keyword fields are the metric columns (schema.METRIC_NAMES): n_samples, error, accuracy (%),
        last50_accuracy (%), samples_per_s, time_encoder_s, time_logits_s, time_posterior_s, time_update_s,
        peak_mem_mb. 'running' starts a fresh attempt (metrics and error cleared; started_at kept from the first
        attempt); 'failed' needs error=...; 'finished' checks rows_done() == n_samples when n_samples is known.
        """
        if status not in schema.STATUSES:
            raise ValueError(f"mark: status must be one of {list(schema.STATUSES)}, got {status!r}")
        unknown = sorted(set(fields) - set(schema.METRIC_NAMES))
        if unknown:
            raise ValueError(f"mark: unknown field(s) {unknown}; valid fields: {list(schema.METRIC_NAMES)}")
        fields = {k: self._coerce_metric(k, v) for k, v in fields.items()}
        while True:
            if self._compacted() is not None:
                store.restore(self, keep_rows=True)  # marking a compacted run runs it again: back to live files
            row = self._new_row(status, fields)
            with self.row_lock():
                if self._compacted() is not None:
                    continue  # compacted between the check and the lock: restore it first
                # a 'running' row is transient: lost to a power cut, the run reads as not started, which a resume
                # runs the same way; the fsyncs of every other status are kept (a sweep of small runs pays two
                # fsyncs fewer per run). A killed attempt's temp row goes when the next attempt starts ('running')
                # or the run is marked failed, not on the hot path's 'finished' (a scan of the runs folder).
                self.write_row(row, durable=status != "running", clean=status != "finished")
                return

    def _new_row(self, status: str, fields: Mapping[str, Any]) -> dict[str, Any]:
        previous = self.read_live_row()
        row = self.base_row()
        now = dt.datetime.now(dt.timezone.utc)
        if previous is not None:
            row.update({k: previous.get(k) for k in ("started_at", "n_samples", *schema.METRIC_NAMES)})
        if status == "running":
            row.update({k: None for k in schema.METRIC_NAMES if k != "n_samples"})
            row["started_at"] = row["started_at"] or now
        else:
            row["finished_at"] = now
        row.update(fields)
        if status == "failed" and not row.get("error"):
            raise ValueError("mark('failed'): pass error='...' saying what went wrong")
        if status == "finished":
            row["error"] = None
            expected, done = row.get("n_samples"), self.rows_done()
            if expected is not None and done != expected:
                raise ValueError(f"mark('finished'): run {self.run_id} has {done} complete rows but n_samples = "
                                 f"{expected}; write the missing parts first")
        row.update(status=status, updated_at=now, host=socket.gethostname(), versions=package_versions())
        return row

    def write_row(self, row: Mapping[str, Any], durable: bool = True, clean: bool = True) -> None:
        """Replace the run's runs-table file with `row` (caller holds the row lock). With `clean`, a temp file of
        the row found here was left by a killed writer (e.g. a trial's progress update when its sweep was
        killed): removed. (A scan of the sweep's runs folder, which holds a file per live run: not on every
        write.)"""
        table = pa.Table.from_pylist([dict(row)], schema=schema.run_table_schema(self.config.hparams))
        table = table.replace_schema_metadata({**self.metadata, schema.META_KIND: b"runs"})
        prefix = f".{self.run_path.name}."
        if clean and self.run_path.parent.is_dir():
            with os.scandir(self.run_path.parent) as entries:
                stale = [Path(e.path) for e in entries if e.name.startswith(prefix) and schema.is_temp_name(e.name)]
            for path in stale:
                log.warning("removing unfinished temp file %s left by an interrupted writer", path)
                path.unlink(missing_ok=True)
        self._written = None
        # One row: dictionaries and statistics would only make the file larger and slower to write.
        atomic_write(self.run_path, lambda tmp: pq.write_table(table, tmp, use_dictionary=False,
                                                               write_statistics=False),
                     "runs-table row", durable=durable)
        self._written = (_file_stamp(self.run_path), dict(row))

    def finished_tables(self, columns: Mapping[str, Any], started_at: dt.datetime, **fields: Any
                        ) -> tuple[pa.Table, pa.Table]:
        """The run's rows (every one, from stream position 0; `columns` as write_part's) and its 'finished'
        runs-table row (`fields` as mark's), for store.commit_runs to commit straight into a segment, with no live
        file written. Refused for a run that has live parts (it goes on through them instead)."""
        unknown = sorted(set(fields) - set(schema.METRIC_NAMES))
        if unknown:
            raise ValueError(f"finished_tables: unknown field(s) {unknown}; valid fields: {list(schema.METRIC_NAMES)}")
        table = self._samples_table(0, columns)
        if self._compacted() is None and self.rows_done():
            raise ValueError(f"finished_tables: run {self.run_id} has live parts in {self.samples_dir}; expected "
                             f"its rows written through them")
        if fields.get("n_samples") not in (None, table.num_rows):
            raise ValueError(f"finished_tables: n_samples = {fields['n_samples']} but {table.num_rows} rows given")
        row = self.base_row()
        now = dt.datetime.now(dt.timezone.utc)
        row.update({k: self._coerce_metric(k, v) for k, v in fields.items()})
        row.update(status="finished", error=None, started_at=started_at, finished_at=now, updated_at=now,
                   host=socket.gethostname(), versions=package_versions())
        runs = pa.Table.from_pylist([row], schema=schema.run_table_schema(self.config.hparams))
        return table, runs

    @staticmethod
    def _coerce_metric(name: str, value: Any) -> Any:
        if value is None:
            return None
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            value = value.item()
        arrow = next(c.arrow for c in schema.METRIC_COLUMNS if c.name == name)
        if pa.types.is_string(arrow):
            return str(value)
        if pa.types.is_integer(arrow):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"mark: {name} must be a non-negative integer, got {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"mark: {name} must be a number, got {value!r}")
        return float(value)

    # ------------------------------------------------------------------------------------------- state
    def save_state(self, state: Mapping[str, Any]) -> Path:
        """Save the run's final state (V, C1, C2, class_ids, U, ...: name -> numeric array) as state.npz."""
        if not state:
            raise ValueError("save_state: state is empty; expected arrays such as V, C1, C2, class_ids")
        arrays = {}
        for name, value in state.items():
            if not isinstance(name, str) or not name.isidentifier() or name == "run_config":
                raise ValueError(f"save_state: {name!r} is not a valid array name")
            arr = _to_numpy(value, name)
            if arr.dtype.kind not in "biuf":
                raise ValueError(f"save_state: {name!r} must be numeric, got dtype {arr.dtype}")
            arrays[name] = arr
        arrays["run_config"] = np.array(self.config_json)

        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)

        atomic_write(self.state_path, write, "state artifact")
        return self.state_path


def _file_stamp(path: Path) -> tuple | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def read_run(results_dir: str | Path | None, sweep: str, run_id: str) -> dict[str, Any] | None:
    """A run's runs-table row as a dict (from its segment once compacted), or None when it has none or its file
    is unreadable."""
    root = schema.resolve_results_dir(results_dir)
    compacted = store.load_catalog(root).run_row(run_id)
    if compacted is not None:
        return compacted
    return read_run_file(schema.run_file(root, sweep, run_id), run_id)


def read_run_file(path: Path, run_id: str | None = None) -> dict[str, Any] | None:
    """The row of a live runs-table file (of `run_id` when given), or None when absent or unreadable."""
    try:
        rows = pq.ParquetFile(path).read(use_threads=False).to_pylist()  # one row: threads cost more than they give
    except FileNotFoundError:
        return None
    except Exception as e:
        log.warning("ignoring unreadable runs-table file %s: %s", path, e)
        return None
    return rows[0] if rows and (run_id is None or rows[0].get("run_id") == run_id) else None


def load_state(results_dir: str | Path | None, run_id: str) -> dict[str, np.ndarray]:
    """A run's saved state arrays (without the stored config); FileNotFoundError names the path if absent."""
    path = schema.state_file(schema.resolve_results_dir(results_dir), run_id)
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files if k != "run_config"}


__all__ = ["RunWriter", "ResultsWriteError", "read_run", "read_run_file", "load_state", "package_versions"]
