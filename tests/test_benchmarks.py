"""The engine benchmark script runs end to end and reports agreement (a smoke run, not a timing test)."""

from __future__ import annotations

from benchmarks import engine as engine_benchmark


def test_engine_benchmark_quick_run_prints_an_agreeing_table(capsys):
    engine_benchmark.main(["--quick", "--K", "10", "--d", "16", "--n", "600", "--naive-n", "200",
                           "--multi-n", "200"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("|") and line.split("|")[1].strip() == "10"]
    assert len(rows) == 1, out
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1] == "16" and cells[6].startswith("yes"), cells
    assert all(float(c.rstrip("x").replace(",", "")) > 0 for c in cells[2:6] + cells[7:]), cells
