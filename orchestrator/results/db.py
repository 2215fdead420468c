"""DuckDB over the results' Parquet files: views samples, runs, accuracy, summary.

An in-memory connection takes no file lock, so any number of readers run while sweeps write. Before every
query the results dir is re-scanned (one stat per file; footers read once per new or changed file): while
all files are good the views read the layout's globs, which DuckDB re-expands on each query, so new runs
appear even through a cursor held by another thread; once a bad file (truncated, foreign, inconsistent) is
found, the views list the good files explicitly and the bad ones are reported in `bad_files`. A file that
only fails past its footer (while a query reads its data) is marked bad and the query retried without it.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import duckdb
import pandas as pd
import pyarrow as pa

from orchestrator.results import files, schema, safety

VIEWS = ("samples", "runs", "accuracy", "summary")
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


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _source(results_dir: Path, glob: str, good: Sequence[Path], use_glob: bool, hive: bool) -> str:
    target = _sql_str(str(results_dir / glob)) if use_glob else "[" + ", ".join(_sql_str(str(p)) for p in good) + "]"
    hive_opts = "hive_partitioning=true, hive_types_autocast=false" if hive else "hive_partitioning=false"
    return f"read_parquet({target}, {hive_opts}, union_by_name=true)"


def _select_list(columns: Sequence[schema.Column], present: set[str]) -> list[str]:
    return [f"CAST({_ident(c.name)} AS {c.sql}) AS {_ident(c.name)}" if c.name in present
            else f"CAST(NULL AS {c.sql}) AS {_ident(c.name)}" for c in columns]


_PARTITION_COLUMNS = tuple(schema.Column(k, pa.string(), "VARCHAR", "from the path") for k in schema.PARTITION_KEYS[:-1])
_RUN_NAMES = {c.name for c in schema.RUN_COLUMNS}
# Runs columns carried into accuracy and summary: the configuration, not bookkeeping or the trial's metrics.
_CONFIG_COLUMNS = ("pretrained", "seed", "templates", "num_templates", "views", "group_id", "setting_id")


class ResultsDB:
    """Read-only SQL over a results dir. Thread-safe: each query runs on its own cursor."""

    def __init__(self, results_dir: str | Path | None = None) -> None:
        self.results_dir = schema.resolve_results_dir(results_dir)
        self._checker = files.FileChecker()
        self._lock = threading.RLock()
        self._state_key: tuple | None = None
        self._bad: list[BadFile] = []
        self.extra_run_columns: list[str] = []
        self._con = duckdb.connect(":memory:")
        for stmt in (
            "SET autoinstall_known_extensions = false",
            "SET autoload_known_extensions = false",
            "SET python_enable_replacements = false",
            f"SET allowed_directories = [{_sql_str(str(self.results_dir) + '/')}]",
            "SET enable_external_access = false",
            "SET lock_configuration = true",
        ):
            self._con.execute(stmt)
        self.refresh()

    # ------------------------------------------------------------------------------------- lifecycle
    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> "ResultsDB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------------------- views
    @property
    def bad_files(self) -> list[BadFile]:
        """Files left out of the views at the last refresh, each with why."""
        return list(self._bad)

    def _scan(self, paths: list[Path], kind: str) -> tuple[list[Path], list[BadFile], set[str], dict[str, str]]:
        good, bad, present, extra = [], [], set(), {}
        for path in paths:
            check = self._checker.check(path, kind)
            if check is None:
                continue
            if check.ok:
                good.append(path)
                present.update(check.columns)
                extra.update({k: v for k, v in check.columns.items() if k not in _RUN_NAMES})
            else:
                bad.append(BadFile(path, check.error or "bad file"))
        return good, bad, present, extra

    def refresh(self) -> list[BadFile]:
        """Re-scan the results dir and rebuild the views when the set of good files changed; returns bad_files."""
        with self._lock:
            root = self.results_dir
            s_good, s_bad, s_cols, _ = self._scan(files.sample_parts(root), "samples")
            r_good, r_bad, r_cols, r_extra = self._scan(files.run_files(root), "runs")
            # With no bad file the views use globs, which need no rebuild when files are added.
            key = (tuple(s_good) if s_bad else bool(s_good), tuple(sorted(s_cols)),
                   tuple(r_good) if r_bad else bool(r_good), tuple(sorted(r_cols)))
            if key != self._state_key:
                self._build(s_good, not s_bad, s_cols, r_good, not r_bad, r_cols, sorted(r_extra))
                self._state_key = key
            self._bad = s_bad + r_bad
            return self.bad_files

    def _build(self, s_good: list[Path], s_glob: bool, s_cols: set[str], r_good: list[Path], r_glob: bool,
               r_cols: set[str], r_extra: list[str]) -> None:
        root = self.results_dir
        sample_cols = _select_list(schema.SAMPLE_COLUMNS, s_cols) + _select_list(_PARTITION_COLUMNS, set(
            schema.PARTITION_KEYS) if s_good else set())
        if s_good:
            samples = (f"SELECT {', '.join(sample_cols)} FROM "
                       f"{_source(root, schema.SAMPLES_GLOB, s_good, s_glob, hive=True)}")
        else:
            samples = f"SELECT {', '.join(sample_cols)} WHERE false"
        run_cols = _select_list(schema.RUN_COLUMNS, r_cols) + [_ident(c) for c in r_extra]
        if r_good:
            runs = f"SELECT {', '.join(run_cols)} FROM {_source(root, schema.RUNS_GLOB, r_good, r_glob, hive=False)}"
        else:
            runs = f"SELECT {', '.join(run_cols)} WHERE false"
        self.extra_run_columns = list(r_extra)
        hparams = [c.name for c in schema.HPARAM_COLUMNS] + list(r_extra)
        carried = [*_CONFIG_COLUMNS, *hparams]
        con = self._con
        con.execute(f"CREATE OR REPLACE VIEW samples AS {samples}")
        con.execute(f"CREATE OR REPLACE VIEW runs AS {runs}")
        con.execute(_accuracy_sql(carried))
        con.execute(_summary_sql(hparams))

    # --------------------------------------------------------------------------------------- queries
    def _blame(self, error: duckdb.Error) -> bool:
        """Mark the files to blame for a failed query as bad: those its message names, else (for errors that can
        come from reading data, not from the SQL itself) any good file that fails a full read. Any found?"""
        named = re.findall(re.escape(str(self.results_dir)) + r"/[^'\"\n]*?\.parquet", str(error))
        for path in named:
            self._checker.mark_bad(Path(path), f"unreadable data: {str(error).splitlines()[0]}")
        if named or isinstance(error, _SQL_ERRORS):
            return bool(named)
        found = False
        for kind, paths in (("samples", files.sample_parts(self.results_dir)), ("runs", files.run_files(self.results_dir))):
            for path in paths:
                shallow = self._checker.check(path, kind)
                if shallow is not None and shallow.ok:
                    deep = self._checker.deep_check(path, kind)
                    found |= deep is not None and not deep.ok
        return found

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

    def df(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> pd.DataFrame:
        """Trusted SQL as a pandas DataFrame."""
        return self._run(lambda cur: cur.sql(query, params=params).df())

    def query(self, user_sql: str) -> pa.Table:
        """User SQL: exactly one read-only SELECT (safety.check_query), as an Arrow table.

        Raises safety.QueryRefused for refused statements and duckdb.Error (its own message) for bad SQL.
        """
        statement = safety.check_query(user_sql)
        return self._run(lambda cur: cur.sql(statement).to_arrow_table())

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor over freshly refreshed views, for a thread that runs its own queries (e.g. the dashboard)."""
        self.refresh()
        return self._con.cursor()


def _accuracy_sql(carried: Sequence[str]) -> str:
    r_cols = ", ".join(f"r.{_ident(c)}" for c in carried)
    return f"""
CREATE OR REPLACE VIEW accuracy AS
WITH stats AS (
    SELECT run_id, any_value(sweep) AS s_sweep, any_value(backbone) AS s_backbone,
           any_value(dataset) AS s_dataset, any_value(method) AS s_method,
           count(*) AS n_rows, count(DISTINCT sample_idx) AS n_distinct
    FROM samples GROUP BY run_id
),
acc AS (
    -- last 50%: stream positions i >= n // 2 (numpy's correct[n // 2:]), n = the run's n_samples (its row
    -- count when unknown)
    SELECT s.run_id,
           100 * avg(s.correct::DOUBLE) AS accuracy,
           100 * avg(s.correct::DOUBLE) FILTER (WHERE s.sample_idx >= coalesce(r.n_samples, st.n_rows) // 2)
               AS last50_accuracy
    FROM samples s JOIN stats st USING (run_id) LEFT JOIN runs r USING (run_id)
    GROUP BY s.run_id
)
SELECT st.run_id,
       coalesce(r.sweep, st.s_sweep) AS sweep, coalesce(r.backbone, st.s_backbone) AS backbone,
       coalesce(r.dataset, st.s_dataset) AS dataset, coalesce(r.method, st.s_method) AS method,
       r.status, r.n_samples, st.n_rows, st.n_distinct,
       coalesce(r.n_samples = st.n_rows AND st.n_distinct = st.n_rows, false) AS complete,
       acc.accuracy, acc.last50_accuracy, {r_cols}
FROM stats st JOIN acc USING (run_id) LEFT JOIN runs r USING (run_id)
"""


def _summary_sql(hparams: Sequence[str]) -> str:
    any_h = ", ".join(f"any_value({_ident(h)}) AS {_ident(h)}" for h in hparams)
    return f"""
CREATE OR REPLACE VIEW summary AS
WITH finished AS (SELECT * FROM accuracy WHERE status = 'finished' AND group_id IS NOT NULL),
grouped AS (
    -- only complete runs count: a finished run with lost or duplicated rows would shift the mean silently
    SELECT group_id, any_value(setting_id) AS setting_id, any_value(sweep) AS sweep,
           any_value(backbone) AS backbone, any_value(pretrained) AS pretrained, any_value(dataset) AS dataset,
           any_value(method) AS method, any_value(templates) AS templates,
           any_value(num_templates) AS num_templates, any_value(views) AS views, {any_h},
           count(*) FILTER (WHERE complete) AS n, list(seed ORDER BY seed) FILTER (WHERE complete) AS seeds,
           avg(accuracy) FILTER (WHERE complete) AS mean, stddev_samp(accuracy) FILTER (WHERE complete) AS std,
           avg(last50_accuracy) FILTER (WHERE complete) AS last50_mean,
           stddev_samp(last50_accuracy) FILTER (WHERE complete) AS last50_std,
           count(*) FILTER (WHERE NOT complete) AS n_incomplete
    FROM finished GROUP BY group_id
),
clip AS (
    -- zero-shot CLIP on the same backbone, data, templates and views, from any sweep
    SELECT setting_id, avg(accuracy) AS clip_mean FROM finished WHERE method = 'clip' AND complete
    GROUP BY setting_id
)
SELECT g.*, clip.clip_mean, g.mean - clip.clip_mean AS gain
FROM grouped g LEFT JOIN clip USING (setting_id)
"""
