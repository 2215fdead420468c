"""The evaluation behind the results store's design (docs/results-store.md): Delta Lake (deltalake, delta-rs),
Apache Iceberg (pyiceberg, a SQLite catalog) and this project's live files + compaction into segments, on the
same generated runs, the way a sweep writes them: each run's rows appended when it finishes, by its own writer.

    python -m benchmarks.store_eval [--runs 500] [--rows-per-run 2000] [--writers 2]

Per backend: seconds per appended run, files after the appends, compaction, then in a fresh DuckDB connection:
listing the table's files (open), a count over all rows, and one run's rows. `--writers` processes append at
once (different runs), to see how each backend's commit protocol takes concurrent writers on one filesystem.
Needs `pip install deltalake 'pyiceberg[sql-sqlite,pyarrow]'` (not project dependencies: the store uses neither).
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks.scale import _configs, _rows


def _table(config: dict, n: int) -> tuple[str, pa.Table]:
    from orchestrator.results.schema import config_hash

    run_id = config_hash(config)
    rng = np.random.default_rng(int(run_id, 16) % 2**32)
    cols = _rows(run_id, n, rng, 0.6)
    return run_id, pa.table({
        "run_id": pa.array([run_id] * n), "sample_idx": np.arange(n, dtype=np.int64),
        "image_id": pa.array([f"img_{i:07d}" for i in range(n)]), "label": cols["label"], "pred": cols["pred"],
        "correct": cols["label"] == cols["pred"], "confidence": cols["confidence"], "method": [config["method"]] * n,
        "dataset": [config["dataset"]] * n})


# ------------------------------------------------------------------------------------------------ writers
def _delta_writer(path: str, configs: list[dict], n: int) -> None:
    from deltalake import write_deltalake

    for config in configs:
        table = _table(config, n)[1]
        for attempt in range(50):  # delta-rs retries a lost commit race a few times itself; past that, again here
            try:
                write_deltalake(path, table, mode="append")
                break
            except Exception:  # noqa: BLE001 - CommitFailedError
                time.sleep(0.05 * (attempt + 1))
        else:
            raise RuntimeError("delta: commit kept failing")


def _iceberg_catalog(root: str):
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog("bench", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")


def _iceberg_writer(root: str, configs: list[dict], n: int) -> None:
    table = _iceberg_catalog(root).load_table("bench.samples")
    for config in configs:
        for attempt in range(50):  # optimistic concurrency: a commit that lost the race is retried
            try:
                table.append(_table(config, n)[1])
                break
            except Exception:  # noqa: BLE001 - CommitFailedException and SQLite's busy errors
                time.sleep(0.05 * (attempt + 1))
                table = _iceberg_catalog(root).load_table("bench.samples")
        else:
            raise RuntimeError("iceberg: commit kept failing")


def _store_writer(root: str, configs: list[dict], n: int) -> None:
    from orchestrator.results.writer import RunWriter

    for config in configs:
        run_id, table = _table(config, n)
        writer = RunWriter(root, config)
        writer.mark("running", n_samples=n)
        writer.write_part(0, {k: table.column(k).to_numpy(zero_copy_only=False)
                              for k in ("label", "pred", "confidence")} | {"image_id": table.column("image_id").to_pylist()})
        writer.mark("finished", n_samples=n)


def _appends(target, where: str, configs: list[dict], n: int, writers: int) -> float:
    chunks = [configs[i::writers] for i in range(writers)]
    t0 = time.perf_counter()
    procs = [mp.get_context("spawn").Process(target=target, args=(where, chunk, n)) for chunk in chunks]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"{target.__name__} failed with exit code {p.exitcode}")
    return time.perf_counter() - t0


def _files(path: Path) -> int:
    return sum(1 for p in path.rglob("*") if p.is_file())


def _duckdb_reads(paths: list[str], run_id: str, total: int) -> dict[str, float]:
    import duckdb

    con = duckdb.connect()
    listed = "[" + ", ".join(f"'{p}'" for p in paths) + "]"
    t0 = time.perf_counter()
    n = con.execute(f"SELECT count(*) FROM read_parquet({listed})").fetchone()[0]
    count_s = time.perf_counter() - t0
    assert n == total, (n, total)
    t0 = time.perf_counter()
    con.execute(f"SELECT sum(correct::INT) FROM read_parquet({listed}) WHERE run_id = '{run_id}'").fetchone()
    return {"count_s": count_s, "one_run_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--rows-per-run", type=int, default=2000)
    parser.add_argument("--writers", type=int, default=2)
    args = parser.parse_args(argv)
    n, configs = args.rows_per_run, _configs(args.runs)
    probe = _table(configs[len(configs) // 2], 1)[0]
    work = Path(tempfile.mkdtemp(prefix="bca-store-eval-"))
    print(f"machine: {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f} (shared with other work: treat "
          f"seconds as rough); {args.runs} runs x {n} rows, {args.writers} writers appending at once")
    rows = []
    try:
        # Delta Lake
        from deltalake import DeltaTable

        path = work / "delta"
        from deltalake import write_deltalake

        write_deltalake(str(path), _table(configs[0], 1)[1].slice(0, 0))  # created once: concurrent creates conflict
        append_s = _appends(_delta_writer, str(path), configs, n, args.writers)
        files = _files(path)
        t0 = time.perf_counter()
        dt = DeltaTable(str(path))
        dt.optimize.compact()
        dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        dt.cleanup_metadata()
        compact_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        paths = DeltaTable(str(path)).file_uris()
        open_s = time.perf_counter() - t0
        rows.append(("Delta Lake (deltalake)", append_s, files, compact_s, _files(path), open_s,
                     _duckdb_reads(paths, probe, args.runs * n)))
        # Iceberg
        root = work / "iceberg"
        root.mkdir()
        catalog = _iceberg_catalog(str(root))
        catalog.create_namespace("bench")
        catalog.create_table("bench.samples", schema=_table(configs[0], 1)[1].schema)
        append_s = _appends(_iceberg_writer, str(root), configs, n, args.writers)
        files = _files(root)
        t0 = time.perf_counter()
        scan = _iceberg_catalog(str(root)).load_table("bench.samples").scan()
        paths = [task.file.file_path.removeprefix("file://") for task in scan.plan_files()]
        open_s = time.perf_counter() - t0
        rows.append(("Apache Iceberg (pyiceberg)", append_s, files, float("nan"), files, open_s,
                     _duckdb_reads(paths, probe, args.runs * n)))
        # this project's store
        from orchestrator.results import compaction, store
        from orchestrator.results.db import ResultsDB

        root = work / "store"
        append_s = _appends(_store_writer, str(root), configs, n, args.writers)
        files = _files(root)
        t0 = time.perf_counter()
        compaction.compact(root)
        compact_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        paths = [str(p) for p in store.load_catalog(root).paths("samples")]
        open_s = time.perf_counter() - t0
        reads = _duckdb_reads(paths, probe, args.runs * n)
        t0 = time.perf_counter()
        with ResultsDB(root):
            reads["resultsdb_open_s"] = time.perf_counter() - t0
        rows.append(("live files + segments (this store)", append_s, files, compact_s, _files(root), open_s, reads))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("| backend | append ms/run | files after appends | compaction s | files after | list files s | "
          "count s | one run s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, append_s, files, compact_s, after, open_s, reads in rows:
        print(f"| {name} | {1000 * append_s / args.runs:.0f} | {files:,} | "
              f"{'not in pyiceberg' if compact_s != compact_s else f'{compact_s:.1f}'} | {after:,} | {open_s:.3f} | "
              f"{reads['count_s']:.3f} | {reads['one_run_s']:.3f} |")
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
