"""cluster.yaml (AWS) and cluster-local.yaml (on-prem) pass Ray's own cluster-launcher validation, the way
`ray up` prepares and checks them, and keep the properties the sweep relies on."""

from __future__ import annotations

import copy
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
    assert "`ray get-auth-token --generate`" in guide and "authenticates nobody" not in guide


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
