"""docs/clusters.md's workflow on a real multi-node Ray cluster on this machine (tests/ray_cluster.py: a head
with no CPUs or GPUs, two worker nodes with a fake GPU each), driven with Ray's own CLI as a user drives it, with
Ray's token authentication as the cluster files set it up: the token made by `ray get-auth-token --generate` in a
clean HOME, every node and the user's shell with RAY_AUTH_MODE=token; `ray job submit` of the guide's command,
`ray job logs --follow`, `ray job stop`, a submission without the token (refused), and faults: a worker node
killed mid-sweep, the job stopped and resubmitted after the head restarted.

The layout is the one cluster.yaml builds: a checkout at ~/bca (HOME is the test's) whose results and cache
point into one shared directory (EFS or NFS on a real cluster). Every outcome is checked against the same spec
run locally without Ray: the same rows, the same runs table, nothing lost or duplicated (`verify`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import yaml

from orchestrator.results import store
from orchestrator.results.db import ResultsDB
from orchestrator.results.schema import SAMPLE_COLUMNS
from orchestrator.results.verify import verify_results
from orchestrator.results.writer import read_run
from orchestrator.sweep.plan import expand, make_trials
from orchestrator.sweep.pieces import FAILPOINT_ENV, settings_of
from orchestrator.sweep.load import load_spec
from orchestrator.sweep.compaction import COMPACT_MIN_RUNS_ENV
from orchestrator.sweep.trial import execute_trial
from ray_cluster import LocalCluster, cluster_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[1]
N, PART = 400, 100
VOLATILE = {"samples_per_s", "latency_ms", "method_mem_mb", "time_encoder_s", "time_logits_s", "time_posterior_s",
            "time_update_s", "peak_mem_mb", "warmup_s", "host", "versions", "started_at", "finished_at",
            "updated_at"}


def guide_steps() -> str:
    text = (REPO / "docs" / "clusters.md").read_text()
    return text.split("## Step by step", 1)[1].split("\n## ", 1)[0]


def guide_command(prefix: str) -> str:
    """The one command of docs/clusters.md's steps that starts with `prefix`, verbatim."""
    (command,) = re.findall(rf"`({re.escape(prefix)}[^`]*)`", guide_steps())
    return command


@pytest.fixture(scope="module")
def cluster():
    """Two worker nodes and a head; ~/bca is a checkout whose results/ and cache/ point into shared storage."""
    root = Path(tempfile.mkdtemp(prefix="bca-cluster-", dir="/tmp"))  # short: Ray's socket paths live under it
    home, shared = root / "home", root / "efs"
    checkout = home / "bca"
    (checkout / "experiments").mkdir(parents=True)
    for name in ("results", "cache"):
        (shared / name).mkdir(parents=True)
        (checkout / name).symlink_to(shared / name)
    (checkout / ".venv").symlink_to(sys.prefix)
    # every node starts Ray with RAY_AUTH_MODE=token (the cluster files), the user's shell exports it (step 4)
    assert "`export RAY_AUTH_MODE=token`" in guide_steps()
    env = {**cluster_env(home, REPO), "RAY_AUTH_MODE": "token"}
    ray_cluster = LocalCluster(root / "ray", env)
    # step 1, in a clean HOME: the token is the user's alone
    made = subprocess.run(["bash", "-c", guide_command("ray get-auth-token")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0 and (home / ".ray" / "auth_token").is_file(), made.stdout + made.stderr
    assert stat.S_IMODE((home / ".ray" / "auth_token").stat().st_mode) == 0o600
    try:
        ray_cluster.start_head()
        ray_cluster.add_worker()
        ray_cluster.add_worker()
        yield ray_cluster, checkout
    finally:
        ray_cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def write_spec(checkout: Path, name: str) -> Path:
    """A tiny synthetic spec in the checkout's experiments/, with the shipped specs' relative paths."""
    path = checkout / "experiments" / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "results_dir": "../results", "cache_dir": "../cache",
        "datasets": [{"synthetic": "label_shift", "n": N, "num_classes": 5, "dim": 16}],
        "methods": [{"method": "clip"}, {"method": "bca", "n1": 50}], "seeds": [1, 2],
        "resources": {"gpu": 0.5, "cpus": 1}, "part_rows": PART, "max_failures": 2,
        "pack": 1}))  # one trial per run: the tests follow each run through node and job faults
    return path


def submit(cluster: LocalCluster, spec: Path, failpoint: str | None = None, env: dict | None = None) -> str:
    """The guide's `ray job submit` for this spec (and this cluster's dashboard port); returns the job id.
    A failpoint or other environment reaches the job through Ray's runtime env, the one addition to the guide's
    command."""
    command = guide_command("ray job submit").replace("http://127.0.0.1:8265", cluster.dashboard)
    command = command.replace("experiments/paper_ood.yaml", f"experiments/{spec.name}")
    env = {**(env or {}), **({FAILPOINT_ENV: failpoint} if failpoint else {})}
    if env:
        runtime = json.dumps({"env_vars": env})
        command = command.replace(" --no-wait ", f" --no-wait --runtime-env-json '{runtime}' ")
    done = subprocess.run(command, shell=True, env=cluster.env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return re.search(r"raysubmit_\w+", done.stdout + done.stderr).group(0)


def follow(cluster: LocalCluster, job: str) -> tuple[str, str]:
    """Step 5: `ray job logs --follow` until the job ends; returns (its logs, its final status)."""
    logs = cluster.ray("job", "logs", "--address", cluster.dashboard, "--follow", job)
    status = cluster.ray("job", "status", "--address", cluster.dashboard, job)
    # `ray job status` says "Job '<id>' succeeded / failed / was stopped" once a job ended
    found = re.search(r"Job '[^']+' (?:was )?(succeeded|failed|stopped)|Status for job '[^']+': (\w+)",
                      status.stdout + status.stderr)
    assert found, status.stdout + status.stderr
    return logs.stdout, (found.group(1) or found.group(2)).upper()


def wait_for(path: Path, timeout: float = 180) -> str:
    """The text of a failpoint's flag file (the pid of the trial process that fired it), once written."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)
    return path.read_text()


def local_reference(spec_path: Path, directory: Path) -> tuple[dict, dict]:
    """The same spec run locally in this process without Ray: (rows by run, runs-table rows by run)."""
    spec = load_spec(spec_path)
    spec = spec.model_copy(update={"results_dir": str(directory)})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a Ray trial of 1 CPU (OMP_NUM_THREADS=1)
    try:
        for trial in make_trials(expand(spec), 1):
            execute_trial(trial, settings_of(spec))
    finally:
        torch.set_num_threads(threads)
    return outcome(spec_path, directory)


def outcome(spec_path: Path, results_dir: Path) -> tuple[dict, dict]:
    """(run_id -> its sample rows in stream order, run_id -> its runs-table row without timings and hosts)."""
    spec = load_spec(spec_path)
    rows, runs = {}, {}
    columns = ", ".join(c.name for c in SAMPLE_COLUMNS)
    with ResultsDB(results_dir) as db:  # live parts or compacted segments alike
        for run in expand(spec):  # the shared results dir holds other sweeps too
            rows[run.run_id] = db.sql(f"SELECT {columns} FROM samples WHERE run_id = $r ORDER BY sample_idx",
                                      {"r": run.run_id}).to_pylist()
            assert [r["sample_idx"] for r in rows[run.run_id]] == list(range(N)), run.label
            row = read_run(results_dir, spec.name, run.run_id)
            runs[run.run_id] = {k: v for k, v in row.items() if k not in VOLATILE}
    return rows, runs


def final_results(results_dir: Path, sweep: str) -> dict[str, dict]:
    """run_id -> the final result its trial reported (with the id of the node it ran on), from Tune's
    result.json files in shared storage."""
    finals = {}
    for result in (results_dir / "tune").glob(f"{sweep}_*/*/result.json"):
        for line in result.read_text().splitlines():
            record = json.loads(line)
            if "node_id" in record and "run_id" in record:
                finals[record["run_id"]] = record
    return finals


def assert_same_as_local(spec_path: Path, shared_results: Path, tmp_path: Path) -> None:
    spec = load_spec(spec_path)
    assert outcome(spec_path, shared_results) == local_reference(spec_path, tmp_path / "local")
    report = verify_results(shared_results)
    assert report.ok, report.problems
    tune = sorted(str(p.relative_to(shared_results)) for p in (shared_results / "tune").glob(f"{spec.name}_*/*/*"))
    assert {r.run_id for r in expand(spec)} <= set(final_results(shared_results, spec.name)), tune


def test_the_guides_job_submit_runs_the_sweep_on_the_worker_nodes(cluster, tmp_path):
    ray_cluster, checkout = cluster
    spec = write_spec(checkout, "flow")
    logs, status = follow(ray_cluster, submit(ray_cluster, spec))
    assert status == "SUCCEEDED", logs
    assert "4/4 runs finished, 0 failed" in logs and "[4/4]" in logs
    results = (checkout / "results").resolve()
    assert_same_as_local(spec, results, tmp_path)
    ran_on = {r["node_id"] for r in final_results(results, "flow").values()}
    assert ran_on <= {w.node_id for w in ray_cluster.workers} and ray_cluster.head.node_id not in ran_on


def test_a_submission_without_the_token_is_refused(cluster, tmp_path):
    ray_cluster, checkout = cluster
    spec = write_spec(checkout, "notoken")
    command = guide_command("ray job submit").replace("http://127.0.0.1:8265", ray_cluster.dashboard)
    command = command.replace("experiments/paper_ood.yaml", f"experiments/{spec.name}")
    (tmp_path / "home").mkdir()
    env = {**ray_cluster.env, "HOME": str(tmp_path / "home")}  # another user: no token file, no RAY_AUTH_MODE
    env.pop("RAY_AUTH_MODE")
    done = subprocess.run(command, shell=True, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "raysubmit_" not in done.stdout, done.stdout + done.stderr
    assert not (checkout / "results" / "sweeps" / "notoken.json").exists()


def test_a_worker_node_killed_mid_sweep_loses_and_duplicates_nothing(cluster, tmp_path):
    ray_cluster, checkout = cluster
    spec = write_spec(checkout, "nodekill")
    flag = tmp_path / "stalled"
    job = submit(ray_cluster, spec, failpoint=f"stall:1:{flag}")
    victim = ray_cluster.node_of(int(wait_for(flag)))  # the node of the trial stalled after its first part
    victim.kill()  # its raylet, workers and agents, by pid
    logs, status = follow(ray_cluster, job)
    assert status == "SUCCEEDED", logs
    assert "retry:" in logs and f"resumed at row {PART}" in logs and "4/4 runs finished" in logs
    results = (checkout / "results").resolve()
    assert_same_as_local(spec, results, tmp_path)
    (resumed,) = [r for r in final_results(results, "nodekill").values() if r["resumed_from"] == PART]
    assert resumed["node_id"] != victim.node_id and resumed["node_id"] in {w.node_id for w in ray_cluster.workers}


def test_job_stopped_then_resubmitted_after_a_head_restart_resumes(cluster, tmp_path):
    ray_cluster, checkout = cluster
    spec = write_spec(checkout, "stopped")
    flag = tmp_path / "stalled"
    job = submit(ray_cluster, spec, failpoint=f"stall:1:{flag}")
    wait_for(flag)
    stopped = ray_cluster.ray("job", "stop", "--address", ray_cluster.dashboard, job)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert follow(ray_cluster, job)[1] == "STOPPED"
    # the stop (SIGTERM to the job's driver) left no run "running": each says how far it got
    records = [read_run(checkout / "results", "stopped", run.run_id) for run in expand(load_spec(spec))]
    assert [r["status"] for r in records if r and r["status"] == "running"] == [], records
    assert any(r and str(r["error"]).startswith(f"interrupted after {PART} complete rows") for r in records)
    ray_cluster.restart(workers=1)
    logs, status = follow(ray_cluster, submit(ray_cluster, spec))  # the same command again
    assert status == "SUCCEEDED", logs
    assert f"resumed at row {PART}" in logs and "4/4 runs finished" in logs
    assert_same_as_local(spec, (checkout / "results").resolve(), tmp_path)


def test_two_sweeps_writing_and_compacting_at_once_lose_and_duplicate_nothing(cluster, tmp_path):
    """Two drivers on the cluster at once (two sweeps of one shared results dir): their trials on both worker nodes
    write live files while both drivers compact (after every run: BCA_COMPACT_MIN_RUNS=1), each commit taking
    turns under the catalog lock. Every run ends up compacted, the rows equal a local run's, verify finds nothing."""
    ray_cluster, checkout = cluster
    specs = [write_spec(checkout, name) for name in ("left", "right")]
    jobs = [submit(ray_cluster, spec, env={COMPACT_MIN_RUNS_ENV: "1"}) for spec in specs]
    for job in jobs:
        logs, status = follow(ray_cluster, job)
        assert status == "SUCCEEDED", logs
        assert "4/4 runs finished, 0 failed" in logs and "compacted" in logs, logs
    results = (checkout / "results").resolve()
    compacted = store.load_catalog(results).compacted()
    for spec in specs:
        assert {r.run_id for r in expand(load_spec(spec))} <= set(compacted)
        assert_same_as_local(spec, results, tmp_path / spec.stem)


def test_a_sharded_episodic_run_spreads_over_the_nodes_and_writes_the_unsharded_rows(cluster, tmp_path):
    """Zero's runs in 4 shards (trials of one run on both worker nodes at once, each with a fake GPU) through the
    guide's `ray job submit`, one shard's worker SIGKILLed after its first part (it resumes there): the rows and
    runs-table rows of the same spec run unsharded, locally without Ray."""
    from orchestrator.clip.testing import TINY_VIT, build_dataset, write_model_config

    ray_cluster, checkout = cluster
    build_dataset("imagenet-a", checkout / "data", num_classes=3, per_class=4)
    config = write_model_config(TINY_VIT, checkout / "models")
    spec = {"name": "sharded", "results_dir": "../results", "cache_dir": "../cache", "data_root": "../data",
            "backbones": [{"model": TINY_VIT, "config": str(config), "pretrained": "random"}],
            "datasets": ["imagenet-a"], "views": "crops", "seeds": [1, 2], "part_rows": 1,
            "resources": {"gpu": 0.5, "cpus": 1}, "max_failures": 2}
    path = checkout / "experiments" / "sharded.yaml"
    path.write_text(yaml.safe_dump({**spec, "methods": [{"method": "zero", "shards": 4}]}))
    local = checkout / "experiments" / "local.yaml"  # the same runs unsharded (and the cache encoded once)
    local.write_text(yaml.safe_dump({**spec, "results_dir": str(tmp_path / "local"), "methods": [{"method": "zero"}]}))
    reference = load_spec(local)
    for trial in make_trials(expand(reference), 1):
        execute_trial(trial, settings_of(reference))
    flag = tmp_path / "stalled"
    job = submit(ray_cluster, path, failpoint=f"stall:1:{flag}")
    pid = int(wait_for(flag))  # a shard's trial, stalled after its first part (holding its node's one CPU)
    victim = ray_cluster.node_of(pid)
    os.kill(pid, signal.SIGKILL)
    logs, status = follow(ray_cluster, job)
    assert status == "SUCCEEDED", logs
    assert "retry:" in logs and "resumed at row" in logs
    assert "2/2 runs finished, 0 failed" in logs and "(shard 4/4)" in logs
    sharded = load_spec(path)
    assert [r.run_id for r in expand(sharded)] == [r.run_id for r in expand(reference)]

    def rows_and_records(spec, results: Path) -> dict:
        columns = ", ".join(c.name for c in SAMPLE_COLUMNS)
        with ResultsDB(results) as db:
            return {run.run_id: (db.sql(f"SELECT {columns} FROM samples WHERE run_id = $r ORDER BY sample_idx",
                                        {"r": run.run_id}).to_pylist(),
                                 {k: v for k, v in read_run(results, "sharded", run.run_id).items()
                                  if k not in VOLATILE | {"progress"}})
                    for run in expand(spec)}

    results = (checkout / "results").resolve()
    assert rows_and_records(sharded, results) == rows_and_records(reference, tmp_path / "local")
    report = verify_results(results)
    assert report.ok, report.problems
    nodes = {json.loads(line)["node_id"] for result in (results / "tune").glob("sharded_*/*/result.json")
             for line in result.read_text().splitlines() if "node_id" in line}
    # the other shards ran on the other node while the stalled one held its node
    assert nodes | {victim.node_id} == {w.node_id for w in ray_cluster.workers}
