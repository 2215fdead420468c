"""Results: the Parquet schema and layout, the run writer, the compacted store (segments listed by one manifest,
docs/results-store.md), DuckDB views, query safety, reports, verification.

    from orchestrator.results import RunWriter, ResultsDB
    w = RunWriter(results_dir, run_config); w.mark("running", n_samples=n); w.write_part(w.rows_done(), cols)
    ResultsDB(results_dir).df("SELECT * FROM summary")

Names are imported on first use, so `bca --help` and the writer in trial actors do not pay for DuckDB/pandas.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ResultsWriteError": "orchestrator.results.atomic",
    "VIEWS": "orchestrator.results.db",
    "BadFile": "orchestrator.results.db",
    "ResultsDB": "orchestrator.results.db",
    "QueryRefused": "orchestrator.results.safety",
    "config_hash": "orchestrator.results.schema",
    "normalize_config": "orchestrator.results.schema",
    "resolve_results_dir": "orchestrator.results.schema",
    "RunWriter": "orchestrator.results.writer",
    "load_state": "orchestrator.results.writer",
    "read_run": "orchestrator.results.writer",
    "method_dataset_table": "orchestrator.results.report",
    "verify_results": "orchestrator.results.verify",
    "compact": "orchestrator.results.compaction",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'orchestrator.results' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
