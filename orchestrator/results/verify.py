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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.results import files, schema
from orchestrator.results.db import ResultsDB

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
    parts = files.sample_parts(root)
    report.parts = len(parts)
    good = []
    for path in parts:
        check = checker.deep_check(path, "samples")
        if check is not None and not check.ok:
            report.problems.append(Problem("bad_part", str(path), check.error or "bad file"))
        elif check is not None:
            good.append(path)
    for path in files.run_files(root):
        check = checker.check(path, "runs")
        if check is not None and not check.ok:
            report.problems.append(Problem("bad_run_file", str(path), check.error or "bad file"))
    now = time.time()
    for path in files.temp_files(root):
        try:
            age = now - path.stat().st_mtime
        except FileNotFoundError:
            continue
        if age >= temp_grace_s:
            report.problems.append(Problem("temp_file", str(path), f"unfinished write, {age:.0f} s old"))

    with ResultsDB(root) as db:
        per_run = db.sql(_PER_RUN_SQL.format(source=_rows_source(good))).to_pylist() if good else []
        runs = db.sql("SELECT run_id, n_samples, status, error FROM runs").to_pylist()
    report.runs = len(runs)
    seen = set()
    for r in per_run:
        run_id, seen_rows = r["run_id"], r["n_rows"]
        seen.add(run_id)
        report.rows += seen_rows
        if r["foreign_rows"]:
            report.problems.append(Problem("foreign_rows", run_id, f"{r['foreign_rows']} row(s) in another run's folder"))
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
       count(*) FILTER (WHERE s.run_id IS DISTINCT FROM regexp_extract(s.filename, 'run_id=([^/]+)/', 1))
           AS foreign_rows
FROM {source} s LEFT JOIN runs r USING (run_id)
GROUP BY s.run_id
"""


def _rows_source(good: list[Path]) -> str:
    """(run_id, sample_idx, filename) of every row in the given parts, run_id as stored in the file (the samples view
    takes it from the folder name and drops the file name)."""
    listed = ", ".join("'" + str(p).replace("'", "''") + "'" for p in good)
    return (f"(SELECT CAST(run_id AS VARCHAR) AS run_id, CAST(sample_idx AS BIGINT) AS sample_idx, filename "
            f"FROM read_parquet([{listed}], filename=true, union_by_name=true, hive_partitioning=false))")
