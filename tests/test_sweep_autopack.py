"""`pack: auto` (the default): trials sized by the cost model, and a sweep whose packs commit their runs straight
into segments with every row, prediction and metric as an unpacked, uncompacted sweep has."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from orchestrator.results import store
from orchestrator.results.db import ResultsDB
from orchestrator.results.verify import verify_results
from orchestrator.sweep import cost
from orchestrator.sweep.compaction import COMPACT_MIN_RUNS_ENV
from orchestrator.sweep.load import load_spec
from orchestrator.sweep.plan import expand, make_trials
from orchestrator.sweep.runner import run_sweep


def write_spec(directory, n=300, seeds=(1, 2), **overrides):
    spec = {"name": "auto", "results_dir": str(directory / "results"),
            "datasets": [{"synthetic": "label_shift", "n": n, "num_classes": 6, "dim": 16}],
            "methods": [{"method": "clip"}, {"method": "bca", "tau": [0.2, 0.3, 0.4], "n2": [5, 10], "n1": 50},
                        {"method": "dota"}],
            "seeds": list(seeds), "resources": {"cpus": 1}, **overrides}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "auto.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_auto_trials_hold_seconds_of_work_and_never_more_than_a_minute(tmp_path):
    runs = expand(load_spec(write_spec(tmp_path, n=300)))
    trials = make_trials(runs, "auto")
    prior = cost.cost_model(lambda source: 300)
    # per seed: the six BCA runs and CLIP cost ~ms each at the prior: one trial; DOTA (5 samples/s) costs 60 s
    assert sorted(len(t.runs) for t in trials) == [1, 1, 7, 7]
    assert all(sum(prior(r) for r in t.runs) <= cost.TRIAL_MAX_S for t in trials if len(t.runs) > 1)
    assert {r.run_id for t in trials for r in t.runs} == {r.run_id for r in runs}
    # measured costs (a resumed sweep) replace the prior: BCA at 0.01 s a sample is 3 s a run, so per seed
    # CLIP + two BCA runs, two BCA runs, two BCA runs (6 s each, past the 5 s target), DOTA alone
    measured = cost.cost_model(lambda source: 300, {"bca": 0.01})
    sizes = sorted(len(t.runs) for t in make_trials(runs, "auto", measured))
    assert sizes == [1, 1, 2, 2, 2, 2, 3, 3]


def test_chunks_close_at_the_target_and_before_the_limit():
    class R:
        def __init__(self, c):
            self.c = c

    group = [R(c) for c in (1, 1, 1, 1, 1, 1, 50, 20, 70, 0.1)]
    chunks = cost.chunk_by_cost(group, lambda r: r.c)
    assert [[r.c for r in chunk] for chunk in chunks] == [[1, 1, 1, 1, 1], [1, 50], [20], [70], [0.1]]


def test_measured_cost_is_the_median_of_finished_runs():
    rows = {"a": {"status": "finished", "method": "bca", "samples_per_s": 100.0},
            "b": {"status": "finished", "method": "bca", "samples_per_s": 1000.0},
            "c": {"status": "finished", "method": "bca", "samples_per_s": 10.0},
            "d": {"status": "failed", "method": "tda", "samples_per_s": 1.0}}
    assert cost.measured_sample_seconds(rows) == {"bca": 0.01}




def test_a_default_sweep_packs_compacts_and_matches_one_run_per_trial(local_ray, tmp_path, monkeypatch):
    methods = [{"method": "clip"}, {"method": "bca", "tau": [0.2, 0.3, 0.4], "n2": [5, 10], "n1": 50}]
    lines: list[str] = []
    monkeypatch.setenv(COMPACT_MIN_RUNS_ENV, "1")
    packed = load_spec(write_spec(tmp_path / "auto", n=200, methods=methods))
    outcome = run_sweep(packed, out=lines.append)
    assert outcome.ok and outcome.total == 14
    assert sum(1 for line in lines if line.startswith("[")) == 2  # one trial per seed's stream
    root = tmp_path / "auto" / "results"
    # each pack of fresh runs is committed as one segment, no live file written (nothing left to compact)
    assert not list(root.glob("samples/*/*/*/*/*/part-*.parquet")) and not list(root.glob("runs/*/*.parquet"))
    assert not any(line.startswith("compacted") for line in lines), lines
    catalog = store.load_catalog(root)
    assert len(catalog.segments) == 2 and len(catalog.compacted()) == 14 and verify_results(root).ok
    tune_bytes = sum(p.stat().st_size for p in (root / "tune").rglob("*") if p.is_file())
    assert tune_bytes / 14 < 16 * 1024  # Tune's own state: a few KB per run
    monkeypatch.delenv(COMPACT_MIN_RUNS_ENV)
    single = load_spec(write_spec(tmp_path / "single", n=200, methods=methods, pack=1))
    assert run_sweep(single, out=lambda line: None).ok
    sql = "SELECT run_id, sample_idx, pred, confidence FROM samples ORDER BY run_id, sample_idx"
    with ResultsDB(root) as a, ResultsDB(single.results_dir) as b:
        got, want = a.df(sql), b.df(sql)
        assert got[["run_id", "sample_idx", "pred"]].equals(want[["run_id", "sample_idx", "pred"]])
        # the multi-config engine is exact per run up to float32 rounding of the posteriors
        assert np.abs(got["confidence"] - want["confidence"]).max() < 1e-5
        metrics = "SELECT run_id, accuracy, last50_accuracy, helped, hurt FROM accuracy LEFT JOIN paired USING " \
                  "(run_id) ORDER BY run_id"
        assert a.df(metrics).equals(b.df(metrics))


def test_on_a_gpu_a_pack_is_sized_by_the_devices_memory(tmp_path):
    """A sweep whose trials take a GPU packs each source's runs by memory: as many configs as fill half of the
    trial's share of the device (an 80 GB card given here, as `local_device_bytes` reads it on a GPU node)."""
    methods = [{"method": "bca", "tau": [round(0.05 * i, 2) for i in range(1, 20)], "n1": [50, 500, 5000]},
               {"method": "dota"}]
    spec = load_spec(write_spec(tmp_path, n=2000, seeds=[1], methods=methods, resources={"gpu": 0.5, "cpus": 1}))
    runs = expand(spec)
    per_bca = cost.config_bytes("bca", 6, 16, 2000)
    # the trace and the card's state: U, V, C1, C2 for BCA; DOTA's scatter [K, d, d] besides its means and precision
    assert per_bca == 4 * (2000 * (6 + 3) + 6 * (16 + 6 + 2))
    assert cost.config_bytes("dota", 6, 16, 2000) == 4 * (2000 * (6 + 3) + 6 * 16 * 16 + 2 * 16 * 16 + 2 * 6 * 16 + 6 + 4)
    device = 80 * 2**30
    memory = cost.sweep_memory(spec, device)
    assert memory[0] == cost.PACK_MEMORY_FRACTION * 0.5 * device
    assert [len(t.runs) for t in make_trials(runs, "auto", memory=memory)] == [len(runs)]  # all 58 in one pack
    # a device holding 20 configs' worth: packs of 20, the last one the rest
    small = cost.sweep_memory(spec, int(20 * per_bca / (cost.PACK_MEMORY_FRACTION * 0.5)) + 1)
    assert [len(t.runs) for t in make_trials(runs, "auto", memory=small)] == [20, 20, 18]
    # no GPU asked for, or none known here: packs by time as before
    assert cost.sweep_memory(load_spec(write_spec(tmp_path / "cpu", n=2000, methods=methods)), device) is None
    assert cost.sweep_memory(spec, None) is None


def test_a_gpu_sweep_planned_on_a_driver_without_a_gpu_packs_by_the_memory_the_spec_gives(tmp_path, monkeypatch):
    """A CPU head node cannot ask its GPU: `resources.gpu_memory_gb` sizes the packs as the trials' GPU would;
    without it the plan packs by CPU time and says so (a GPU would then step methods slow on a CPU alone)."""
    from orchestrator.sweep.dryrun import dry_run

    monkeypatch.setattr(cost, "local_device_bytes", lambda: None)
    methods = [{"method": "bca", "tau": [round(0.05 * i, 2) for i in range(1, 20)], "n1": [50, 500, 5000]},
               {"method": "dota"}]
    given = load_spec(write_spec(tmp_path / "given", n=2000, seeds=[1], methods=methods,
                                 resources={"gpu": 0.5, "cpus": 1, "gpu_memory_gb": 80}))
    assert cost.trial_device_bytes(given) == 80 * 2**30
    lines = dry_run(given, expand(given), address="ray://head:10001")  # joining a cluster: no local checks
    assert "58 to run in 1 trials" in lines[0] and not any("gpu_memory_gb" in line for line in lines), lines[0]
    unknown = load_spec(write_spec(tmp_path / "unknown", n=2000, seeds=[1], methods=methods,
                                   resources={"gpu": 0.5, "cpus": 1}))
    assert cost.trial_device_bytes(unknown) is None
    lines = dry_run(unknown, expand(unknown), address="ray://head:10001")
    assert "in 1 trials" not in lines[0]
    assert lines[-1].startswith("note: trials take a GPU but its memory is not known here") and \
        "set resources.gpu_memory_gb" in lines[-1]
    fixed = load_spec(write_spec(tmp_path / "fixed", n=2000, seeds=[1], methods=methods, pack=8,
                                 resources={"gpu": 0.5, "cpus": 1}))
    assert not any("gpu_memory_gb" in line for line in dry_run(fixed, expand(fixed), address="ray://head:10001"))


def test_a_pack_commits_fresh_runs_as_one_segment_and_resumes_a_started_run_from_its_parts(tmp_path):
    """Fresh runs: one segment, no live file, verify clean. A run with parts from an earlier attempt (stopped
    after its first part) makes its pack go on through parts: the part on disk is kept, every run ends with all
    its rows once, the same rows as the fresh pack's (floats to float32 rounding), and verify finds nothing."""
    from dataclasses import replace

    from orchestrator.results.writer import RunWriter
    from orchestrator.sweep.plan import Trial
    from orchestrator.sweep.pieces import settings_of
    from orchestrator.sweep.trial import execute_trial

    methods = [{"method": "bca", "tau": [0.2, 0.3, 0.4], "n2": [5], "n1": 50}]
    sql = "SELECT run_id, sample_idx, pred, selected, confidence FROM samples ORDER BY run_id, sample_idx"
    fresh = load_spec(write_spec(tmp_path / "fresh", n=200, seeds=(1,), methods=methods, part_rows=50))
    (trial,) = make_trials(expand(fresh), 3)
    execute_trial(trial, settings_of(fresh))
    root = tmp_path / "fresh" / "results"
    assert len(store.load_catalog(root).segments) == 1 and len(store.load_catalog(root).compacted()) == 3
    assert not list(root.glob("samples/**/part-*.parquet")) and not list(root.glob("runs/*/*.parquet"))
    assert verify_results(root).ok

    resumed = load_spec(write_spec(tmp_path / "resumed", n=200, seeds=(1,), methods=methods, part_rows=50))
    (trial,) = make_trials(expand(resumed), 3)
    started = trial.runs[1]
    settings = settings_of(resumed)
    flag = tmp_path / "fired"
    with pytest.raises(RuntimeError, match="failpoint"):
        execute_trial(Trial(started.run_id, trial.source, (started,)), replace(settings, failpoint=f"raise:1:{flag}"))
    writer = RunWriter(resumed.results_dir, started.config)
    (part,) = writer.samples_dir.glob("part-*.parquet")
    kept = part.stat().st_mtime_ns
    assert writer.rows_done() == 50 and writer.status() == "failed"
    assert len(execute_trial(trial, settings)) == 3
    assert part.stat().st_mtime_ns == kept and store.load_catalog(resumed.results_dir).segments == ()
    assert verify_results(resumed.results_dir).ok
    with ResultsDB(root) as a, ResultsDB(resumed.results_dir) as b:
        got, want = b.df(sql), a.df(sql)
    assert got[["run_id", "sample_idx", "pred", "selected"]].equals(want[["run_id", "sample_idx", "pred", "selected"]])
    assert np.abs(got["confidence"] - want["confidence"]).max() < 1e-5

