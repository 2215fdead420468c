"""The benchmark scripts run end to end and report agreement (smoke runs, not timing tests)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from benchmarks import engine as engine_benchmark
from benchmarks import methods as methods_benchmark
from orchestrator.registry import method_cards


def test_engine_benchmark_quick_run_prints_an_agreeing_table(capsys):
    engine_benchmark.main(["--quick", "--K", "10", "--d", "16", "--n", "600", "--naive-n", "200",
                           "--multi-n", "200"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("|") and line.split("|")[1].strip() == "10"]
    assert len(rows) == 1, out
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1] == "16" and cells[6].startswith("yes"), cells
    assert all(float(c.rstrip("x").replace(",", "")) > 0 for c in cells[2:6] + cells[7:]), cells


def test_methods_benchmark_quick_run_prints_every_method_and_agrees(capsys):
    methods_benchmark.main(["--quick", "--n", "20", "--repeat", "2"])
    out = capsys.readouterr().out
    table = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines() if line.startswith("| ")]
    head, rows = table[0], {cells[0]: dict(zip(table[0], cells)) for cells in table[1:]}
    assert head[:4] == ["method", "single /s", "official /s", "single / official"], head
    on_views = {"TDA (10 views)", "BCA (10 views)"}  # the quick preset's study views
    cards = [card for card in method_cards() if card.text_encoder is None and card.image_encoder is None]
    assert set(rows) == {card.label for card in cards} | on_views, out
    lockstep = [row for row in rows.values() if row["G=1 cfg-samples/s (/ single)"] != "-"]
    assert len(lockstep) >= 3 and all(row["agree, max dpost"].startswith("yes") for row in lockstep), out
    # every transcribed official loop has its columns: its rate and the method's own run against it
    official = {card.label for card in cards if (card.name, card.takes_views) in methods_benchmark.OFFICIAL}
    assert {"CLIP", "BCA", "TDA", "DOTA", "DPE", "TPS", "DMN-ZS", "MTA", "BoostAdapter", "OnZeta"} <= official
    for label in official | on_views:
        assert float(rows[label]["official /s"].replace(",", "")) > 0, (label, out)
        assert float(rows[label]["single / official"].rstrip("x")) > 0, (label, out)
    assert {label for label, row in rows.items() if row["official /s"] != "-"} == official | on_views, out
    # the view rows' lockstep agrees with their own run
    assert all(rows[label]["agree, max dpost"].startswith("yes") for label in on_views), out


def test_gpu_check_quick_runs_without_ray_duckdb_open_clip_pydantic():
    """`python -m benchmarks.gpu --quick` on the CPU with those modules made unimportable: exit 0, every exactness
    line ok, and the parts that need them say what to carry."""
    code = ("import sys\n"
            "for m in ('ray', 'duckdb', 'open_clip', 'pydantic'):\n"
            "    sys.modules[m] = None\n"
            "from benchmarks import gpu\n"
            "sys.exit(gpu.main(['--quick']))\n")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stdout + done.stderr
    exact = [line for line in done.stdout.splitlines() if line.startswith("  engine") or line.startswith("  lockstep")]
    assert len(exact) >= 6 and all(" ok " in line for line in exact), done.stdout
    assert "skipped: the sweep needs 'pydantic'" in done.stdout and "exact: all checks passed" in done.stdout


def test_gpu_check_prints_the_wheels_to_carry(capsys):
    """`python -m benchmarks.gpu --wheels`: a pip download of every missing package, pinned to this environment's
    versions, and the install line for the GPU machine."""
    from importlib.metadata import version

    from benchmarks import gpu

    assert gpu.main(["--wheels"]) == 0
    download, _, install = capsys.readouterr().out.splitlines()
    assert download.startswith("python -m pip download --no-deps --only-binary=:all: --python-version 3.12")
    for name in gpu.OPEN_CLIP_WHEELS + gpu.TRIAL_WHEELS:
        assert f" {name}=={version(name)}" in download, name
    assert install.endswith("PYTHONPATH=/tmp/site python -m benchmarks.gpu")


def test_plan_benchmark_small_run_plans_a_realtime_grid(capsys):
    """`python -m benchmarks.plan` on a small grid streamed realtime: every run its own trial, each step timed, the
    dry run's first line printed."""
    from benchmarks import plan

    plan.main(["--runs-per-seed", "16", "--seeds", "2", "--stream", '{"realtime": {"base": "iid"}}'])
    out = capsys.readouterr().out
    assert "32 runs, 32 trials" in out and "32 to run in 32 trials" in out, out
    assert all(f"{step} " in out for step in ("validate", "expand", "trials", "dry run")), out


def test_scale_benchmark_small_run_builds_reads_and_sweeps(tmp_path, capsys):
    """`python -m benchmarks.scale` with small sizes: every read step answers in a fresh process (no errors, the
    rows it built counted), and both sweeps finish every run."""
    from benchmarks import scale

    assert scale.main(["--runs", "120", "--rows-per-run", "50", "--live-runs", "40", "--sweep-runs", "98",
                       "--unpacked-runs", "98", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[{'n': 6000}] rows in the store" in out, out
    steps = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert set(steps) >= {"open", "count", "accuracy", "summary", "paired", "gains", "tuned", "report",
                          "report_macro_f1", "report_tune_on", "dashboard", "run_page"}, out
    assert "exit code" not in out, out
    assert "'error':" not in out and "'errors': []" in out, out
    sweeps = [line for line in out.splitlines() if line.startswith("sweep ")]
    assert len(sweeps) == 2 and all("98 runs of 300 samples" in s and "rc 0" in s for s in sweeps), out


def test_scale_benchmark_ab_times_both_checkouts_and_compares_the_reports(tmp_path, capsys):
    """`--ab CHECKOUT`: `bca report` and the first page timed with each checkout's code in fresh processes, and
    whether the reports printed the same bytes (here the same checkout twice: they must)."""
    from benchmarks import scale

    assert scale.main(["--runs", "30", "--rows-per-run", "20", "--live-runs", "10", "--sweep-runs", "0",
                       "--dir", str(tmp_path), "--ab", str(scale.ROOT), "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    rounds = [line for line in out.splitlines() if line.startswith("round 1 ")]
    assert len(rounds) == 4 and not any("Traceback" in line for line in rounds), out
    assert sum("dashboard:" in line and "s CPU in the page" in line for line in rounds) == 2, out
    assert "`bca report` printed the same bytes with both codes" in out, out


def test_store_evaluation_runs_every_backend(capsys):
    """`python -m benchmarks.store_eval` (needs the `eval` extra): all three backends append, compact and read."""
    import pytest

    pytest.importorskip("deltalake")
    pytest.importorskip("pyiceberg")
    from benchmarks import store_eval

    assert store_eval.main(["--runs", "12", "--rows-per-run", "40"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "backend" not in line]
    assert [r.split("|")[1].strip() for r in rows] == ["Delta Lake (deltalake)", "Apache Iceberg (pyiceberg)",
                                                      "live files + segments (this store)"]


def test_prompt_tuning_benchmark_quick_run_and_the_gpu_checks_section(capsys):
    """`python -m benchmarks.prompt --quick` (the tiny tower) prints each episodic method's chunked and one-by-one
    cost, the online DynaPrompt's and HisTPT's stream cost, and TPT's, DynaPrompt's and HisTPT's agreement with their
    references; `benchmarks.gpu`'s prompt-tuning section runs its quick preset on a CPU."""
    from benchmarks import gpu
    from benchmarks import prompt as prompt_benchmark

    prompt_benchmark.main(["--quick", "--n", "2", "--reference"])
    out = capsys.readouterr().out
    for name in ("tpt", "ctpt", "rtpt", "otpt", "atpt", "rlcf"):
        assert f"    {name:<5} chunked " in out, out
    for name in ("dynaprompt", "histpt"):  # online: one run over the samples in order
        assert f"    {name:<5} stream " in out, out
    assert out.count("(predictions identical, max dpost") == 3 and "MB of activations per class" in out
    gpu.prompt_tuning("cpu", quick=True)
    out = capsys.readouterr().out
    assert "bca-tiny-vit text tower" in out and "    tpt   chunked " in out, out


def test_shards_benchmark_small_run_prints_every_actor_count_with_equal_rows(capsys):
    """`python -m benchmarks.shards` with small sizes: a row for 1, 2 and 4 actors, each run's rows those of one
    actor (exit 0)."""
    from benchmarks import shards

    assert shards.main(["--n", "400", "--classes", "20", "--dim", "16", "--views", "4", "--part-rows", "50"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "actors" not in line]
    assert [r.split("|")[1].strip() for r in rows] == ["1", "2", "4"]
    assert all(r.rstrip(" |").endswith("yes") for r in rows)


def test_precision_benchmark_prints_each_methods_float16_agreement(capsys):
    """`python -m benchmarks.precision` on small streams: a row per method and stream, agreement in [0, 100]."""
    from benchmarks.precision import main

    main(["--n", "60", "--dpe-n", "20", "--views", "16"])
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in capsys.readouterr().out.splitlines()[3:]]
    assert [(r[0], r[1].split()[1]) for r in rows] == [
        (m, s) for _ in range(2) for m, s in (("tda", "single"), ("tda", "views"), ("zero", "views"), ("dpe", "views"))]
    assert all(0.0 <= float(r[3]) <= 100.0 for r in rows)


def test_runs_shape_benchmark_compares_both_layouts(capsys):
    """`python -m benchmarks.runs_shape` (docs/results-store.md): both layouts written and read over the same runs."""
    from benchmarks import runs_shape
    from orchestrator.results import schema

    assert runs_shape.main(["--runs", "200"]) == 0
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ")]
    wide = len(schema.run_columns())
    assert [r[:2] for r in rows[1:]] == [["wide (today)", str(wide)],
                                         ["narrow (JSON hparams)", str(wide - len(schema.hparam_columns()) + 1)]]


def test_encoder_methods_benchmark_quick_run(capsys):
    """`python -m benchmarks.encoder --quick` (the tiny towers) prints each method's images/s, peak memory and its
    card's memory plan, and a method its card refuses on a tower (WATT on the ResNet: LayerNorms only) says so."""
    from benchmarks import encoder

    assert encoder.main(["--quick", "--methods", "tent", "watt"]) == 0
    out = capsys.readouterr().out
    for name, tower in (("tent", "bca-tiny-vit"), ("watt", "bca-tiny-vit"), ("tent", "bca-tiny-rn")):
        assert re.search(rf"  {name} +{tower} +batch +2: [\d,.]+ images/s, [\d,]+ MB .*card's plan", out), out
    assert re.search(r"  watt +bca-tiny-rn +refused: watt: ", out), out
