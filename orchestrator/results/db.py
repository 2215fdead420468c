"""DuckDB over the results' Parquet files: views samples, runs, accuracy, summary, paired, and the table macros
paired_against(method) and gains_against(method) (the statistics: orchestrator.results.stats), tuned_choice(ids)
and tuned(ids) (honest tuning: orchestrator.results.tuning).

An in-memory connection takes no file lock, so any number of readers run while sweeps write. Every query
through ResultsDB (sql, df, query, cursor) first re-scans the results dir (one stat per file; a footer is
read once per new or changed file) and rebuilds only what changed:
- samples: while every part is good the view reads the layout's glob, which DuckDB re-expands on each query,
  so new parts appear even through a cursor another thread holds; once a bad part (truncated, inconsistent
  with its name, unreadable) is found, the view lists the good parts explicitly.
- runs: one small row per run, kept in an in-memory table rebuilt whenever a run file changes (reading
  hundreds of one-row files on every query would cost more than the query).
Bad files are left out and reported in `bad_files`. A file that fails only past its footer, while a query
reads its data, is marked bad and the query retried without it.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator import registry
from orchestrator.results import files, metrics, safety, schema, stats, store, tuning
from orchestrator.results.sql import (CURVE_COLUMNS, MATERIALISED_METRICS, PAIRED_COLUMNS, PAIRED_STAT_COLUMNS,
                                      RUN_METRICS_COLUMNS, baseline_pairs_sql, concat_runs, paired_rows_sql,
                                      paired_statistics_sql, run_metrics_sql, sql_str)

VIEWS = ("samples", "runs", "accuracy", "summary", "paired")
T = TypeVar("T")
_MAX_RETRIES = 5
# Errors about the SQL itself, never about a file's bytes.
_SQL_ERRORS = (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException, duckdb.SyntaxException,
               duckdb.PermissionException, duckdb.NotImplementedException)


@dataclass(frozen=True)
class BadFile:
    path: Path
    error: str

    def __str__(self) -> str:
        return f"{self.path}: {self.error}"


@dataclass(frozen=True)
class Lost:
    """Runs the results dir committed that no view reads (whole, with their runs-table row), and why: a table over
    the views would stand on fewer runs than were made. `rows`: their runs-table rows where a file still holds
    them (a table's evidence counts them as expected); `sweeps`: None where no file says."""
    kind: str   # bad_segment, unlisted_segment, no_run_row or recorded (see `ResultsDB.lost`)
    why: str    # a few words, e.g. "in a segment that cannot be read"
    where: str  # the file, or the sweep record, that says they were committed
    run_ids: tuple[str, ...] = ()
    count: int = 0  # >= len(run_ids): a segment that nothing of is readable is known by the manifest's count
    sweeps: frozenset[str] | None = None
    rows: tuple[dict[str, Any], ...] = ()
    detail: str = ""  # e.g. the read error

    def __str__(self) -> str:
        ids = ", ".join(self.run_ids[:5]) + (f" and {len(self.run_ids) - 5} more" if len(self.run_ids) > 5 else "")
        return (f"{self.count} run(s) {self.why}: {self.where}" + (f": {self.detail}" if self.detail else "")
                + (f" (runs {ids})" if ids else ""))


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _samples_source(results_dir: Path, good: Sequence[Path], use_glob: bool) -> str:
    """read_parquet over the layout's glob or the listed parts; partition values stay text (a run_id of digits
    or a dataset called 2024 must not turn into numbers)."""
    target = (sql_str(str(results_dir / schema.SAMPLES_GLOB)) if use_glob
              else "[" + ", ".join(sql_str(str(p)) for p in good) + "]")
    return f"read_parquet({target}, hive_partitioning=true, hive_types_autocast=false, union_by_name=true)"


def _select_list(columns: Sequence[schema.Column], present: set[str], cast: str = "CAST") -> list[str]:
    """Each column cast to its type; absent from the files (or null there): NULL, or the column's `missing` value
    (a column added after those files were written)."""
    out = []
    for c in columns:
        value = f"{cast}({_ident(c.name)} AS {c.sql})" if c.name in present else f"CAST(NULL AS {c.sql})"
        if c.missing is not None:
            value = f"coalesce({value}, CAST({c.missing!r} AS {c.sql}))"
        out.append(f"{value} AS {_ident(c.name)}")
    return out


_PARTITION_COLUMNS = tuple(schema.Column(k, pa.string(), "VARCHAR", "from the path") for k in schema.PARTITION_KEYS[:-1])
# Runs columns carried into accuracy and summary: the configuration, not bookkeeping or the trial's metrics.
_CONFIG_COLUMNS = ("pretrained", "weights_sha256", *schema.STARTING_POINT, "seed", "templates", "num_templates", "views",
                   "stream", "order_index", "batch_size", "group_id", "setting_id")
_RUNS_TABLE = "runs_rows"
_COMPACTED = "compacted_runs"
_LIVE_SAMPLES = "live_samples"
_COMPUTE_ROWS = "metrics_rows"
_RUN_METRICS = "run_metrics"
_MATERIALISED_PAIRS = "materialised_pairs"
_UNPAIRED = "unpaired_pairs"
# Each compacted run's curve as compaction materialised it (run_curves_sql), for the dashboard's stream curves.
_RUN_CURVES = "run_curves"
_LITERAL_IDS = 5000
_STREAM_COLUMNS = tuple(c for c in schema.SEGMENT_RUN_COLUMNS if c.name in ("stream", "order_index"))


class ResultsDB:
    """Read-only SQL over a results dir. Thread-safe: each query runs on its own cursor."""

    def __init__(self, results_dir: str | Path | None = None) -> None:
        self.results_dir = schema.resolve_results_dir(results_dir)
        self._checker = files.FileChecker()
        self._lock = threading.RLock()
        self._key: tuple | None = None
        self._bad_segments: dict[str, BadFile] = {}
        self._fresh = False
        self._seg_columns: dict[str, list[str]] = {}
        self._run_rows: dict[Path, tuple[tuple[int, int], pa.Table]] = {}
        self._bad: list[BadFile] = []
        self.extra_run_columns: list[str] = []
        self._used_hparams: tuple[tuple | None, list[str]] | None = None
        self._columns: dict[str, tuple[tuple | None, list[str]]] = {}
        self._pairs: tuple[tuple | None, pd.DataFrame] | None = None
        self._lost: tuple[tuple, list[Lost]] | None = None
        self._con = duckdb.connect(":memory:")
        stats.register(self._con)
        # DuckDB lets SQL read its spill directory (default ./.tmp under the current directory) besides
        # allowed_directories: a private empty one keeps whatever lies in ./.tmp out of reach.
        self._spill = tempfile.TemporaryDirectory(prefix="bca-duckdb-")
        for stmt in (
            f"SET temp_directory = {sql_str(self._spill.name)}",
            "SET autoinstall_known_extensions = false",
            "SET autoload_known_extensions = false",
            "SET python_enable_replacements = false",
            f"SET allowed_directories = [{sql_str(str(self.results_dir) + '/')}]",
            "SET parquet_metadata_cache = true",  # segments do not change once written: footers read once
            "SET enable_external_access = false",
            "SET lock_configuration = true",
        ):
            self._con.execute(stmt)
        self.refresh()

    # ------------------------------------------------------------------------------------- lifecycle
    def close(self) -> None:
        self._con.close()
        self._spill.cleanup()

    def __enter__(self) -> "ResultsDB":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        except duckdb.Error:
            if exc[0] is None:
                raise  # else the exception under way says more (a query interrupted leaves its connection busy)

    # ----------------------------------------------------------------------------------------- views
    @property
    def bad_files(self) -> list[BadFile]:
        """Files left out of the views at the last refresh, each with why."""
        return list(self._bad)

    def _scan(self, paths: list[Path], kind: str) -> tuple[list[Path], list[BadFile], set[str]]:
        """(good files, bad files, the columns the good files have)."""
        good, bad, present = [], [], set()
        for path in paths:
            check = self._checker.check(path, kind)
            if check is None:
                continue
            if check.ok:
                good.append(path)
                present.update(check.columns)
            else:
                bad.append(BadFile(path, check.error or "bad file"))
        return good, bad, present

    @property
    def hparam_names(self) -> list[str]:
        """The runs view's hyperparameter columns: every registered method's, then those only the files carry."""
        return [c.name for c in schema.hparam_columns()] + self.extra_run_columns

    def columns(self, view: str) -> list[str]:
        """A view's column names (one of VIEWS), found once per version of the views."""
        if view not in VIEWS:
            raise ValueError(f"columns: expected one of the views {', '.join(VIEWS)}, got {view!r}")
        with self._lock:
            self.refresh()
            if self._columns.get(view, (None,))[0] != self._key:
                names = self._run(lambda cur: [d[0] for d in cur.execute(f"SELECT * FROM {view} LIMIT 0").description])
                self._columns[view] = (self._key, names)
            return list(self._columns[view][1])

    def paired_gains(self) -> pd.DataFrame:
        """run_id, baseline_run, helped, hurt, n, gain of every pair of the paired view with a gain: read once per
        version of the views (a report's significance and the dashboard's gains each need all of them, 10^5 rows
        at a study's size). Shared: callers must not modify it."""
        with self._lock:
            self.refresh()
            if self._pairs is None or self._pairs[0] != self._key:
                frame = self.df("SELECT run_id, baseline_run, helped, hurt, n, gain FROM paired WHERE gain IS NOT NULL")
                self._pairs = (self._key, frame)
            return self._pairs[1]

    @property
    def used_hparam_names(self) -> list[str]:
        """hparam_names less those NULL in every run (the hparams of methods not run here): what a frame of every
        run needs (tens of empty columns over 10^5 runs cost seconds in pandas); the views keep them all. Found
        once per version of the views."""
        with self._lock:
            self.refresh()
            if self._used_hparams is None or self._used_hparams[0] != self._key:
                names = self.hparam_names
                counts = self._con.execute("SELECT " + ", ".join(f"count({_ident(h)})" for h in names)
                                           + " FROM runs").fetchone() if names else ()
                self._used_hparams = (self._key, [h for h, n in zip(names, counts) if n])
            return list(self._used_hparams[1])

    def lost(self, sweep: str | None = None) -> list[Lost]:
        """The runs this results dir committed that no view reads, of `sweep` if given (and those whose sweep no
        file says): runs of a segment that cannot be read, of segment files the manifest does not list (it was
        deleted or replaced by hand) that are nowhere else, rows whose runs-table row is gone, and runs a sweep
        recorded finished that no file holds. Found once per version of the views, the orphan files and the
        sweep records."""
        with self._lock:
            self.refresh()
            root = self.results_dir
            orphans = store.orphan_files(root)
            records = store.recorded_finished(root)
            key = (self._key, tuple(self._bad_segments), tuple(orphans),
                   tuple((name, store.file_stamp(path)) for name, (path, _) in records.items()))
            if self._lost is None or self._lost[0] != key:
                self._lost = (key, self._find_lost(orphans, records))
            found = self._lost[1]
        return [lost for lost in found if sweep is None or lost.sweeps is None or sweep in lost.sweeps]

    def _find_lost(self, orphans: list[Path], records: dict[str, tuple[Path, set[str]]]) -> list[Lost]:
        root = self.results_dir
        named: set[str] = set()  # each run named once, by the first finding
        out: list[Lost] = []

        def absent(ids: set[str]) -> set[str]:
            """Those of `ids` the runs view lacks (an anti-join in DuckDB: a record lists up to 10^5 runs)."""
            if not ids:
                return set()
            with contextlib.closing(self._con.cursor()) as cur:
                cur.register("lost_candidates", pa.table({"run_id": sorted(ids)}))
                return {r for (r,) in cur.execute("SELECT run_id FROM lost_candidates WHERE run_id NOT IN "
                                                  "(SELECT run_id FROM runs)").fetchall()}

        def add(kind: str, why: str, where: Path | str, pairs: list[tuple[str, str | None]], rows: list[dict] = (),
                count: int | None = None, detail: str = "", checked: bool = False) -> None:
            gone = {r for r, _ in pairs} if checked else absent({r for r, _ in pairs})
            pairs = [(r, s) for r, s in pairs if r in gone and r not in named]
            if not pairs and not count:
                return
            named.update(r for r, _ in pairs)
            ids = tuple(sorted({r for r, _ in pairs}))
            sweeps = None if not pairs or any(s is None for _, s in pairs) else frozenset(s for _, s in pairs)
            out.append(Lost(kind, why, str(where), ids, len(ids) or count or 0, sweeps,
                            tuple(row for row in rows if row["run_id"] in ids), detail))

        segments = {seg.id: seg for seg in store.load_catalog(root).segments}
        for seg_id, bad in self._bad_segments.items():
            if seg_id in segments:
                rows, pairs = store.segment_runs(root, seg_id)
                add("bad_segment", "in a segment that cannot be read", bad.path, pairs, rows,
                    None if pairs else segments[seg_id].runs, bad.error)
        by_segment = {path.name.split(".", 1)[0] for path in orphans}
        manifest = schema.manifest_file(root)
        for seg_id in sorted(by_segment):
            rows, pairs = store.segment_runs(root, seg_id)
            add("unlisted_segment", "in a segment the manifest does not list",
                schema.segment_file(root, seg_id, "runs").with_name(f"{seg_id}.*.parquet"), pairs, rows,
                detail="" if manifest.is_file() else f"{manifest} is missing")
        # rows whose runs-table row is gone: a live run's part metadata still holds its config
        good = list(self._good_segments())
        with contextlib.closing(self._con.cursor()) as cur:
            orphaned = cur.execute(
                f"SELECT DISTINCT run_id, sweep FROM {_LIVE_SAMPLES} WHERE run_id NOT IN (SELECT run_id FROM runs) "
                + (f"UNION SELECT run_id, {'s_sweep' if all('s_sweep' in g.metrics_columns for g in good) else 'NULL'} "
                   f"FROM {self._segment_source(good, 'metrics')} "
                   "WHERE run_id NOT IN (SELECT run_id FROM runs)" if good else "")).fetchall()
        if orphaned:
            add("no_run_row", "with rows but no runs-table row", f"{root}/{schema.RUNS_GLOB} and the segments' runs "
                "files", sorted(orphaned), self._rows_from_parts({r for r, _ in orphaned}), checked=True)
        for sweep, (path, finished) in sorted(records.items()):
            add("recorded", f"recorded finished by sweep {sweep!r} but held by no file", path,
                [(r, sweep) for r in sorted(finished)])
        return out

    def _good_segments(self) -> tuple[store.Segment, ...]:
        return tuple(seg for seg in store.load_catalog(self.results_dir).segments if seg.id not in self._bad_segments)

    def _rows_from_parts(self, run_ids: set[str]) -> list[dict[str, Any]]:
        """Runs-table rows (identity and configuration only) of live runs whose row is gone, from the run config
        every part carries in its metadata."""
        from orchestrator.results.writer import RunWriter

        rows: dict[str, dict[str, Any]] = {}
        for path in files.sample_parts(self.results_dir):
            run_id = path.parent.name.removeprefix("run_id=")
            check = self._checker.check(path, "samples") if run_id in run_ids and run_id not in rows else None
            config = check.metadata.get(schema.META_RUN_CONFIG.decode()) if check is not None else None
            if config:
                with contextlib.suppress(ValueError):
                    rows[run_id] = RunWriter(self.results_dir, json.loads(config)).base_row()
        return list(rows.values())

    def refresh(self) -> list[BadFile]:
        """Re-scan the results dir and rebuild what changed (see the module docstring); returns bad_files. A file
        that fails while the views are bound (a damaged segment's footer) is marked bad and the views rebuilt."""
        with self._lock:
            for _attempt in range(_MAX_RETRIES):
                try:
                    return self._refresh()
                except duckdb.Error as e:
                    self._key = None
                    if not self._blame(e):
                        raise
            return self._refresh()

    def _refresh(self) -> list[BadFile]:
        with self._lock:
            root = self.results_dir
            catalog = store.load_catalog(root)
            segments = [seg for seg in catalog.segments if seg.id not in self._bad_segments]
            s_good, s_bad, s_cols = self._scan(files.sample_parts(root), "samples")
            r_good, r_bad, _ = self._scan(files.run_files(root), "runs")
            rows = []
            for path in r_good:
                row = self._run_row(path)
                if row is not None:
                    rows.append(row)
                else:
                    check = self._checker.check(path, "runs")
                    if check is not None:
                        r_bad.append(BadFile(path, check.error or "unreadable data"))
            # a glob needs no rebuild when parts are added; not usable with a bad part or a root DuckDB would
            # read as a pattern
            use_glob = not s_bad and not any(ch in str(root) for ch in "*?[{")
            key = (catalog.stamp, tuple(seg.id for seg in segments), bool(s_good) if use_glob else tuple(s_good),
                   tuple(sorted(s_cols)), tuple((path, stamp) for path, stamp, _ in rows))
            if key != self._key:
                self._build_compacted(segments)
                self._build_runs([table for _, _, table in rows], segments)
                self._build_samples(s_good, use_glob, s_cols, segments)
                self._build_metrics(segments)
                hparams = self.hparam_names
                self._con.execute(_accuracy_sql([*_CONFIG_COLUMNS, *hparams]))
                baseline = sql_str(registry.baseline_method())
                self._con.execute(_paired_sql(baseline, self._unpaired(segments, baseline)))
                self._con.execute(_paired_against_sql(baseline))
                self._con.execute(_GAINS_SQL)
                for macro in tuning.MACROS:
                    self._con.execute(macro)
                self._con.execute(_summary_sql(hparams))
                self._key = key
            self._bad = s_bad + r_bad + list(self._bad_segments.values())
            return self.bad_files

    def _build_compacted(self, segments: list[store.Segment]) -> None:
        """_compacted: the runs the good segments hold (their live files, if any are left, are not read; a bad
        segment's runs are in no view). Read by DuckDB from the segments' runs files: a study's 10^5 run ids never
        pass through Python objects on open."""
        if not segments:
            self._con.execute(f"CREATE OR REPLACE TABLE {_COMPACTED} (run_id VARCHAR, segment VARCHAR)")
            return
        where = pa.table({"filename": [str(seg.path(self.results_dir, "runs")) for seg in segments],
                          "segment": [seg.id for seg in segments]})
        self._con.register("segment_names", where)
        try:
            self._con.execute(f"CREATE OR REPLACE TABLE {_COMPACTED} AS SELECT r.run_id, n.segment FROM "
                              f"read_parquet([{', '.join(sql_str(f) for f in where.column('filename').to_pylist())}],"
                              f" filename = true) r JOIN segment_names n USING (filename)")
        finally:
            self._con.unregister("segment_names")

    def _segment_source(self, segments: list[store.Segment], kind: str) -> str:
        paths = ", ".join(sql_str(str(seg.path(self.results_dir, kind))) for seg in segments)
        return f"read_parquet([{paths}], union_by_name=true)"

    def _run_row(self, path: Path) -> tuple[Path, tuple[int, int], pa.Table] | None:
        """A runs-table file's row, read once per version of the file; None (marked bad) when unreadable."""
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        hit = self._run_rows.get(path)
        if hit is not None and hit[0] == stamp:
            return path, stamp, hit[1]
        try:
            table = pq.ParquetFile(path).read()
        except FileNotFoundError:
            return None
        except Exception as e:  # damage past the footer
            self._checker.mark_bad(path, f"unreadable data: {str(e).splitlines()[0]}")
            return None
        self._run_rows[path] = (stamp, table)
        return path, stamp, table

    def _build_samples(self, good: list[Path], use_glob: bool, present: set[str],
                       segments: list[store.Segment]) -> None:
        """samples = the segments' rows and the live parts' rows of runs not compacted, with each run's stream and
        order (stored in a segment's rows; joined from the runs table for live parts)."""
        cols = _select_list(schema.SAMPLE_COLUMNS, present) + _select_list(
            _PARTITION_COLUMNS, set(schema.PARTITION_KEYS) if good else set())
        run_cols = ", ".join(f"r.{_ident(c.name)}" for c in _STREAM_COLUMNS)
        if good:
            live = (f"SELECT s.*, {run_cols} FROM (SELECT {', '.join(cols)} FROM "
                    f"{_samples_source(self.results_dir, good, use_glob)}) s "
                    f"LEFT JOIN {_RUNS_TABLE} r ON r.run_id = s.run_id "
                    f"WHERE s.run_id NOT IN (SELECT run_id FROM {_COMPACTED})")
        else:
            live = f"SELECT {', '.join(cols + _select_list(_STREAM_COLUMNS, set()))} WHERE false"
        names = [c.name for c in (*schema.SAMPLE_COLUMNS, *_PARTITION_COLUMNS, *_STREAM_COLUMNS)]
        seg_cols = _select_list([*schema.SAMPLE_COLUMNS, *_PARTITION_COLUMNS, *_STREAM_COLUMNS], set(names))
        parts = [live] + ([f"SELECT {', '.join(seg_cols)} FROM {self._segment_source(segments, 'samples')}"]
                          if segments else [])
        self._con.execute(f"CREATE OR REPLACE VIEW {_LIVE_SAMPLES} AS {live}")
        self._con.execute(f"CREATE OR REPLACE VIEW samples AS SELECT {', '.join(map(_ident, names))} FROM ("
                          + " UNION ALL BY NAME ".join(f"({p})" for p in parts) + ")")

    def _build_metrics(self, segments: list[store.Segment]) -> None:
        """The per-run metrics: materialised by compaction, except for segments written before a metric existed
        (computed from their rows here, as for live runs)."""
        fresh = [seg for seg in segments if set(MATERIALISED_METRICS) <= set(seg.metrics_columns)]
        stale = [seg for seg in segments if seg not in fresh]
        self._fresh = bool(fresh)
        curved = [seg for seg in segments if set(CURVE_COLUMNS) <= set(seg.metrics_columns)]
        cols = ", ".join(map(_ident, ("run_id", "s_backbone", "s_dataset", *CURVE_COLUMNS)))
        self._con.execute(f"CREATE OR REPLACE VIEW {_RUN_CURVES} AS SELECT {cols} FROM "
                          + (self._segment_source(curved, "metrics") if curved else
                             "(SELECT NULL::VARCHAR AS run_id, NULL::VARCHAR AS s_backbone, NULL::VARCHAR AS s_dataset, "
                             "NULL::BIGINT AS curve_window, NULL::BIGINT[] AS curve_win, NULL::BIGINT[] AS curve_n, "
                             "NULL::BIGINT[] AS curve_k) WHERE false"))
        if fresh:
            # the statistics a segment stored (read by name: NULL from those written before they were stored)
            with_stats = any(set(PAIRED_STAT_COLUMNS) <= set(seg.metrics_columns) for seg in fresh)
            cols = ", ".join([*map(_ident, ("run_id", *PAIRED_COLUMNS)), *(
                _ident(c) if with_stats else f"NULL::DOUBLE AS {_ident(c)}" for c in PAIRED_STAT_COLUMNS)])
            self._con.execute(f"CREATE OR REPLACE VIEW {_MATERIALISED_PAIRS} AS SELECT {cols} FROM "
                              f"{self._segment_source(fresh, 'metrics')} WHERE baseline_run IS NOT NULL")
        rows = f"SELECT * FROM {_LIVE_SAMPLES}"
        if stale:
            rows += f" UNION ALL BY NAME SELECT * FROM {self._segment_source(stale, 'samples')}"
        self._con.execute(f"CREATE OR REPLACE VIEW {_COMPUTE_ROWS} AS {rows}")
        wanted = ", ".join(map(_ident, ("run_id", *RUN_METRICS_COLUMNS)))
        computed = f"SELECT {wanted} FROM ({run_metrics_sql(_COMPUTE_ROWS, 'runs')})"
        if fresh:
            computed = (f"SELECT {wanted} FROM {self._segment_source(fresh, 'metrics')} "
                        f"UNION ALL BY NAME {computed}")
        self._con.execute(f"CREATE OR REPLACE VIEW {_RUN_METRICS} AS {computed}")

    def _unpaired(self, segments: list[store.Segment], baseline: str) -> list[str] | None:
        """The pairs (run_id, baseline_run) whose counts the paired view computes from the rows: those of runs with no
        materialised pairing (live runs, runs compacted before their baseline, segments written before pairing was
        materialised), kept in a small table; None when no segment materialised pairings (every pair from the
        rows). Returns the run ids whose rows those pairs read (the runs and their baselines)."""
        if not self._fresh:
            return None
        live = f"SELECT run_id, method FROM {_RUNS_TABLE} WHERE run_id NOT IN (SELECT run_id FROM {_COMPACTED})"
        ids = (f"SELECT run_id, method FROM {self._segment_source(segments, 'runs')} UNION ALL {live}"
               if segments else live)
        self._con.execute(f"CREATE OR REPLACE TABLE {_UNPAIRED} AS SELECT run_id FROM ({ids}) WHERE method <> "
                          f"{baseline} AND run_id NOT IN (SELECT run_id FROM {_MATERIALISED_PAIRS})")
        if self._con.execute(f"SELECT count(*) FROM {_UNPAIRED}").fetchone()[0]:
            among = f"(SELECT * FROM runs WHERE run_id IN (SELECT run_id FROM {_UNPAIRED}))"
            self._con.execute(f"CREATE OR REPLACE TABLE {_UNPAIRED} AS "
                              f"{baseline_pairs_sql('runs', baseline, among)}")
        else:
            self._con.execute(f"CREATE OR REPLACE TABLE {_UNPAIRED} (run_id VARCHAR, baseline_run VARCHAR)")
        rows = self._con.execute(f"SELECT run_id, baseline_run FROM {_UNPAIRED}").fetchall()
        return sorted({r for row in rows for r in row})

    def _build_runs(self, tables: list[pa.Table], segments: list[store.Segment]) -> None:
        """runs = the segments' runs files and the live rows (one small file per run, kept in an in-memory table)
        of runs not compacted."""
        merged = concat_runs(tables)
        columns = schema.run_columns()
        known = {col.name for col in columns}
        names = merged.column_names if merged is not None else []
        extras = [c for c in names if c not in known]
        # TRY_CAST: a hand-made file with an odd value gives a NULL cell, not a runs view that never works
        cols = _select_list(columns, set(names), cast="TRY_CAST") + [_ident(c) for c in extras]
        con = self._con
        if merged is None:
            con.execute(f"CREATE OR REPLACE TABLE {_RUNS_TABLE} AS SELECT {', '.join(cols)} WHERE false")
        else:
            con.register("runs_arrow", merged)
            try:
                con.execute(f"CREATE OR REPLACE TABLE {_RUNS_TABLE} AS SELECT {', '.join(cols)} FROM runs_arrow")
            finally:
                con.unregister("runs_arrow")
        live = f"SELECT * FROM {_RUNS_TABLE} WHERE run_id NOT IN (SELECT run_id FROM {_COMPACTED})"
        if segments:
            seg_names: list[str] = []
            for seg in segments:
                if seg.id not in self._seg_columns:  # a segment never changes: its footer read once
                    self._seg_columns[seg.id] = pq.read_schema(seg.path(self.results_dir, "runs")).names
                seg_names += [n for n in self._seg_columns[seg.id] if n not in seg_names]
            seg_extras = [c for c in seg_names if c not in known]
            extras += [c for c in seg_extras if c not in extras]
            seg_cols = _select_list(columns, set(seg_names), cast="TRY_CAST") + [_ident(c) for c in seg_extras]
            live = (f"SELECT {', '.join(seg_cols)} FROM {self._segment_source(segments, 'runs')} "
                    f"UNION ALL BY NAME {live}")
        con.execute(f"CREATE OR REPLACE VIEW runs AS {live}")
        self.extra_run_columns = extras

    def _blame(self, error: duckdb.Error) -> bool:
        """Mark the files to blame for a failed query as bad: those its message names, else (for errors that can
        come from reading data, not from the SQL itself) any good file that fails a full read. Any found? A
        segment named but no longer in the manifest was replaced by a compaction meanwhile: the retry's refresh
        reads the new manifest."""
        named = re.findall(re.escape(str(self.results_dir)) + r"/[^'\"\n]*?\.parquet", str(error))
        for path in named:
            self._blame_file(Path(path), f"unreadable data: {str(error).splitlines()[0]}")
        if named or isinstance(error, _SQL_ERRORS):
            return bool(named)
        found = False
        for kind, paths in (("samples", files.sample_parts(self.results_dir)), ("runs", files.run_files(self.results_dir))):
            for path in paths:
                shallow = self._checker.check(path, kind)
                if shallow is not None and shallow.ok:
                    deep = self._checker.deep_check(path, kind)
                    found |= deep is not None and not deep.ok
        for seg in store.load_catalog(self.results_dir).segments:
            for kind in schema.SEGMENT_KINDS:
                path = seg.path(self.results_dir, kind)
                try:
                    pq.ParquetFile(path).read()
                except Exception as e:
                    self._blame_file(path, f"unreadable data: {str(e).splitlines()[0]}")
                    found = True
        return found

    def _blame_file(self, path: Path, error: str) -> None:
        for seg in store.load_catalog(self.results_dir).segments:
            if path in {seg.path(self.results_dir, kind) for kind in schema.SEGMENT_KINDS}:
                self._bad_segments[seg.id] = BadFile(path, error if path.exists() else "listed in the manifest "
                                                                                        "but missing")
                return
        self._checker.mark_bad(path, error)

    def _run(self, fn: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        """Run fn on a fresh cursor after a refresh; a file failing mid-read is marked bad and fn retried."""
        for _attempt in range(_MAX_RETRIES):
            self.refresh()
            cur = self._con.cursor()
            try:
                return fn(cur)
            except duckdb.Error as e:
                if not self._blame(e):
                    raise
            finally:
                cur.close()
        self.refresh()
        return fn(self._con.cursor())

    def sql(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> pa.Table:
        """Trusted SQL (this package's own queries) as an Arrow table. User SQL goes through query()."""
        return self._run(lambda cur: cur.sql(query, params=params).to_arrow_table())

    def df(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None,
           tables: dict[str, pa.Table] | None = None) -> pd.DataFrame:
        """Trusted SQL as a pandas DataFrame; `tables`: Arrow tables the query reads by these names (e.g. the run
        ids a page shows: a join with them binds in no time, a literal list of thousands of ids does not)."""
        def run(cur: duckdb.DuckDBPyConnection) -> pd.DataFrame:
            for name, table in (tables or {}).items():
                cur.register(name, table)
            return cur.sql(query, params=params).df()

        return self._run(run)

    def query(self, user_sql: str, timeout_s: float | None = None) -> pa.Table:
        """User SQL: exactly one read-only SELECT (safety.check_query), as an Arrow table, stopped after `timeout_s`
        seconds (QueryTimeout) or by Ctrl-C (KeyboardInterrupt), either at once: DuckDB runs it without the GIL's
        checks for signals, so it runs in a thread the caller's thread waits on and interrupts.

        Raises safety.QueryRefused for refused statements and duckdb.Error (its own message) for bad SQL.
        """
        statement = safety.check_query(user_sql)
        return self._run(lambda cur: _interruptible(cur, lambda: cur.sql(statement).to_arrow_table(), timeout_s))

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor over freshly refreshed views, for a thread that runs its own queries (e.g. the dashboard)."""
        self.refresh()
        return self._con.cursor()


class QueryTimeout(RuntimeError):
    """A user query stopped after its time limit."""


def _interruptible(cur: duckdb.DuckDBPyConnection, fn: Callable[[], T], timeout_s: float | None) -> T:
    """fn() (a query on `cur`) run in a thread, interrupted on `cur` after timeout_s seconds or on Ctrl-C in the
    calling thread."""
    done: dict[str, Any] = {}
    finished = threading.Event()  # not Thread.is_alive: a join that Ctrl-C interrupted can leave it False

    def work() -> None:
        try:
            done["value"] = fn()
        except BaseException as e:  # handed to the caller
            done["error"] = e
        finally:
            finished.set()

    def stop() -> None:
        # until the query has started it has nothing to interrupt, and while it is being bound the cursor is busy
        while not finished.is_set():
            with contextlib.suppress(duckdb.Error):
                cur.interrupt()
            finished.wait(0.05)

    deadline = None if not timeout_s else time.monotonic() + timeout_s
    threading.Thread(target=work, name="bca-query", daemon=True).start()
    try:
        while not finished.wait(0.05):
            if deadline is not None and time.monotonic() >= deadline:
                stop()
                raise QueryTimeout(f"the query was stopped after {timeout_s:g} s")
    except KeyboardInterrupt:
        stop()
        raise
    if "error" in done:
        raise done["error"]
    return done["value"]


def _accuracy_sql(carried: Sequence[str]) -> str:
    """Per run: its metrics (materialised for compacted runs, computed from the rows for live ones, see
    run_metrics_sql) with the runs table's status, completeness and configuration."""
    r_cols = ", ".join(f"r.{_ident(c)}" for c in carried)
    return f"""
CREATE OR REPLACE VIEW accuracy AS
SELECT p.run_id,
       coalesce(r.sweep, p.s_sweep) AS sweep, coalesce(r.backbone, p.s_backbone) AS backbone,
       coalesce(r.dataset, p.s_dataset) AS dataset, coalesce(r.method, p.s_method) AS method,
       r.status, r.n_samples, p.n_rows, p.n_distinct,
       coalesce(r.n_samples = p.n_rows AND p.n_distinct = p.n_rows, false) AS complete,
       {", ".join(f"p.{m.name}" for m in metrics.RUN_METRICS)}, p.n_ood, {r_cols}
FROM {_RUN_METRICS} p LEFT JOIN runs r USING (run_id)
"""


def _paired_against_sql(baseline: str) -> str:
    """paired_against(method): each run against any baseline method, computed from the rows; against `baseline`
    (the default one, zero-shot CLIP) the `paired` view, the same numbers read from what compaction materialised
    (pairing a study's 10^8 rows again takes minutes and GBs). The branch a call does not take is a constant
    false filter, which DuckDB drops before reading anything."""
    rows = paired_statistics_sql(paired_rows_sql(f"({baseline_pairs_sql('runs', 'baseline_method')})", "samples",
                                                 "samples"), "baseline_method")
    return (f"CREATE OR REPLACE MACRO paired_against(baseline_method) AS TABLE "
            f"SELECT * FROM paired WHERE baseline_method = {baseline} "
            f"UNION ALL SELECT * FROM ({rows}) WHERE baseline_method <> {baseline}")


def _paired_sql(baseline: str, unpaired: list[str] | None) -> str:
    """paired: materialised by compaction where its baseline was compacted then; the other pairs (_UNPAIRED, over
    the rows of the runs `unpaired` names: a literal list, so only their row groups are read) from the rows; every
    pair from the rows when `unpaired` is None (no materialised pairing)."""
    if unpaired is None:
        counts = paired_rows_sql(f"({baseline_pairs_sql('runs', baseline)})", "samples", "samples")
    else:
        cols = ", ".join(map(_ident, ("run_id", *PAIRED_COLUMNS, *PAIRED_STAT_COLUMNS)))
        counts = f"SELECT {cols} FROM {_MATERIALISED_PAIRS}"
        if unpaired:
            # a literal list prunes row groups; past a few thousand runs binding it costs more than it saves
            ids = (", ".join(map(sql_str, unpaired)) if len(unpaired) <= _LITERAL_IDS
                   else f"SELECT run_id FROM {_UNPAIRED} UNION ALL SELECT baseline_run FROM {_UNPAIRED}")
            rows = f"(SELECT * FROM samples WHERE run_id IN ({ids}))"
            counts += f" UNION ALL BY NAME {paired_rows_sql(_UNPAIRED, rows, rows)}"
    return f"CREATE OR REPLACE VIEW paired AS {paired_statistics_sql(counts, baseline, stored=unpaired is not None)}"


# Per configuration (group_id), against a baseline method: its finished complete runs paired with the baseline's
# finished complete runs on the same seed and order (paired_against), then the mean gain, a 95% interval and a
# p-value across those runs (orchestrator.results.stats.across_runs with each run its own replicate, all on one
# test set: from MIN_RUNS_FOR_SPREAD runs on, two_level of the runs' spread, the mean of their McNemar standard
# errors sqrt(helped + hurt) / n and the mean of 1 / n, in points; else the counts pooled over the runs: bootstrap
# interval and exact McNemar).
def _gains_sql(pairs: str, baseline: str) -> str:
    """The per-configuration gains over `baseline` (a SQL expression) from `pairs` (paired_against's columns)."""
    two_level = f"k >= {stats.MIN_RUNS_FOR_SPREAD}"
    return f"""
WITH ok AS (SELECT run_id, group_id FROM accuracy WHERE status = 'finished' AND complete AND group_id IS NOT NULL),
g AS (
    SELECT ok.group_id, count(*) AS k, avg(p.gain) AS m, stddev_samp(p.gain) AS sd,
           avg(100 * sqrt(p.helped + p.hurt) / p.n) AS se, avg(100 / p.n) AS delta,
           sum(p.helped)::BIGINT AS h, sum(p.hurt)::BIGINT AS u, sum(p.n)::BIGINT AS nn
    FROM {pairs} p JOIN ok USING (run_id)
    WHERE p.gain IS NOT NULL AND p.baseline_run IN (SELECT run_id FROM ok)
    GROUP BY ok.group_id
)
SELECT group_id, {baseline} AS baseline, k AS gain_runs, m AS paired_gain,
       CASE WHEN {two_level} THEN m - bca_gain_halfwidth(m, sd, k, se, delta)
            ELSE 100 * bca_gain_ci_low(h, u, nn) END AS gain_ci_low,
       CASE WHEN {two_level} THEN m + bca_gain_halfwidth(m, sd, k, se, delta)
            ELSE 100 * bca_gain_ci_high(h, u, nn) END AS gain_ci_high,
       CASE WHEN {two_level} THEN bca_gain_p(m, sd, k, se, delta) ELSE bca_mcnemar_p(h, u) END AS gain_p,
       CASE WHEN {two_level} THEN '{stats.TWO_LEVEL}' ELSE '{stats.POOLED_MCNEMAR}' END AS gain_test
FROM g
"""


_GAINS_SQL = ("CREATE OR REPLACE MACRO gains_against(baseline_method) AS TABLE "
              + _gains_sql("paired_against(baseline_method)", "baseline_method"))


def _summary_metrics() -> str:
    """Every registered metric's mean and std over a configuration's complete runs (Metric.summary_columns)."""
    return ",\n           ".join(
        f"avg({_ident(m.name)}) FILTER (WHERE complete) AS {_ident(mean)}, "
        f"stddev_samp({_ident(m.name)}) FILTER (WHERE complete) AS {_ident(std)}"
        for m in metrics.RUN_METRICS for mean, std in [m.summary_columns])


def _summary_sql(hparams: Sequence[str]) -> str:
    any_h = ", ".join(f"any_value({_ident(h)}) AS {_ident(h)}" for h in hparams)
    return f"""
CREATE OR REPLACE VIEW summary AS
WITH finished AS MATERIALIZED (SELECT * FROM accuracy WHERE status = 'finished' AND group_id IS NOT NULL),
grouped AS (
    -- only complete runs count: a finished run with lost or duplicated rows would shift the mean silently
    SELECT group_id, any_value(setting_id) AS setting_id, any_value(sweep) AS sweep,
           any_value(backbone) AS backbone, any_value(pretrained) AS pretrained, any_value(dataset) AS dataset,
           any_value(method) AS method, any_value(templates) AS templates,
           any_value(num_templates) AS num_templates, any_value(views) AS views, {any_h},
           any_value(stream) AS stream, any_value(batch_size) AS batch_size,
           count(*) FILTER (WHERE complete) AS n, list(DISTINCT seed ORDER BY seed) FILTER (WHERE complete) AS seeds,
           count(DISTINCT coalesce(order_index, 0)) FILTER (WHERE complete) AS orders,
           {_summary_metrics()},
           count(*) FILTER (WHERE NOT complete) AS n_incomplete
    FROM finished GROUP BY group_id
),
worst AS (
    -- OGA's measure over the runs of a configuration (its seeds x orders): the mean of the worst 10%
    SELECT group_id, worst10, worst_count
    FROM ({metrics.across_orders_sql("(SELECT * FROM finished WHERE complete)", "group_id", "accuracy")})
),
clip AS (
    -- zero-shot CLIP on the same backbone, data, templates and views, from any sweep
    SELECT setting_id, avg(accuracy) AS clip_mean FROM finished WHERE method = {sql_str(registry.baseline_method())}
           AND complete
    GROUP BY setting_id
)
SELECT g.*, worst.worst10, worst.worst_count, clip.clip_mean, g.mean - clip.clip_mean AS gain,
       gains.gain_runs, gains.paired_gain, gains.gain_ci_low, gains.gain_ci_high, gains.gain_p, gains.gain_test
FROM grouped g LEFT JOIN clip USING (setting_id) LEFT JOIN worst USING (group_id)
     LEFT JOIN ({_gains_sql('paired', sql_str(registry.baseline_method()))}) gains USING (group_id)
"""
