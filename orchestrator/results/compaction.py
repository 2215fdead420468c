"""Compaction: finished, complete live runs moved out of their many small files into segments of the compacted
store (`store`: the layout, the manifest and its locks), small segments merged, older segments given what they
lack. Above both the store and the writer: it reads live runs through their writers, under their locks.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.results import files, schema, store
from orchestrator.results.sql import concat_runs
from orchestrator.results.writer import RunWriter, read_run_file

log = logging.getLogger(__name__)

# A segment's size: large enough that a study of 10^5 runs is tens of files, small enough to write in memory.
SEGMENT_ROWS = 4_000_000
# Segments smaller than this are merged once MERGE_FANIN of them exist, so a long sweep's periodic compactions
# do not leave hundreds of small segments (each row is rewritten about log_FANIN(total / first size) times).
SMALL_SEGMENT_ROWS = SEGMENT_ROWS // 4
MERGE_FANIN = 8


@dataclass
class CompactReport:
    runs: int = 0            # runs moved into new segments
    rows: int = 0
    segments: list[str] = field(default_factory=list)
    merged: int = 0          # small segments merged into larger ones
    leftovers: int = 0       # live files of already compacted runs removed
    given_back: list[str] = field(default_factory=list)  # runs whose live files changed while compacting
    upgraded: int = 0        # segments written before curves or pairing statistics were materialised, given them



@dataclass
class _Live:
    """A finished, complete live run as read for compaction, with what must not change before it is removed."""
    writer: Any  # RunWriter
    row: dict[str, Any]
    table: pa.Table
    stamp: tuple


def _live_stamp(writer: Any) -> tuple:
    """What changes when a writer touches the run: its parts and its runs-table row."""
    names = sorted(p.name for p in writer.samples_dir.iterdir()) if writer.samples_dir.is_dir() else []
    return tuple((n, store.file_stamp(writer.samples_dir / n)) for n in names if not n.startswith(".")) + (
        ("row", store.file_stamp(writer.run_path)),)


def _live_runs(root: Path, compacted: dict[str, tuple[str, int]]) -> tuple[list[Any], list[Any]]:
    """(writers of finished live runs, writers of compacted runs whose live files are leftovers)."""
    finished, leftovers = [], []
    for path in files.run_files(root):
        row = read_run_file(path)
        if row is None or not row.get("config_json"):
            continue
        try:
            writer = RunWriter(root, json.loads(row["config_json"]))
        except ValueError as e:  # a hand-made row: left alone, as the views leave it
            log.warning("not compacting %s: its config_json is not a run config (%s)", path, e)
            continue
        if writer.run_id != row["run_id"]:
            continue
        if writer.run_id in compacted:
            leftovers.append(writer)
        elif row.get("status") == "finished":
            finished.append(writer)
    return finished, leftovers


def _read_live(writer: Any) -> _Live | None:
    """A finished run's rows when every one is on disk in complete parts, read under the run's locks."""
    with writer.lock(), writer.row_lock():
        row = writer.read_live_row()
        if row is None or row.get("status") != "finished" or row.get("n_samples") is None:
            return None
        end, stray = writer.scan()
        if end != row["n_samples"] or stray:
            return None
        parts = sorted((p for p in writer.samples_dir.iterdir() if schema.part_start(p.name) is not None),
                       key=lambda p: schema.part_start(p.name))
        tables = [pq.read_table(p, schema=schema.SAMPLE_ARROW_SCHEMA) for p in parts]
        table = pa.concat_tables(tables).replace_schema_metadata(None) if tables else None
        if table is None or table.num_rows != end:
            return None
        return _Live(writer, row, table, _live_stamp(writer))



def _remove_live(writer: Any) -> None:
    """Remove a compacted run's live files (its parts, its runs-table row, its folder), under its locks."""
    with writer.lock(), writer.row_lock():
        store.unlink_live(writer)



def _batches(lives: list[_Live], limit: int) -> Iterator[list[_Live]]:
    batch, rows = [], 0
    for live in lives:
        if batch and rows + live.table.num_rows > limit:
            yield batch
            batch, rows = [], 0
        batch.append(live)
        rows += live.table.num_rows
    if batch:
        yield batch



def compact(results_dir: str | Path | None, *, segment_rows: int = SEGMENT_ROWS, min_runs: int = 1) -> CompactReport:
    """Move every finished, complete live run into segments of at most `segment_rows` rows (a run is never
    split), merge small segments, give segments written before curves or the pairings' statistics were
    materialised what they lack (`add_missing`), and remove leftovers; a no-op below `min_runs` finished live
    runs. Safe beside running writers and readers, on any node of shared storage (see the module docstring)."""
    root = schema.resolve_results_dir(results_dir)
    report = CompactReport()
    if not root.is_dir():
        return report
    with store.catalog_lock(root):
        catalog = store.load_catalog(root)
        segments = list(catalog.segments)
        older = [seg for seg in segments if store.missing_columns(seg)]
        if older:
            upgraded = {seg.id: store.add_missing(root, seg) for seg in older}
            segments = [upgraded.get(seg.id, seg) for seg in segments]
            store.write_manifest(root, segments)
            report.upgraded = len(older)
        finished, leftovers = _live_runs(root, catalog.compacted())
        for writer in leftovers:
            _remove_live(writer)
        report.leftovers = len(leftovers)
        if len(finished) < min_runs:
            finished = []
        lives = [live for w in sorted(finished, key=lambda w: w.run_id) if (live := _read_live(w)) is not None]
        written: list[tuple[store.Segment, list[_Live]]] = []
        for batch in _batches(lives, segment_rows):
            samples = pa.concat_tables([store.with_run_columns(live.table, live.row) for live in batch])
            runs = concat_runs([pa.Table.from_pylist([live.row]) for live in batch])
            written.append((store.write_segment(root, samples, runs, segments + [seg for seg, _ in written]), batch))
        merged_away: list[store.Segment] = []
        small = sorted((s for s in segments if s.rows < SMALL_SEGMENT_ROWS), key=lambda s: s.rows)
        small += [seg for seg, _ in written if seg.rows < SMALL_SEGMENT_ROWS]
        if len(small) >= MERGE_FANIN:
            picked, rows = [], 0
            for seg in sorted(small, key=lambda s: s.rows):
                if picked and rows + seg.rows > segment_rows:
                    break
                picked.append(seg)
                rows += seg.rows
            if len(picked) > 1:
                tables = [store.segment_tables(root, seg) for seg in picked]
                merged = store.write_segment(root, pa.concat_tables([t[0] for t in tables]),
                                        concat_runs([t[1] for t in tables]),
                                        [s for s in segments + [seg for seg, _ in written] if s not in picked])
                merged_away = picked
                report.merged = len(picked)
        picked_ids = {s.id for s in merged_away}
        new = [s for s in segments if s.id not in picked_ids] + [seg for seg, _ in written if seg.id not in picked_ids]
        if merged_away:
            new.append(merged)
        if written or merged_away:
            store.write_manifest(root, new)  # the commit
            store.remove_segment_files(root, merged_away)
        give_back = []
        for seg, batch in written:
            report.segments.append(seg.id)
            for live in batch:
                with live.writer.lock(), live.writer.row_lock():
                    if _live_stamp(live.writer) != live.stamp:
                        give_back.append(live.writer.run_id)  # a writer touched it meanwhile: its live files win
                        continue
                    store.unlink_live(live.writer)
                report.runs += 1
                report.rows += live.table.num_rows
        if give_back:
            store.drop_runs(root, set(give_back))
            report.given_back = give_back
        report.segments = [s for s in report.segments if s not in picked_ids] + ([merged.id] if merged_away else [])
    return report
