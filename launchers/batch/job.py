"""Inside a batch job: what the job script starts on every node, for every scheduler.

Every node reads the job's setup (:func:`read_job`: the cluster file's snapshot, plus what the
launcher added to ``program.env``) and builds the same plan from the scheduler's node list
(:meth:`JobNode.hosts`). The coordinating node (the scheduler's first: :attr:`JobNode.coordinates`)
listens on a TCP port, publishes the rendezvous record (:mod:`tflaunch.runtime.rendezvous`:
address, port, a one-run token; mode 0600) in the run directory on the shared file system, waits
for every other node's agent to connect and say hello (with its GPU ids), writes the final plan,
starts its own node's agent as a subprocess, sends ``start`` to the others and runs the
coordinator over all of them. The other nodes connect, wait for ``start``, and run their agent
with its JSON-lines stream on the TCP connection: same protocol, another transport. A lost
connection or a silent coordinator makes an agent tear its tasks down.

A scheduler's node module subclasses :class:`JobNode` (how it names its nodes, GPUs, job id) and
calls :func:`main` with its loader.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from tflaunch.cluster import hostlist
from tflaunch.cluster.config import ClusterConfig, parse_config
from tflaunch.cluster.placement import make_plan
from tflaunch.cluster.plan import Host, Plan
from tflaunch.errors import TflaunchError
from tflaunch.launchers.agent import serve
from tflaunch.launchers.base import Backend, LaunchOptions, spawn_agent
from tflaunch.launchers.batch.backend import SETUP_FILE, SNAPSHOT_FILE
from tflaunch.launchers.batch.state import BatchDetails
from tflaunch.runtime import protocol
from tflaunch.runtime.coordinator import Requeue
from tflaunch.runtime.link import MAX_LINE, SocketLink, socket_streams
from tflaunch.runtime.rendezvous import Listener, Rendezvous, connect, publish, wait_published
from tflaunch.runtime.run import Outcome, Run
from tflaunch.trace.request import TraceRequest


def read_job(run_dir: Path, setup_file: str = SETUP_FILE) -> tuple[ClusterConfig, Run]:
    """The cluster as submitted (with what the launcher added to ``program.env``: ``up
    --trace``'s variables) and the run, from the run directory the job script names."""
    setup = json.loads((run_dir / setup_file).read_text())
    config = parse_config(
        (run_dir / SNAPSHOT_FILE).read_text(),
        source=setup["cluster_file"],
        base_dir=setup["base_dir"],
    )
    if setup.get("program_env"):
        program_env = {**config.program.env, **setup["program_env"]}
        config = replace(config, program=replace(config.program, env=program_env))
    return config, Run(setup["run_id"], run_dir)


@dataclass(frozen=True)
class JobNode(ABC):
    """One node's view of the job. A scheduler subclasses it with what it reads from its
    environment, and says how the allocation becomes plan hosts (:meth:`hosts`)."""

    config: ClusterConfig
    run: Run
    name: str
    job_id: str
    gpu_ids: tuple[str, ...]  # what the scheduler gave this node (a PS node: none)

    backend: ClassVar[str] = ""  # the registered backend's name, for run.json
    scheduler: ClassVar[str] = ""  # "Slurm", in messages
    details: ClassVar[type[BatchDetails]] = BatchDetails

    @property
    @abstractmethod
    def coordinates(self) -> bool:
        """Whether this node coordinates (the scheduler's first task)."""

    @abstractmethod
    def hosts(self, known_gpus: Mapping[str, tuple[str, ...]]) -> list[Host]:
        """The allocation as plan hosts, in the scheduler's order; ``known_gpus`` are the GPU
        ids nodes reported (any other node: as requested)."""

    @property
    def attempt(self) -> str:
        """Which start of the run this is (a requeued job has a rendezvous of its own)."""
        return self.job_id

    @property
    def requeue(self) -> Requeue | None:
        """What the scheduler's warning signal leads to (Slurm's requeue); None: nothing."""
        return None

    @property
    def output_hint(self) -> str:
        """Where a person finds the nodes' errors."""
        return "the job's output file"

    def plan(self, known_gpus: Mapping[str, tuple[str, ...]] | None = None) -> Plan:
        """The whole plan (the coordinating node's view)."""
        gpus = {self.name: self.gpu_ids, **(known_gpus or {})}
        return make_plan(self.config, self.hosts(gpus), self.run.dir)

    def own_plan(self) -> Plan:
        """The shared cluster and this node's tasks only: all a joining node runs, in time and
        memory linear in the cluster however many nodes plan at once."""
        hosts = self.hosts({self.name: self.gpu_ids})
        return make_plan(self.config, hosts, self.run.dir, only_host=self.name)


class JobCoordinator(Backend):
    """The coordinating node's view: its own agent as a subprocess, the others over TCP."""

    def __init__(self, node: JobNode, remote: list[SocketLink]):
        self.node, self.remote = node, remote
        self.name = node.backend
        self.requeue = node.requeue

    def hosts(self, config: ClusterConfig) -> list[Host]:
        return self.node.hosts({})

    def start_agents(self, config: ClusterConfig, plan: Plan, run: Run) -> list:
        links: list = []
        if plan.tasks_on(self.node.name):
            links.append(spawn_agent(run, self.node.name, die_with_parent=True))
        for link in self.remote:
            link.send(protocol.Start().wire())
        return links + list(self.remote)


def coordinate(node: JobNode) -> Outcome:
    """Gather the other nodes' agents and coordinate the run from this node; its outcome."""
    first_plan = node.plan()
    expected = {h.name for h in first_plan.hosts_with_tasks()} - {node.name}
    timeout = first_plan.supervision.ready_timeout
    if expected:
        print(
            f"[tflaunch] waiting up to {timeout:g} s for the agents on "
            f"{hostlist.compress(sorted(expected))} to connect to {node.name}",
            flush=True,
        )
    started = time.monotonic()
    record = Rendezvous.ahead()
    listener = Listener(socket.gethostbyname(node.name), record.token, expected)
    publish(node.run.dir, record.listening(listener, host=node.name, attempt=node.attempt))
    joined = listener.accept(timeout)
    missing = sorted(expected - set(joined))
    if missing:
        for agent in joined.values():
            agent.link.close(timeout=1)
        outcome = node.run.finish(
            Outcome(
                1,
                (
                    f"the agents on {hostlist.compress(missing)} did not connect to the coordinator "
                    f"on {node.name} within {timeout:g} s (supervision.ready_timeout). Check "
                    f"{node.output_hint} for their errors, and that the run directory "
                    f"{node.run.dir} is on a file system every node shares."
                ),
            )
        )
        print(f"tflaunch: {outcome.message}", file=sys.stderr, flush=True)
        return outcome
    print(
        f"[tflaunch] agents on {len(joined) + 1} node(s) connected in "
        f"{time.monotonic() - started:.1f} s; coordinating from {node.name}",
        flush=True,
    )
    gpus = {h: tuple(str(g) for g in a.hello.get("gpu_ids", ())) for h, a in joined.items()}
    plan = node.plan(gpus)
    node.run.write_plan(plan)
    node.run.update_part(
        node.details,
        job_id=node.job_id,
        coordinator_host=node.name,
        nodes=[h.name for h in plan.hosts],
    )
    links = [a.link for a in joined.values()]
    # up --trace's request came with the job's setup (read_job), in the plan's environment
    traced = LaunchOptions(trace=TraceRequest.from_env(plan.program.env))
    return JobCoordinator(node, links).launch(node.config, plan, node.run, traced)


def join(node: JobNode) -> int:
    """Connect to the coordinator, wait for ``start``, and run this node's agent over that
    connection; its exit code."""
    plan = node.own_plan()
    if not plan.tasks_on(node.name):
        return 0  # a node the plan does not use has nothing to run or report
    timeout = plan.supervision.ready_timeout
    info = wait_published(node.run.dir, timeout, lambda r: r.attempt == node.attempt)
    sock = connect(
        info.address, int(info.port), info.token, node.name, timeout, gpu_ids=list(node.gpu_ids)
    )
    commands, events = socket_streams(sock)
    sock.settimeout(timeout + 30)  # the coordinator waits up to ready_timeout for the others
    try:
        command = protocol.command_of(json.loads(commands.readline(MAX_LINE) or "{}"))
    except (OSError, ValueError):
        command = None
    if not isinstance(command, protocol.Start):
        print(
            f"tflaunch: {node.name}: the coordinator on {info.host} did not start the run",
            file=sys.stderr,
            flush=True,
        )
        return 1
    sock.settimeout(None)
    try:
        return serve(plan, node.name, node.run.dir, commands, events)
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


def main(
    load: Callable[[Path, Mapping[str, str]], JobNode],
    argv: list[str] | None = None,
    prog: str = "",
    doc: str | None = None,
    coordinator: Callable[[JobNode], int] | None = None,
    node_name: Callable[[Mapping[str, str]], str] | None = None,
) -> int:
    """A scheduler's node entry point: ``--run-dir DIR``, then :func:`coordinate` on the
    coordinating node (or ``coordinator``, which may do more around it) and :func:`join`
    elsewhere. Errors are one line on stderr and the error's exit code, no traceback."""
    parser = argparse.ArgumentParser(prog=prog or None, description=doc)
    parser.add_argument("--run-dir", required=True, help="the run directory (shared file system)")
    args = parser.parse_args(argv)
    # A scheduler's warning (Slurm's --signal) goes to every process of the job; until the
    # coordinator or the agent handle it, it must not kill this process (its default action).
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    try:
        node = load(Path(args.run_dir), os.environ)
        if not node.coordinates:
            return join(node)
        return coordinator(node) if coordinator else coordinate(node).code
    except TflaunchError as err:
        name = node_name(os.environ) if node_name else socket.gethostname().split(".")[0]
        print(f"tflaunch: {name}: error: {err}", file=sys.stderr, flush=True)
        return err.exit_code
