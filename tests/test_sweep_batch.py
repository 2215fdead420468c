"""The batch protocol through the sweep: batch_size as a grid axis ('official' from the cards), per-sample methods
kept at 1 with their run_ids unchanged, a batch run's parts at multiples of its batch (a resumed run equals an
uninterrupted one row for row), batch runs inside packs, the runs table's batch_size, and the refusals."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from orchestrator.methods import make_method
from orchestrator.results.db import ResultsDB
from orchestrator.results.schema import setting_id
from orchestrator.results.writer import RunWriter
from orchestrator.sweep.load import validate_spec
from orchestrator.sweep.plan import expand, make_trials
from orchestrator.sweep.pieces import MEMO, load_stream, method_hparams, part_rows_for, settings_of
from tests.test_sweep_trial import rows, run_all

N, PART = 300, 50  # parts of 50 rows hold whole batches of 32 only as parts of 32
SPEC = {
    "name": "batches",
    "results_dir": "results",
    "datasets": [{"synthetic": "label_shift", "n": N, "num_classes": 6, "dim": 12}],
    "methods": [{"method": "clip"}, {"method": "bca", "n1": 20}, {"method": "oga"}],
    "seeds": [2],
    "part_rows": PART,
}


def spec_in(directory: Path, **overrides):
    return validate_spec({**copy.deepcopy(SPEC), **overrides}, base_dir=directory)


def test_official_batch_sizes_cross_the_methods_and_keep_every_batch_1_run_id(tmp_path):
    plain = {(r.method, r.batch_size): r.run_id for r in expand(spec_in(tmp_path))}
    crossed = spec_in(tmp_path, batch_size=[1, "official"], stream=["iid", {"dirichlet": {"gamma": 0.1}}])
    runs = expand(crossed)
    # clip and bca adapt per sample: their 'official' is 1, so each runs once per stream; oga at 1 and 32; clip,
    # the baseline, also on the Dirichlet order drawn for batches of 32 (below)
    assert sorted((r.method, r.batch_size) for r in runs) == sorted(
        [(m, 1) for m in ("clip", "bca", "oga") for _ in range(2)] + [("oga", 32)] * 2 + [("clip", 1)])
    assert {(r.method, r.batch_size): r.run_id for r in expand(spec_in(tmp_path))} == plain
    batch = [r for r in runs if r.batch_size == 32]
    assert all(r.config["batch_size"] == 32 for r in batch)
    assert all("batch_size" not in r.config for r in runs if r.batch_size == 1)
    # a Dirichlet order at batch 32 takes StatA's slots from it, and the run's stream says so
    streams = sorted(str(r.config["stream"]) for r in batch)
    assert streams == ["iid", str({"dirichlet": {"gamma": 0.1, "slots": "batches", "batch": 32}})]
    # every batch run has its zero-shot baseline on the same order: a CLIP run at batch size 1 of its setting
    baselines = {str(r.config["stream"]): r for r in runs if r.method == "clip"}
    for run in batch:
        clip = baselines[str(run.config["stream"])]
        assert "batch_size" not in clip.config and clip.source == run.source
        assert setting_id(clip.config) == setting_id(run.config)
    # an entry's own batch sizes replace the spec's
    own = spec_in(tmp_path, batch_size=[1], methods=[{"method": "oga", "batch_size": [8, 32]}])
    assert [r.batch_size for r in expand(own)] == [8, 32]


@pytest.mark.parametrize(("overrides", "field", "needle"), [
    ({"methods": [{"method": "clip", "batch_size": 32}]}, "methods[0].batch_size",
     "'clip' adapts per sample (its card has no batch size), so it runs at batch size 1 only; expected 1 or "
     "'official', got 32"),
    ({"batch_size": 32}, "batch_size", "leaves methods[0] no run"),
    ({"batch_size": 0}, "batch_size", "expected an integer >= 1 (samples per adaptation step) or 'official'"),
    ({"batch_size": "largest"}, "batch_size", "got 'largest'"),
])
def test_bad_batch_sizes_are_refused_naming_the_field(tmp_path, overrides, field, needle):
    spec = {**copy.deepcopy(SPEC), **overrides}
    import yaml

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "sweep", str(path), "--dry-run"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert field in done.stderr and needle in done.stderr, done.stderr


def test_a_batch_run_stopped_mid_stream_resumes_exactly(tmp_path):
    assert part_rows_for(PART, 32) == 32 and part_rows_for(PART, 1) == PART and part_rows_for(10, 32) == 32
    only_oga = {"methods": [{"method": "oga"}], "batch_size": 32, "stream": {"dirichlet": {"gamma": 0.1}}}
    reference = spec_in(tmp_path / "ref", **only_oga)
    run_all(reference)
    spec = spec_in(tmp_path / "faulted", **only_oga)
    with pytest.raises(RuntimeError, match="failpoint"):
        run_all(spec, failpoint=f"raise:3:{tmp_path / 'flag'}")
    run = expand(spec)[0]
    assert RunWriter(spec.results_dir, run.config).rows_done() == 3 * 32  # three whole parts of one batch each
    results = run_all(spec)
    assert results[0]["resumed_from"] == 96 and results[0]["rows_written"] == N - 96
    assert rows(spec.results_dir) == rows(reference.results_dir)
    # and the rows are OGA's at batch 32 over the run's stream
    MEMO.clear()
    stream, _ = load_stream(run.source, settings_of(spec))
    expected = make_method("oga", stream.class_embeddings, stream.class_ids, stream.num_classes,
                           batch_size=32).run(stream.features).predictions
    assert [r["pred"] for r in rows(spec.results_dir)[run.run_id]] == expected.tolist()


def test_batch_runs_in_a_pack_write_what_they_write_alone(tmp_path):
    crossed = {"batch_size": [1, "official"]}
    single, packed = spec_in(tmp_path / "single", **crossed), spec_in(tmp_path / "packed", pack=8, **crossed)
    run_all(single)
    trials = make_trials(expand(packed), 8)
    assert len(trials) == 1 and len(trials[0].runs) == 4
    run_all(packed, pack=8)
    a, b = rows(single.results_dir), rows(packed.results_dir)
    assert a.keys() == b.keys()
    for run_id in a:  # identical rows; probabilities within the BCA engine's float tolerance (other block edges)
        for column in ("confidence", "prob_true"):
            values_a = np.array([r.pop(column) for r in a[run_id]])
            values_b = np.array([r.pop(column) for r in b[run_id]])
            assert np.allclose(values_a, values_b, atol=1e-5)
        assert a[run_id] == b[run_id]


def test_the_runs_table_records_batch_size_and_old_files_read_1(tmp_path):
    spec = spec_in(tmp_path, batch_size=[1, "official"], methods=[{"method": "clip"}, {"method": "oga"}])
    run_all(spec)
    with ResultsDB(spec.results_dir) as db:
        got = db.df("SELECT method, batch_size, setting_id FROM runs ORDER BY method, batch_size")
    assert got[["method", "batch_size"]].values.tolist() == [["clip", 1], ["oga", 1], ["oga", 32]]
    assert got["setting_id"].nunique() == 1  # the batch run's baseline is CLIP on the same (iid) order
    # the report splits OGA's rows by batch size; the dashboard offers it as a filter and a series setting
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "report", "--results", spec.results_dir],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "OGA (batch_size=1)" in done.stdout and "OGA (batch_size=32)" in done.stdout, done.stdout
    assert "rows split by settings that vary within a dataset: batch_size" in " ".join(done.stdout.split())
    from dashboard import queries

    with ResultsDB(spec.results_dir) as db:
        runs = queries.accuracy_runs(db)
        assert queries.filter_columns(runs, db.hparam_names)["batch_size"] == "batch size"
        labels = queries.series_labels(runs, db.hparam_names)
        assert sorted(labels[runs["method"] == "oga"]) == ["OGA (batch_size=1)", "OGA (batch_size=32)"]
        assert queries.filter_columns(runs[runs["method"] == "clip"], db.hparam_names).get("batch_size") is None
    for path in Path(spec.results_dir).glob("runs/*/*.parquet"):  # files written before the column existed
        table = pq.read_table(path)
        pq.write_table(table.drop(["batch_size"]), path)
    with ResultsDB(spec.results_dir) as db:
        assert db.df("SELECT DISTINCT batch_size FROM runs")["batch_size"].tolist() == [1]
        gains = db.df("SELECT run_id, gain FROM paired")
    assert len(gains) == 2 and gains["gain"].notna().all()


def test_reproduce_this_run_keeps_a_batch_runs_batch_and_order(tmp_path):
    import json

    from dashboard.context import reproduce_spec
    from orchestrator.sweep.record import write_sweep_record

    spec = spec_in(tmp_path, batch_size=[1, "official"], stream=["iid", {"dirichlet": {"gamma": 0.1}}])
    runs = expand(spec)
    write_sweep_record(spec, runs)
    record = json.loads(next((Path(spec.results_dir) / "sweeps").glob("batches.json")).read_text())
    for run in runs:
        again = validate_spec(reproduce_spec(record, run.config, run.run_id), base_dir=tmp_path)
        assert [r.run_id for r in expand(again)] == [run.run_id], run.label


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_batch_method_sweeps_at_its_official_size_and_at_1(local_ray, tmp_path):
    """Card-driven: every method with an official batch size, beside CLIP, through a Ray sweep on a CLIP-like
    synthetic preset and a tiny real-layout dataset, under iid, Dirichlet and separate streams, at its official
    batch size and at 1; each run's rows are the method's own at its batch size over the run's stream."""
    from orchestrator import registry
    from orchestrator.clip.testing import TINY_VIT, build_dataset, write_model_config
    from orchestrator.results.verify import verify_results
    from orchestrator.sweep.load import load_spec
    from orchestrator.sweep.runner import run_sweep
    import yaml

    # (the methods adapting the image encoder run on images only: tests/test_encoder_sweep.py)
    batch_methods = [c.name for c in registry.method_cards() if c.batch_size is not None and c.image_encoder is None]
    assert "oga" in batch_methods
    build_dataset("dtd", tmp_path / "data", num_classes=3, per_class=12)
    config = write_model_config(TINY_VIT, tmp_path / "models")
    spec = {"name": "every-batch", "results_dir": "results", "cache_dir": "cache", "data_root": "data",
            "backbones": [{"model": TINY_VIT, "config": str(config), "pretrained": "random"}],
            "datasets": [{"synthetic": "fine_grained", "n": 200, "num_classes": 10, "dim": 32}, "dtd"],
            "stream": ["iid", {"dirichlet": {"gamma": 0.1}}, "separate"], "batch_size": [1, "official"],
            "methods": [{"method": "clip"}, *({"method": m} for m in batch_methods)], "seeds": [1],
            "resources": {"cpus": 1}, "part_rows": 40}
    path = tmp_path / "batches.yaml"
    path.write_text(yaml.safe_dump(spec))
    loaded = load_spec(path)
    outcome = run_sweep(loaded, out=lambda line: None)
    assert outcome.ok, outcome.failed
    assert verify_results(loaded.results_dir).ok
    runs = expand(loaded)
    sizes = {(r.method, r.batch_size) for r in runs}
    assert sizes == {("clip", 1)} | {(m, b) for m in batch_methods for b in (1, registry.method_card(m).batch_size)}
    # and CLIP, the baseline, also on each dataset's Dirichlet order drawn for each batch size above 1
    assert len(runs) == 2 * 3 * len(sizes) + 2 * len({b for _, b in sizes if b > 1})
    written = rows(loaded.results_dir)
    settings = settings_of(loaded)
    for run in runs:
        MEMO.clear()
        stream, _ = load_stream(run.source, settings)
        expected = make_method(run.method, stream.class_embeddings, stream.class_ids, stream.num_classes,
                               batch_size=run.batch_size, **method_hparams(run.config, len(stream)))
        assert [r["pred"] for r in written[run.run_id]] == expected.run(stream.features).predictions.tolist(), \
            run.label
