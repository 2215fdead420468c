"""Results: the Parquet schema and layout, the run writer, DuckDB views, query safety, reports, verification.

    from orchestrator.results import RunWriter, ResultsDB
    w = RunWriter(results_dir, run_config); w.mark("running", n_samples=n); w.write_part(w.rows_done(), cols)
    ResultsDB(results_dir).df("SELECT * FROM summary")
"""

from orchestrator.results.atomic import ResultsWriteError
from orchestrator.results.db import VIEWS, BadFile, ResultsDB
from orchestrator.results.safety import QueryRefused
from orchestrator.results.schema import config_hash, normalize_config, resolve_results_dir
from orchestrator.results.writer import RunWriter, load_state, read_run

__all__ = ["VIEWS", "BadFile", "QueryRefused", "ResultsDB", "ResultsWriteError", "RunWriter", "config_hash",
           "load_state", "normalize_config", "read_run", "resolve_results_dir"]
