"""`bca query`, `bca report`, `bca verify`: output formats, exit codes, messages without tracebacks."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.results.testing import make_fake_results, write_fake_run

runner = CliRunner()
ENV = {"COLUMNS": "300", "NO_COLOR": "1"}


def bca(*args: str):
    return runner.invoke(app, list(args), env=ENV)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("results")
    make_fake_results(root, datasets=("imagenet", "imagenet_a", "dtd"), methods={"clip": {}, "bca": {"tau": 0.3}},
                      seeds=(1, 2), n=30)
    return root


SQL = "SELECT method, dataset, n, mean FROM summary ORDER BY method, dataset"


def test_query_table_view(results):
    r = bca("query", SQL, "--results", str(results))
    assert r.exit_code == 0, r.output
    assert "method" in r.stdout and "bca" in r.stdout and "imagenet_a" in r.stdout and "6 row(s)" in r.stdout
    r = bca("query", "SELECT * FROM samples", "--results", str(results), "--max-rows", "3")
    assert "360 row(s); showing 3" in r.stdout


def test_query_csv_json_parquet_agree(results, tmp_path):
    csv = bca("query", SQL, "--results", str(results), "--csv")
    assert csv.exit_code == 0
    frame = pd.read_csv(io.StringIO(csv.stdout))
    assert list(frame.columns) == ["method", "dataset", "n", "mean"] and len(frame) == 6
    js = bca("query", SQL, "--results", str(results), "--json")
    rows = json.loads(js.stdout)
    assert [r["mean"] for r in rows] == pytest.approx(frame["mean"].tolist())
    out = tmp_path / "out.parquet"
    pq_run = bca("query", SQL, "--results", str(results), "--parquet", str(out))
    assert pq_run.exit_code == 0 and "wrote 6 row(s)" in pq_run.stderr
    assert pq.read_table(out).to_pandas()["mean"].tolist() == pytest.approx(frame["mean"].tolist())


def test_query_json_handles_nan_lists_and_timestamps(results):
    r = bca("query", "SELECT seeds, std, started_at, 'NaN'::DOUBLE AS x FROM summary JOIN runs USING (group_id) "
                     "LIMIT 1", "--results", str(results), "--json")
    row = json.loads(r.stdout)[0]
    assert row["seeds"] == [1, 2] and row["x"] is None and "T" in row["started_at"]


def test_query_from_file(results, tmp_path):
    f = tmp_path / "q.sql"
    f.write_text("-- per method\nSELECT method, count(*) AS runs FROM runs GROUP BY method ORDER BY method;\n")
    r = bca("query", "--file", str(f), "--results", str(results), "--csv")
    assert r.exit_code == 0 and r.stdout.splitlines() == ["method,runs", "bca,6", "clip,6"]


@pytest.mark.parametrize("args, code, message", [
    (["COPY samples TO '/tmp/x.csv'"], 2, "refused: COPY statements are not allowed"),
    (["SELECT * FROM read_csv('/etc/passwd')"], 2, "refused: function read_csv() is not allowed"),
    (["SELECT 1; SELECT 2"], 2, "refused: one statement at a time"),
    (["SELEC 1"], 2, "Parser Error"),
    (["SELECT nope FROM runs"], 2, "Binder Error"),
    ([], 2, "give the SQL as an argument or with --file"),
    (["SELECT 1", "--csv", "--json"], 2, "choose one of --csv, --json, --parquet"),
    (["--file", "/nonexistent/q.sql"], 2, "cannot read SQL file /nonexistent/q.sql"),
])
def test_query_errors(results, args, code, message):
    r = bca("query", *args, "--results", str(results))
    assert r.exit_code == code
    assert message in r.stderr
    assert "Traceback" not in r.output


def test_query_parquet_to_unwritable_path(results, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = bca("query", "SELECT 1 AS a", "--results", str(results), "--parquet", str(blocker / "out.parquet"))
    assert r.exit_code == 2 and "cannot write" in r.stderr and str(blocker) in r.stderr


def test_query_parquet_never_writes_into_the_results(results):
    target = results / "samples" / "export.parquet"
    r = bca("query", "SELECT 1 AS a", "--results", str(results), "--parquet", str(target))
    assert r.exit_code == 2 and "inside the results dir" in r.stderr and not target.exists()


def test_query_and_report_on_a_missing_results_dir_name_it(tmp_path):
    missing = tmp_path / "none"
    for r in (bca("query", "SELECT count(*) AS n FROM runs", "--results", str(missing), "--csv"),
              bca("report", "--results", str(missing)), bca("verify", str(missing))):
        assert r.exit_code == 2 and f"results dir {missing} does not exist" in r.stderr and r.stdout == ""
    assert not missing.exists()


def test_sql_beginning_with_a_comment(results):
    r = bca("query", "-- how many runs\nSELECT count(*) AS n FROM runs", "--results", str(results), "--csv")
    assert r.exit_code == 0 and r.stdout.splitlines() == ["n", "12"]


def test_install_refusal_names_install(results):
    r = bca("query", "INSTALL httpfs", "--results", str(results))
    assert r.exit_code == 2 and "INSTALL statements are not allowed" in r.stderr


def test_query_names_bad_files_and_goes_on(tmp_path):
    make_fake_results(tmp_path, methods={"clip": {}}, seeds=(1,), n=80, part_size=40)
    part = sorted((tmp_path / "samples").rglob("part-000000040.parquet"))[0]
    part.write_bytes(part.read_bytes()[:100])
    r = bca("query", "SELECT count(*) AS n FROM samples", "--results", str(tmp_path), "--csv")
    assert r.exit_code == 0 and r.stdout.splitlines() == ["n", "40"]
    assert f"warning: skipped bad file {part}" in r.stderr


def test_query_in_a_real_process_has_no_traceback(results):
    bca_exe = Path(sys.executable).with_name("bca")
    cmd = [str(bca_exe)] if bca_exe.exists() else [sys.executable, "-m", "orchestrator.cli"]
    out = subprocess.run([*cmd, "query", "SELECT FROM WHERE", "--results", str(results)], capture_output=True,
                         text=True, timeout=120, env={**os.environ, **ENV})
    assert out.returncode == 2 and "Parser Error" in out.stderr and "Traceback" not in out.stderr


def test_report(results):
    r = bca("report", "--results", str(results))
    assert r.exit_code == 0, r.output
    assert "Table 1: OOD benchmark" in r.stdout and "Table 2: cross-domain benchmark" in r.stdout
    assert "ImageNet-Sketch" in r.stdout and "—" in r.stdout and "BCA" in r.stdout
    p = bca("report", "--results", str(results), "--paper")
    assert p.exit_code == 0 and "Δ paper" in p.stdout and "70.22" in p.stdout and "CVPR 2025" in p.stdout
    s = bca("report", "--results", str(results), "--sweep", "fake")
    assert s.exit_code == 0 and "Table 1" in s.stdout


def test_report_unknown_sweep_and_empty_dir(results, tmp_path):
    r = bca("report", "--results", str(results), "--sweep", "nope")
    assert r.exit_code == 1 and "no finished runs for sweep 'nope'" in r.stderr and "sweeps there: fake" in r.stderr
    e = bca("report", "--results", str(tmp_path))
    assert e.exit_code == 0 and "no finished runs in" in e.stderr
    p = bca("report", "--results", str(tmp_path), "--paper")
    assert p.exit_code == 0 and "61.81" in p.stdout


def test_verify_ok(results):
    r = bca("verify", str(results))
    assert r.exit_code == 0 and "OK" in r.stdout and "12 run(s)" in r.stdout


def test_verify_lists_problems_with_exit_code_1(tmp_path):
    cfg = {"sweep": "s", "backbone": "RN50", "dataset": "dtd", "method": "clip"}
    make_fake_results(tmp_path, methods={"clip": {}}, seeds=(1,), n=80, part_size=40)
    write_fake_run(tmp_path, {**cfg, "seed": 2}, n=100, rows=40, status="running")
    part = sorted((tmp_path / "samples").rglob("part-000000040.parquet"))[0]
    part.write_bytes(part.read_bytes()[:100])
    r = bca("verify", str(tmp_path))
    assert r.exit_code == 1
    assert "bad_part" in r.stdout and str(part) in r.stdout.replace("\n", "")
    assert "missing_rows" in r.stdout and "running: 40 of 100 rows present" in r.stdout
    assert "bca sweep SPEC --resume repairs runs with missing rows" in r.stdout


def test_verify_missing_dir(tmp_path):
    r = bca("verify", str(tmp_path / "none"))
    assert r.exit_code == 2 and "does not exist" in r.stderr


def test_verify_temp_files_by_age(tmp_path):
    make_fake_results(tmp_path, methods={"clip": {}}, seeds=(1,), n=20)
    run_dir = next((tmp_path / "samples").rglob("run_id=*"))
    tmp = run_dir / ".part-000000020.parquet.123.abcd.tmp"
    tmp.write_bytes(b"PAR1")
    assert bca("verify", str(tmp_path)).exit_code == 0  # a live writer's temp file is not a problem yet
    old = time.time() - 3600
    os.utime(tmp, (old, old))
    r = bca("verify", str(tmp_path))
    assert r.exit_code == 1 and "temp_file" in r.stdout


def _caltech_runs(root: Path, pretrained: str, methods=("clip", "bca"), fingerprint: str | None = None) -> None:
    from orchestrator.results.writer import RunWriter

    for method in methods:
        for seed in (1, 2):
            config = {"sweep": "s", "backbone": "ViT-B-16", "pretrained": pretrained, "dataset": "caltech101",
                      "method": method, "seed": seed, "views": "single"}
            write_fake_run(root, config, n=40, accuracy=0.1)
            if fingerprint:
                RunWriter(root, config).mark("finished", data_fingerprint=fingerprint)


def test_random_weight_runs_are_labelled_and_never_set_beside_the_paper(tmp_path):
    _caltech_runs(tmp_path, "random")
    r = bca("report", "--results", str(tmp_path), "--paper")
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stdout.splitlines() if "ViT-B/16" in ln and "Caltech" not in ln]
    random_rows = [ln for ln in lines if "(random weights)" in ln]
    assert len(random_rows) == 2 and all("measured" in ln for ln in random_rows)  # no paper, no Δ paper rows
    # the published ViT-B/16 rows stand alone: nothing measured beside them
    deltas = [ln for ln in lines if "(random weights)" not in ln and "Δ paper" in ln]
    assert deltas and all({c.strip() for c in ln.split("│")[4:-1]} == {"—"} for ln in deltas)
    from orchestrator.results.db import ResultsDB
    from orchestrator.results.report import row_labels

    with ResultsDB(tmp_path) as db:
        runs = db.df("SELECT * FROM accuracy")
    assert set(row_labels(runs, [])) == {"CLIP [random weights]", "BCA [random weights]"}


def test_report_names_datasets_whose_runs_saw_different_image_lists(tmp_path):
    _caltech_runs(tmp_path, "openai", methods=("clip",), fingerprint="aaaaaaaaaaaaaaaa")
    _caltech_runs(tmp_path, "openai", methods=("bca",), fingerprint="bbbbbbbbbbbbbbbb")
    r = bca("report", "--results", str(tmp_path))
    assert r.exit_code == 0
    assert ("warning: caltech101: finished runs were made on 2 versions of its image list (2 run(s) on "
            "aaaaaaaaaaaaaaaa") in r.stderr and "bbbbbbbbbbbbbbbb" in r.stderr and "--rerun-changed" in r.stderr


def test_report_metric_flag_prints_that_metric_and_refuses_unknown_ones(results):
    out = bca("report", "--metric", "ece", "--results", str(results))
    assert out.exit_code == 0, out.output
    assert "expected calibration error (%)" in out.output and "Table 1: OOD benchmark" in out.output
    bad = bca("report", "--metric", "acc", "--results", str(results))
    assert bad.exit_code == 2 and "--metric: unknown metric 'acc'; expected one of: accuracy" in bad.output


def test_query_the_paired_view_as_the_readme_does(results):
    out = bca("query", "SELECT * FROM paired", "--json", "--results", str(results))
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert len(rows) == 3 * 2  # one bca run per dataset and seed, each against its CLIP run
    assert all(r["misaligned"] == 0 and r["helped"] + r["hurt"] + r["both_right"] + r["both_wrong"] == 30
               for r in rows)


# A self-join with no end in sight on the module's results (12 runs x 30 rows: 360^4 row combinations).
ENDLESS = "SELECT count(*) FROM samples a, samples b, samples c, samples d"


def test_query_past_its_timeout_is_stopped_and_named(results):
    started = time.monotonic()
    r = bca("query", ENDLESS, "--results", str(results), "--timeout", "0.5")
    assert r.exit_code == 2 and "the query was stopped after 0.5 s (--timeout 0.5)" in r.stderr
    assert "Traceback" not in r.output and time.monotonic() - started < 60


def test_ctrl_c_interrupts_a_running_query(results):
    """Ctrl-C (SIGINT to this process while the query runs) stops it at once and leaves the connection usable;
    `bca query` says so and exits 130."""
    import signal

    # Python's own Ctrl-C handler, as `bca query` has it: an earlier test in this process (a sweep, Ray) may have
    # left another one installed
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupt_a_running_query(results)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_a_running_query(results):
    import signal
    import threading

    from orchestrator.results.db import ResultsDB

    with ResultsDB(results) as db:
        db.query("SELECT 1")  # the views built before the clock starts
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
        started = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            db.query(ENDLESS)
        assert time.monotonic() - started < 30
        assert db.query("SELECT count(*) AS n FROM runs").column("n").to_pylist() == [12]


def test_query_interrupted_by_ctrl_c_exits_130(results, monkeypatch):
    from orchestrator.results.db import ResultsDB

    def interrupted(self, sql, timeout_s=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(ResultsDB, "query", interrupted)
    r = bca("query", "SELECT 1", "--results", str(results))
    assert r.exit_code == 130 and "query interrupted (Ctrl-C)" in r.stderr
