"""Inside the Slurm allocation: the process the job's single ``srun`` step starts on every node.

Every node builds the same plan from ``SLURM_JOB_NODELIST`` (for a heterogeneous job, the worker
component's nodes then the PS component's) and from the GPUs Slurm gave it: when Slurm set
``CUDA_VISIBLE_DEVICES=2,3`` on a node, that node's worker 0 gets ``2`` and worker 1 gets ``3``;
PS always get the empty string. The node with ``SLURM_PROCID`` 0 coordinates: it listens on a
TCP port, publishes ``coordinator.json`` (address, port, a one-run token; mode 0600) in the run
directory on the shared file system, waits for every other node's agent to connect and say hello
(with its GPU ids), writes the final plan, starts its own node's agent as a subprocess, then runs
the coordinator over all of them. The other nodes connect, wait for ``start``, and run their agent
with its JSON-lines stream on the TCP connection instead of stdin/stdout: same protocol, another
transport. A lost connection or a silent coordinator makes an agent tear its tasks down.

Run as ``python -m tflaunch.launchers.slurm.node --run-dir DIR`` (from the generated job script only).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tflaunch.launchers.base import Backend, ProcessLink, StreamLink
from tflaunch.launchers.slurm.script import Layout, layout

from tflaunch import hostlist, procs
from tflaunch.agent import Agent, LineEmitter, listen
from tflaunch.config import ClusterConfig, parse_config
from tflaunch.errors import LaunchError, TflaunchError
from tflaunch.plan import Host, Plan, make_plan
from tflaunch.run import Run

RENDEZVOUS_FILE = "coordinator.json"
SETUP_FILE = "slurm.json"
SNAPSHOT_FILE = "cluster.yaml"
HELLO_TIMEOUT = 10.0


# --- the allocation as hosts (pure) --------------------------------------------------------------


def node_gpu_ids(env: Mapping[str, str], job: Layout, ps_node: bool) -> tuple[str, ...]:
    """The GPU ids Slurm gave this node: its CUDA_VISIBLE_DEVICES, else all requested ones."""
    if ps_node:
        return ()
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return tuple(g for g in visible.split(",") if g)
    return tuple(str(i) for i in range(job.gpus_per_node))


def allocation_nodes(env: Mapping[str, str], job: Layout) -> tuple[list[str], list[str]]:
    """Worker nodes and dedicated PS nodes of the allocation, in Slurm's order."""
    if job.heterogeneous:
        return (
            hostlist.expand(env.get("SLURM_JOB_NODELIST_HET_GROUP_0", "")),
            hostlist.expand(env.get("SLURM_JOB_NODELIST_HET_GROUP_1", "")),
        )
    return hostlist.expand(env.get("SLURM_JOB_NODELIST", "")), []


def allocation_hosts(
    env: Mapping[str, str], job: Layout, known_gpus: Mapping[str, tuple[str, ...]]
) -> list[Host]:
    """Plan hosts: worker nodes then PS nodes (the plan puts dedicated PS on the last hosts).

    ``known_gpus`` holds the GPU ids nodes reported; any other worker node is assumed to have the
    requested count, numbered from 0 — only its own agent starts its tasks, with its real ids.
    """
    workers, ps = allocation_nodes(env, job)
    default = tuple(str(i) for i in range(job.gpus_per_node))
    hosts = [Host(n, n, n, known_gpus.get(n, default)) for n in workers]
    hosts += [Host(n, n, n, ()) for n in ps]
    return hosts


# --- node context ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """This node's view of the job."""

    config: ClusterConfig
    job: Layout
    run: Run
    name: str
    procid: int
    job_id: str
    gpu_ids: tuple[str, ...]
    env: Mapping[str, str]

    def plan(self, known_gpus: Mapping[str, tuple[str, ...]] | None = None) -> Plan:
        gpus = {self.name: self.gpu_ids, **(known_gpus or {})}
        return make_plan(self.config, allocation_hosts(self.env, self.job, gpus))


def load_node(run_dir: Path, env: Mapping[str, str]) -> Node:
    setup = json.loads((run_dir / SETUP_FILE).read_text())
    config = parse_config(
        (run_dir / SNAPSHOT_FILE).read_text(),
        source=setup["cluster_file"],
        base_dir=setup["base_dir"],
    )
    job = layout(config)
    name = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    _, ps_nodes = allocation_nodes(env, job)
    return Node(
        config=config,
        job=job,
        run=Run(setup["run_id"], run_dir),
        name=name,
        procid=int(env.get("SLURM_PROCID", "0")),
        job_id=env.get("SLURM_JOB_ID", "?"),
        gpu_ids=node_gpu_ids(env, job, name in ps_nodes),
        env=env,
    )


# --- the coordinating node ---------------------------------------------------------------------


class SocketLink(StreamLink):
    """An agent on another node, reached over one TCP connection."""

    def __init__(self, host: str, sock: socket.socket):
        self.sock = sock
        super().__init__(
            host,
            sock.makefile("r", encoding="utf-8", newline="\n"),
            sock.makefile("w", encoding="utf-8", newline="\n"),
        )

    def close(self, timeout: float) -> None:
        super().close(timeout)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone
        self.sock.close()


class AllocationBackend(Backend):
    """The coordinating node's view: its own agent as a subprocess, the others over TCP."""

    name = "slurm"

    def __init__(self, node: Node, remote: list[SocketLink]):
        self.node, self.remote = node, remote

    def hosts(self, config: ClusterConfig) -> list[Host]:
        return allocation_hosts(self.node.env, self.node.job, {})

    def start_agents(self, config: ClusterConfig, plan: Plan, run: Run) -> list:
        links: list = []
        if plan.tasks_on(self.node.name):
            argv = [
                sys.executable,
                "-m",
                "tflaunch.agent",
                "--plan",
                str(run.plan_path),
                "--host",
                self.node.name,
                "--run-dir",
                str(run.dir),
            ]
            proc = procs.spawn(
                argv,
                os.environ,
                cwd=None,
                stdin=subprocess.PIPE,
                stderr=None,
                die_with_parent=True,
                text=True,
            )
            links.append(ProcessLink(self.node.name, proc))
        for link in self.remote:
            link.send({"cmd": "start"})
        return links + list(self.remote)


def coordinate(node: Node) -> int:
    """Run the coordinator on this node; returns the run's exit code."""
    first_plan = node.plan()
    expected = {h.name for h in first_plan.hosts_with_tasks()} - {node.name}
    timeout = first_plan.supervision.ready_timeout
    started = time.monotonic()
    if expected:
        print(
            f"[tflaunch] waiting up to {timeout:g} s for the agents on "
            f"{hostlist.compress(sorted(expected))} to connect to {node.name}",
            flush=True,
        )
    with socket.create_server(("", 0), backlog=max(16, len(expected))) as server:
        token = secrets.token_hex(16)
        _publish(node, server.getsockname()[1], token)
        links, gpus = _accept_agents(server, token, expected, timeout)
    missing = sorted(expected - {link.host for link in links})
    if missing:
        for link in links:
            link.close(timeout=1)
        message = (
            f"the agents on {hostlist.compress(missing)} did not connect to the coordinator "
            f"on {node.name} within {timeout:g} s (supervision.ready_timeout). Check "
            f"slurm-{node.job_id}.out for their errors, and that the run directory "
            f"{node.run.dir} is on a file system every node shares."
        )
        node.run.update_meta(state="failed", exit_code=1, ended=time.time(), message=message)
        print(f"tflaunch: {message}", file=sys.stderr, flush=True)
        return 1
    print(
        f"[tflaunch] agents on {len(links) + 1} node(s) connected in "
        f"{time.monotonic() - started:.1f} s; coordinating from {node.name}",
        flush=True,
    )
    plan = node.plan(gpus)
    node.run.write_plan(plan)
    node.run.update_meta(
        job_id=node.job_id, coordinator_host=node.name, nodes=[h.name for h in plan.hosts]
    )
    return AllocationBackend(node, links).launch(node.config, plan, node.run).code


def _publish(node: Node, port: int, token: str) -> None:
    path = node.run.dir / RENDEZVOUS_FILE
    tmp = path.with_name(f".{RENDEZVOUS_FILE}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(
            {
                "job_id": node.job_id,
                "restart": node.env.get("SLURM_RESTART_COUNT", "0"),
                "host": node.name,
                "port": port,
                "token": token,
            },
            f,
        )
    os.replace(tmp, path)


def _accept_agents(
    server: socket.socket, token: str, expected: set[str], timeout: float
) -> tuple[list[SocketLink], dict[str, tuple[str, ...]]]:
    links: dict[str, SocketLink] = {}
    gpus: dict[str, tuple[str, ...]] = {}
    deadline = time.monotonic() + timeout
    while set(links) != expected and time.monotonic() < deadline:
        server.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            sock, _ = server.accept()
        except TimeoutError:
            break
        hello = _read_hello(sock, token, expected - set(links))
        if hello is None:
            sock.close()
            continue
        sock.settimeout(None)
        links[hello["hello"]] = SocketLink(hello["hello"], sock)
        gpus[hello["hello"]] = tuple(str(g) for g in hello.get("gpu_ids", ()))
    return list(links.values()), gpus


def _read_hello(sock: socket.socket, token: str, waiting: set[str]) -> dict[str, Any] | None:
    """The first line of a new connection, if it is a hello from an agent we wait for."""
    sock.settimeout(HELLO_TIMEOUT)
    data = b""
    try:
        while not data.endswith(b"\n") and len(data) < 65536:
            chunk = sock.recv(1)  # byte by byte: what follows the line belongs to the link
            if not chunk:
                return None
            data += chunk
        hello = json.loads(data)
    except (OSError, ValueError):
        return None
    if not isinstance(hello, dict) or not secrets.compare_digest(str(hello.get("token")), token):
        return None
    return hello if hello.get("hello") in waiting else None


# --- the other nodes ---------------------------------------------------------------------------


def join(node: Node) -> int:
    """Connect to the coordinator and run this node's agent over that connection."""
    plan = node.plan()
    if not plan.tasks_on(node.name):
        return 0  # a node the plan does not use has nothing to run or report
    timeout = plan.supervision.ready_timeout
    info = _wait_for_rendezvous(node, timeout)
    sock = socket.create_connection((info["host"], int(info["port"])), timeout=timeout)
    reader = sock.makefile("r", encoding="utf-8", newline="\n")
    writer = sock.makefile("w", encoding="utf-8", newline="\n")
    writer.write(
        json.dumps({"hello": node.name, "token": info["token"], "gpu_ids": list(node.gpu_ids)})
        + "\n"
    )
    writer.flush()
    sock.settimeout(timeout + 30)  # the coordinator waits up to ready_timeout for the others
    try:
        command = json.loads(reader.readline() or "{}")
    except (OSError, ValueError):
        command = {}
    if command.get("cmd") != "start":
        print(
            f"tflaunch: {node.name}: the coordinator on {info['host']} did not start the run",
            file=sys.stderr,
            flush=True,
        )
        return 1
    sock.settimeout(None)
    emitter = LineEmitter(writer, node.name)
    agent = Agent(plan, node.name, node.run.dir, emitter)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: agent.stop(f"signal {signum}"))
    heartbeat = plan.supervision.heartbeat_timeout
    threading.Thread(target=listen, args=(agent, reader, heartbeat), daemon=True).start()
    try:
        return agent.run()
    finally:
        emitter.close()
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


def _wait_for_rendezvous(node: Node, timeout: float) -> dict[str, Any]:
    """The coordinator's address, once the first node has published it for this job."""
    path = node.run.dir / RENDEZVOUS_FILE
    restart = node.env.get("SLURM_RESTART_COUNT", "0")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = json.loads(path.read_text())
            if info.get("job_id") == node.job_id and info.get("restart") == restart:
                return info
        except (OSError, ValueError):
            pass  # not written yet
        time.sleep(0.1)
    raise LaunchError(
        f"{node.name}: the coordinator did not publish {path} within {timeout:g} s; "
        "is the run directory on a file system every node shares?"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tflaunch.launchers.slurm.node", description=__doc__
    )
    parser.add_argument("--run-dir", required=True, help="the run directory (shared file system)")
    args = parser.parse_args(argv)
    try:
        node = load_node(Path(args.run_dir), os.environ)
        return coordinate(node) if node.procid == 0 else join(node)
    except TflaunchError as err:
        print(
            f"tflaunch: {os.environ.get('SLURMD_NODENAME', '?')}: error: {err}",
            file=sys.stderr,
            flush=True,
        )
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
