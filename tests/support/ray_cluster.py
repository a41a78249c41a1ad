"""A local Ray cluster for tests: a head and worker nodes on loopback, each a `ray start --block`
process in its own session, stopped by process group (never `ray stop`, which would stop every
Ray process on the machine)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prebake.engine.bundled.cache_layout import temp_dir
from tests.support.ports import free_port, free_ports

RAY = Path(sys.executable).parent / "ray"
# Ray 2.60 rewrites 127.0.0.1 (and "localhost") into the machine's routable address before it
# binds; 127.0.0.2 is loopback too on Linux and Ray leaves it alone, so every node stays on lo.
LOOPBACK = "127.0.0.2"
_MiB = 1 << 20


@dataclass
class Node:
    proc: subprocess.Popen
    resources: dict[str, float]
    log: Path

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill the node's whole process group: ray start, its raylet and every worker."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


@dataclass
class Cluster:
    root: Path
    address: str
    env: dict[str, str]
    nodes: list[Node] = field(default_factory=list)

    def add_node(
        self, resources: Mapping[str, float], *, num_cpus: int = 1, env: Mapping[str, str] | None = None
    ) -> Node:
        args = [f"--address={self.address}", f"--num-cpus={num_cpus}", f"--resources={json.dumps(dict(resources))}"]
        node = _start(self.root, args, {**self.env, **(env or {})}, dict(resources), len(self.nodes))
        self.nodes.append(node)
        return self.wait_until_started(node)

    def wait_until_started(self, node: Node, timeout: float = 180) -> Node:
        """Until `ray start` says the node registered with the cluster (its raylet is up)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = node.log.read_text() if node.log.exists() else ""
            if "Ray runtime started" in text:
                return node
            if node.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise AssertionError(f"a Ray node did not start within {timeout} s: " + node.log.read_text()[-3000:])

    def logs(self) -> str:
        return "\n".join(n.log.read_text()[-1500:] for n in self.nodes if n.log.exists())

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.kill(signal.SIGTERM)
        for node in reversed(self.nodes):
            node.kill(signal.SIGKILL)


def _start(root: Path, args: list[str], env: dict[str, str], resources: dict[str, float], index: int) -> Node:
    # six distinct ports (Ray refuses a port given to two of its components)
    node_manager, object_manager, agent_listen, agent_grpc, runtime_env, metrics = free_ports(6)
    ports = [
        f"--node-manager-port={node_manager}",
        f"--object-manager-port={object_manager}",
        f"--dashboard-agent-listen-port={agent_listen}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--runtime-env-agent-port={runtime_env}",
        f"--metrics-export-port={metrics}",
        f"--min-worker-port={20000 + 200 * index}",
        f"--max-worker-port={20000 + 200 * index + 199}",
    ]
    log = root / f"node-{index}.log"
    argv = [str(RAY), "start", "--block", f"--node-ip-address={LOOPBACK}", "--disable-usage-stats"]
    argv += [f"--object-store-memory={80 * _MiB}", *ports, *args]
    with log.open("w") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return Node(proc, resources, log)


@contextlib.contextmanager
def ray_cluster(env: Mapping[str, str]) -> Iterator[Cluster]:
    """A head node (no CPUs: bakes run only on the worker nodes the test adds)."""
    root = Path(tempfile.mkdtemp(prefix="rf-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    port = free_port()
    # Token auth off: the cluster listens on loopback only and lives for one test module. Every node's
    # temporary folder is under root, removed with it: what a killed worker leaves (Ray's session
    # folders, a bake's scratch) does not stay in the host's /tmp; torch's machine folder is linked in.
    env = {**env, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "TMPDIR": str(temp_dir(root))}
    args = [
        "--head",
        f"--port={port}",
        "--num-cpus=0",
        "--include-dashboard=false",
        f"--dashboard-port={free_port()}",
        f"--temp-dir={root / 'ray'}",
    ]
    cluster = Cluster(root, f"{LOOPBACK}:{port}", dict(env))
    cluster.nodes.append(_start(root, args, cluster.env, {}, 0))
    try:
        cluster.wait_until_started(cluster.nodes[0])
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
