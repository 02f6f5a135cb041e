"""The cluster file's ``supervision:``: how tasks are watched and stopped, and how a failed task
(or the whole cluster) is restarted, within which bounds."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from tflaunch.cluster.bounds import MAX_RESTARTS, seconds
from tflaunch.cluster.schema import field

JOBS = ("ps", "chief", "worker", "evaluator")


def restarts(default: int, doc: str) -> Any:
    """A restart limit: a count from 0 to :data:`MAX_RESTARTS`."""
    return field(default, minimum=0, maximum=MAX_RESTARTS, doc=doc)


def _role_restart_entry(raw: Any) -> Any:
    """A role's restart policy may be written as the policy alone: ``worker: on-failure``."""
    return {"policy": raw} if isinstance(raw, str) else raw


RestartPolicyName = Literal["never", "on-failure", "exit-code"]
CLUSTER_SCOPED_JOBS = ("ps", "chief")  # their loss takes the model's state (or its driver) away


@dataclasses.dataclass(frozen=True)
class RoleRestart:
    """How a failed task of one role is restarted. A task restarted alone keeps its host, port,
    GPUs and TF_CONFIG; a cluster restart stops every task and starts them all again, and the
    programs resume from their checkpoints."""

    policy: RestartPolicyName = field(
        "never",
        doc="never: a failure ends the run; on-failure: restart on any non-zero exit or stall; "
        "exit-code: restart only when killed by a signal or exiting 128+N (preemption, OOM "
        "kill, stall), not on an exit such as 1 (a bug)",
    )
    scope: Literal["task", "cluster"] | None = field(
        None,
        doc="task: restart the failed task alone; cluster: restart every task from the "
        "checkpoints (default: cluster for ps and chief, task for worker and evaluator)",
    )
    max_restarts: int = restarts(3, doc="restarts of one task of this role, at most")


@dataclasses.dataclass(frozen=True)
class Restart:
    """Restart policies per role, and the bounds over the whole run."""

    ps: RoleRestart = field(factory=RoleRestart, doc="PS", coerce=_role_restart_entry)
    chief: RoleRestart = field(factory=RoleRestart, doc="chief", coerce=_role_restart_entry)
    worker: RoleRestart = field(factory=RoleRestart, doc="workers", coerce=_role_restart_entry)
    evaluator: RoleRestart = field(factory=RoleRestart, doc="evaluator", coerce=_role_restart_entry)
    max_restarts: int = restarts(
        10, doc="restarts of single tasks in the run, all tasks together, at most"
    )
    max_cluster_restarts: int = restarts(2, doc="whole-cluster restarts in the run, at most")
    backoff: float = seconds(
        1.0,
        doc="seconds before a task's first restart; each further restart of it waits twice as long",
    )
    backoff_max: float = seconds(30.0, doc="the longest wait before a restart")

    def of(self, job: str) -> RoleRestart:
        return getattr(self, job)

    def scope_of(self, job: str) -> str:
        """What a restart of ``job`` restarts: its ``scope``, else the role's default."""
        scope = self.of(job).scope
        if scope is not None:
            return scope
        return "cluster" if job in CLUSTER_SCOPED_JOBS else "task"

    @property
    def enabled(self) -> bool:
        return any(self.of(job).policy != "never" for job in JOBS)


@dataclasses.dataclass(frozen=True)
class Supervision:
    """How tasks are watched and stopped."""

    ready_timeout: float = seconds(
        120.0, doc="seconds to wait for every PS port to accept connections"
    )
    grace_period: float = seconds(5.0, doc="seconds between SIGTERM and SIGKILL at teardown")
    finish_timeout: float = seconds(
        300.0, doc="seconds the other workers may run on after the chief finished successfully"
    )
    heartbeat: float = seconds(
        2.0, minimum=0.1, doc="seconds between launcher heartbeats to the agents"
    )
    heartbeat_timeout: float = seconds(
        20.0,
        minimum=1,
        doc="an agent that hears nothing from its launcher this long tears its tasks down "
        "(at least twice the heartbeat)",
    )
    sample_interval: float = seconds(1.0, doc="seconds between resource samples (0: off)")
    success: Literal["auto", "workers", "chief"] = field(
        "auto",
        doc="auto: with a chief, as Kubeflow's TFJob, the chief's exit 0 ends the run: workers "
        "still busy (printing, or using CPU) may finish first, and workers that serve, idle, "
        "until stopped (TF2 ParameterServerStrategy's join()) are stopped; without a chief, as "
        "workers. workers: the run succeeds when the chief (else worker 0) and every worker exit "
        "0. chief: when the chief exits 0, the other tasks stopped at once",
    )
    restart: Restart = field(factory=Restart, doc="restart policies (default: never restart)")
    stall_timeout: float = seconds(
        0.0,
        doc="a task that prints nothing this many seconds (or, once it has printed a step, "
        "whose step stops growing) fails as 'stalled' and is handled by its restart policy (0: off)",
    )
    step_pattern: str = field(
        r"\bstep[ :=]+(\d+)",
        doc="regular expression finding a step number (its first group that matched) in a task's "
        "output line; left at this default, progress samples also recognise global_step, Keras "
        "fit progress lines and images/sec lines",
    )
    rate_pattern: str = field(
        "",
        doc="regular expression finding a throughput (images/sec, examples/sec) in its first group "
        "that matched; empty: recognise 'images/sec: N', 'examples/sec: N', 'N img/s'",
    )
    max_runtime: float | None = seconds(
        None,
        minimum=1,
        doc="seconds a run may last; then it is stopped as on Ctrl-C (ssh backend; provisioned "
        "instances also power off and terminate by themselves at this age)",
    )
