"""The run's verdict from its tasks: what a task's exit means, and what the clock decides.

- Success (``supervision.success``, :mod:`tflaunch.runtime.tasks`): the leader and the workers
  the policy waits for exited 0; with ``auto`` and a chief, workers that serve until stopped
  (idle since the chief's exit) are stopped and the run succeeds.
- Failure: a task exiting non-zero, a PS exiting at all, or a stalled task goes to its role's
  restart policy (:class:`~tflaunch.runtime.restarter.Restarter`); a task its agent stopped on its
  own fails the run, never restarted; one whose agent was signalled stops it (``interrupted``).
- Workers still running ``finish_timeout`` seconds after the leader finished fail the run.

The :class:`~tflaunch.runtime.coordinator.Coordinator` hands it every exit and every tick; it
answers with the run's :class:`~tflaunch.runtime.run.Outcome`, or None while the run goes on.
"""

from __future__ import annotations

import signal
import time

from tflaunch.cluster.plan import Plan
from tflaunch.runtime.restart import STALLED, Failure, describe_code
from tflaunch.runtime.restarter import Restarter
from tflaunch.runtime.run import INTERRUPT_CODES, Outcome
from tflaunch.runtime.tasks import IDLE_S, TaskBoard, TaskState


class Verdict:
    """Success and failure of the run from its tasks' exits and the finish window."""

    def __init__(self, plan: Plan, board: TaskBoard, restarter: Restarter) -> None:
        self.plan, self.board, self.restarter = plan, board, restarter
        self.finish_timeout = plan.supervision.finish_timeout
        self.started_at = time.monotonic()

    def task_exited(self, state: TaskState, code: int, stopped_by: str | None) -> Outcome | None:
        """What ``state``'s exit with ``code`` means for the run (``stopped_by``: its agent's
        reason, when the agent stopped it); None: the run goes on."""
        signalled = agent_signal(stopped_by)
        if signalled is not None:
            # Its agent was signalled (a scheduler's cancel or time limit reaches every process
            # of the job, 'kill'): the run is being stopped, not failing. A stop, never restarted.
            return Outcome(
                code if code in INTERRUPT_CODES else 128 + signalled,
                f"{state.name} on {state.host} was stopped by its agent, which got "
                f"{signal_name(signalled)}",
                interrupted=True,
            )
        if stopped_by and stopped_by != STALLED:
            # Its agent stopped it without being asked (scancel, lost its launcher): never a
            # reason to restart.
            return self.restarter.fail_task(
                state, code or 1, f"was stopped by its agent ({stopped_by})"
            )
        cause = STALLED if stopped_by == STALLED else "exited"
        if state.name.startswith("ps:"):
            what = (
                "stalled"
                if cause == STALLED
                else f"exited by itself (code {describe_code(code)}); a PS serves until the "
                "launcher stops it"
            )
            return self.restarter.task_failed(state, Failure(state.name, code, cause), what)
        if code != 0 or cause == STALLED:
            what = (
                f"stalled and was stopped (exit {describe_code(code)})"
                if cause == STALLED
                else f"exited with code {describe_code(code)}"
            )
            return self.restarter.task_failed(state, Failure(state.name, code, cause), what)
        if self.board.training_done():
            return self.succeeded()
        if state.name == self.board.leader:
            self.board.leader_done_at = time.monotonic()
        return None

    def by_clock(self, now: float) -> Outcome | None:
        """What the time since the leader finished decides: workers serving since then are
        stopped (success, ``auto``), workers still busy past ``finish_timeout`` fail the run."""
        # (idle half the finish window at most: a busy worker is given the rest to finish)
        serving = self.board.serving(now, min(IDLE_S, self.finish_timeout / 2))
        if serving is not None:
            return self.succeeded(
                f"{self.board.leader} finished and {', '.join(serving)}, idle since, "
                f"{'was' if len(serving) == 1 else 'were'} serving: stopped (supervision.success: "
                "auto)"
            )
        done_at = self.board.leader_done_at
        if done_at is not None and now - done_at > self.finish_timeout:
            return self.restarter.fail_task(
                self.board.late_trainers()[0],
                1,
                f"was still running {self.finish_timeout:g} s after {self.board.leader} "
                "finished (supervision.finish_timeout); a worker that starts after the chief "
                f"finished can wait forever{self._serving_hint()}",
            )
        return None

    def succeeded(self, how: str = "") -> Outcome:
        elapsed = time.monotonic() - self.started_at
        message = (
            f"succeeded: {len(self.board)} tasks on "
            f"{len(self.plan.hosts_with_tasks())} host(s) in {elapsed:.1f} s"
        )
        if how:
            message += f"; {how}"
        restarts = self.restarter.book.summary()
        if restarts:
            message += "; restarts: " + "; ".join(restarts)
        return Outcome(0, message)

    def _serving_hint(self) -> str:
        """Where workers that serve until stopped (ParameterServerStrategy's ``join()``) are
        the likely reason, how to let the chief's exit end the run."""
        if self.board.chief_decides:
            return ""  # idle ones are stopped already: these were busy
        if "chief:0" in self.board.tasks:
            return (
                "; if the workers serve until stopped (ParameterServerStrategy), leave "
                f"supervision.success at auto (it is {self.plan.supervision.success})"
            )
        return (
            "; if the workers serve until stopped (ParameterServerStrategy), give the cluster a "
            "chief (roles.chief: 1): its exit then ends the run"
        )


def agent_signal(stopped_by: str | None) -> int | None:
    """The signal an agent stopped its tasks on (its reason ``signal N``), or None."""
    number = (stopped_by or "").removeprefix("signal ")
    if stopped_by and stopped_by.startswith("signal ") and number.isdigit():
        return int(number)
    return None


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
