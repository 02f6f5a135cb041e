"""What the coordinator learns from its tasks' output besides printing it: progress samples
(:mod:`tflaunch.runtime.progress`) and, for ``up --trace``, when to open the capture window
(:mod:`tflaunch.runtime.tracehook`). The coordinator feeds it every line and every tick."""

from __future__ import annotations

import time
from collections.abc import Callable

from tflaunch.cluster.plan import Plan
from tflaunch.runtime.progress import ProgressLog, StepParser
from tflaunch.runtime.run import Run
from tflaunch.runtime.tracehook import TraceRequest, TraceTrigger


class Insight:
    def __init__(self, plan: Plan, run: Run, leader: str, say: Callable[[str], None]):
        sup = plan.supervision
        self.progress = ProgressLog(run.dir, StepParser(sup.step_pattern, sup.rate_pattern))
        request = TraceRequest.from_env(plan.program.env)
        self.trigger: TraceTrigger | None = None
        if request is not None:
            addresses = {
                f"{job}:{i}": address
                for job, items in plan.cluster.items()
                for i, address in enumerate(items)
            }
            program = plan.program.argv[0] if plan.program.argv else "?"
            self.trigger = TraceTrigger(request, leader, addresses, program, say, time.monotonic())

    def output(self, task: str, line: str) -> None:
        step = self.progress.output(task, line, time.time())
        if step is not None and self.trigger is not None:
            self.trigger.step(task, step, time.monotonic())

    def tick(self) -> None:
        if self.trigger is not None:
            self.trigger.tick(time.monotonic())

    def close(self) -> None:
        """Write the last samples; wait (bounded) for a capture and write the trace verdict."""
        self.progress.close()
        if self.trigger is not None:
            self.trigger.finish()
