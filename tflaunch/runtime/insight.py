"""What the coordinator records from its agents besides events: resource samples
(:class:`tflaunch.runtime.monitor.SampleLog`), progress samples from the tasks' output
(:mod:`tflaunch.runtime.progress`) and, for ``up --trace``, the capture window
(:mod:`tflaunch.trace.window`, opened from the leader's step lines or, from a timer thread
of its own, by the clock; where the backend says, :class:`~tflaunch.trace.site.TraceSite`).
The coordinator hands it samples and output lines, and closes it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tflaunch.cluster.plan import Plan
from tflaunch.runtime import protocol
from tflaunch.runtime.monitor import SampleLog
from tflaunch.runtime.progress import ProgressLog, StepParser
from tflaunch.runtime.run import Run
from tflaunch.trace.request import TraceRequest
from tflaunch.trace.site import TraceSite
from tflaunch.trace.window import TraceTrigger

TICK_S = 0.2


class Insight:
    def __init__(
        self,
        plan: Plan,
        run: Run,
        leader: str,
        say: Callable[[str], None],
        trace_site: TraceSite | None = None,
        send: Callable[[protocol.Command, str | None], None] | None = None,
    ):
        sup = plan.supervision
        self.samples = SampleLog(run.dir)  # samples-<host>.jsonl
        self.progress = ProgressLog(run.dir, StepParser(sup.step_pattern, sup.rate_pattern))
        self.trigger: TraceTrigger | None = None
        self._say = say
        self._lock = threading.Lock()
        self._closed = threading.Event()
        request = TraceRequest.from_env(plan.program.env)
        if request is None:
            return
        addresses = {
            f"{job}:{i}": address
            for job, items in plan.cluster.items()
            for i, address in enumerate(items)
        }
        self.trigger = TraceTrigger(
            request, leader, addresses, plan.program.argv, say, time.monotonic(), trace_site
        )
        if send is not None:
            self.trigger.site.connect(send)
        self.trigger.start_helper()
        if request.at_s is not None:
            threading.Thread(target=self._tick, name="trace-window", daemon=True).start()

    def write(self, host: str, event: Mapping[str, Any]) -> None:
        """A resource sample from ``host``'s agent."""
        self.samples.write(host, event)

    def output(self, task: str, line: str, at: float | None = None) -> int | None:
        """A line ``task`` printed, ``at`` the time its agent read it (unix; else now): the step
        rate is measured on the agent's clock, whatever delays the link adds. The step it holds
        (added up), if any."""
        at = time.time() if at is None else float(at)
        step = self.progress.output(task, line, at)
        if step is not None and self.trigger is not None:
            with self._lock:
                self.trigger.step(task, step, at)
        return step

    def trace_event(self, host: str, event: protocol.Event) -> None:
        if self.trigger is not None:
            with self._lock:
                self.trigger.site.received(host, event)

    def trace_stopped(self, why: str) -> None:
        """Writing the hosts' trace files failed (a full disk): the verdict says so."""
        if self.trigger is not None:
            with self._lock:
                self.trigger.stop(why)

    def trace_drain_s(self) -> float:
        return self.trigger.site.drain_s() if self.trigger is not None else 0.0

    def _tick(self) -> None:
        assert self.trigger is not None
        while not self._closed.wait(TICK_S):
            with self._lock:
                self.trigger.tick(time.monotonic())

    def crash_note(self, task: str, code: int) -> str:
        """Why ``task``'s death by ``code`` may be the trace capture's doing ('' if not)."""
        if self.trigger is None:
            return ""
        with self._lock:
            return self.trigger.crash_note(task, code, time.monotonic())

    def close(self) -> None:
        """Write the last samples; wait (bounded) for a capture and write the trace verdict."""
        self._closed.set()
        self.samples.close()
        self.progress.close()
        if self.trigger is not None:
            with self._lock:
                try:
                    self.trigger.finish()
                except Exception as e:  # the trace never keeps the run from ending in its state
                    self._say(f"trace: ended without a verdict ({type(e).__name__}: {e})")
