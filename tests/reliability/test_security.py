"""Security (issue 7, item 7): user SQL reads the results and nothing else, writes nothing.

Covered next door, not repeated: the table of refused statements and functions (tests/test_results_safety.py),
the connection's own limits without the statement check (tests/test_results_db.py), `bca query --parquet`
refusing to write into the results, and the dashboard listening on 127.0.0.1 unless --host says otherwise
(tests/test_dashboard_browser.py reads the listening socket from /proc/net/tcp). Here: the ways around the
allowed-directory check that do not look like a file function at all.
"""

from __future__ import annotations

import os

import duckdb
import pytest

from orchestrator.results.db import ResultsDB
from orchestrator.results.safety import QueryRefused
from orchestrator.results.testing import make_fake_results

SECRET = "secret_value_42"


@pytest.fixture
def layout(tmp_path):
    """results/ with one fake run, a secret CSV beside it, and a symlink inside results pointing out."""
    results = tmp_path / "results"
    make_fake_results(results, methods={"clip": {}}, seeds=(1,), n=20)
    (tmp_path / "secret.csv").write_text(f"a\n{SECRET}\n")
    (results / "escape").symlink_to(tmp_path)
    return tmp_path, results


def _attempts(tmp_path, results) -> dict[str, str]:
    return {
        "absolute path": f"SELECT * FROM '{tmp_path}/secret.csv'",
        "relative path": "SELECT * FROM 'secret.csv'",
        "dot-dot out of the results": f"SELECT * FROM '{results}/../secret.csv'",
        "symlink inside the results": f"SELECT * FROM '{results}/escape/secret.csv'",
        "symlink then dot-dot": f"SELECT * FROM '{results}/escape/../{tmp_path.name}/secret.csv'",
        "glob through the symlink": f"SELECT * FROM '{results}/escape/*.csv'",
        "file URL": f"SELECT * FROM 'file://{tmp_path}/secret.csv'",
        "http URL": "SELECT * FROM 'http://127.0.0.1:9/x.csv'",
        "quoted identifier path": f'SELECT * FROM "{tmp_path}/secret.csv"',
        "path in a subquery": f"SELECT (SELECT count(*) FROM '{tmp_path}/secret.csv') AS n FROM runs",
        "path in DESCRIBE": f"DESCRIBE SELECT * FROM '{tmp_path}/secret.csv'",
        "duckdb's spill dir (./.tmp)": "SELECT * FROM '.tmp/secret.csv'",
        "absolute spill dir": f"SELECT * FROM '{tmp_path}/.tmp/secret.csv'",
    }


@pytest.mark.parametrize("name", list(_attempts(__import__("pathlib").Path("/x"), __import__("pathlib").Path("/x/r"))))
def test_user_sql_cannot_read_outside_the_results(layout, monkeypatch, name, ledger):
    tmp_path, results = layout
    # DuckDB spills to ./.tmp under the current directory by default; put a secret there too
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "secret.csv").write_text(f"a\n{SECRET}\n")
    monkeypatch.chdir(tmp_path)
    sql = _attempts(tmp_path, results)[name]
    with ResultsDB(results) as db:
        try:
            table = db.query(sql)
        except (QueryRefused, duckdb.Error):
            leaked = False
        else:
            leaked = SECRET in str(table.to_pylist())
        assert not leaked, f"{name}: {sql} read a file outside {results}"
        assert db.query("SELECT count(*) AS n FROM samples").to_pylist() == [{"n": 20}]
    ledger.bad_input(f"SQL reaching outside the results: {name}", "refused")


def test_trusted_path_cannot_unlock_the_connection(layout, monkeypatch):
    """Even SQL that skips the statement check (the package's own db.sql) cannot turn file access back on."""
    tmp_path, results = layout
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "secret.csv").write_text(f"a\n{SECRET}\n")
    monkeypatch.chdir(tmp_path)
    with ResultsDB(results) as db:
        for stmt in ("SET enable_external_access = true", f"SET allowed_directories = ['{tmp_path}/']",
                     "SET temp_directory = '/'", "RESET lock_configuration"):
            with pytest.raises(duckdb.Error):
                db.sql(stmt)
        with pytest.raises(duckdb.Error):
            db.sql(f"COPY (SELECT 1) TO '{tmp_path}/written.csv'")
        with pytest.raises(duckdb.Error):  # DuckDB's default spill dir ./.tmp is allowed unless moved
            db.sql("SELECT * FROM '.tmp/secret.csv'")
    assert not (tmp_path / "written.csv").exists()


def test_queries_leave_no_files_behind(layout, monkeypatch):
    """Reading the results writes nothing: not into the results, not into the current directory."""
    tmp_path, results = layout
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    before = sorted(p for p in results.rglob("*"))
    with ResultsDB(results) as db:
        db.query("SELECT method, avg(accuracy) FROM accuracy GROUP BY method")
        db.query("SELECT * FROM samples ORDER BY confidence DESC")
    assert sorted(p for p in results.rglob("*")) == before
    assert os.listdir(work) == []
