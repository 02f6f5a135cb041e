"""Restart decisions: given a task's failure and the restart policies, restart the task, restart
the whole cluster, or fail the run. Pure bookkeeping (no processes, no clocks): the coordinator
feeds it failures and acts on its decisions.

- ``never`` fails the run; ``on-failure`` restarts on any failure; ``exit-code`` restarts only a
  task killed by a signal or exiting 128+N (preemption's SIGTERM, the OOM killer's SIGKILL), or
  one tflaunch stopped because it stalled — never a task that exits 1 (a bug does it again).
- A restart restarts the task alone (``scope: task``, the default for workers and the evaluator)
  or the whole cluster (``scope: cluster``, the default for PS and chief, whose loss takes the
  model's variables or its driver with it).
- Bounds: ``max_restarts`` per task of the role, ``restart.max_restarts`` single-task restarts per
  run, ``restart.max_cluster_restarts`` cluster restarts per run. Past a bound the run fails and
  the report names the task, its exits and the bound.
- A host that is lost (it stops answering, or its instance ended) restarts its tasks alone on
  the host once it is back (or replaced) when every one of them may restart alone: its role's
  scope is ``task`` and its policy is not ``never`` (a lost host counts as a preemption, which
  ``exit-code`` restarts). Each counts against its role's ``max_restarts`` and the run's
  ``restart.max_restarts``. Otherwise it costs a cluster restart, within
  ``restart.max_cluster_restarts``, whatever the roles' policies.
- Backoff: ``backoff`` seconds before a task's first restart, doubling with each further one of
  the same task (of the cluster, for cluster restarts), at most ``backoff_max``.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from tflaunch.cluster.supervision import Restart

STALLED = "stalled"
LOST = "lost"  # the task's host was lost: it stopped answering, or its instance ended


@dataclass(frozen=True)
class Failure:
    """One task failing: which, how (its exit code; ``stalled`` when tflaunch stopped it)."""

    task: str
    code: int
    cause: str = "exited"  # "exited", STALLED or LOST

    @property
    def job(self) -> str:
        return self.task.partition(":")[0]

    def describe(self) -> str:
        if self.cause == STALLED:
            return f"stalled (stopped by tflaunch, exit {describe_code(self.code)})"
        if self.cause == LOST:
            return "lost with its host"
        return f"exited with code {describe_code(self.code)}"


# What a failure leads to: its task restarted alone, the whole cluster restarted, or the run failed
Action = Literal["restart_task", "restart_cluster", "fail"]


@dataclass(frozen=True)
class Decision:
    action: Action
    delay: float = 0.0  # seconds to wait before the restart
    count: int = 0  # this task's restarts, this one included
    reason: str = ""  # for "fail": why it is not restarted


@dataclass
class RestartBook:
    """Counts restarts, keeps each task's failures, and decides what a new failure leads to."""

    policy: Restart
    failures: dict[str, list[Failure]] = field(default_factory=dict)
    task_restarts: dict[str, int] = field(default_factory=dict)
    run_task_restarts: int = 0
    cluster_restarts: int = 0
    hosts_lost: dict[str, int] = field(default_factory=dict)

    def decide(self, failure: Failure) -> Decision:
        """Record ``failure`` and say what to do about it."""
        self.failures.setdefault(failure.task, []).append(failure)
        role = self.policy.of(failure.job)
        if not restartable(role.policy, failure):
            why = (
                f"its restart policy is '{role.policy}'"
                if role.policy != "exit-code"
                else "its restart policy 'exit-code' restarts only on a signal or a 128+N exit"
            )
            return Decision("fail", reason=why)
        done = self.task_restarts.get(failure.task, 0)
        if done >= role.max_restarts:
            return Decision(
                "fail",
                reason=f"it was restarted {done} time(s), the limit of "
                f"supervision.restart.{failure.job}.max_restarts ({role.max_restarts})",
            )
        scope = self.policy.scope_of(failure.job)
        if scope == "cluster":
            if self.cluster_restarts >= self.policy.max_cluster_restarts:
                return self._cluster_limit_reached()
            self.cluster_restarts += 1
            self.task_restarts[failure.task] = done + 1
            return Decision("restart_cluster", self._backoff(self.cluster_restarts), done + 1)
        if self.run_task_restarts >= self.policy.max_restarts:
            return Decision(
                "fail",
                reason=f"the run restarted tasks {self.run_task_restarts} time(s), the limit of "
                f"supervision.restart.max_restarts ({self.policy.max_restarts})",
            )
        self.run_task_restarts += 1
        self.task_restarts[failure.task] = done + 1
        return Decision("restart_task", self._backoff(done + 1), done + 1)

    def decide_host_lost(self, host: str, tasks: Sequence[str] = ()) -> Decision:
        """A host with ``tasks`` was lost: restart those tasks alone once it is back, when
        every one of them may (``restart_task``, each counted as its own restart; the count
        is the highest), else the cluster; within the bounds."""
        self.hosts_lost[host] = self.hosts_lost.get(host, 0) + 1
        if tasks and all(self._alone_after_loss(task) for task in tasks):
            decisions = [self.decide(Failure(task, 0, LOST)) for task in tasks]
            for task, decision in zip(tasks, decisions, strict=True):
                if decision.action == "fail":
                    return replace(decision, reason=f"{task}: {decision.reason}")
            return Decision("restart_task", 0.0, max(d.count for d in decisions))
        if self.cluster_restarts >= self.policy.max_cluster_restarts:
            return self._cluster_limit_reached()
        self.cluster_restarts += 1
        return Decision("restart_cluster", self._backoff(self.cluster_restarts))

    def _alone_after_loss(self, task: str) -> bool:
        job = task.partition(":")[0]
        return self.policy.scope_of(job) == "task" and self.policy.of(job).policy != "never"

    def _cluster_limit_reached(self) -> Decision:
        return Decision(
            "fail",
            reason=f"the cluster was restarted {self.cluster_restarts} time(s), the limit "
            f"of supervision.restart.max_cluster_restarts ({self.policy.max_cluster_restarts})",
        )

    def _backoff(self, nth: int) -> float:
        return min(self.policy.backoff * 2 ** (nth - 1), self.policy.backoff_max)

    def history(self, task: str) -> str:
        """``137 (SIGKILL), stalled`` — the task's failures in order."""
        return ", ".join(
            f.cause if f.cause in (STALLED, LOST) else describe_code(f.code)
            for f in self.failures.get(task, [])
        )

    def summary(self) -> list[str]:
        """One line per restarted task and one for cluster restarts, for the final report."""
        lines = [
            f"{task} restarted {n} time(s) (failures: {self.history(task)})"
            for task, n in sorted(self.task_restarts.items())
        ]
        lines += [f"{host} was lost {n} time(s)" for host, n in sorted(self.hosts_lost.items())]
        if self.cluster_restarts:
            lines.append(f"the cluster restarted {self.cluster_restarts} time(s)")
        return lines


def restartable(policy: str, failure: Failure) -> bool:
    if policy == "on-failure":
        return True
    if policy == "exit-code":
        return failure.cause in (STALLED, LOST) or failure.code > 128
    return False


def describe_code(code: int) -> str:
    """``137 (SIGKILL)`` for a 128+N exit, else the number."""
    if code > 128:
        try:
            return f"{code} ({signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return str(code)
