"""`bca query` SQL safety: one read-only SELECT over the views; everything that writes or reaches out is refused."""

from __future__ import annotations

import duckdb
import pytest

from orchestrator.results.db import ResultsDB
from orchestrator.results.safety import QueryRefused, check_query
from orchestrator.results.testing import make_fake_results

REFUSED = [
    ("COPY samples TO '/tmp/out.csv'", "COPY statements are not allowed"),
    ("COPY (SELECT * FROM runs) TO '/tmp/out.parquet' (FORMAT parquet)", "COPY statements"),
    ("ATTACH '/tmp/x.duckdb' AS x", "ATTACH statements"),
    ("DETACH x", "DETACH statements"),
    ("INSTALL httpfs", "INSTALL statements"),
    ("LOAD httpfs", "LOAD statements"),
    ("CREATE TABLE t AS SELECT 1", "CREATE statements"),
    ("CREATE MACRO m(x) AS x", "CREATE statements"),
    ("CREATE OR REPLACE VIEW samples AS SELECT 1", "CREATE statements"),
    ("INSERT INTO t VALUES (1)", "INSERT statements"),
    ("UPDATE t SET a = 1", "UPDATE statements"),
    ("DELETE FROM t", "DELETE statements"),
    ("DROP VIEW samples", "DROP statements"),
    ("ALTER VIEW samples RENAME TO s2", "ALTER statements"),
    ("PRAGMA version", "PRAGMA statements"),
    ("SET enable_external_access = true", "SET statements"),
    ("RESET threads", "RESET statements"),
    ("SET VARIABLE x = 1", "SET statements"),
    ("EXPORT DATABASE '/tmp/db'", "EXPORT statements"),
    ("CALL pragma_version()", "CALL statements"),
    ("CHECKPOINT", "CHECKPOINT statements"),
    ("BEGIN TRANSACTION", "BEGIN statements"),
    ("PREPARE p AS SELECT 1", "PREPARE statements"),
    ("VACUUM", "VACUUM statements"),
    ("EXPLAIN ANALYZE COPY (SELECT 1) TO '/tmp/x.csv'", "EXPLAIN statements"),
    ("PIVOT runs ON method USING count(*)", "PIVOT needs an explicit IN list"),
    ("SELECT 1; SELECT 2", "one statement at a time: got 2"),
    ("SELECT 1; DROP VIEW runs", "one statement at a time"),
    ("", "empty query"),
    ("  ;  ", "empty query"),
    ("SELECT * FROM read_csv('/etc/passwd')", "function read_csv() is not allowed"),
    ("SELECT * FROM read_csv_auto('/etc/passwd')", "read_csv_auto()"),
    ("SELECT * FROM read_parquet('/tmp/*.parquet')", "read_parquet()"),
    ("SELECT * FROM parquet_scan('/tmp/x.parquet')", "parquet_scan()"),
    ("SELECT * FROM read_json('/etc/x.json')", "read_json()"),
    ("SELECT * FROM read_text('/etc/hostname')", "read_text()"),
    ("SELECT * FROM read_blob('/etc/hostname')", "read_blob()"),
    ("SELECT * FROM glob('/etc/*')", "glob()"),
    ("SELECT * FROM parquet_metadata('/tmp/x.parquet')", "parquet_metadata()"),
    ("SELECT * FROM sniff_csv('/etc/passwd')", "sniff_csv()"),
    ("SELECT * FROM query('SELECT 1')", "query()"),
    ("SELECT * FROM query_table('runs')", "query_table()"),
    ('SELECT * FROM "read_csv"(\'/etc/passwd\')', "read_csv()"),
    ("SELECT * FROM main.READ_TEXT('/etc/hostname')", "read_text()"),
    ("SELECT * FROM read_csv ('/etc/passwd')", "read_csv()"),
    ("SELECT getenv('HOME')", "getenv()"),
    ("SELECT * FROM pandas_scan('x')", "pandas_scan()"),
    ("SELECT * FROM sqlite_scan('x.db', 't')", "sqlite_scan()"),
    ("SELECT * FROM read_duckdb('x.db')", "read_duckdb()"),
    ("WITH t AS (SELECT * FROM read_csv('/etc/passwd')) SELECT * FROM t", "read_csv()"),
    ("SELECT (SELECT count(*) FROM glob('/*'))", "glob()"),
]


@pytest.mark.parametrize("sql, message", REFUSED)
def test_refused_statements(tmp_path, sql, message):
    db = ResultsDB(tmp_path)
    with pytest.raises(QueryRefused, match=message.replace("(", r"\(").replace(")", r"\)")):
        db.query(sql)
    # and nothing changed: the views are still there, nothing was written
    assert db.sql("SELECT count(*) AS c FROM runs").to_pylist() == [{"c": 0}]
    assert not any((tmp_path / "out.csv").parent.glob("out.*"))


ALLOWED = [
    "SELECT count(*) AS n FROM samples",
    "select method, avg(accuracy) from accuracy group by method;",
    "WITH t AS (SELECT * FROM summary) SELECT * FROM t",
    "FROM runs SELECT run_id",
    "DESCRIBE samples",
    "SUMMARIZE accuracy",
    "SHOW TABLES",
    "PIVOT runs ON method IN ('clip', 'bca') USING count(*) GROUP BY dataset",
    "SELECT * FROM range(3) r(x)",
    "SELECT * FROM unnest([1, 2])",
    "SELECT json_extract(config_json, '$.seed') FROM runs",
    "-- a comment\nSELECT 1 AS one /* and another */",
    "SELECT 'read_csv(' AS text_that_looks_like_a_call",
]


@pytest.fixture(scope="module")
def fake_db(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    make_fake_results(root, seeds=(1,), n=20)
    return ResultsDB(root)


@pytest.mark.parametrize("sql", ALLOWED)
def test_allowed_statements(fake_db, sql):
    assert fake_db.query(sql).num_columns >= 1


def test_malformed_sql_gives_duckdbs_message(tmp_path):
    with pytest.raises(duckdb.ParserException, match="syntax error"):
        ResultsDB(tmp_path).query("SELEC 1")
    with pytest.raises(duckdb.BinderException, match="nonexistent"):
        ResultsDB(tmp_path).query("SELECT nonexistent FROM samples")


def test_file_paths_as_tables_cannot_leave_the_results(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "secret.csv").write_text("a\n1\n")
    db = ResultsDB(tmp_path / "results")
    with pytest.raises((QueryRefused, duckdb.Error)):
        db.query(f"SELECT * FROM '{tmp_path / 'secret.csv'}'")


def test_check_query_returns_the_single_statement():
    assert check_query("  SELECT 1 ;  ").strip().rstrip(";").strip() == "SELECT 1"
