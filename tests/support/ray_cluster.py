"""A real multi-node Ray cluster on this machine, for the scale-out tests.

Each node is what `ray start` makes on a machine of a real cluster: its own raylet, object store,
agents and worker processes, its own `--temp-dir`, ports, CPUs, custom resources and labels; the
head also runs the GCS. Only the machine is shared. The cluster uses Ray's token authentication
(the documented setup, docs/scale-out.md) with a token file of its own.

A node is killed or frozen by signalling its Ray processes only (the raylet, agents and
`ray::` workers, found through their command lines and parentage), not the CLIs its runners
started: on a real machine those would die with it, here they stay behind, which is what lets
the tests see whether a runner's guard reaps them.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
OBJECT_STORE_BYTES = 100 * 1024 * 1024  # Ray's default is 30% of RAM per node
START_ATTEMPTS = 3


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class RayNode:
    name: str
    temp_dir: Path  # Ray's --temp-dir
    node_id: str = ""
    resources: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def tmp(self) -> Path:
        """The node's TMPDIR, where its runners keep their workspaces (its "/tmp"): beside
        the Ray temp dir, not in it, so that finding Ray's processes by their temp dir never
        finds a runner's guard or CLIs."""
        return self.temp_dir.with_name(f"{self.temp_dir.name}.tmp")


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, command line) of every live process (zombies left out)."""
    table: dict[int, tuple[int, str]] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if stat[0] != "Z":
            table[int(proc.name)] = (int(stat[1]), cmdline)
    return table


class LocalRayCluster:
    """`ray start --head` plus `ray start --address` nodes, all on this machine.

    `own_token=False` leaves auth to Ray's defaults (the token in ~/.ray, the one a local
    `ray.init()` uses): for a cluster that a pytest process connects to, since Ray reads its
    token once per process and the same process also starts local clusters."""

    def __init__(self, root: Path, *, own_token: bool = True) -> None:
        self.root = root
        self.env: dict[str, str] = {}
        if own_token:
            token_path = root / "auth_token"
            token_path.write_text(secrets.token_hex(32))
            token_path.chmod(0o600)
            # What every process of the cluster, nodes and drivers, needs (docs/scale-out.md).
            self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)}
        self.address = ""
        self.nodes: list[RayNode] = []

    def _start(self, node: RayNode, num_cpus: int, extra: list[str]) -> RayNode:
        agent_port, = free_ports(1)
        argv = [RAY, "start", f"--temp-dir={node.temp_dir}", f"--num-cpus={num_cpus}",
                f"--resources={json.dumps(node.resources)}",
                f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats",
                f"--dashboard-agent-listen-port={agent_port}", *extra]
        if node.labels:
            argv.append("--labels=" + ",".join(f"{k}={v}" for k, v in node.labels.items()))
        node.tmp.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env, "TMPDIR": str(node.tmp)}
        for attempt in range(START_ATTEMPTS):
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
            if done.returncode == 0:
                break
            # Ray gives a node 30 s (fixed) to register with the GCS; on a loaded machine a
            # node may miss that: remove what it started and start it again.
            self.signal(node, signal.SIGKILL)
            shutil.rmtree(node.temp_dir, ignore_errors=True)
            if "timed out during startup" not in done.stderr or attempt + 1 == START_ATTEMPTS:
                raise RuntimeError(
                    f"ray start failed for {node.name}:\n{done.stdout}\n{done.stderr}")
        node.node_id = self._node_id(node)
        self.nodes.append(node)
        return node

    def start_head(self, name: str = "head", *, num_cpus: int = 1,
                   resources: dict[str, float] | None = None,
                   labels: dict[str, str] | None = None) -> RayNode:
        port, dashboard = free_ports(2)
        node = RayNode(name, self.root / name, resources=resources or {}, labels=labels or {})
        self.address = f"127.0.0.1:{port}"
        return self._start(node, num_cpus, ["--head", f"--port={port}",
                                            "--include-dashboard=false",
                                            f"--dashboard-port={dashboard}"])

    def add_node(self, name: str, *, num_cpus: int = 1,
                 resources: dict[str, float] | None = None,
                 labels: dict[str, str] | None = None) -> RayNode:
        node = RayNode(name, self.root / name, resources=resources or {}, labels=labels or {})
        return self._start(node, num_cpus, [f"--address={self.address}",
                                            "--include-log-monitor=false"])

    def _node_id(self, node: RayNode) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for _, cmdline in _processes().values():
                if "raylet/raylet" in cmdline and f"--temp_dir={node.temp_dir} " in cmdline:
                    return cmdline.split("--node_id=", 1)[1].split()[0]
            time.sleep(0.2)
        raise RuntimeError(f"no raylet found for {node.name}")

    def ray_pids(self, node: RayNode) -> set[int]:
        """The node's Ray processes: those naming its temp dir, and the `ray::` workers and
        agents below them (a worker renames itself, so its command line no longer does)."""
        table = _processes()
        roots = {pid for pid, (_, cmd) in table.items() if f"{node.temp_dir}/" in cmd
                 or cmd.rstrip().endswith(str(node.temp_dir))}
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        found, todo = set(roots), list(roots)
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in found and table[child][1].startswith("ray::"):
                    found.add(child)
                    todo.append(child)
        return found

    def signal(self, node: RayNode, sig: int) -> set[int]:
        pids = self.ray_pids(node)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def kill(self, node: RayNode) -> set[int]:
        """The machine dies, as far as Ray can tell: SIGKILL to every Ray process of the node."""
        pids = self.signal(node, signal.SIGKILL)
        if node in self.nodes:
            self.nodes.remove(node)
        return pids

    def freeze(self, node: RayNode) -> set[int]:
        """The machine goes silent (SIGSTOP): connections stay open, nothing answers."""
        return self.signal(node, signal.SIGSTOP)

    def stop(self) -> None:
        for node in reversed(list(self.nodes)):
            self.signal(node, signal.SIGCONT)
            self.kill(node)


def kill_everything_under(root: Path) -> set[int]:
    """SIGKILL every process whose command line names `root` (a safety net after a test)."""
    pids = {pid for pid, (_, cmd) in _processes().items() if f"{root}/" in cmd}
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


@contextmanager
def one_node_cluster(**start) -> Iterator[LocalRayCluster]:
    """A running one-node cluster (`ray start --head`, Ray's default auth) for tests to connect
    to: connecting takes about a second, where starting and stopping a local cluster per test
    took ~8 s on a loaded machine."""
    # A short root: Ray's unix sockets live under the node's temp dir (a 107-byte path limit).
    root = Path(tempfile.mkdtemp(prefix="hg-ray-"))
    cluster = LocalRayCluster(root, own_token=False)
    try:
        cluster.start_head(**start)
        yield cluster
    finally:
        cluster.stop()
        kill_everything_under(root)
        shutil.rmtree(root, ignore_errors=True)
