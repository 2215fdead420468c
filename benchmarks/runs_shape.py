"""The runs table's shape (docs/results-store.md): today's wide table, one typed column per hyperparameter name of
every registered method (most NULL in any row), against a narrow one, the fixed columns and the hyperparameters as
one JSON column that a per-method view widens again.

    python -m benchmarks.runs_shape [--runs 100000]

Both hold the same generated runs: every registered method in turn, its card's defaults with the float
hyperparameters scaled by 0.5, 1 or 2 (a grid), rows as `schema.run_table_schema` types them, written as a
segment's runs file is (zstd, row groups of `store.ROW_GROUP_ROWS`). Per layout: its columns, the Parquet file's
bytes, the Arrow table's bytes in memory (what `SELECT *` hands pandas), and DuckDB's CPU seconds (best of 3) for
the means of one method's grid cells and for reading every run. A benchmark, not a test: the seconds depend on
the machine; the bytes do not.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.tables import markdown_table

GRID_METHOD = "bca"


def _tables(runs: int) -> tuple[pa.Table, pa.Table]:
    from orchestrator import registry
    from orchestrator.results import schema

    rng = random.Random(0)
    cards = registry.method_cards()
    rows, texts = [], []
    for i in range(runs):
        card = cards[i % len(cards)]
        hparams = {k: round(v * rng.choice((0.5, 1.0, 2.0)), 6) if card.hparam(k).kind == "float"
                   and isinstance(v, float) else v for k, v in card.resolve({}).items()}
        config = schema.normalize_config({
            "sweep": "shape", "backbone": "ViT-B-16", "pretrained": "openai", "dataset": f"set{i % 15:02d}",
            "method": card.name, "seed": i // 3000, "templates": "ensemble7", "num_templates": 7, "views": "single",
            "hparams": hparams})
        rows.append({**{k: v for k, v in config.items() if k != "hparams"}, **config["hparams"],
                     "run_id": schema.config_hash(config), "status": "finished", "n_samples": 2000,
                     "accuracy": rng.uniform(50.0, 80.0)})
        texts.append(schema.canonical_json(config["hparams"]))
    wide = pa.Table.from_pylist(rows, schema=schema.run_table_schema({}))
    narrow = wide.drop_columns([c.name for c in schema.hparam_columns()]).append_column("hparams", pa.array(texts))
    return wide, narrow


def _cpu_seconds(con: duckdb.DuckDBPyConnection, query: str) -> float:
    best = float("inf")
    for _ in range(3):
        began = time.process_time()
        con.sql(query).to_arrow_table()
        best = min(best, time.process_time() - began)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    args = parser.parse_args(argv)
    from orchestrator import registry
    from orchestrator.results import schema
    from orchestrator.results.store import ROW_GROUP_ROWS

    wide, narrow = _tables(args.runs)
    card = registry.method_card(GRID_METHOD)
    types = {c.name: c.sql for c in schema.hparam_columns()}
    widened = ", ".join(f"CAST(json_extract_string(hparams, '$.{h.name}') AS {types[h.name]}) AS {h.name}"
                        for h in card.hparams)
    grid = ", ".join(h.name for h in card.hparams if h.kind == "float")
    lines = [["layout", "columns", "Parquet bytes", "Arrow bytes", f"{GRID_METHOD} grid cells CPU s",
              "every run CPU s"]]
    with tempfile.TemporaryDirectory() as tmp:
        con = duckdb.connect()
        for name, table in (("wide (today)", wide), ("narrow (JSON hparams)", narrow)):
            path = os.path.join(tmp, f"{len(lines)}.parquet")
            pq.write_table(table, path, compression="zstd", row_group_size=ROW_GROUP_ROWS)
            con.execute(f"CREATE OR REPLACE VIEW runs AS SELECT * FROM read_parquet('{path}')")
            if table is narrow:  # the per-method view that widens the JSON column again
                con.execute(f"CREATE OR REPLACE VIEW runs_{GRID_METHOD} AS SELECT * EXCLUDE (hparams), {widened} "
                            f"FROM runs WHERE method = '{GRID_METHOD}'")
            else:
                con.execute(f"CREATE OR REPLACE VIEW runs_{GRID_METHOD} AS SELECT * FROM runs "
                            f"WHERE method = '{GRID_METHOD}'")
            cells = _cpu_seconds(con, f"SELECT {grid}, avg(accuracy) FROM runs_{GRID_METHOD} GROUP BY ALL")
            lines.append([name, str(table.num_columns), f"{os.path.getsize(path):,}", f"{table.nbytes:,}",
                          f"{cells:.3f}", f"{_cpu_seconds(con, 'SELECT * FROM runs'):.3f}"])
    print(f"{args.runs:,} runs of {len(registry.method_cards())} methods, "
          f"{len(schema.hparam_columns())} hyperparameter names")
    print(markdown_table(lines, left_columns=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
