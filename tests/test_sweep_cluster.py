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


def test_ray_validation_rejects_a_broken_config():
    raw = yaml.safe_load((REPO / "cluster.yaml").read_text())
    raw["available_node_types"]["head"]["resourcez"] = {}
    with pytest.raises(Exception, match="resourcez"):
        util.validate_config(util.prepare_config(raw))
