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

The coordinate/join mechanics are the batch base's (:mod:`tflaunch.launchers.batch.job`); this
module says how Slurm names the nodes, their GPUs and the job, and adds the requeue.

Run as ``python -m tflaunch.launchers.slurm.node --run-dir DIR`` (from the generated job script only).
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tflaunch.launchers.slurm.client import requeue as requeue_job
from tflaunch.launchers.slurm.script import SETUP_FILE, Layout, SlurmDetails, layout
from tflaunch.launchers.slurm.section import SlurmSection
from tflaunch.plugin import (
    ClusterConfig,
    Host,
    JobNode,
    Outcome,
    Requeue,
    TflaunchError,
    coordinate_job,
    expand_hostlist,
    job_main,
    read_job,
)

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
            expand_hostlist(env.get("SLURM_JOB_NODELIST_HET_GROUP_0", "")),
            expand_hostlist(env.get("SLURM_JOB_NODELIST_HET_GROUP_1", "")),
        )
    return expand_hostlist(env.get("SLURM_JOB_NODELIST", "")), []


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
    limit = config.section(SlurmSection).requeue
    if not limit or not config.section(SlurmSection).signal:
        return None
    if restarts >= limit:
        return Requeue(
            refused=f"the job is not requeued again: it was requeued {restarts} time(s), the "
            f"limit of slurm.requeue ({limit}), so it ends at its time limit"
        )
    return Requeue(
        config.section(SlurmSection).checkpoint_wait, f"requeue {restarts + 1} of at most {limit}"
    )


def too_many_requeues(config: ClusterConfig, restarts: int, job_id: str) -> str | None:
    """Why a job requeued ``restarts`` times must not start again (None: it may)."""
    limit = config.section(SlurmSection).requeue
    if restarts <= limit:
        return None
    return (
        f"Slurm job {job_id} was requeued {restarts} time(s) (SLURM_RESTART_COUNT), more than "
        f"slurm.requeue allows ({limit}); not starting the cluster again. Raise slurm.requeue "
        "to let a requeued job (preemption, node failure) resume, or resubmit the run."
    )


# --- node context ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node(JobNode):
    """This node's view of the job: the batch base's, with Slurm's layout and environment."""

    job: Layout
    procid: int
    env: Mapping[str, str]

    backend: ClassVar[str] = "slurm"
    scheduler: ClassVar[str] = "Slurm"
    details: ClassVar[type[SlurmDetails]] = SlurmDetails

    @property
    def coordinates(self) -> bool:
        return self.procid == 0

    def hosts(self, known_gpus: Mapping[str, tuple[str, ...]]) -> list[Host]:
        return allocation_hosts(self.env, self.job, known_gpus)

    @property
    def restart(self) -> str:
        """Slurm's requeue count: a requeued job meets a new coordinator."""
        return self.env.get("SLURM_RESTART_COUNT", "0")

    @property
    def attempt(self) -> str:
        """Which start of the run this is: the job id and its requeue count (each start of a
        requeued job has a rendezvous of its own)."""
        return f"{self.job_id}.{self.restart}"

    @property
    def requeue(self) -> Requeue | None:
        return requeue_rule(self.config, int(self.restart))

    @property
    def output_hint(self) -> str:
        return f"slurm-{self.job_id}.out"


def load_node(run_dir: Path, env: Mapping[str, str]) -> Node:
    config, run = read_job(run_dir, SETUP_FILE)
    job = layout(config)
    name = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    _, ps_nodes = allocation_nodes(env, job)
    return Node(
        config=config,
        job=job,
        run=run,
        name=name,
        procid=int(env.get("SLURM_PROCID", "0")),
        job_id=env.get("SLURM_JOB_ID", "?"),
        gpu_ids=node_gpu_ids(env, job, name in ps_nodes),
        env=env,
    )


# --- the coordinating node ---------------------------------------------------------------------


def coordinate(node: Node) -> int:
    """Run the coordinator on this node (refusing a job requeued too often, requeueing the job
    when the warning said so); returns the run's exit code."""
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
    outcome = coordinate_job(node)
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


def main(argv: list[str] | None = None) -> int:
    return job_main(
        load_node,
        argv,
        prog="python -m tflaunch.launchers.slurm.node",
        doc=__doc__,
        coordinator=coordinate,  # type: ignore[arg-type]
        node_name=lambda env: env.get("SLURMD_NODENAME", "?"),
    )


if __name__ == "__main__":
    sys.exit(main())
