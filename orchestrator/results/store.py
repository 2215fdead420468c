"""The compacted store: finished runs moved out of their many small files into a few large segments, listed by
one manifest (docs/results-store.md has the layout, the evaluation against Delta Lake and Iceberg, and the plan
for a cluster).

A run is written in the live layout (schema.py: its parts, its runs-table row, one writer under the run's
locks). `compaction.compact()` moves finished, complete runs into a segment: their rows in one Parquet file sorted by
(run_id, sample_idx) with row groups cut at run boundaries (one run's rows are read by pruning on run_id), their
runs-table rows in a second file and their per-run metrics (sql.run_metrics_sql over the rows) in a third. The
manifest, replaced atomically, is the commit: a run listed there is compacted, and its live files (present only
between the commit and their removal, e.g. after a crash) are leftovers that every reader ignores and the next
compaction removes. Readers trust the manifest's files (written, fsynced and renamed before the commit) and
check none of them on open; `bca verify` reads them in full.
A sweep's pack of fresh runs skips the live layout: `commit_runs` commits them straight into a segment.

Locks: compaction and `restore` hold the catalog lock, then a run's locks; a writer holds a run's lock and
checks the manifest under it, and never waits for the catalog lock while holding a run's. A run compacted while
its live files changed (a re-run started meanwhile) is given back to the live layout at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from filelock import FileLock

from orchestrator.results import files, schema
from orchestrator.results.atomic import ResultsWriteError, atomic_write, ensure_dir
from orchestrator.results.sql import (CURVE_COLUMNS, PAIRED_STAT_COLUMNS, SEGMENT_METRICS_COLUMNS, baseline_pairs_sql,
                                      concat_runs, paired_rows_sql, paired_statistics_sql, run_curves_sql,
                                      run_metrics_sql, sql_str)

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 1
# Row groups close at the first run boundary past this many rows (a longer run gets row groups of its own).
ROW_GROUP_ROWS = 131_072


class ManifestError(ValueError):
    """The manifest is not one this version wrote (hand-edited or damaged): names the file and what is wrong."""


@dataclass(frozen=True)
class Segment:
    id: str
    rows: int
    runs: int
    metrics_columns: tuple[str, ...]  # the per-run metrics it materialised (sql.RUN_METRICS_COLUMNS when written)

    def path(self, results_dir: Path, kind: str) -> Path:
        return schema.segment_file(results_dir, self.id, kind)


class Catalog:
    """One version of the manifest: the segments, and (read on first use) which runs they hold."""

    def __init__(self, results_dir: Path, segments: tuple[Segment, ...], stamp: tuple | None) -> None:
        self.results_dir = results_dir
        self.segments = segments
        self.stamp = stamp
        self._runs: dict[str, tuple[str, int]] | None = None
        self._lock = threading.Lock()

    def compacted(self) -> dict[str, tuple[str, int]]:
        """run_id -> (segment id, rows) of every compacted run (two small columns per segment's runs file)."""
        with self._lock:
            if self._runs is None:
                runs: dict[str, tuple[str, int]] = {}
                for seg in self.segments:
                    t = pq.read_table(seg.path(self.results_dir, "runs"), columns=["run_id", "n_samples"])
                    for run_id, n in zip(t.column("run_id").to_pylist(), t.column("n_samples").to_pylist()):
                        runs[run_id] = (seg.id, n)
                self._runs = runs
            return self._runs

    def run_row(self, run_id: str) -> dict[str, Any] | None:
        """A compacted run's runs-table row, or None when the run is not compacted."""
        hit = self.compacted().get(run_id)
        if hit is None:
            return None
        seg = next(s for s in self.segments if s.id == hit[0])
        rows = pq.read_table(seg.path(self.results_dir, "runs"), filters=[("run_id", "=", run_id)]).to_pylist()
        return rows[0] if rows else None

    def run_rows(self, run_ids: set[str]) -> dict[str, dict[str, Any]]:
        """run_id -> runs-table row of those of `run_ids` that are compacted (one filtered read per segment)."""
        where = self.compacted()
        out: dict[str, dict[str, Any]] = {}
        for seg in self.segments:
            ids = sorted(r for r in run_ids if where.get(r, ("",))[0] == seg.id)
            if ids:
                table = pq.read_table(seg.path(self.results_dir, "runs"), filters=[("run_id", "in", ids)])
                out.update((row["run_id"], row) for row in table.to_pylist())
        return out

    def paths(self, kind: str) -> list[Path]:
        return [seg.path(self.results_dir, kind) for seg in self.segments]


_CACHE: dict[Path, Catalog] = {}
_CACHE_LOCK = threading.Lock()


def file_stamp(path: Path) -> tuple | None:
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def load_catalog(results_dir: str | Path | None) -> Catalog:
    """The current manifest (one stat when it has not changed since this process last read it)."""
    root = schema.resolve_results_dir(results_dir)
    path = schema.manifest_file(root)
    stamp = file_stamp(path)
    with _CACHE_LOCK:
        hit = _CACHE.get(root)
    if hit is not None and hit.stamp == stamp:
        return hit
    catalog = Catalog(root, _read_manifest(path) if stamp is not None else (), stamp)
    with _CACHE_LOCK:
        _CACHE[root] = catalog
    return catalog


def _read_manifest(path: Path) -> tuple[Segment, ...]:
    try:
        data = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return ()
    except (OSError, ValueError) as e:
        raise ManifestError(f"results manifest {path}: cannot read it as JSON ({e}); `bca verify` says more") from e
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT or not isinstance(data.get("segments"), list):
        raise ManifestError(f"results manifest {path}: expected {{'format': {MANIFEST_FORMAT}, 'segments': [...]}}, "
                            f"got {str(data)[:200]}")
    try:
        return tuple(Segment(str(s["id"]), int(s["rows"]), int(s["runs"]), tuple(s["metrics_columns"]))
                     for s in data["segments"])
    except (KeyError, TypeError, ValueError) as e:
        raise ManifestError(f"results manifest {path}: a segment entry lacks {e} (expected id, rows, runs, "
                            f"metrics_columns)") from e


def write_manifest(root: Path, segments: list[Segment]) -> None:
    body = json.dumps({"format": MANIFEST_FORMAT, "segments": [
        {"id": s.id, "rows": s.rows, "runs": s.runs, "metrics_columns": list(s.metrics_columns)} for s in segments]},
        indent=1)

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(body)

    atomic_write(schema.manifest_file(root), write, "results manifest")


@contextlib.contextmanager
def catalog_lock(root: Path) -> Iterator[None]:
    """Held by whoever changes the manifest (compaction, restore): one at a time, on any node of shared storage."""
    directory = schema.catalog_root(root)
    ensure_dir(directory, "results catalog")
    lock = FileLock(str(directory / ".lock"))
    try:
        lock.acquire()
    except OSError as e:
        raise ResultsWriteError(directory / ".lock", "catalog lock", e) from e
    try:
        yield
    finally:
        lock.release()


def with_run_columns(table: pa.Table, row: dict[str, Any]) -> pa.Table:
    n = table.num_rows
    for col in schema.SEGMENT_RUN_COLUMNS:
        table = table.append_column(pa.field(col.name, col.arrow), pa.array([row.get(col.name)] * n, col.arrow))
    return table


_IDENTITY = ["run_id", "method", "setting_id", "seed", "order_index"]
_PAIR_ROWS = ["run_id", "sample_idx", "image_id", "correct", "is_ood"]


def _metrics(root: Path, samples: pa.Table, runs: pa.Table, others: list[Segment]) -> pa.Table:
    """Per run of a new segment: sql.run_metrics_sql over its rows, and its pairing against the baseline method
    (sql.paired_rows_sql, with its statistics: sql.paired_statistics_sql) where the baseline run is in this segment
    or in one of `others` (read by pruning); null pairing where it is not (the paired view computes those from the
    rows)."""
    import duckdb

    from orchestrator import registry
    from orchestrator.results import stats

    con = duckdb.connect(":memory:")
    stats.register(con)
    try:
        ident = runs.select(_IDENTITY)
        known = [ident] + [pq.read_table(seg.path(root, "runs"), columns=_IDENTITY) for seg in others]
        con.register("seg_samples", samples)
        con.register("seg_runs", runs.select(["run_id", "n_samples"]))
        con.register("seg_ident", ident)
        con.register("all_ident", pa.concat_tables(known, promote_options="permissive"))
        baseline = sql_str(registry.baseline_method())
        pairs = con.sql(baseline_pairs_sql("all_ident", baseline, "seg_ident")).to_arrow_table()
        con.register("pairs", pairs)
        here = set(samples.column("run_id").unique().to_pylist())
        wanted = sorted(set(pairs.column("baseline_run").to_pylist()) - here)
        outside = [pq.read_table(seg.path(root, "samples"), columns=_PAIR_ROWS, filters=[("run_id", "in", wanted)])
                   for seg in others] if wanted else []
        con.register("base_rows", pa.concat_tables([samples.select(_PAIR_ROWS), *outside]))
        cols = ", ".join(f'"{c}"' for c in ("run_id", *SEGMENT_METRICS_COLUMNS))
        pairing = paired_statistics_sql(paired_rows_sql("pairs", "seg_samples", "base_rows"), "NULL")
        return con.sql(f"""
SELECT {cols} FROM ({run_metrics_sql("seg_samples", "seg_runs")}) m
LEFT JOIN ({pairing}) p USING (run_id)
LEFT JOIN ({run_curves_sql("seg_samples")}) c USING (run_id)
ORDER BY run_id""").to_arrow_table()
    finally:
        con.close()


def write_segment(root: Path, samples: pa.Table, runs: pa.Table, others: list[Segment]) -> Segment:
    """Write one segment's three files (atomically each; not yet in the manifest, so invisible); `others`: the
    segments its runs' baselines may be in."""
    order = pc.sort_indices(samples, [("run_id", "ascending"), ("sample_idx", "ascending")])
    samples = samples.take(order).cast(schema.SEGMENT_SAMPLE_ARROW_SCHEMA)
    runs = concat_runs([runs]).sort_by("run_id")
    seg = Segment(f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}", samples.num_rows, runs.num_rows,
                  SEGMENT_METRICS_COLUMNS)
    meta = {schema.META_SCHEMA_VERSION: schema.SCHEMA_VERSION.encode("ascii")}

    def write_samples(tmp: str) -> None:
        run_ids = samples.column("run_id").to_numpy(zero_copy_only=False)
        with pq.ParquetWriter(tmp, samples.schema.with_metadata({**meta, schema.META_KIND: b"segment-samples"}),
                              compression="zstd") as out:
            start = 0
            while start < samples.num_rows:
                stop = min(start + ROW_GROUP_ROWS, samples.num_rows)
                while stop < samples.num_rows and run_ids[stop] == run_ids[stop - 1]:
                    stop += 1  # close the row group at a run boundary
                out.write_table(samples.slice(start, stop - start), row_group_size=stop - start)
                start = stop

    def write_table(table: pa.Table, kind: bytes) -> Any:
        return lambda tmp: pq.write_table(table.replace_schema_metadata({**meta, schema.META_KIND: kind}), tmp,
                                          compression="zstd", row_group_size=ROW_GROUP_ROWS)

    atomic_write(seg.path(root, "samples"), write_samples, "results segment")
    atomic_write(seg.path(root, "runs"), write_table(runs, b"segment-runs"), "results segment runs")
    atomic_write(seg.path(root, "metrics"), write_table(_metrics(root, samples, runs, others), b"segment-metrics"),
                 "results segment metrics")
    return seg


def missing_columns(seg: Segment) -> list[str]:
    """The metrics columns a segment written before they were materialised lacks: the registry's metrics added
    since, its curves, and its stored pairings' statistics."""
    from orchestrator.results.metrics import RUN_METRICS

    have = set(seg.metrics_columns)
    stats = PAIRED_STAT_COLUMNS if "baseline_run" in have else ()
    return [c for c in (*(m.name for m in RUN_METRICS), *CURVE_COLUMNS, *stats) if c not in have]


def add_missing(root: Path, seg: Segment) -> Segment:
    """A segment written before metrics, curves or the pairings' statistics were materialised, with what it lacks
    added to its metrics file: the registry's metrics added since (sql.run_metrics_sql over its rows), its runs'
    curves (sql.run_curves_sql over its rows), the statistics of its stored pairings
    (sql.paired_statistics_sql over their counts: no row read). The file is replaced atomically with the same
    columns and the new ones; the manifest, written by the caller, then lists them (a crash in between leaves a
    file whose extra columns nobody reads)."""
    import duckdb

    from orchestrator.results import stats
    from orchestrator.results.metrics import RUN_METRICS

    path = seg.path(root, "metrics")
    lacking = set(missing_columns(seg))
    add_metrics = [m.name for m in RUN_METRICS if m.name in lacking]
    add_curves, add_stats = bool(lacking & set(CURVE_COLUMNS)), bool(lacking & set(PAIRED_STAT_COLUMNS))
    added = [*add_metrics, *(CURVE_COLUMNS if add_curves else ()), *(PAIRED_STAT_COLUMNS if add_stats else ())]
    metrics = pq.read_table(path).replace_schema_metadata(None)
    metrics = metrics.drop_columns([c for c in added if c in metrics.column_names])
    con = duckdb.connect(":memory:")
    stats.register(con)
    try:
        con.register("seg_metrics", metrics)
        table = "seg_metrics"
        if add_metrics:
            rows = pq.read_table(seg.path(root, "samples"))
            for c in schema.SAMPLE_COLUMNS:  # sample columns added after the segment was written: null there
                if c.name not in rows.column_names:
                    rows = rows.append_column(c.name, pa.nulls(len(rows), c.arrow))
            con.register("seg_rows", rows)
            con.register("seg_runs", pq.read_table(seg.path(root, "runs"), columns=["run_id", "n_samples"]))
            cols = ", ".join(f'r."{c}"' for c in add_metrics)
            table = (f"(SELECT m.*, {cols} FROM {table} m "
                     f"LEFT JOIN ({run_metrics_sql('seg_rows', 'seg_runs')}) r USING (run_id))")
        if add_curves:
            con.register("seg_samples", pq.read_table(seg.path(root, "samples"),
                                                      columns=["run_id", "sample_idx", "correct"]))
            cols = ", ".join(f'c."{c}"' for c in CURVE_COLUMNS)
            table = f"(SELECT m.*, {cols} FROM {table} m LEFT JOIN ({run_curves_sql('seg_samples')}) c USING (run_id))"
        if add_stats:
            counts = "(SELECT * FROM seg_metrics WHERE baseline_run IS NOT NULL)"
            cols = ", ".join(f't."{c}"' for c in PAIRED_STAT_COLUMNS)
            table = (f"(SELECT m.*, {cols} FROM {table} m "
                     f"LEFT JOIN ({paired_statistics_sql(counts, 'NULL')}) t USING (run_id))")
        table = con.sql(f"SELECT * FROM {table} ORDER BY run_id").to_arrow_table()
    finally:
        con.close()
    meta = {schema.META_SCHEMA_VERSION: schema.SCHEMA_VERSION.encode("ascii"), schema.META_KIND: b"segment-metrics"}
    atomic_write(path, lambda tmp: pq.write_table(table.replace_schema_metadata(meta), tmp, compression="zstd",
                                                  row_group_size=ROW_GROUP_ROWS), "results segment metrics")
    return Segment(seg.id, seg.rows, seg.runs, (*seg.metrics_columns, *(c for c in added
                                                                       if c not in seg.metrics_columns)))


def unlink_live(writer: Any, *, folder: bool = True) -> None:
    """Remove a run's live parts and runs-table row; with `folder`, its (then empty) folder and lock files too,
    so that compacted runs leave no file behind. Callers hold the run's locks."""
    for path in writer.samples_dir.iterdir():
        if schema.part_start(path.name) is not None or schema.is_temp_name(path.name):
            path.unlink(missing_ok=True)
    writer.run_path.unlink(missing_ok=True)
    if folder:
        for name in (".lock", ".row.lock"):
            (writer.samples_dir / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty: something not ours is in it, left alone
            writer.samples_dir.rmdir()


def remove_segment_files(root: Path, segments: list[Segment]) -> None:
    for seg in segments:
        for kind in schema.SEGMENT_KINDS:
            seg.path(root, kind).unlink(missing_ok=True)


def segment_tables(root: Path, seg: Segment, drop: set[str] = frozenset()) -> tuple[pa.Table, pa.Table]:
    samples = pq.read_table(seg.path(root, "samples"))
    runs = pq.read_table(seg.path(root, "runs"))
    if drop:
        keep = pa.array(sorted(drop))
        samples = samples.filter(pc.invert(pc.is_in(samples.column("run_id"), keep)))
        runs = runs.filter(pc.invert(pc.is_in(runs.column("run_id"), keep)))
    return samples.replace_schema_metadata(None), runs.replace_schema_metadata(None)


def add_segment(results_dir: str | Path | None, samples: pa.Table, runs: pa.Table) -> Segment:
    """Commit rows and runs-table rows of finished runs that have no live files (generated elsewhere, e.g. by
    benchmarks.scale) as one segment: `samples` with schema.SEGMENT_SAMPLE_ARROW_SCHEMA's columns, `runs` with the
    runs table's. Refused for a run the manifest already holds."""
    root = schema.resolve_results_dir(results_dir)
    with catalog_lock(root):
        catalog = load_catalog(root)
        held = set(catalog.compacted())
        again = sorted(set(runs.column("run_id").to_pylist()) & held)
        if again:
            raise ValueError(f"add_segment: run(s) {again[:5]} are already compacted in {root}")
        seg = write_segment(root, samples, runs, list(catalog.segments))
        write_manifest(root, [*catalog.segments, seg])
    return seg


def commit_runs(results_dir: str | Path | None, runs: list[tuple[pa.Table, pa.Table]]) -> list[str]:
    """Commit finished runs straight into one segment, without live files (a sweep's pack: its runs' rows and
    runs-table rows written once, in one file each, instead of as parts to compact later): each run as (its rows
    in the live parts' schema, from sample 0, all of them; its 'finished' runs-table row, RunWriter.finished_tables).
    A run the manifest already holds (a zombie trial's commit got there first) is left out; returns the run_ids
    committed."""
    root = schema.resolve_results_dir(results_dir)
    with catalog_lock(root):
        # every writer of the catalog's files holds this lock: a temp file there is a killed holder's
        for folder in (schema.catalog_root(root), schema.catalog_root(root) / "segments"):
            for path in folder.glob(f".*{schema.TEMP_SUFFIX}") if folder.is_dir() else ():
                log.warning("removing unfinished temp file %s left by an interrupted commit", path)
                path.unlink(missing_ok=True)
        catalog = load_catalog(root)
        held = catalog.compacted()
        fresh = [(table, row.to_pylist()[0], row) for table, row in runs
                 if row.column("run_id")[0].as_py() not in held]
        if not fresh:
            return []
        samples = pa.concat_tables([with_run_columns(table.replace_schema_metadata(None), row)
                                    for table, row, _ in fresh])
        table = concat_runs([row.replace_schema_metadata(None) for _, _, row in fresh])
        seg = write_segment(root, samples, table, list(catalog.segments))
        write_manifest(root, [*catalog.segments, seg])
    return [row["run_id"] for _, row, _ in fresh]


def drop_runs(root: Path, run_ids: set[str]) -> None:
    """Rewrite the segments holding these runs without them (caller holds the catalog lock)."""
    catalog = load_catalog(root)
    where = catalog.compacted()
    touched = {where[r][0] for r in run_ids if r in where}
    if not touched:
        return
    kept, gone = [], []
    for seg in catalog.segments:
        if seg.id not in touched:
            kept.append(seg)
            continue
        gone.append(seg)
        samples, runs = segment_tables(root, seg, run_ids)
        if runs.num_rows:
            kept.append(write_segment(root, samples, runs, [s for s in catalog.segments if s.id != seg.id]))
    write_manifest(root, kept)
    remove_segment_files(root, gone)


def restore(writer: Any, *, keep_rows: bool) -> None:
    """Give a compacted run back to the live layout (to run it again): its runs-table row and, with keep_rows,
    its rows as one part from 0; then rewrite its segment without it. A no-op for a run not compacted."""
    root = writer.results_dir
    with catalog_lock(root):
        catalog = load_catalog(root)
        hit = catalog.compacted().get(writer.run_id)
        if hit is None:
            return
        seg = next(s for s in catalog.segments if s.id == hit[0])
        path = seg.path(root, "samples")
        rows = pq.read_table(path, filters=[("run_id", "=", writer.run_id)],
                             columns=[c.name for c in schema.SAMPLE_COLUMNS]).sort_by("sample_idx")
        row = catalog.run_row(writer.run_id)
        with writer.lock(), writer.row_lock():
            unlink_live(writer, folder=False)
            if keep_rows and rows.num_rows:
                table = rows.cast(schema.SAMPLE_ARROW_SCHEMA).replace_schema_metadata(
                    {**writer.metadata, schema.META_KIND: b"samples"})
                atomic_write(writer.samples_dir / schema.part_name(0),
                             lambda tmp: pq.write_table(table, tmp, compression="zstd"), "results part")
            writer.write_row(row)
        drop_runs(root, {writer.run_id})


def orphan_files(results_dir: Path) -> list[Path]:
    """Segment files no manifest lists: a compaction killed before its commit, or a replaced segment."""
    root = schema.resolve_results_dir(results_dir)
    listed = {p for kind in schema.SEGMENT_KINDS for p in load_catalog(root).paths(kind)}
    folder = schema.catalog_root(root) / "segments"
    return sorted(p for p in folder.glob("*.parquet") if p not in listed) if folder.is_dir() else []


def segment_runs(results_dir: Path, segment_id: str) -> tuple[list[dict[str, Any]], list[tuple[str, str | None]]]:
    """What a segment's files still say about its runs, whichever of them can be read: (its runs-table rows, from
    its runs file; (run_id, sweep) of each run, from the first readable of its runs, metrics and samples files).
    For naming the runs of a segment no view reads (unreadable, or not in the manifest)."""
    rows: list[dict[str, Any]] = []
    with contextlib.suppress(Exception):  # damaged or missing: the next file may still say
        rows = pq.read_table(schema.segment_file(results_dir, segment_id, "runs")).to_pylist()
    if rows:
        return rows, [(r["run_id"], r.get("sweep")) for r in rows]
    for kind, sweep in (("metrics", "s_sweep"), ("samples", "sweep")):
        with contextlib.suppress(Exception):
            table = pq.read_table(schema.segment_file(results_dir, segment_id, kind), columns=["run_id", sweep])
            pairs = table.group_by(["run_id", sweep]).aggregate([]).to_pylist()
            return [], sorted((p["run_id"], p[sweep]) for p in pairs)
    return [], []


def recorded_finished(results_dir: Path) -> dict[str, tuple[Path, set[str]]]:
    """sweep -> (its record, the run_ids it recorded finished): the runs each sweep's driver saw finished
    (orchestrator.sweep.record), which the store must still hold. Records written before they listed them, or
    unreadable ones, say nothing."""
    out: dict[str, tuple[Path, set[str]]] = {}
    folder = schema.sweeps_root(results_dir)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        stamp = file_stamp(path)
        hit = _RECORDS.get(path)
        if hit is None or hit[0] != stamp:  # a study's record lists 10^5 runs: parsed once per version
            hit = _RECORDS[path] = (stamp, None)
            with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
                data = json.loads(path.read_text("utf-8"))
                if isinstance(data.get("finished"), list) and isinstance(data.get("name"), str):
                    hit = _RECORDS[path] = (stamp, (data["name"], {str(r) for r in data["finished"]}))
        if hit[1] is not None:
            out[hit[1][0]] = (path, hit[1][1])
    return out


_RECORDS: dict[Path, tuple[tuple | None, tuple[str, set[str]] | None]] = {}


def remove_orphans(results_dir: Path, older_than_s: float = 600.0) -> int:
    """Delete orphan segment files older than `older_than_s` (younger ones may belong to a compaction under way),
    but none of a segment holding a run that is nowhere else: its manifest entry was lost (a manifest deleted by
    hand), so it is the only copy, which the readers name as lost (db.ResultsDB.lost)."""
    root = schema.resolve_results_dir(results_dir)
    held = set(load_catalog(root).compacted()) | {
        p.name.removeprefix("run_id=").removesuffix(".parquet") for p in files.run_files(root)}
    only_copy: dict[str, bool] = {}
    now, n = time.time(), 0
    for path in orphan_files(results_dir):
        seg_id = path.name.split(".", 1)[0]
        if seg_id not in only_copy:
            only_copy[seg_id] = any(run_id not in held for run_id, _ in segment_runs(root, seg_id)[1])
        if only_copy[seg_id]:
            continue
        with contextlib.suppress(FileNotFoundError):
            if now - path.stat().st_mtime >= older_than_s:
                os.unlink(path)
                n += 1
    return n


__all__ = ["Catalog", "ManifestError", "Segment", "add_missing", "add_segment", "catalog_lock", "commit_runs",
           "drop_runs", "file_stamp", "load_catalog", "missing_columns", "orphan_files", "recorded_finished",
           "remove_orphans", "remove_segment_files", "restore", "segment_runs", "segment_tables", "unlink_live",
           "with_run_columns", "write_manifest", "write_segment"]
