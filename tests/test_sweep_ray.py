"""Sweeps against a real local Ray (num_cpus=2 and a fake GPU, so fractional-GPU trials are scheduled):
end to end, a trial's worker SIGKILLed mid-run, the driver SIGKILLed then --resume, determinism and replay.

One Ray session serves the whole module (starting Ray costs seconds on 2 cores). Faults are injected with
the trial failpoint (BCA_SWEEP_FAILPOINT, see orchestrator/sweep/pieces.py), so a kill always lands mid-run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from orchestrator.data.synthetic import make_synthetic
from orchestrator.methods import run_stream
from orchestrator.results import store
from orchestrator.results.writer import load_state, read_run
from orchestrator.sweep.load import load_spec
from orchestrator.sweep.plan import expand, make_trials
from orchestrator.sweep.runner import run_sweep
from orchestrator.sweep.pieces import FAILPOINT_ENV, settings_of
from orchestrator.sweep.trial import execute_trial
from ray_cluster import shared_local_ray

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.usefixtures("local_ray")]

N = 600
PART = 100
SAMPLE_KEYS = ["run_id", "sample_idx"]
ROW_COLUMNS = ["run_id", "sample_idx", "image_id", "label", "pred", "correct", "confidence", "gated", "gated_prior",
               "selected"]




def write_spec(directory: Path, *, name: str = "t", results: str = "results", **overrides) -> Path:
    spec = {
        "name": name,
        "results_dir": results,
        "datasets": [{"synthetic": "label_shift", "n": N, "num_classes": 6, "dim": 32}],
        "methods": [{"method": "clip"}, {"method": "bca", "tau": [0.2, 0.4], "n1": 50}, {"method": "tda_pa"}],
        "seeds": [1, 2],
        "resources": {"gpu": 0.5, "cpus": 1},
        "part_rows": PART,
        "max_failures": 1,
        "pack": 1,  # one trial per run: these tests follow each run through faults and resumes
        **overrides,
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def sample_rows(results_dir: str | Path) -> dict[str, list[dict]]:
    """run_id -> its rows in stream order, read back from every part file and segment (a pack of fresh runs is
    committed straight into a segment)."""
    parts = sorted(Path(results_dir).glob("samples/*/*/*/*/*/part-*.parquet"))
    segments = store.load_catalog(results_dir).paths("samples")
    rows: dict[str, list[dict]] = {}
    for part in parts + segments:
        for row in pq.read_table(part, columns=ROW_COLUMNS).to_pylist():
            rows.setdefault(row["run_id"], []).append(row)
    return {rid: sorted(r, key=lambda x: x["sample_idx"]) for rid, r in rows.items()}


def assert_complete(results_dir: str | Path, spec_path: Path, killed_writes: frozenset = frozenset()) -> dict[str, list[dict]]:
    """Every run of the spec finished, with exactly N rows 0..N-1 and no duplicate (run_id, sample_idx)."""
    spec = load_spec(spec_path)
    runs = expand(spec)
    rows = sample_rows(results_dir)
    assert set(rows) == {r.run_id for r in runs}
    for run in runs:
        assert [r["sample_idx"] for r in rows[run.run_id]] == list(range(N)), run.label
        assert read_run(results_dir, spec.name, run.run_id)["status"] == "finished"
    # a SIGKILL may land inside an atomic write: its temp file is never read, and only those may stay
    assert not set(Path(results_dir).rglob(".*.tmp")) - killed_writes, "temp files left behind"
    return rows


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of the standard spec: the rows every faulted run must reproduce."""
    shared_local_ray()
    directory = tmp_path_factory.mktemp("reference")
    spec_path = write_spec(directory)
    lines: list[str] = []
    outcome = run_sweep(load_spec(spec_path), out=lines.append)
    return directory, spec_path, outcome, lines


def test_small_sweep_end_to_end(reference):
    directory, spec_path, outcome, lines = reference
    assert outcome.ok and outcome.total == 2 * (1 + 2 + 1) and not outcome.failed
    rows = assert_complete(directory / "results", spec_path)
    spec = load_spec(spec_path)
    for run in expand(spec):
        row = read_run(spec.results_dir, spec.name, run.run_id)
        assert row["n_samples"] == N and 0 <= row["accuracy"] <= 100 and row["samples_per_s"] > 0
        assert row["config_hash"] == run.run_id and row["seed"] == run.config["seed"]
        assert row["time_logits_s"] is not None and row["peak_mem_mb"] > 0 and row["host"]
        correct = np.array([r["correct"] for r in rows[run.run_id]])
        assert row["accuracy"] == pytest.approx(100 * correct.mean())
        if run.config["method"] == "bca":
            assert row["tau"] in (0.2, 0.4) and row["n1"] == 50 and row["n2"] == 10
        part = next(Path(spec.results_dir).glob(f"samples/*/*/*/*/run_id={run.run_id}/part-000000000.parquet"))
        metadata = pq.read_schema(part).metadata
        assert metadata[b"bca.run_id"] == run.run_id.encode()
        assert json.loads(metadata[b"bca.run_config"]) == run.config
        state = load_state(spec.results_dir, run.run_id)
        assert np.array_equal(state["stream_order"], np.arange(N))  # synthetic: the scenario's own order
    # progress: one line per finished trial with done/total, then the table and the dashboard command
    done_lines = [ln for ln in lines if ln.startswith("[")]
    assert len(done_lines) == outcome.total and done_lines[-1].startswith(f"[{outcome.total}/{outcome.total}]")
    assert any("By method and dataset" in ln and "top-1 accuracy (%)" in ln and "±" in ln for ln in lines)
    assert any("bca dashboard --results" in ln for ln in lines)


def test_rerun_skips_finished_runs(reference):
    directory, spec_path, outcome, _ = reference
    lines: list[str] = []
    again = run_sweep(load_spec(spec_path), resume=True, out=lines.append)
    assert again.ok and again.skipped == again.total
    assert not [ln for ln in lines if ln.startswith("[")]


def test_a_running_trials_progress_reaches_the_driver(local_ray, tmp_path):
    """With --progress-every 0 every part of a running trial shows up as a driver line, through Tune."""
    spec_path = write_spec(tmp_path, methods=[{"method": "bca", "n1": 50}], seeds=[1])
    lines: list[str] = []
    assert run_sweep(load_spec(spec_path), out=lines.append, progress_every_s=0).ok
    adapting = [ln.split(": adapting ", 1)[1] for ln in lines if ": adapting " in ln]
    assert [ln.split(" samples")[0] for ln in adapting] == [f"{k}/{N}" for k in range(PART, N + 1, PART)]
    assert all("ETA" in ln for ln in adapting)


def test_trial_worker_sigkilled_mid_run_is_retried_from_its_last_part(reference, tmp_path, monkeypatch):
    ref_dir, ref_spec, _, _ = reference
    flag = tmp_path / "killed"
    monkeypatch.setenv(FAILPOINT_ENV, f"sigkill:2:{flag}")
    spec_path = write_spec(tmp_path)
    lines: list[str] = []
    outcome = run_sweep(load_spec(spec_path), out=lines.append)
    assert flag.exists(), "the failpoint never fired"
    assert outcome.ok, outcome.failed
    assert any(ln.startswith("retry:") for ln in lines)
    assert any(f"resumed at row {2 * PART}" in ln for ln in lines)
    assert assert_complete(tmp_path / "results", spec_path) == assert_complete(ref_dir / "results", ref_spec)


def test_failed_trial_is_recorded_then_resumed(reference, tmp_path, monkeypatch):
    ref_dir, ref_spec, _, _ = reference
    flag = tmp_path / "killed"
    monkeypatch.setenv(FAILPOINT_ENV, f"sigkill:3:{flag}")
    spec_path = write_spec(tmp_path, max_failures=0)
    outcome = run_sweep(load_spec(spec_path), out=lambda line: None)
    assert len(outcome.failed) == 1 and not outcome.ok
    (run_id, error), = outcome.failed.items()
    assert "died" in error.lower() or "actor" in error.lower(), error
    spec = load_spec(spec_path)
    assert read_run(spec.results_dir, spec.name, run_id)["status"] == "failed"
    assert len(sample_rows(spec.results_dir)[run_id]) == 3 * PART  # complete parts survive the kill

    monkeypatch.delenv(FAILPOINT_ENV)
    lines: list[str] = []
    resumed = run_sweep(load_spec(spec_path), resume=True, out=lines.append)
    assert resumed.ok and resumed.skipped == resumed.total - 1
    assert any(f"resumed at row {3 * PART}" in ln for ln in lines)
    assert assert_complete(tmp_path / "results", spec_path) == assert_complete(ref_dir / "results", ref_spec)


def _bca(*args: str, env: dict | None = None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, **kwargs)


def test_driver_sigkilled_then_resume(reference, local_ray, tmp_path):
    ref_dir, ref_spec, _, _ = reference
    address = local_ray
    flag = tmp_path / "stalled"
    spec_path = write_spec(tmp_path)
    driver = _bca("sweep", str(spec_path), "--address", address,
                  env={**os.environ, FAILPOINT_ENV: f"stall:2:{flag}"})
    deadline = time.monotonic() + 240
    while not flag.exists():
        assert driver.poll() is None, driver.stdout.read()
        assert time.monotonic() < deadline, "the trial never reached its second part"
        time.sleep(0.2)
    os.killpg(driver.pid, signal.SIGKILL)  # the driver and anything it spawned; Ray ends the job's actors
    driver.wait()
    time.sleep(2)  # the job's actors end after the driver
    killed_writes = frozenset((tmp_path / "results").rglob(".*.tmp"))

    resumed = _bca("sweep", str(spec_path), "--resume", "--address", address)  # also tests joining a cluster
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output
    assert "to run" in output and "runs finished" in output
    assert assert_complete(tmp_path / "results", spec_path, killed_writes) == assert_complete(ref_dir / "results",
                                                                                         ref_spec)


def test_same_spec_and_seed_give_identical_rows_and_the_stored_order_replays(reference, tmp_path):
    """A second execution of the spec (here the trials run in this process, no Ray) writes the very same rows as
    the Ray sweep, and a run's recorded stream order replays it outside the sweep."""
    ref_dir, ref_spec, _, _ = reference
    spec = load_spec(write_spec(tmp_path))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a Ray trial (OMP_NUM_THREADS=1): BLAS sums may round by thread count
    try:
        for trial in make_trials(expand(spec), 1):
            execute_trial(trial, settings_of(spec))
    finally:
        torch.set_num_threads(threads)
    assert sample_rows(spec.results_dir) == sample_rows(ref_dir / "results")
    run = next(r for r in expand(spec) if r.config["method"] == "bca")
    order = load_state(spec.results_dir, run.run_id)["stream_order"]
    bench = make_synthetic("label_shift", seed=run.config["seed"], **{
        k: v for k, v in run.config["synthetic"].items() if k != "scenario"})
    posteriors = run_stream("bca", bench.features[torch.from_numpy(order)], bench.class_embeddings, bench.class_ids,
                            bench.num_classes, **run.config["hparams"])
    stored = [r["pred"] for r in sample_rows(spec.results_dir)[run.run_id]]
    assert posteriors.argmax(dim=1).tolist() == stored


def test_real_dataset_sweep_encodes_each_cache_key_once(local_ray, tmp_path):
    """The real-data path through Ray: a tiny open_clip model (its config registered in every trial process),
    datasets in their real layouts, single views shared by all seeds, AugMix views per seed, zero on them."""
    from orchestrator.clip.testing import TINY_VIT, build_dataset, write_model_config

    build_dataset("dtd", tmp_path / "data", num_classes=3, per_class=4)
    build_dataset("imagenet-a", tmp_path / "data", num_classes=3, per_class=3)
    config = write_model_config(TINY_VIT, tmp_path / "models")
    spec_path = tmp_path / "real.yaml"
    spec_path.write_text(yaml.safe_dump({
        "name": "real", "results_dir": "results", "cache_dir": "cache", "data_root": "data",
        "backbones": [{"model": TINY_VIT, "config": str(config), "pretrained": "random"}],
        "datasets": ["dtd", {"name": "imagenet-a", "views": "augmix4"}],
        "methods": [{"method": "clip"}, {"method": "bca", "tau": 0.3, "n1": 10},
                    {"method": "zero", "datasets": ["imagenet-a"]}],
        "seeds": [1, 2], "resources": {"gpu": 0.5, "cpus": 1}, "part_rows": 5,
    }))
    spec = load_spec(spec_path)
    outcome = run_sweep(spec, out=lambda line: None)
    assert outcome.ok, outcome.failed
    runs = expand(spec)
    assert len(runs) == 2 * 2 + 3 * 2
    rows = sample_rows(spec.results_dir)
    encoded = 0
    for run in runs:
        row = read_run(spec.results_dir, spec.name, run.run_id)
        n = row["n_samples"]
        assert [r["sample_idx"] for r in rows[run.run_id]] == list(range(n))
        encoded += row["time_encoder_s"] > 0
        order = load_state(spec.results_dir, run.run_id)["stream_order"]
        assert order.tolist() == torch.randperm(n, generator=torch.Generator().manual_seed(run.config["seed"])).tolist()
    entries = [p for p in Path(spec.cache_dir).glob("features/*") if p.is_dir()]
    # dtd single view: one entry for both seeds; imagenet-a AugMix: one per seed. Each encoded by one trial.
    assert len(entries) == 3 and encoded == 3
