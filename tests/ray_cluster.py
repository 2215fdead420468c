"""Ray for the tests: the local Ray that tests running sweeps in this process share (`shared_local_ray`, the
`local_ray` fixture), one of a test's own (`own_ray`), and a multi-node Ray cluster on this machine, started and
stopped with Ray's own commands, for the cluster tests.

`ray start --head` (no CPUs, no GPUs: like cluster.yaml's head, it never runs a trial) and `ray start --address`
per worker node, each its own raylet with fake GPUs and a custom resource, all given 127.0.0.1 (on Linux Ray
resolves a loopback address to this machine's own, so that is the nodes' IP; the dashboard stays on loopback)
and ports chosen free here, so that several such clusters (other test sessions) can run side by side. Every
process a node starts is found by its temp dir (each node has its own) and stopped by pid: `ray stop` would
end every Ray process on the machine, other people's included.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).with_name("ray"))
# Fast detection of a killed node (Ray's defaults take about half a minute), so a fault test stays short.
SYSTEM_CONFIG = {"health_check_initial_delay_ms": 1000, "health_check_period_ms": 1000,
                 "health_check_failure_threshold": 3}
WORKER_PORTS = 12  # worker processes a node may run at once (Tune actors, the job supervisor, tasks)


LOCAL_RAY = {"num_cpus": 2, "num_gpus": 1}  # one GPU in name only: trials that ask for a share of one get placed


def _init_local(**kwargs) -> str:
    import ray

    # "local": a Ray of the test's own even where a `ray start` cluster runs on the machine (a bare ray.init
    # would join that one)
    ray.init(address="local", include_dashboard=False, logging_level="WARNING", **kwargs)
    return ray.get_runtime_context().gcs_address


def shared_local_ray() -> str:
    """The local Ray (LOCAL_RAY) that the tests running sweeps in this process share, started at first use and
    kept (each start costs seconds); its GCS address. A Ray started since by a sweep without it (with this
    machine's resources) is replaced, and one stopped by `own_ray` started again."""
    import ray

    if ray.is_initialized() and ray.cluster_resources().get("GPU", 0) < LOCAL_RAY["num_gpus"]:
        ray.shutdown()
    if not ray.is_initialized():
        return _init_local(**LOCAL_RAY)
    return ray.get_runtime_context().gcs_address


@contextlib.contextmanager
def own_ray(**kwargs):
    """`with own_ray(num_cpus=2) as address:` a local Ray of the test's own, whose workers get the environment
    as it is then (fault hooks on their path), shut down after the block."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    try:
        yield _init_local(**kwargs)
    finally:
        ray.shutdown()


def free_ports(n: int) -> list[int]:
    """n ports free on loopback now (held together while chosen, so they are distinct)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


@dataclass
class Node:
    name: str
    temp_dir: Path
    node_id: str = ""
    pids: set[int] = field(default_factory=set)

    def processes(self) -> list[psutil.Process]:
        """The node's Ray processes (those naming its temp dir) and their children (workers rename themselves
        'ray::...', so they are found as children of the raylet)."""
        found: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if any(str(self.temp_dir) in arg for arg in proc.info["cmdline"] or ()):
                    found[proc.pid] = proc
                    found.update({c.pid: c for c in proc.children(recursive=True)})
        for pid in self.pids - set(found):
            with contextlib.suppress(psutil.Error):
                found[pid] = psutil.Process(pid)
        self.pids |= set(found)
        return list(found.values())

    def raylet(self) -> psutil.Process:
        for proc in self.processes():
            with contextlib.suppress(psutil.Error):
                if proc.name() == "raylet":
                    return proc
        raise RuntimeError(f"node {self.name}: no raylet running")

    def kill(self) -> None:
        """SIGKILL every process of the node, by pid."""
        procs = self.processes()
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        psutil.wait_procs(procs, timeout=10)


class LocalCluster:
    """A head and worker nodes on 127.0.0.1; `address` is the GCS address, `dashboard` the Jobs/dashboard URL."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = env
        self.port, self.dashboard_port, self.client_port = free_ports(3)
        self.address = f"127.0.0.1:{self.port}"
        self.dashboard = f"http://127.0.0.1:{self.dashboard_port}"
        self.head: Node | None = None
        self.workers: list[Node] = []

    def _start(self, name: str, args: list[str]) -> Node:
        temp_dir = self.root / name
        temp_dir.mkdir(parents=True, exist_ok=True)
        nm, om, agent, agent_grpc, env_agent, metrics, *workers = free_ports(6 + WORKER_PORTS)
        node = Node(name, temp_dir)
        cmd = [RAY, "start", "--node-name", name, "--temp-dir", str(temp_dir),
               "--node-manager-port", str(nm), "--object-manager-port", str(om),
               "--dashboard-agent-listen-port", str(agent), "--dashboard-agent-grpc-port", str(agent_grpc),
               "--runtime-env-agent-port", str(env_agent), "--metrics-export-port", str(metrics),
               "--worker-port-list", ",".join(map(str, workers)), "--disable-usage-stats", *args]
        try:
            done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=180)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
            node.node_id = self._node_id(node)
        except BaseException:
            node.kill()
            raise
        return node

    def _node_id(self, node: Node) -> str:
        """The node id Ray gave the node (read from `ray list nodes`, matched by its name)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            listed = self.ray("list", "nodes", "--address", self.address, "--format", "json", timeout=60)
            if listed.returncode == 0:
                for info in json.loads(listed.stdout):
                    if info.get("state") == "ALIVE" and info.get("node_name") == node.name:
                        return info["node_id"]
            time.sleep(0.5)
        raise RuntimeError(f"node {node.name} never showed up in `ray list nodes`")

    def start_head(self, name: str = "head") -> Node:
        """`name` names the node and its temp dir under root (`ray start` writes the address a bare ray.init
        joins into that dir: "ray" makes it root/ray, where a process with TMPDIR=root looks)."""
        self.head = self._start(name, [
            "--head", "--node-ip-address", "127.0.0.1", "--port", str(self.port), "--num-cpus", "0", "--num-gpus", "0",
            "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
            "--dashboard-port", str(self.dashboard_port), "--ray-client-server-port", str(self.client_port),
            "--system-config", json.dumps(SYSTEM_CONFIG)])
        return self.head

    def add_worker(self, cpus: int = 1, gpus: int = 1) -> Node:
        name = f"worker{len(self.workers) + 1}"
        node = self._start(name, ["--address", self.address, "--num-cpus", str(cpus), "--num-gpus", str(gpus),
                                  "--resources", json.dumps({"bca_worker": 1})])
        self.workers.append(node)
        return node

    def node_of(self, pid: int) -> Node:
        """The worker node whose raylet is an ancestor of process `pid`."""
        parents = {p.pid for p in psutil.Process(pid).parents()}
        for node in self.workers:
            if node.raylet().pid in parents:
                return node
        raise RuntimeError(f"process {pid} belongs to no worker node")

    def stop(self) -> None:
        """Kill every node's processes by pid (workers first)."""
        for node in [*self.workers, *([self.head] if self.head else [])]:
            node.kill()
        self.workers, self.head = [], None

    def restart(self, workers: int) -> None:
        """The whole cluster stopped and started again on the same address (a head restart: without GCS fault
        tolerance the worker raylets exit with their head, and the launcher restarts them)."""
        self.stop()
        self.start_head()
        for _ in range(workers):
            self.add_worker()

    def ray(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """A `ray ...` CLI command (job submit, logs, stop) as a user runs it, against this cluster."""
        return subprocess.run([RAY, *args], env=self.env, capture_output=True, text=True, timeout=timeout)


def cluster_env(home: Path, repo: Path) -> dict[str, str]:
    """The environment of the cluster's processes and of the `ray` CLI: HOME is the test's (so the cluster steps' ~/bca
    is its checkout), this environment's `ray` first on PATH, this checkout importable, nothing inherited that
    would point Ray at another cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0",
               PATH=os.pathsep.join([str(Path(RAY).parent), os.environ.get("PATH", "")]),
               PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])))
    return env
