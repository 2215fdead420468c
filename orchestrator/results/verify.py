"""`bca verify`: everything in a results dir that would make a number wrong or a resume necessary.

Problems found (each names its file or run):
  bad_part         a sample part that is truncated, unreadable, or inconsistent with its name (fully read)
  bad_run_file     a runs-table file that cannot be read
  temp_file        a temp file older than a minute: a write that never finished (a live writer's are younger)
  missing_rows     a run whose rows (in good parts) differ from its n_samples, whatever its status, or an
                   unfinished run with no rows
  duplicate_rows   a (run_id, sample_idx) present more than once
  gap              stream positions missing before a run's last row
  foreign_rows     rows whose run_id differs from the run folder they are in
  no_run_row       sample parts of a run that has no runs-table row
  bad_segment      a compacted segment file (catalog/segments) that is missing, truncated or unreadable
  stale_metrics    a compacted run whose materialised metrics differ from those recomputed from its rows
  leftover         live files of a run already compacted (a compaction stopped before removing them; the next
                   `bca compact` removes them, and no view reads them meanwhile)
  orphan_segment   a segment file older than a minute that the manifest does not list (a compaction killed
                   before its commit; the next `bca compact` removes it)
  inconsistent_rows  rows whose `correct` is not pred = label (a writer never stores such a row: edited by hand)
  lost_runs        runs the results dir committed that no view reads (ResultsDB.lost): in an unreadable segment,
                   in segment files the manifest does not list and nowhere else, rows without a runs-table row,
                   or recorded finished by a sweep and held by no file
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from orchestrator.results import files, schema, store
from orchestrator.results.db import ResultsDB
from orchestrator.results.sql import (CURVE_COLUMNS, PAIRED_COLUMNS, PAIRED_STAT_COLUMNS, RUN_METRICS_COLUMNS,
                                      paired_rows_sql, paired_statistics_sql, run_curves_sql, run_metrics_sql, sql_str)

TEMP_GRACE_S = 60.0


@dataclass(frozen=True)
class Problem:
    kind: str
    where: str  # a file path or a run id
    detail: str


@dataclass
class VerifyReport:
    results_dir: Path
    problems: list[Problem] = field(default_factory=list)
    parts: int = 0
    segments: int = 0
    runs: int = 0
    rows: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_results(results_dir: str | Path | None = None, temp_grace_s: float = TEMP_GRACE_S) -> VerifyReport:
    """Check every part (footer and all pages), every runs-table row, and each run's rows against n_samples."""
    root = schema.resolve_results_dir(results_dir)
    report = VerifyReport(root)
    if not root.exists():
        return report
    checker = files.FileChecker()
    catalog = store.load_catalog(root)
    parts = files.sample_parts(root)
    report.parts = len(parts)
    good = []
    segments = []
    report.segments = len(catalog.segments)
    for seg in catalog.segments:
        bad = _segment_problem(root, seg)
        if bad:
            report.problems.append(Problem("bad_segment", bad[0], bad[1]))
        else:
            segments.append(seg)
    # the runs the readable segments hold (a bad segment's runs are named by `lost_runs` below)
    compacted = {run_id for seg in segments
                 for run_id in pq.read_table(seg.path(root, "runs"), columns=["run_id"]).column(0).to_pylist()}
    for path in parts:
        run_id = path.parent.name.removeprefix("run_id=")
        if run_id in compacted:
            report.problems.append(Problem("leftover", str(path), f"run {run_id} is compacted; this part is not read"))
            continue
        check = checker.deep_check(path, "samples")
        if check is not None and not check.ok:
            report.problems.append(Problem("bad_part", str(path), check.error or "bad file"))
        elif check is not None:
            good.append(path)
    for path in files.run_files(root):
        if path.name.removeprefix("run_id=").removesuffix(".parquet") in compacted:
            report.problems.append(Problem("leftover", str(path), "the run is compacted; this row is not read"))
            continue
        check = checker.check(path, "runs")
        if check is not None and not check.ok:
            report.problems.append(Problem("bad_run_file", str(path), check.error or "bad file"))
    now = time.time()
    # leftovers of a write, past the grace a writer still working on them could need
    for kind, paths, what in (("temp_file", files.temp_files(root), "unfinished write"),
                              ("orphan_segment", store.orphan_files(root), "not in the manifest")):
        for path in paths:
            try:
                age = now - path.stat().st_mtime
            except FileNotFoundError:
                continue
            if age >= temp_grace_s:
                report.problems.append(Problem(kind, str(path), f"{what}, {age:.0f} s old"))

    with ResultsDB(root) as db:
        per_run = _per_run(db, good, [seg.path(root, "samples") for seg in segments])
        runs = db.sql("SELECT run_id, n_samples, status, error FROM runs").to_pylist()
        for seg in segments:
            report.problems += _metrics_problems(db, root, seg)
        for lost in db.lost():
            if lost.kind == "no_run_row":
                continue  # named run by run below
            report.problems.append(Problem("lost_runs", lost.where, f"{lost.count} run(s) {lost.why}"
                                           + (f" ({lost.detail})" if lost.detail else "") + ": "
                                           + (", ".join(lost.run_ids) or "their ids are in no readable file")))
    report.runs = len(runs)
    seen = set()
    for r in per_run:
        run_id, seen_rows = r["run_id"], r["n_rows"]
        seen.add(run_id)
        report.rows += seen_rows
        if r["foreign_rows"]:
            report.problems.append(Problem("foreign_rows", run_id, f"{r['foreign_rows']} row(s) in another run's folder"))
        if r["miscounted"]:
            report.problems.append(Problem("inconsistent_rows", run_id, f"{r['miscounted']} row(s) whose correct "
                                                                        f"disagrees with pred = label"))
        if r["n_distinct"] != seen_rows:
            report.problems.append(Problem("duplicate_rows", run_id,
                                           f"{seen_rows - r['n_distinct']} duplicate (run_id, sample_idx) row(s)"))
        if r["max_idx"] is not None and r["max_idx"] + 1 != r["n_distinct"]:
            report.problems.append(Problem("gap", run_id, f"{r['max_idx'] + 1 - r['n_distinct']} stream position(s) "
                                                          f"missing before position {r['max_idx']}"))
        if not r["has_row"]:
            report.problems.append(Problem("no_run_row", run_id, f"{seen_rows} row(s) but no runs-table row"))
        elif r["n_samples"] is not None and r["n_distinct"] != r["n_samples"]:
            report.problems.append(Problem("missing_rows", run_id, f"{r['status']}: {r['n_distinct']} of "
                                                                   f"{r['n_samples']} rows present"))
    for r in runs:
        if r["run_id"] not in seen and r["n_samples"]:
            report.problems.append(Problem("missing_rows", r["run_id"],
                                           f"{r['status']}: 0 of {r['n_samples']} rows present"))
        elif r["run_id"] not in seen and r["status"] != "finished":
            # stopped before its length was known (e.g. its dataset could not be read): every row is missing
            why = (r["error"] or "").strip().splitlines()
            report.problems.append(Problem("missing_rows", r["run_id"], f"{r['status']}: no rows written"
                                                                       + (f" ({why[-1]})" if why else "")))
    # every run not finished is named, also one with all its rows (a sweep stopped before it was recorded finished)
    named = {problem.where for problem in report.problems}
    for r in runs:
        if r["status"] != "finished" and r["run_id"] not in named:
            why = (r["error"] or "").strip().splitlines()
            report.problems.append(Problem("not_finished", r["run_id"], f"{r['status'] or 'no status'}"
                                                                        + (f": {why[-1]}" if why else "")))
    return report


_PER_RUN_SQL = """
SELECT s.run_id, count(*) AS n_rows, count(DISTINCT s.sample_idx) AS n_distinct, max(s.sample_idx) AS max_idx,
       any_value(r.n_samples) AS n_samples, any_value(r.status) AS status, bool_or(r.run_id IS NOT NULL) AS has_row,
       count(*) FILTER (WHERE s.correct IS DISTINCT FROM (s.pred = s.label)) AS miscounted,
       count(*) FILTER (WHERE s.filename IS NOT NULL
                        AND s.run_id IS DISTINCT FROM regexp_extract(s.filename, 'run_id=([^/]+)/', 1)) AS foreign_rows
FROM {source} s
LEFT JOIN (SELECT run_id, any_value(n_samples) AS n_samples, any_value(status) AS status FROM runs GROUP BY run_id) r
  USING (run_id)
GROUP BY s.run_id
"""


def _per_run(db: ResultsDB, good: list[Path], segments: list[Path]) -> list[dict]:
    """_PER_RUN_SQL's row per run, counted over the live parts together and over each segment alone: a run is never
    split between segments, so memory holds one segment's distinct positions at a time, not a study's 2 x 10^8
    (benchmarks/logs/scale-2026-11-27.txt). A run found in more than one of them (written twice) is counted again
    over all its rows."""
    sources = ([_rows_source(good, [])] if good else []) + [_rows_source([], [path]) for path in segments]
    found: dict[str, dict] = {}
    again: set[str] = set()
    for source in sources:
        for r in db.sql(_PER_RUN_SQL.format(source=source)).to_pylist():
            if r["run_id"] in found:
                again.add(r["run_id"])
            found[r["run_id"]] = r
    if again:
        ids = ", ".join(map(sql_str, sorted(again)))
        source = f"(SELECT * FROM {_rows_source(good, segments)} WHERE run_id IN ({ids}))"
        found.update((r["run_id"], r) for r in db.sql(_PER_RUN_SQL.format(source=source)).to_pylist())
    return list(found.values())


def _rows_source(good: list[Path], segments: list[Path]) -> str | None:
    """(run_id, sample_idx, label, pred, correct, filename) of every row in the given live parts and segments,
    run_id as stored in the file (the samples view takes a live part's from its folder name). A segment's rows have
    no filename: a segment holds many runs, so there is no folder to disagree with."""
    def listed(paths: list[Path]) -> str:
        return ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths)

    selects = []
    if good:
        selects.append(f"SELECT CAST(run_id AS VARCHAR) AS run_id, CAST(sample_idx AS BIGINT) AS sample_idx, "
                       f"CAST(label AS INTEGER) AS label, CAST(pred AS INTEGER) AS pred, CAST(correct AS BOOLEAN) AS "
                       f"correct, filename FROM read_parquet([{listed(good)}], filename=true, union_by_name=true, "
                       f"hive_partitioning=false)")
    if segments:
        selects.append(f"SELECT run_id, sample_idx, label, pred, correct, NULL::VARCHAR AS filename "
                       f"FROM read_parquet([{listed(segments)}])")
    return "(" + " UNION ALL ".join(selects) + ")" if selects else None


def _segment_problem(root: Path, seg: store.Segment) -> tuple[str, str] | None:
    """(file, what is wrong) for the first of a segment's files that is missing or fails a full read."""
    for kind in schema.SEGMENT_KINDS:
        path = seg.path(root, kind)
        try:
            pf = pq.ParquetFile(path)
            for rg in range(pf.num_row_groups):
                pf.read_row_group(rg)
        except FileNotFoundError:
            return str(path), "listed in the manifest but missing"
        except Exception as e:
            return str(path), f"unreadable: {str(e).splitlines()[0]}"
        if kind == "samples" and pf.metadata.num_rows != seg.rows:
            return str(path), f"{pf.metadata.num_rows} rows but the manifest says {seg.rows}"
    return None


def _metrics_problems(db: ResultsDB, root: Path, seg: store.Segment) -> list[Problem]:
    """The segment's materialised per-run metrics against the same metrics recomputed from its rows."""
    rows = f"read_parquet({sql_str(str(seg.path(root, 'samples')))})"
    stored_cols = [c for c in RUN_METRICS_COLUMNS if c in seg.metrics_columns]
    stored = {r["run_id"]: r for r in db.sql(
        f"SELECT run_id, {', '.join(stored_cols)} FROM read_parquet({sql_str(str(seg.path(root, 'metrics')))})").to_pylist()}
    fresh = db.sql(f"SELECT * FROM ({run_metrics_sql(rows, 'runs')})").to_pylist()
    if "baseline_run" in seg.metrics_columns:
        pairs = (f"(SELECT run_id, baseline_run FROM read_parquet({sql_str(str(seg.path(root, 'metrics')))}) "
                 f"WHERE baseline_run IS NOT NULL)")
        paired = {r["run_id"]: r for r in db.sql(
            paired_statistics_sql(paired_rows_sql(pairs, "samples", "samples"), "NULL")).to_pylist()}
        compared = [*PAIRED_COLUMNS, *(c for c in PAIRED_STAT_COLUMNS if c in seg.metrics_columns)]
        stored_pairs = {r["run_id"]: r for r in db.sql(
            f"SELECT run_id, {', '.join(compared)} FROM read_parquet("
            f"{sql_str(str(seg.path(root, 'metrics')))}) WHERE baseline_run IS NOT NULL").to_pylist()}
        for run_id, have in stored_pairs.items():
            again = paired.get(run_id, {"run_id": run_id, **{c: None for c in compared}})
            differ = [c for c in compared if not _same(have[c], again.get(c))]
            if differ:
                out_pairs = ", ".join(f"{c} = {have[c]!r}, recomputed {again.get(c)!r}" for c in differ)
                fresh.append({"run_id": run_id, "_pairs": out_pairs})
    if set(CURVE_COLUMNS) <= set(seg.metrics_columns):
        curves = {r["run_id"]: r for r in db.sql(run_curves_sql(rows)).to_pylist()}
        for have in db.sql(f"SELECT run_id, {', '.join(CURVE_COLUMNS)} FROM read_parquet("
                           f"{sql_str(str(seg.path(root, 'metrics')))})").to_pylist():
            again = curves.get(have["run_id"], {})
            if any(have[c] != again.get(c) for c in CURVE_COLUMNS):
                fresh.append({"run_id": have["run_id"], "_curve": f"window {have['curve_window']}, "
                              f"{len(have['curve_n'] or [])} point(s); recomputed from the rows: window "
                              f"{again.get('curve_window')}, {len(again.get('curve_n') or [])} point(s), "
                              f"differing at window(s) {_differing(have, again)}"})
    out = []
    for r in fresh:
        if "_curve" in r:
            out.append(Problem("stale_metrics", r["run_id"], f"materialised stream curve: {r['_curve']}"))
            continue
        if "_pairs" in r:
            out.append(Problem("stale_metrics", r["run_id"], f"materialised pairing against the baseline: {r['_pairs']}"))
            continue
        have = stored.get(r["run_id"])
        if have is None:
            out.append(Problem("stale_metrics", r["run_id"], f"no materialised metrics in segment {seg.id}"))
            continue
        differ = [c for c in stored_cols if not _same(have[c], r[c])]
        if differ:
            out.append(Problem("stale_metrics", r["run_id"], "materialised " + ", ".join(
                f"{c} = {have[c]!r}, recomputed {r[c]!r}" for c in differ)))
    return out


def _differing(have: dict, again: dict) -> list:
    """The windows where a stored curve's counts differ from the recomputed ones (a few, for the message)."""
    stored = dict(zip(have["curve_win"] or [], zip(have["curve_n"] or [], have["curve_k"] or [])))
    fresh = dict(zip(again.get("curve_win") or [], zip(again.get("curve_n") or [], again.get("curve_k") or [])))
    return sorted(w for w in stored.keys() | fresh.keys() if stored.get(w) != fresh.get(w))[:5]


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))
    return a == b
