"""A damaged results dir is reported, never shown as a smaller complete one (issue 37, item 3).

A small store as a sweep leaves it (runs written through RunWriter from a spec's expansion, most compacted into
segments, a few live, the sweep record naming the runs seen finished) is copied, damaged one way per test, and
read through the CLI: `bca report` and `bca query` print what is left, name what is missing and exit 1; `bca
verify` names the damage and exits 1, never with a traceback.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.results import compaction, files, schema, store
from orchestrator.results.testing import write_fake_run
from orchestrator.sweep.load import validate_spec
from orchestrator.sweep.plan import expand
from orchestrator.sweep.record import write_sweep_record

runner = CliRunner()
ENV = {"COLUMNS": "400", "NO_COLOR": "1"}
SPEC = {"name": "damage", "results_dir": "results", "stream": "iid", "orders": 3, "seeds": [1],
        "datasets": [{"synthetic": "fine_grained", "n": 60}, {"synthetic": "imagenet_like", "n": 60}],
        "methods": [{"method": "clip"}, {"method": "bca", "tau": 0.3, "n1": 100}]}


def bca(*args: str):
    return runner.invoke(app, list(args), env=ENV)


@pytest.fixture(scope="module")
def intact(tmp_path_factory) -> Path:
    """12 runs: the first 9 compacted into a segment, the last 3 live; the record lists all 12 finished."""
    base = tmp_path_factory.mktemp("damage")
    spec = validate_spec(dict(SPEC), base_dir=base)
    runs = expand(spec)
    assert len(runs) == 12
    for run in runs[:9]:
        write_fake_run(spec.results_dir, run.config, n=60, part_size=30, save_state=False)
    compaction.compact(spec.results_dir)
    for run in runs[9:]:
        write_fake_run(spec.results_dir, run.config, n=60, part_size=30, save_state=False)
    write_sweep_record(spec, runs, [r.run_id for r in runs])
    root = Path(spec.results_dir)
    assert len(store.load_catalog(root).segments) == 1 and len(files.run_files(root)) == 3
    return root


@pytest.fixture
def copy(intact, tmp_path) -> Path:
    root = tmp_path / "results"
    shutil.copytree(intact, root)
    return root


def segment(root: Path, kind: str) -> Path:
    (seg,) = store.load_catalog(root).segments
    return seg.path(root, kind)


def cell_line(out: str, method: str) -> str:
    return next(line for line in out.splitlines() if f"│ {method} " in line)


def test_the_intact_store_reports_and_verifies_cleanly(intact):
    done = bca("report", "--results", str(intact))
    assert done.exit_code == 0, done.output
    assert "(n=3)" in cell_line(done.output, "CLIP") and "of 3" not in done.output
    assert bca("verify", str(intact)).exit_code == 0


def test_a_deleted_manifest_is_named_and_fails_report_and_query(copy):
    schema.manifest_file(copy).unlink()
    done = bca("report", "--results", str(copy))
    assert done.exit_code == 1
    assert "the results are damaged: 9 run(s)" in done.output and "manifest.json is missing" in done.output
    assert "(n=0 of 3)" in done.output or "of 3)" in cell_line(done.output, "CLIP")
    done = bca("query", "--results", str(copy), "SELECT count(*) AS n FROM runs")
    assert done.exit_code == 1 and "9 run(s) in a segment the manifest does not list" in done.output
    done = bca("verify", str(copy))
    assert done.exit_code == 1 and "lost_runs" in done.output


def test_a_truncated_segment_leaves_cells_at_n_of_3(copy):
    path = segment(copy, "samples")
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    done = bca("report", "--results", str(copy))
    assert done.exit_code == 1, done.output
    assert "9 run(s) in a segment that cannot be read" in done.output
    # 9 of the 12 runs were in the segment: every cell is short of some, and says of how many
    for method in ("CLIP", "BCA"):
        assert "of 3)" in cell_line(done.output, method), done.output
    assert "lost (in a segment that cannot be read)" in done.output
    done = bca("verify", str(copy))
    assert done.exit_code == 1 and "bad_segment" in done.output and "lost_runs" in done.output


def test_a_segments_deleted_runs_file_is_named_by_verify(copy):
    segment(copy, "runs").unlink()
    done = bca("verify", str(copy))
    assert done.exit_code == 1, done.output
    assert done.exception is None or isinstance(done.exception, SystemExit)
    assert "listed in the manifest but missing" in done.output and "lost_runs" in done.output
    done = bca("report", "--results", str(copy))
    assert done.exit_code == 1 and "9 run(s) in a segment that cannot be read" in done.output


def test_a_live_part_with_a_changed_correct_column_fails_verify(copy):
    part = files.sample_parts(copy)[0]
    table = pq.read_table(part)
    at = table.schema.get_field_index("correct")
    pq.write_table(table.set_column(at, table.schema.field(at), pc.invert(table.column(at))), part)
    done = bca("verify", str(copy))
    assert done.exit_code == 1, done.output
    assert "inconsistent_rows" in done.output and "30 row(s) whose correct disagrees with pred = label" in done.output


def test_a_deleted_runs_table_row_is_named_not_a_traceback(copy):
    row = files.run_files(copy)[0]
    run_id = row.name.removeprefix("run_id=").removesuffix(".parquet")
    row.unlink()
    done = bca("report", "--results", str(copy))
    assert done.exit_code == 1, done.output
    assert isinstance(done.exception, SystemExit)
    assert "1 run(s) with rows but no runs-table row" in done.output and run_id in done.output
    assert sum("of 3)" in line for line in done.output.splitlines() if line.startswith("│")) >= 1
    assert f"no_run_row: {run_id}" in bca("verify", str(copy)).output


def test_runs_recorded_finished_but_held_by_no_file_are_named(copy):
    shutil.rmtree(schema.catalog_root(copy))
    done = bca("report", "--results", str(copy))
    assert done.exit_code == 1, done.output
    assert "9 run(s) recorded finished by sweep 'damage' but held by no file" in done.output
    # another sweep's report is not failed by this one's damage
    assert bca("report", "--results", str(copy), "--sweep", "other").output.count("damaged") == 0


@pytest.mark.parametrize("damage", ["manifest", "runs_row"])
def test_the_dashboard_says_the_store_is_damaged(copy, monkeypatch, damage):
    from streamlit.testing.v1 import AppTest

    from dashboard import APP_PATH, RESULTS_ENV

    if damage == "manifest":
        schema.manifest_file(copy).unlink()
        said = ("The results are damaged: 9 run(s)", "manifest.json is missing")
    else:
        files.run_files(copy)[0].unlink()
        said = ("The results are damaged: 1 run(s)", "with rows but no runs-table row")
    monkeypatch.setenv(RESULTS_ENV, str(copy))
    at = AppTest.from_file(str(APP_PATH), default_timeout=180).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(all(s in e.value for s in said) for e in at.error), [e.value for e in at.error]


def test_compact_keeps_unlisted_segments_that_are_the_only_copy(copy):
    schema.manifest_file(copy).unlink()
    old = (copy / "catalog" / "segments").glob("*.parquet")
    for path in old:
        os.utime(path, (1, 1))  # past the age at which an orphan is removed
    assert bca("compact", str(copy)).exit_code == 0
    done = bca("report", "--results", str(copy))
    assert done.exit_code == 1 and "9 run(s) in a segment the manifest does not list" in done.output
