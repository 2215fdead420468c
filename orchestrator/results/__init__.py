"""Results: the Parquet schema and layout, the run writer, the compacted store (segments listed by one manifest,
docs/results-store.md), DuckDB views, query safety, reports, verification.

    from orchestrator.results import RunWriter, ResultsDB
    w = RunWriter(results_dir, run_config); w.mark("running", n_samples=n); w.write_part(w.rows_done(), cols)
    ResultsDB(results_dir).df("SELECT * FROM summary")

Names are imported on first use, so `bca --help` and the writer in trial actors do not pay for DuckDB/pandas.
"""

from __future__ import annotations

from typing import Any


# Lazy imports as functions holding an import statement, which static tools follow (a name in a string they
# would not).

def _import_atomic() -> Any:
    from orchestrator.results import atomic

    return atomic


def _import_db() -> Any:
    from orchestrator.results import db

    return db


def _import_safety() -> Any:
    from orchestrator.results import safety

    return safety


def _import_schema() -> Any:
    from orchestrator.results import schema

    return schema


def _import_writer() -> Any:
    from orchestrator.results import writer

    return writer


def _import_report() -> Any:
    from orchestrator.results import report

    return report


def _import_verify() -> Any:
    from orchestrator.results import verify

    return verify


def _import_compaction() -> Any:
    from orchestrator.results import compaction

    return compaction


_EXPORTS = {
    "ResultsWriteError": _import_atomic,
    "VIEWS": _import_db,
    "BadFile": _import_db,
    "ResultsDB": _import_db,
    "QueryRefused": _import_safety,
    "config_hash": _import_schema,
    "normalize_config": _import_schema,
    "resolve_results_dir": _import_schema,
    "RunWriter": _import_writer,
    "load_state": _import_writer,
    "read_run": _import_writer,
    "method_dataset_table": _import_report,
    "verify_results": _import_verify,
    "compact": _import_compaction,
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'orchestrator.results' has no attribute {name!r}")
    return getattr(_EXPORTS[name](), name)
