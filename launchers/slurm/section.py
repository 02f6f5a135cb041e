"""The ``slurm:`` section of the cluster file, its checks, and the rules for files with
``backend: slurm``. Read by :mod:`tflaunch.cluster.config` through the backend registry."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tflaunch.plugin import MAX_GPUS, MAX_HOSTS, MAX_ITEMS, ClusterConfig, Fail, field

MAX_CPUS = 65_536  # slurm.cpus_per_task
SLURM_TIME = re.compile(r"(\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|(?i:infinite|unlimited))")


def _slurm_time_problem(value: str) -> str | None:
    if SLURM_TIME.fullmatch(value):
        return None
    return (
        f"{value!r} is not a Slurm time; write minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
        "D-HH:MM:SS (quoted, e.g. '01:00:00'), or UNLIMITED"
    )


@dataclass(frozen=True)
class SlurmSection:
    """Slurm settings (backend: slurm)."""

    nodes: int | None = field(
        None,
        minimum=1,
        maximum=MAX_HOSTS,
        doc="number of nodes (default: as many as the plan needs)",
    )
    time: str | None = field(
        None,
        doc="walltime as sbatch --time takes it, quoted: '00:30:00', '1-12:00:00', '90'",
        line=True,
        check=lambda v: _slurm_time_problem(v),
    )
    partition: str | None = field(None, doc="partition", line=True)
    account: str | None = field(None, doc="account", line=True)
    qos: str | None = field(None, doc="quality of service", line=True)
    constraint: str | None = field(None, doc="node constraint, e.g. gpu", line=True)
    ps_constraint: str | None = field(
        None,
        doc="node constraint of dedicated PS nodes (their own job component), e.g. mc",
        line=True,
    )
    gpus_per_node: int | None = field(
        None, minimum=0, maximum=MAX_GPUS, doc="GPUs per node (--gpus-per-node)"
    )
    gres: str | None = field(
        None, doc="generic resources (--gres), instead of gpus_per_node", line=True
    )
    cpus_per_task: int | None = field(
        None, minimum=1, maximum=MAX_CPUS, doc="CPUs per agent (one agent per node)"
    )
    mem: str | None = field(None, doc="memory per node, e.g. 32G", line=True)
    options: tuple[str, ...] = field(
        (), doc="extra sbatch options, e.g. ['--exclusive']", line=True, maximum=MAX_ITEMS
    )
    setup: tuple[str, ...] = field(
        (),
        doc="shell lines run before the step (module loads, activation), verbatim",
        maximum=MAX_ITEMS,
    )
    output: str | None = field(None, doc="sbatch --output path", line=True)
    error: str | None = field(None, doc="sbatch --error path", line=True)
    python: str = field("python3", doc="Python interpreter on the nodes", line=True)
    signal: str | None = field(
        None,
        doc="USR1@SECONDS or USR2@SECONDS: Slurm signals the agents that long before the time "
        "limit (sbatch --signal) and they pass it on to every task, so the chief can checkpoint",
    )
    requeue: int = field(
        0,
        minimum=0,
        doc="times the job may be requeued (sbatch --requeue): when the signal arrives, tflaunch "
        "waits checkpoint_wait seconds, stops the cluster and requeues the job with scontrol "
        "requeue; the requeued job resumes from the checkpoints. Needs signal (0: never)",
    )
    checkpoint_wait: float = field(
        30.0,
        minimum=0,
        doc="with requeue: seconds between the signal and stopping the cluster for the requeue, "
        "for the chief to write its checkpoint; less than the signal's SECONDS",
    )


def check(config: ClusterConfig, fail: Fail) -> None:
    """The section's own rules (every file), then those of files that choose Slurm."""
    slurm = config.section(SlurmSection)
    if slurm.signal and not re.fullmatch(r"USR[12]@\d+", slurm.signal):
        fail(
            ("slurm", "signal"),
            f"{slurm.signal!r} is not USR1@SECONDS or USR2@SECONDS (e.g. USR1@120); "
            "the agents pass only those on to the tasks",
        )
    _check_requeue(config, fail)
    if config.backend != "slurm" or not config.program.env_from:
        return
    for i, option in enumerate(slurm.options):
        if option.startswith("--export") and not option.startswith("--export=ALL"):
            fail(
                ("slurm", "options", i),
                f"'{option}' would stop sbatch from passing the launcher's environment "
                "to the job, which program.env_from relies on; drop it or list the "
                "variables in program.env",
            )


def _check_requeue(config: ClusterConfig, fail: Fail) -> None:
    """``slurm.requeue`` needs the warning signal, and time after the wait to stop the tasks."""
    slurm = config.section(SlurmSection)
    if not slurm.requeue:
        return
    if not slurm.signal:
        fail(
            ("slurm", "requeue"),
            "needs slurm.signal (e.g. USR1@120): the requeue happens when Slurm's warning "
            "arrives ahead of the time limit, after the chief had time to checkpoint",
        )
    lead = int(str(slurm.signal).partition("@")[2])
    stop = config.supervision.grace_period + 5
    if slurm.checkpoint_wait + stop >= lead:
        fail(
            ("slurm", "checkpoint_wait"),
            f"{slurm.checkpoint_wait:g} s, plus {stop:g} s to stop the tasks "
            f"(supervision.grace_period + 5), does not fit in the {lead} s between the signal "
            f"and the time limit (slurm.signal {slurm.signal}); lower checkpoint_wait or signal "
            "earlier",
        )
