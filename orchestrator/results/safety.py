"""Which user SQL `bca query` runs: exactly one read-only SELECT over the results views.

Two layers. Here, DuckDB's own parser and tokenizer decide: the statement must parse to one SELECT (so COPY,
ATTACH, INSTALL/LOAD, CREATE, INSERT, UPDATE, DELETE, DROP, PRAGMA, SET, EXPORT, CALL... are refused by
type), a table function may only be called when it is on a short allowlist of ones that touch no files
(so read_csv, read_parquet, glob, read_text, query, ... are refused by name), and no table name may look like
a file path or URL (FROM 'x.csv' would open the file). Underneath, db.py's
connection has external access disabled outside the results dir and its configuration locked, so even
SQL that slipped past this check could not write or read anywhere else.
"""

from __future__ import annotations

import json

import duckdb

# What a query may read, for the refusals (orchestrator.results.db defines them).
READABLE = ("the views samples, runs, accuracy, summary and paired and the macros paired_against(method), "
            "gains_against(method), tuned_choice(tune_ids) and tuned(tune_ids)")

# Table functions that read nothing but their arguments or the in-memory catalog.
ALLOWED_TABLE_FUNCTIONS = frozenset({
    "range", "generate_series", "unnest", "repeat", "repeat_row", "json_each", "json_tree", "summary",
    "histogram", "histogram_values", "icu_calendar_names", "pg_timezone_names", "test_all_types",
    "pragma_table_info", "pragma_version", "pragma_platform", "pragma_show", "pragma_collations",
    "duckdb_columns", "duckdb_views", "duckdb_tables", "duckdb_functions", "duckdb_types", "duckdb_keywords",
    "duckdb_schemas", "duckdb_databases", "duckdb_constraints", "duckdb_settings", "duckdb_extensions",
    "duckdb_variables",
})
# Refused wherever they are called, even where the running DuckDB does not register them as table functions.
DENIED_FUNCTIONS = frozenset({
    "read_csv", "read_csv_auto", "sniff_csv", "read_parquet", "parquet_scan", "read_json", "read_json_auto",
    "read_json_objects", "read_ndjson", "read_ndjson_auto", "read_ndjson_objects", "read_text", "read_blob",
    "glob", "read_duckdb", "query", "query_table", "getenv", "json_execute_serialized_sql", "read_xlsx",
    "st_read", "iceberg_scan", "delta_scan", "sqlite_scan", "postgres_scan", "mysql_scan",
})
DENIED_PREFIXES = ("read_", "parquet_", "sniff_", "iceberg_", "delta_", "sqlite_", "postgres_", "mysql_")


# Characters of a file path, glob or URL, none of which the views' names (or sensible CTE names) contain.
_PATH_CHARS = "/\\.:*?~"


class QueryRefused(ValueError):
    """The SQL is valid but not allowed here; the message says why and what is allowed."""


def _table_function_names() -> frozenset[str]:
    con = duckdb.connect(":memory:")
    try:
        rows = con.execute("SELECT DISTINCT function_name FROM duckdb_functions() "
                           "WHERE function_type IN ('table', 'table_macro')").fetchall()
    finally:
        con.close()
    return frozenset(r[0].lower() for r in rows)


_TABLE_FUNCTIONS: frozenset[str] | None = None


def _called_names(sql: str) -> list[str]:
    """Names directly followed by '(' (function calls, and CTE column lists, which are harmless)."""
    tokens = duckdb.tokenize(sql)
    spans = []
    for i, (offset, kind) in enumerate(tokens):
        end = tokens[i + 1][0] if i + 1 < len(tokens) else len(sql)
        spans.append((sql[offset:end].strip(), kind))
    names = []
    for (text, kind), (nxt, nkind) in zip(spans, spans[1:]):
        if kind in (duckdb.token_type.identifier, duckdb.token_type.keyword) and nxt.startswith("(") \
                and nkind == duckdb.token_type.operator:
            names.append(text.strip('"').lower())
    return names


def _table_names(sql: str) -> list[str] | None:
    """Names the statement reads as tables (views, CTEs, and strings DuckDB would open as files), from DuckDB's
    own parse tree; None when DuckDB cannot serialise the statement."""
    con = duckdb.connect(":memory:")
    try:
        tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
    finally:
        con.close()
    if tree.get("error"):
        return None
    names: list[str] = []
    stack: list = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "BASE_TABLE":
                names.append(str(node.get("table_name", "")))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return names


def check_query(sql: str) -> str:
    """Return the single statement to run, or raise QueryRefused (duckdb.ParserException for malformed SQL)."""
    global _TABLE_FUNCTIONS
    statements = duckdb.extract_statements(sql)
    if not statements:
        raise QueryRefused("empty query: expected one SELECT statement")
    if len(statements) > 1:
        raise QueryRefused(f"one statement at a time: got {len(statements)}; run them separately")
    stmt = statements[0]
    if stmt.type != duckdb.StatementType.SELECT:
        # the statement's own keyword (DuckDB files INSTALL under LOAD, for one)
        words = stmt.query.split()
        kind = words[0].upper() if words and words[0].isalpha() else stmt.type.name
        hint = " (PIVOT needs an explicit IN list here)" if stmt.type.name == "MULTI" else ""
        raise QueryRefused(f"{kind} statements are not allowed{hint}: the results are read-only; use SELECT "
                           f"(WITH, FROM, DESCRIBE, SUMMARIZE, SHOW) over {READABLE}")
    if _TABLE_FUNCTIONS is None:
        _TABLE_FUNCTIONS = _table_function_names()
    for name in _called_names(stmt.query):
        denied = name in DENIED_FUNCTIONS or name.startswith(DENIED_PREFIXES) or (
            name in _TABLE_FUNCTIONS and name not in ALLOWED_TABLE_FUNCTIONS)
        if denied:
            raise QueryRefused(f"function {name}() is not allowed: queries may read only {READABLE}, not files or "
                               "other sources")
    # A file path or URL in FROM ('x.csv', "dir/*.parquet") is opened by a replacement scan. The connection only
    # allows the results dir, but DuckDB checks that lexically: results/<symlink>/../x is "inside" the results
    # while the OS resolves it outside. So no table name may look like a path.
    names = _table_names(stmt.query)
    if names is None:
        raise QueryRefused(f"this statement cannot be checked; write it as a plain SELECT over {READABLE}")
    for name in names:
        if any(c in name for c in _PATH_CHARS):
            raise QueryRefused(f"table {name!r} looks like a file or URL: queries may read only {READABLE}, not "
                               "files")
    return stmt.query
