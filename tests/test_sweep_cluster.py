"""cluster.yaml (AWS) and cluster-local.yaml (on-prem) pass Ray's own cluster-launcher validation, the way
`ray up` prepares and checks them, and keep the properties the sweep relies on."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

util = pytest.importorskip("ray.autoscaler._private.util")

REPO = Path(__file__).resolve().parents[1]


def prepared(name: str) -> dict:
    raw = yaml.safe_load((REPO / name).read_text())
    config = util.prepare_config(copy.deepcopy(raw))  # what `ray up` does before validating
    util.validate_config(config)
    return config


def test_aws_cluster_config_passes_ray_validation():
    config = prepared("cluster.yaml")
    assert config["provider"]["type"] == "aws"
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"] == {"CPU": 0}, "the head must not offer trial resources"
    workers = [t for name, t in config["available_node_types"].items() if name != config["head_node_type"]]
    assert workers and all(t["node_config"]["InstanceType"].startswith(("g", "p")) for t in workers)  # GPU types
    setup = "\n".join(config["setup_commands"])
    assert "pip install" in setup and "-e ~/bca" in setup  # installs this project
    assert "mount -t nfs4" in setup  # shared storage for cache and results
    assert all("~/bca/.venv/bin/ray start" in " ".join(c) for c in (config["head_start_ray_commands"],
                                                                     config["worker_start_ray_commands"]))


def test_local_cluster_config_passes_ray_validation():
    config = prepared("cluster-local.yaml")
    assert config["provider"]["type"] == "local"
    assert any("--num-cpus=0" in c for c in config["head_start_ray_commands"])
    assert any("mount -t nfs" in c for c in config["setup_commands"])


@pytest.mark.parametrize("name", ["cluster.yaml", "cluster-local.yaml"])
def test_cluster_files_run_ray_with_token_authentication(name):
    """Every node starts Ray with RAY_AUTH_MODE=token and gets the user's token file (docs/clusters.md)."""
    config = prepared(name)
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in config[key] if " ray start" in f" {c.split('/')[-1]}" or "bin/ray start" in c]
        assert starts and all("RAY_AUTH_MODE=token" in c for c in starts), (key, config[key])
    mounts = {Path(k).as_posix().replace("/home/ubuntu", "~"): v for k, v in config["file_mounts"].items()}
    assert mounts.get("~/.ray/auth_token") == "~/.ray/auth_token", config["file_mounts"]
    guide = (REPO / "docs" / "clusters.md").read_text()
    assert "`ray get-auth-token --generate && chmod 600 ~/.ray/auth_token`" in guide  # run by test_sweep_multinode
    assert "authenticates nobody" not in guide


def test_ray_validation_rejects_a_broken_config():
    raw = yaml.safe_load((REPO / "cluster.yaml").read_text())
    raw["available_node_types"]["head"]["resourcez"] = {}
    with pytest.raises(Exception, match="resourcez"):
        util.validate_config(util.prepare_config(raw))


@pytest.mark.parametrize("name", ["cluster.yaml", "cluster-local.yaml"])
def test_cluster_files_keep_the_dashboard_on_the_heads_loopback(name):
    """Whoever holds the token runs any code through the dashboard's Jobs API: it stays off the network."""
    config = prepared(name)
    text = (REPO / name).read_text()
    assert "0.0.0.0" not in text
    head_start = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start and "--head" in head_start


@pytest.mark.parametrize("name", ["cluster.yaml", "cluster-local.yaml"])
def test_cluster_files_install_what_the_readme_flow_needs(name):
    """`ray job submit` and `ray dashboard` need Ray's default extra on the head, in the project's venv."""
    setup = " ".join(prepared(name)["setup_commands"])
    assert "-e ~/bca 'ray[default,tune]'" in setup
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"ray[default,tune]' in pyproject


def test_joining_a_cluster_with_an_unwritable_results_dir_fails_at_start(tmp_path):
    """Exit 2 before Ray is contacted (a plain socket listens at the address, so it passes the reachability
    check), naming the path and what it needs. /proc takes no new directories, whoever runs the test (root
    ignores permission bits)."""
    import socket
    import subprocess
    import sys

    results = "/proc/bca-results-test"
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "results_dir": results, "seeds": [1],
                                    "datasets": [{"synthetic": "label_shift", "n": 50}],
                                    "methods": [{"method": "clip"}]}))
    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        head.listen()
        address = f"127.0.0.1:{head.getsockname()[1]}"
        done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "sweep", str(spec), "--address", address],
                              capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"error: results_dir: {results} cannot be written" in done.stderr
    assert "every node mounts at that same path" in done.stderr and address in done.stderr


def test_joining_a_cluster_with_a_relative_results_dir_is_refused(tmp_path):
    from orchestrator.sweep.runner import SharedStorageError, check_shared_storage
    from orchestrator.sweep.load import validate_spec

    spec = validate_spec({"name": "s", "results_dir": "results", "datasets": [{"synthetic": "label_shift"}],
                          "methods": [{"method": "clip"}], "seeds": [1]}, base_dir=tmp_path)
    check_shared_storage(spec, "10.0.0.10:6379")  # absolute once loaded, and writable: accepted
    with pytest.raises(SharedStorageError, match="results_dir: results is not absolute; joining the cluster at "
                                                 "10.0.0.10:6379 needs an absolute path"):
        check_shared_storage(spec.model_copy(update={"results_dir": "results"}), "10.0.0.10:6379")


@pytest.mark.slow
def test_a_sweep_without_address_runs_on_a_ray_of_its_own_beside_a_ray_start_cluster(tmp_path, monkeypatch):
    """A `ray start --head` cluster on the machine (in a clean HOME, its own temp dir and ports): a sweep
    without --address runs on a local Ray of its own and says how to use that cluster instead (a bare ray.init
    would join it and refuse the sweep's num_cpus); the cluster keeps running. Then, on that finished sweep,
    a malformed --address is refused before anything else."""
    import shutil
    import subprocess
    import tempfile

    from typer.testing import CliRunner

    from orchestrator.cli import app
    from ray_cluster import LocalCluster, cluster_env
    from tests.dashboard_results import bca_executable

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "results_dir": str(tmp_path / "results"), "seeds": [1],
                                    "datasets": [{"synthetic": "label_shift", "n": 50}],
                                    "methods": [{"method": "clip"}]}))
    root = Path(tempfile.mkdtemp(prefix="bca-head-", dir="/tmp"))  # short: Ray's socket paths live under it
    env = {**cluster_env(root / "home", REPO), "TMPDIR": str(root)}  # Ray's default temp dir: root/ray
    cluster = LocalCluster(root, env)
    try:
        cluster.start_head("ray")  # its address in root/ray/ray_current_cluster, where a bare ray.init looks
        done = subprocess.run([bca_executable(), "sweep", str(spec)], env=env, capture_output=True, text=True,
                              timeout=600)
        cluster.head.raylet()  # still running
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert re.search(rf"^note: a Ray cluster started with `ray start` runs on this machine at (\S+):{cluster.port}; "
                     rf"this sweep runs on a local Ray of its own, as every sweep without --address does \(to run it "
                     rf"on that cluster: --address \1:{cluster.port}\)$", done.stdout, re.M), done.stdout
    assert "1/1 runs finished" in done.stdout

    monkeypatch.setenv("RAY_ADDRESS", "not-a-host:xyz")  # --address sets it; restored after the test
    refused = CliRunner().invoke(app, ["sweep", str(spec), "--address", "not-a-host:xyz"])
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    assert "error: --address not-a-host:xyz: not a Ray address; expected the address `ray start --head` printed, " \
           "host:port (port 6379 by default)" in refused.stderr


@pytest.mark.parametrize("address, expected", [
    ("not-a-host:xyz", "not a Ray address"),
    ("10.0.0.10", "not a Ray address"),
    ("10.0.0.10:70000", "not a Ray address"),
    ("http://127.0.0.1:8265", "that is a dashboard's address (`ray job submit` takes it)"),
])
def test_an_address_of_another_form_is_named_with_the_form_expected(address, expected):
    from orchestrator.sweep.runner import ClusterUnreachable, check_address

    with pytest.raises(ClusterUnreachable) as raised:
        check_address(address)
    assert str(raised.value).startswith(f"--address {address}: {expected}")
    assert "expected the address `ray start --head` printed, host:port (port 6379 by default)" in str(raised.value)
    for good in ("10.0.0.10:6379", "head-node.example:6379", "ray://10.0.0.10:10001", "[::1]:6379", "auto"):
        check_address(good)


def test_a_head_ray_cannot_join_is_an_error_naming_the_address_not_a_disk_error(monkeypatch):
    """ray.init's ConnectionError is an OSError, which `bca sweep` reports as a results dir it cannot write
    (exit 1): joining turns it into ClusterUnreachable (exit 2)."""
    import ray

    from orchestrator.sweep import runner

    def refuse(**kwargs):
        raise ConnectionError("Could not find any running Ray instance")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(runner.ClusterUnreachable, match=r"^--address 10.0.0.10:6379: Ray could not join the cluster "
                                                        r"there \(Could not find any running Ray instance\); expected"):
        runner._init_ray("10.0.0.10:6379", 0, False, print)
