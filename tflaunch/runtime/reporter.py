"""What the coordinator tells, and where: every event it keeps goes to ``events.jsonl``, resource
samples and progress to :class:`tflaunch.runtime.insight.Insight` (the leader's steps on to
``up --trace``'s window), task output (prefixed with the task) and the coordinator's own
lines (``[tflaunch] ...``) to its output stream, and the one failure report of a failed run —
task, host, exit, the restarts so far, why there was none this time, the task's last lines and its
log — to stderr at the end."""

from __future__ import annotations

import json
import sys
import time
from typing import IO, Any

from tflaunch.cluster.plan import Plan
from tflaunch.runtime import diagnose, procs, protocol
from tflaunch.runtime.insight import Insight
from tflaunch.runtime.run import Outcome, Run
from tflaunch.runtime.runfiles import open_run_file
from tflaunch.runtime.statusline import ClusterProgress, StatusLine
from tflaunch.runtime.tasks import TaskBoard, TaskState
from tflaunch.runtime.tracing import HeldTrace
from tflaunch.text import for_terminal


class Reporter:
    def __init__(
        self,
        plan: Plan,
        run: Run,
        board: TaskBoard,
        out: IO[str] | None = None,
        trace: HeldTrace | None = None,
    ):
        self.run, self.board = run, board
        self.out = out or sys.stdout
        self.width = max(len(s.name) for s in board) + 2
        self.plan = plan
        self.argv = plan.program.argv  # (placeholders unfilled: argv[0] and -m are enough)
        self._events_file = open_run_file(run.events_path, "a")
        # Resource samples (samples-<host>.jsonl, not events) and steps.
        self._samples = Insight(plan, run)
        self.trace = trace or HeldTrace(None, self.say)  # up --trace: fed steps, asked of crashes
        # On a terminal: the cluster's progress on one line under the output.
        self.progress = ClusterProgress(len(board.trainers))
        self.console = StatusLine(self.out, self.progress.render)

    def close(self) -> None:
        self.console.stop()
        self._events_file.close()
        self._samples.close()

    # ---- files -------------------------------------------------------------------------------

    def record(self, event: protocol.Event) -> None:
        """Keep one of the coordinator's own events."""
        self._write(event.wire())

    def record_from(self, host: str, data: dict[str, Any]) -> None:
        """Keep an agent's event as it came, with the host it came from."""
        self._write({"host": host, **data})

    def sample(self, host: str, data: dict[str, Any]) -> None:
        self._samples.write(host, data)

    def _write(self, data: dict[str, Any]) -> None:
        data.setdefault("time", round(time.time(), 3))
        self._events_file.write(json.dumps(data) + "\n")
        self._events_file.flush()

    # ---- the console -------------------------------------------------------------------------

    def output(self, task: str, line: str, at: float | None = None) -> None:
        """A line ``task`` printed (``at``: when its agent read it, unix time)."""
        at = time.time() if at is None else float(at)
        step = self._samples.output(task, line, at)
        if step is not None:
            self.trace.step(task, step, at)
        state = self.board.get(task)
        if state:
            state.tail.append(line)
        if self.console.active and task in self.board.trainers:
            self.progress.line(task, line)
            if step is not None:
                self.progress.step(task, step, at)
        prefix = f"{'[' + task + ']':<{self.width}} "
        self.console.write(line, prefix=prefix, redraw=step is not None)

    def say(self, message: str) -> None:
        self.console.write(f"[tflaunch] {message}")

    def end(self, outcome: Outcome) -> None:
        """The run's one verdict: succeeded, stopped (a signal: Ctrl-C, SIGTERM, ``down``) or
        failed, as ``status`` will say it."""
        if outcome.code == 0:
            self.say(f"run {self.run.id} {outcome.message}; run directory {self.run.dir}")
        else:
            message = for_terminal(outcome.message, sys.stderr)  # its tasks' last lines
            # one verdict, as status says the state: stopped (a signal) or failed
            sys.stderr.write(f"tflaunch: run {self.run.id} {outcome.state}: {message}\n")
            sys.stderr.flush()

    # ---- failure reports ---------------------------------------------------------------------

    def failed_by_task(
        self, state: TaskState, code: int, what: str, note: str, restarts: list[str]
    ) -> Outcome:
        """The report of a run failed by one task, its root cause first: a known cause
        (:func:`tflaunch.runtime.diagnose.notes`) with its fix, then which task ended how,
        then the lines around its error (else its last lines) and its log. (Whether the task
        is restarted instead is the restarter's decision: ``Restarter.task_failed``.)"""
        context = state.tail.context()
        task = self.plan.task(state.name)
        holder = None
        if task.port is not None and diagnose.port_taken_note(context, None, None):
            holder = procs.port_holder(task.port, task.cluster_address)
        found = diagnose.notes(
            state.name,
            context,
            self.argv,
            state.executable,
            state.host,
            code,
            env=self.plan.program.env,
            address=task.address,
            holder=holder,
        )
        lines = [*found, f"{state.name} on {state.host} {what}."]
        traced = self.trace.crash_note(state.name, code, time.monotonic())
        if traced:
            lines.append(traced)
        if note:
            lines.append(note)
        if restarts:
            lines.append("restarts: " + "; ".join(restarts))
        if found and diagnose.is_traceback(context):
            lines.append("its output ends in that error's traceback, kept in its log")
        elif state.tail.error_scrolled_out:
            last = list(state.tail)[-2:]
            lines.append("its output around its last error, and its last lines:")
            lines += [f"    {line}" for line in context]
            lines.append(f"    ... ({state.tail.hidden_after_window - len(last)} lines) ...")
            lines += [f"    {line}" for line in last]
        elif context:
            lines.append(f"last {len(context)} lines of its output:")
            lines += [f"    {line}" for line in context]
        lines.append(f"log: {state.log}")
        self.record(protocol.Failed(task=state.name, code=code))
        return Outcome(code, "\n".join(lines))

    def failed(self, message: str, code: int) -> Outcome:
        """The report of a run failed by no task of its own (an agent, a host, a timeout)."""
        self.record(protocol.Failed(code=code, message=message))
        return Outcome(code, message)
