"""The results subcommands of `bca`: query, report, verify, compact (registered on the app by orchestrator/cli.py).

Exit codes: 0 success; 1 `verify` found problems / `report --sweep` found no such sweep / `report` or `query` read a
damaged store (runs it committed are not read: what they print stands on fewer runs, and stderr names them); 2 bad
usage, refused or malformed SQL, a query past its --timeout, unwritable output, missing results dir for verify; 130
a query stopped by Ctrl-C.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from orchestrator.results import schema
from orchestrator.results.metrics import RUN_METRICS

if TYPE_CHECKING:
    from orchestrator.results.db import ResultsDB

# Problems `bca sweep --resume` repairs (it re-runs what is missing of a run; see orchestrator.sweep.status).
REPAIRED_BY_RESUME = ("missing_rows", "gap", "bad_part", "temp_file")
RESULTS_HELP = f"Results directory written by `bca sweep` (default ./{schema.DEFAULT_RESULTS_DIR})."
# `bca query`'s default time limit: a scan of a study's 2 x 10^8 rows takes a minute or two on two cores; a query
# still running after ten is most likely an unintended join.
QUERY_TIMEOUT_S = 600.0


def _err(message: str) -> None:
    from rich.console import Console

    Console(stderr=True, soft_wrap=True).print(message, markup=False, highlight=False)


def _warn_bad_files(db: Any) -> None:
    for bad in db.bad_files:
        _err(f"warning: skipped bad file {bad.path}: {bad.error}")


def _damaged(db: Any, sweep: str | None = None) -> bool:
    """Name on stderr the runs the results dir committed that no view reads (`ResultsDB.lost`); True when any:
    whatever was printed stands on fewer runs than were made, and the command exits 1."""
    lost = db.lost(sweep)
    if lost:
        total = sum(found.count for found in lost)
        _err(f"error: the results are damaged: {total} run(s) committed to {db.results_dir} are not read, so what "
             f"is printed stands on fewer runs than were made:")
        for found in lost:
            _err(f"  {found}")
        _err(f"bca verify {db.results_dir} says more")
    return bool(lost)


def _existing_results(results: Path) -> Path:
    """The results dir, or exit 2 naming it: a mistyped --results must not read as "no runs"."""
    root = schema.resolve_results_dir(results)
    if not root.is_dir():
        what = "is a file, not a directory" if root.exists() else "does not exist"
        _err(f"error: results dir {root} {what}; expected the results_dir of a sweep spec (what `bca sweep` wrote)")
        raise typer.Exit(2)
    return root


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def query_cmd(
    sql: Optional[str] = typer.Argument(None, help="One SELECT over the views samples, runs, accuracy, summary, paired."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="Read the SQL from this file instead."),
    results: Path = typer.Option(Path(schema.DEFAULT_RESULTS_DIR), "--results", help=RESULTS_HELP),
    csv: bool = typer.Option(False, "--csv", help="Write CSV to stdout."),
    json_out: bool = typer.Option(False, "--json", help="Write a JSON array of row objects to stdout."),
    parquet: Optional[Path] = typer.Option(None, "--parquet", help="Write the result to this Parquet file."),
    max_rows: int = typer.Option(50, "--max-rows", min=1, help="Rows shown in the table view."),
    timeout: float = typer.Option(QUERY_TIMEOUT_S, "--timeout", min=0, help="Stop the query after this many "
                                  "seconds (0: no limit); Ctrl-C stops it at any time."),
) -> None:
    """Run read-only SQL over the results (views: samples, runs, accuracy, summary, paired)."""
    import duckdb
    import pyarrow.parquet as pq

    from orchestrator.results.atomic import atomic_write
    from orchestrator.results.db import QueryTimeout, ResultsDB
    from orchestrator.results.safety import QueryRefused

    if (sql is None) == (file is None):
        _err("error: give the SQL as an argument or with --file, not both or neither")
        raise typer.Exit(2)
    if sum([csv, json_out, parquet is not None]) > 1:
        _err("error: choose one of --csv, --json, --parquet")
        raise typer.Exit(2)
    if file is not None:
        try:
            sql = file.read_text(encoding="utf-8")
        except OSError as e:
            _err(f"error: cannot read SQL file {file}: {e.strerror or e}")
            raise typer.Exit(2)
    results = _existing_results(results)
    with ResultsDB(results) as db:
        try:
            table = db.query(sql or "", timeout_s=timeout or None)
        except QueryRefused as e:
            _err(f"refused: {e}")
            raise typer.Exit(2)
        except QueryTimeout as e:
            _err(f"error: {e} (--timeout {timeout:g}); give a larger --timeout, or 0 for none, or narrow the query")
            raise typer.Exit(2)
        except KeyboardInterrupt:
            _err("query interrupted (Ctrl-C)")
            raise typer.Exit(130)
        except duckdb.Error as e:
            _err(str(e))
            raise typer.Exit(2)
        finally:
            _warn_bad_files(db)
        damaged = _damaged(db)
    if parquet is not None:
        out = parquet.absolute()
        if out.resolve().is_relative_to(db.results_dir.resolve()):
            _err(f"error: --parquet {out} is inside the results dir {db.results_dir}; the results are read-only")
            raise typer.Exit(2)
        try:
            atomic_write(out, lambda tmp: pq.write_table(table, tmp), "query result")
        except OSError as e:
            _err(f"error: {e}")
            raise typer.Exit(2)
        _err(f"wrote {table.num_rows} row(s) to {out}")
    elif csv:
        table.to_pandas().to_csv(sys.stdout, index=False)
    elif json_out:
        sys.stdout.write(json.dumps(_jsonable(table.to_pylist()), ensure_ascii=False) + "\n")
    else:
        from rich.table import Table

        from orchestrator.results.report import wide_console
        from rich.text import Text

        view = Table(show_lines=False, header_style="bold")
        for name in table.column_names:
            view.add_column(Text(name), overflow="fold")
        for row in table.slice(0, max_rows).to_pylist():  # Text: values are never read as rich markup
            view.add_row(*(Text(_cell(v)) for v in row.values()))
        console = wide_console()
        console.print(view)
        shown = min(max_rows, table.num_rows)
        more = f"; showing {shown} (--max-rows, or --csv for all)" if shown < table.num_rows else ""
        console.print(f"{table.num_rows} row(s){more}", highlight=False)
    if damaged:
        raise typer.Exit(1)


def report_cmd(
    sweep: Optional[str] = typer.Option(None, "--sweep", help="Only this sweep's runs."),
    paper: bool = typer.Option(False, "--paper", help="Show the published numbers and measured minus published."),
    metric: str = typer.Option("accuracy", "--metric", help=f"{', '.join(m.name for m in RUN_METRICS)} (the metric "
                               "registry, orchestrator.results.metrics)."),
    table_kind: str = typer.Option("comparison", "--table", help="comparison: the paper's tables and a method x "
                                   "dataset table; cost: accuracy against latency and memory per method (the BCA "
                                   "paper's Table 3 shape)."),
    tune_on: Optional[str] = typer.Option(
        None, "--tune-on", help="Honest tuning: an SQL predicate over the runs view (e.g. \"order_index < 50\" or "
        "\"seed = 1\"); per method, backbone, dataset and stream the configuration with the best mean --metric on "
        "the matching runs is chosen and reported on the other runs only."),
    results: Path = typer.Option(Path(schema.DEFAULT_RESULTS_DIR), "--results", help=RESULTS_HELP),
) -> None:
    """Print the paper's Table 1 (OOD) and Table 2 (cross-domain) from finished runs, mean ± std over seeds and
    stream orders."""
    from orchestrator.results.db import ResultsDB
    from orchestrator.results.report import METRICS, cost_table, recorded_runs, report_tables, wide_console
    from orchestrator.results.tuning import TuneOnError, tune

    if metric not in METRICS:
        _err(f"--metric: unknown metric {metric!r}; expected one of: {', '.join(METRICS)}")
        raise typer.Exit(2)
    if table_kind not in ("comparison", "cost"):
        _err(f"--table: unknown table {table_kind!r}; expected comparison or cost")
        raise typer.Exit(2)
    results = _existing_results(results)
    with ResultsDB(results) as db:
        runs = None
        if tune_on is not None:
            try:
                tuning = tune(db, tune_on, metric)
            except TuneOnError as e:
                _err(f"error: {e}")
                raise typer.Exit(2)
            every = recorded_runs(db, sweep)
            runs = tuning.evaluation(every)
        tables = (report_tables(db, sweep=sweep, paper=paper, metric=metric, runs=runs) if table_kind == "comparison"
                  else [cost_table(db, sweep=sweep, runs=runs, metric=metric)])
        if tune_on is not None:
            for table in tables:
                table.notes[:0] = tuning.notes(every, db.used_hparam_names)
        _warn_bad_files(db)
        if not any(not t.empty for t in tables) and not paper:
            sweeps = [r["sweep"] for r in db.sql("SELECT DISTINCT sweep FROM runs ORDER BY 1").to_pylist()]
            where = f"for sweep {sweep!r} " if sweep else ""
            _err(f"no finished runs {where}in {db.results_dir}" + (f" (sweeps there: {', '.join(sweeps)})" if sweeps
                                                                   else ""))
            if _damaged(db, sweep) or sweep:
                raise typer.Exit(1)
            return
        versions = _dataset_versions(db, sweep)
        damaged = _damaged(db, sweep)
    rendered = [table.render() for table in tables]
    console = wide_console(fit=rendered)
    for table in rendered:
        console.print(table)
    for line in versions:
        _err(f"warning: {line}")
    if damaged:
        raise typer.Exit(1)


def _dataset_versions(db: ResultsDB, sweep: str | None) -> list[str]:
    """A line per dataset whose finished runs were made on different versions of its image list (images added or
    removed between runs): their numbers are not comparable."""
    where = " AND sweep = $sweep" if sweep is not None else ""
    sql = ("SELECT dataset, data_fingerprint, count(*) AS n, min(run_id) AS example FROM runs WHERE status = "
           f"'finished' AND data_fingerprint IS NOT NULL{where} GROUP BY 1, 2 ORDER BY 1, 3 DESC, 2")
    rows = db.sql(sql, {"sweep": sweep} if sweep is not None else None).to_pylist()
    by_dataset: dict[str, list[dict]] = {}
    for row in rows:
        by_dataset.setdefault(row["dataset"], []).append(row)
    return [f"{dataset}: finished runs were made on {len(versions)} versions of its image list ("
            + ", ".join(f"{v['n']} run(s) on {v['data_fingerprint']}, e.g. {v['example']}" for v in versions)
            + "); their numbers are not comparable: run the old ones again with bca sweep SPEC --rerun-changed"
            for dataset, versions in by_dataset.items() if len(versions) > 1]


def verify_cmd(
    results: Path = typer.Argument(Path(schema.DEFAULT_RESULTS_DIR), help=RESULTS_HELP),
) -> None:
    """List bad or unfinished parts and runs with missing or duplicate rows; exit code 1 when there are any."""
    from rich.console import Console

    from orchestrator.results.verify import verify_results

    root = _existing_results(results)
    report = verify_results(root)
    console = Console()
    summary = (f"{root}: {report.segments} segment(s), {report.parts} live part(s), {report.rows} row(s), "
               f"{report.runs} run(s)")
    if report.ok:
        console.print(f"{summary}: OK", markup=False, highlight=False)
        return
    # one plain line per problem, so paths stay whole for copying and grep
    console.print(summary, markup=False, highlight=False)
    console.print(f"{len(report.problems)} problem(s):", highlight=False)
    for p in report.problems:
        console.print(f"  {p.kind}: {p.where}: {p.detail}", markup=False, highlight=False, soft_wrap=True)
    if any(p.kind in REPAIRED_BY_RESUME for p in report.problems):
        console.print("bca sweep SPEC --resume repairs runs with missing rows, gaps or bad parts: it runs again what "
                      "is missing, exactly as an uninterrupted run writes it", markup=False, highlight=False)
    raise typer.Exit(1)


def compact_cmd(
    results: Path = typer.Argument(Path(schema.DEFAULT_RESULTS_DIR), help=RESULTS_HELP),
) -> None:
    """Move finished runs into large segments (a sweep does this by itself; this also converts a results dir
    written before segments existed). Safe while sweeps write and dashboards read."""
    from orchestrator.results.atomic import ResultsWriteError
    from orchestrator.results.compaction import compact
    from orchestrator.results.store import ManifestError, remove_orphans

    root = _existing_results(results)
    try:
        done = compact(root)
        orphans = remove_orphans(root)
    except (ResultsWriteError, ManifestError) as e:
        _err(f"error: {e}")
        raise typer.Exit(2)
    print(f"{root}: {done.runs} run(s), {done.rows} row(s) compacted into {len(done.segments)} new segment(s)"
          + (f"; {done.merged} small segments merged" if done.merged else "")
          + (f"; {done.upgraded} older segment(s) given their runs' newer metrics, stream curves or pairing "
             "statistics"
             if done.upgraded else "")
          + (f"; {done.leftovers} leftover run(s) removed" if done.leftovers else "")
          + (f"; {orphans} orphan segment file(s) removed" if orphans else ""))


def register(app: typer.Typer) -> None:
    app.command("query", context_settings={"ignore_unknown_options": True})(query_cmd)
    app.command("report")(report_cmd)
    app.command("verify")(verify_cmd)
    app.command("compact")(compact_cmd)
