"""`bca sweep` and the app's own flags as a user meets them, without running a trial: refusals with exit code 2
that write nothing (the sweep lock, a large grid without --yes, an invalid `bca cache` spec, a taken dashboard
port, a CPU request no node can hold), the dry run's plan, the inert-setting warning, --help and --version."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.sweep.load import load_spec
from orchestrator.sweep.runner import cpus_issue, sweep_lock

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


def bca(*args: str):
    return CliRunner().invoke(app, list(args), env=ENV)


def files_under(root: Path) -> set[Path]:
    return set(root.rglob("*")) if root.exists() else set()


def write_spec(directory: Path, **overrides) -> Path:
    spec = {"name": "s", "results_dir": "results",
            "datasets": [{"synthetic": "label_shift", "n": 60, "num_classes": 4, "dim": 16}],
            "methods": [{"method": "clip"}, {"method": "bca", "tau": [0.2, 0.4], "n1": 50}], "seeds": [1, 2],
            **overrides}
    path = directory / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_second_sweep_of_the_same_sweep_says_who_holds_it_and_writes_nothing(tmp_path):
    path = write_spec(tmp_path)
    with sweep_lock(load_spec(path)):
        before = files_under(tmp_path / "results")
        r = bca("sweep", str(path))
        assert r.exit_code == 2
        assert f"sweep 's' in {tmp_path / 'results'} is being run by pid {os.getpid()} on {socket.gethostname()}, " \
               "since 20" in r.stderr
        assert files_under(tmp_path / "results") == before and not (tmp_path / "results" / "sweeps" / "s.json").exists()
    assert not (tmp_path / "results" / "sweeps" / "s.owner.json").exists()  # released with its owner note


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path):
    r = bca("sweep", str(write_spec(tmp_path)), "--dry-run")
    assert r.exit_code == 0, r.output
    # pack: auto (the default): each seed's stream is one trial of its three runs
    assert "sweep s (dry run: nothing is run or written): 6 runs, 0 finished, 6 to run in 2 trials (pack auto)" in r.stdout
    lines = [ln.split() for ln in r.stdout.splitlines()]
    # each trial packs clip's and bca's runs of a seed: it counts under both rows, and the plan says so
    assert ["synthetic", "synthetic-label_shift", "clip", "2", "0", "2"] in lines
    assert ["synthetic", "synthetic-label_shift", "bca", "4", "0", "2"] in lines
    assert "a trial packs runs of several rows, so the column adds up to more than the 2 trials" in r.stdout
    assert "estimated cost: 360 online steps" in r.stdout  # 6 runs x 60 samples
    assert not (tmp_path / "results").exists()


def test_dry_run_of_a_real_dataset_names_the_cache_entries_to_encode(tmp_path):
    from orchestrator.clip.testing import TINY_VIT, build_dataset, write_model_config

    build_dataset("dtd", tmp_path / "data", num_classes=3, per_class=2)
    path = write_spec(tmp_path, data_root="data", cache_dir="cache", datasets=["dtd"], seeds=[1, 2],
                      backbones=[{"model": TINY_VIT, "pretrained": "random",
                                  "config": str(write_model_config(TINY_VIT, tmp_path / "models"))}])
    r = bca("sweep", str(path), "--dry-run")
    assert r.exit_code == 0, r.output
    assert "feature-cache entries the trials read (1)" in r.stdout  # a single view: one entry for both seeds
    assert f"{TINY_VIT} random weights dtd views=single: to encode" in r.stdout
    assert "estimated cost: 36 online steps (samples through a method, over the runs to run), 6 image views to " \
           "encode" in r.stdout
    assert not (tmp_path / "results").exists() and not (tmp_path / "cache").exists()


def test_a_large_sweep_needs_yes_and_writes_nothing_without_it(tmp_path):
    taus = [round(0.01 * i, 2) for i in range(101)]
    path = write_spec(tmp_path, methods=[{"method": "bca", "tau": taus, "n1": list(range(10, 35))}], seeds=[1, 2])
    r = bca("sweep", str(path))
    assert r.exit_code == 2
    assert "has 5,050 runs to run (more than 5,000); check the plan with" in r.stderr and "--yes" in r.stderr
    assert not (tmp_path / "results").exists()


def test_inert_settings_are_reported_once(tmp_path):
    path = write_spec(tmp_path, methods=[{"method": "bca", "update": ["count", "decay"], "decay": [0.9, 0.99]}])
    r = bca("sweep", str(path), "--dry-run")
    assert r.exit_code == 0, r.output
    assert r.stderr.count("warning: methods[0].decay: matters only with update: decay") == 1
    assert "3 runs" not in r.stdout and "6 runs, 0 finished" in r.stdout  # (1 count + 2 decay) x 2 seeds


def test_planning_stops_at_ctrl_c_and_writes_nothing(tmp_path, monkeypatch):
    import orchestrator.sweep.plan as plan

    def interrupted(spec):
        raise KeyboardInterrupt

    monkeypatch.setattr(plan, "expand", interrupted)
    r = bca("sweep", str(write_spec(tmp_path)))
    assert r.exit_code == 130 and "interrupted while planning: nothing was run or written" in r.stderr
    assert not (tmp_path / "results").exists()


def test_bca_cache_on_a_spec_with_a_missing_dataset_folder(tmp_path):
    (tmp_path / "data").mkdir()
    path = write_spec(tmp_path, data_root="data", cache_dir="cache", datasets=["dtd"],
                      backbones=[{"model": "RN50", "pretrained": "openai"}])
    r = bca("cache", str(path))
    assert r.exit_code == 2 and "datasets[0]: DTD: folder" in r.stderr and "does not exist" in r.stderr
    assert "Traceback" not in r.output and not (tmp_path / "cache").exists()


def test_a_cpu_request_no_node_can_hold_is_refused():
    nodes = [{"Alive": True, "Resources": {"CPU": 4.0}}, {"Alive": True, "Resources": {"CPU": 8.0}},
             {"Alive": False, "Resources": {"CPU": 64.0}}]
    assert cpus_issue(8, nodes) is None
    assert cpus_issue(16, nodes) == ("resources.cpus: each trial asks for 16 CPUs but the largest node of the Ray "
                                     "cluster has 8; expected resources.cpus <= 8")


def test_help_shows_no_bool_and_version_prints_it():
    for args in (["sweep", "--help"], ["cache", "--help"], ["query", "--help"], ["--help"]):
        r = bca(*args)
        assert r.exit_code == 0 and "<bool>" not in r.stdout and "--help" in r.stdout, args
    v = bca("--version")
    assert v.exit_code == 0 and v.stdout.startswith("bca ") and v.stdout.split()[1][0].isdigit()


def test_a_taken_dashboard_port_is_reported_before_anything_claims_it_started(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = bca("dashboard", "--results", str(tmp_path), "--port", str(port))
    assert r.exit_code == 2 and f"--port {port}: cannot listen on 127.0.0.1:{port}" in r.stderr
    assert "dashboard for" not in r.stdout


@pytest.mark.parametrize("flag", ["--dry-run", "--yes", "--rerun-changed"])
def test_sweep_flags_are_documented(flag):
    assert flag in bca("sweep", "--help").stdout


def test_ctrl_c_before_trials_start_counts_them_not_started(tmp_path, monkeypatch):
    import orchestrator.sweep.runner as runner

    monkeypatch.setattr(runner, "_tune", lambda *args, **kwargs: {})  # Tune returned at Ctrl-C before starting a trial
    r = bca("sweep", str(write_spec(tmp_path)))
    assert r.exit_code == 130
    assert "0/6 runs finished, 0 failed, 0 interrupted, 6 not started" in r.stdout
    assert "continue with: bca sweep" in r.stdout and "--resume" in r.stdout
