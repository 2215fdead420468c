"""verify_results: each kind of problem found and named, nothing reported on a clean results dir."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.results.testing import make_fake_results, write_fake_run
from orchestrator.results.verify import verify_results

CFG = {"sweep": "s", "backbone": "RN50", "dataset": "dtd", "method": "clip"}


def kinds(report) -> list[tuple[str, str]]:
    return sorted((p.kind, p.where) for p in report.problems)


def test_clean_results(tmp_path):
    runs = make_fake_results(tmp_path, seeds=(1, 2), n=50, part_size=20)
    report = verify_results(tmp_path)
    assert report.ok and report.runs == len(runs) == 4 and report.rows == 200 and report.parts == 12


def test_missing_dir_is_empty_and_ok(tmp_path):
    report = verify_results(tmp_path / "none")
    assert report.ok and report.parts == 0


def test_unfinished_and_failed_runs_have_missing_rows(tmp_path):
    running = write_fake_run(tmp_path, {**CFG, "seed": 1}, n=50, rows=30, status="running")
    failed = write_fake_run(tmp_path, {**CFG, "seed": 2}, n=50, rows=0, status="failed")
    report = verify_results(tmp_path)
    assert kinds(report) == sorted([("missing_rows", running.run_id), ("missing_rows", failed.run_id)])
    details = {p.where: p.detail for p in report.problems}
    assert details[running.run_id] == "running: 30 of 50 rows present"
    assert details[failed.run_id] == "failed: 0 of 50 rows present"


def _run_dir(root, run_id):
    return next((root / "samples").rglob(f"run_id={run_id}"))


def test_gap(tmp_path):
    run = write_fake_run(tmp_path, {**CFG, "seed": 1}, n=60, part_size=20)
    (_run_dir(tmp_path, run.run_id) / "part-000000020.parquet").unlink()
    report = verify_results(tmp_path)
    assert kinds(report) == [("gap", run.run_id), ("missing_rows", run.run_id)]
    assert {p.kind: p.detail for p in report.problems}["gap"] == "20 stream position(s) missing before position 59"


def test_overlapping_parts_are_duplicate_rows(tmp_path):
    """Two parts, each consistent with its own name, covering rows 10..19 twice (only by hand: the writer refuses)."""
    run = write_fake_run(tmp_path, {**CFG, "seed": 1}, n=40, part_size=20)
    d = _run_dir(tmp_path, run.run_id)
    rows = pa.concat_tables([pq.read_table(d / "part-000000000.parquet"), pq.read_table(d / "part-000000020.parquet")])
    pq.write_table(rows.slice(10, 20), d / "part-000000010.parquet")
    report = verify_results(tmp_path)
    assert kinds(report) == [("duplicate_rows", run.run_id)]
    assert report.problems[0].detail == "20 duplicate (run_id, sample_idx) row(s)"


def test_rows_copied_into_another_runs_folder(tmp_path):
    run = write_fake_run(tmp_path, {**CFG, "seed": 1}, n=20)
    d = _run_dir(tmp_path, run.run_id)
    other = d.parent / "run_id=0000000000000000"
    other.mkdir()
    (other / "part-000000000.parquet").write_bytes((d / "part-000000000.parquet").read_bytes())
    found = kinds(verify_results(tmp_path))
    assert ("foreign_rows", run.run_id) in found and ("duplicate_rows", run.run_id) in found


def test_part_inconsistent_with_its_name(tmp_path):
    run = write_fake_run(tmp_path, {**CFG, "seed": 1}, n=40, part_size=20)
    d = _run_dir(tmp_path, run.run_id)
    (d / "part-000000020.parquet").rename(d / "part-000000040.parquet")
    found = kinds(verify_results(tmp_path))
    assert ("bad_part", str(d / "part-000000040.parquet")) in found and ("missing_rows", run.run_id) in found


def test_damaged_pages_are_found_by_the_full_read(tmp_path):
    run = write_fake_run(tmp_path, {**CFG, "seed": 1}, n=400, part_size=400)
    part = _run_dir(tmp_path, run.run_id) / "part-000000000.parquet"
    data = bytearray(part.read_bytes())
    for i in range(4, len(data) // 2):
        data[i] = (data[i] * 7 + 13) % 256
    part.write_bytes(bytes(data))
    report = verify_results(tmp_path)
    assert kinds(report) == [("bad_part", str(part)), ("missing_rows", run.run_id)]
    assert "unreadable data" in report.problems[0].detail


def test_rows_without_a_run_row_and_bad_run_file(tmp_path):
    run = write_fake_run(tmp_path, {**CFG, "seed": 1}, n=20)
    run_file = next((tmp_path / "runs").rglob(f"run_id={run.run_id}.parquet"))
    run_file.write_bytes(b"not parquet")
    report = verify_results(tmp_path)
    assert kinds(report) == sorted([("bad_run_file", str(run_file)), ("no_run_row", run.run_id)])


def test_a_run_written_into_two_segments_has_duplicate_rows(tmp_path):
    """verify counts each segment's runs alone (bounded memory at a study's size); a run whose rows are in two
    segments is still counted over all of them."""
    import json
    import shutil

    from orchestrator.results import compaction, schema, store

    make_fake_results(tmp_path, datasets=("dtd",), seeds=(1,))
    compaction.compact(tmp_path)
    assert verify_results(tmp_path).ok
    manifest = schema.manifest_file(tmp_path)
    data = json.loads(manifest.read_text())
    seg = store.load_catalog(tmp_path).segments[0]
    copy = dict(data["segments"][0], id=seg.id + "-copy")
    for kind in schema.SEGMENT_KINDS:
        shutil.copy(seg.path(tmp_path, kind), store.Segment(copy["id"], seg.rows, seg.runs, ()).path(tmp_path, kind))
    data["segments"].append(copy)
    manifest.write_text(json.dumps(data))
    problems = verify_results(tmp_path).problems
    rows = pq.read_table(seg.path(tmp_path, "samples"), columns=["run_id"]).column("run_id").value_counts()
    expected = {r["values"]: f"{r['counts']} duplicate (run_id, sample_idx) row(s)" for r in rows.to_pylist()}
    assert {p.where: p.detail for p in problems if p.kind == "duplicate_rows"} == expected
