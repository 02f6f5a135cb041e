"""Inside the Slurm allocation: the process the job's single ``srun`` step starts on every node.

Every node builds the same plan from ``SLURM_JOB_NODELIST`` (for a heterogeneous job, the worker
component's nodes then the PS component's) and from the GPUs Slurm gave it: when Slurm set
``CUDA_VISIBLE_DEVICES=2,3`` on a node, that node's worker 0 gets ``2`` and worker 1 gets ``3``;
PS always get the empty string. The node with ``SLURM_PROCID`` 0 coordinates: it listens on a
TCP port, publishes the rendezvous record (:mod:`tflaunch.runtime.rendezvous`: address, port, a
one-run token; mode 0600) in the run directory on the shared file system, waits for every other node's agent to connect and say hello
(with its GPU ids), writes the final plan, starts its own node's agent as a subprocess, then runs
the coordinator over all of them. The other nodes connect, wait for ``start``, and run their agent
with its JSON-lines stream on the TCP connection instead of stdin/stdout: same protocol, another
transport. A lost connection or a silent coordinator makes an agent tear its tasks down.

Requeue (``slurm.requeue: N`` with ``slurm.signal``): when Slurm's warning signal arrives, the
coordinator passes it on (the chief checkpoints), waits ``slurm.checkpoint_wait`` seconds, stops
the cluster, and this node runs ``scontrol requeue $SLURM_JOB_ID``; run.json says ``requeued``.
The requeued job (same id, ``SLURM_RESTART_COUNT`` one higher, its own rendezvous) starts every
task again and the programs resume from their checkpoints. Past N requeues the warning is only
passed on, and a job requeued more than N times (by Slurm itself: node failure, preemption)
refuses to start. A job stopped by ``scancel`` or ``tflaunch down`` is never requeued.

Run as ``python -m tflaunch.launchers.slurm.node --run-dir DIR`` (from the generated job script only).
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
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from tflaunch.cluster import hostlist
from tflaunch.cluster.config import ClusterConfig, parse_config
from tflaunch.cluster.plan import Host, Plan, make_plan
from tflaunch.errors import TflaunchError
from tflaunch.launchers.base import Backend, spawn_agent
from tflaunch.launchers.slurm.client import requeue as requeue_job
from tflaunch.launchers.slurm.script import SETUP_FILE, SNAPSHOT_FILE, Layout, SlurmDetails, layout
from tflaunch.runtime import protocol
from tflaunch.runtime.agent import serve
from tflaunch.runtime.coordinator import Requeue
from tflaunch.runtime.link import MAX_LINE, SocketLink, socket_streams
from tflaunch.runtime.rendezvous import Listener, Rendezvous, connect, publish, wait_published
from tflaunch.runtime.run import Outcome, Run

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


def requeue_rule(config: ClusterConfig, restarts: int) -> Requeue | None:
    """What the warning signal leads to in a job Slurm has requeued ``restarts`` times."""
    limit = config.slurm.requeue
    if not limit or not config.slurm.signal:
        return None
    if restarts >= limit:
        return Requeue(
            refused=f"the job is not requeued again: it was requeued {restarts} time(s), the "
            f"limit of slurm.requeue ({limit}), so it ends at its time limit"
        )
    return Requeue(config.slurm.checkpoint_wait, f"requeue {restarts + 1} of at most {limit}")


def too_many_requeues(config: ClusterConfig, restarts: int, job_id: str) -> str | None:
    """Why a job requeued ``restarts`` times must not start again (None: it may)."""
    limit = config.slurm.requeue
    if restarts <= limit:
        return None
    return (
        f"Slurm job {job_id} was requeued {restarts} time(s) (SLURM_RESTART_COUNT), more than "
        f"slurm.requeue allows ({limit}); not starting the cluster again. Raise slurm.requeue "
        "to let a requeued job (preemption, node failure) resume, or resubmit the run."
    )


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

    @property
    def restart(self) -> str:
        """Slurm's requeue count: a requeued job meets a new coordinator."""
        return self.env.get("SLURM_RESTART_COUNT", "0")

    @property
    def attempt(self) -> str:
        """Which start of the run this is: the job id and its requeue count (each start of a
        requeued job has a rendezvous of its own)."""
        return f"{self.job_id}.{self.restart}"

    def plan(self, known_gpus: Mapping[str, tuple[str, ...]] | None = None) -> Plan:
        """The whole plan (the coordinating node's view)."""
        gpus = {self.name: self.gpu_ids, **(known_gpus or {})}
        return make_plan(self.config, allocation_hosts(self.env, self.job, gpus), self.run.dir)

    def own_plan(self) -> Plan:
        """The shared cluster and this node's tasks only: all a joining node runs, in time and
        memory linear in the cluster however many nodes plan at once."""
        hosts = allocation_hosts(self.env, self.job, {self.name: self.gpu_ids})
        return make_plan(self.config, hosts, self.run.dir, only_host=self.name)


def load_node(run_dir: Path, env: Mapping[str, str]) -> Node:
    setup = json.loads((run_dir / SETUP_FILE).read_text())
    config = parse_config(
        (run_dir / SNAPSHOT_FILE).read_text(),
        source=setup["cluster_file"],
        base_dir=setup["base_dir"],
    )
    if setup.get("program_env"):  # what the launcher added to the file (up --trace)
        program_env = {**config.program.env, **setup["program_env"]}
        config = replace(config, program=replace(config.program, env=program_env))
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


class AllocationBackend(Backend):
    """The coordinating node's view: its own agent as a subprocess, the others over TCP."""

    name = "slurm"

    def __init__(self, node: Node, remote: list[SocketLink]):
        self.node, self.remote = node, remote
        self.requeue = requeue_rule(node.config, int(node.restart))

    def hosts(self, config: ClusterConfig) -> list[Host]:
        return allocation_hosts(self.node.env, self.node.job, {})

    def start_agents(self, config: ClusterConfig, plan: Plan, run: Run) -> list:
        links: list = []
        if plan.tasks_on(self.node.name):
            links.append(spawn_agent(run, self.node.name, die_with_parent=True))
        for link in self.remote:
            link.send(protocol.Start().wire())
        return links + list(self.remote)


def coordinate(node: Node) -> int:
    """Run the coordinator on this node; returns the run's exit code."""
    refused = too_many_requeues(node.config, int(node.restart), node.job_id)
    if refused:
        node.run.finish(Outcome(1, refused))
        print(f"tflaunch: {refused}", file=sys.stderr, flush=True)
        return 1
    if node.restart != "0":
        print(
            f"[tflaunch] Slurm job {node.job_id} requeued {node.restart} time(s): starting the "
            "cluster again; the programs resume from their checkpoints",
            flush=True,
        )
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
                    f"slurm-{node.job_id}.out for their errors, and that the run directory "
                    f"{node.run.dir} is on a file system every node shares."
                ),
            )
        )
        print(f"tflaunch: {outcome.message}", file=sys.stderr, flush=True)
        return outcome.code
    print(
        f"[tflaunch] agents on {len(joined) + 1} node(s) connected in "
        f"{time.monotonic() - started:.1f} s; coordinating from {node.name}",
        flush=True,
    )
    gpus = {h: tuple(str(g) for g in a.hello.get("gpu_ids", ())) for h, a in joined.items()}
    plan = node.plan(gpus)
    node.run.write_plan(plan)
    node.run.update_part(
        SlurmDetails,
        job_id=node.job_id,
        coordinator_host=node.name,
        nodes=[h.name for h in plan.hosts],
    )
    links = [a.link for a in joined.values()]
    outcome = AllocationBackend(node, links).launch(node.config, plan, node.run)
    if not outcome.requeued:
        return outcome.code
    try:
        requeue_job(node.job_id)
    except TflaunchError as err:
        failed = node.run.finish(Outcome(1, f"the job could not be requeued: {err}"))
        print(f"tflaunch: {failed.message}", file=sys.stderr, flush=True)
        return 1
    print(f"[tflaunch] requeued Slurm job {node.job_id}", flush=True)
    return 0


# --- the other nodes ---------------------------------------------------------------------------


def join(node: Node) -> int:
    """Connect to the coordinator and run this node's agent over that connection."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tflaunch.launchers.slurm.node", description=__doc__
    )
    parser.add_argument("--run-dir", required=True, help="the run directory (shared file system)")
    args = parser.parse_args(argv)
    # Slurm's warning (--signal) goes to every process of the step; until the coordinator or the
    # agent handle it, it must not kill this process (its default action).
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    try:
        node = load_node(Path(args.run_dir), os.environ)
        return coordinate(node) if node.procid == 0 else join(node)
    except TflaunchError as err:
        name = os.environ.get("SLURMD_NODENAME", "?")
        print(f"tflaunch: {name}: error: {err}", file=sys.stderr, flush=True)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
