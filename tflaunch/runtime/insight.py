"""What the coordinator records from its agents besides events: resource samples
(:class:`tflaunch.runtime.monitor.SampleLog`) and progress samples from the tasks' output
(:mod:`tflaunch.runtime.progress`), whose step lines also drive ``up --trace``'s window (the
reporter hands the steps on). The coordinator hands it samples and output lines, and closes it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tflaunch.cluster.plan import Plan
from tflaunch.runtime.monitor import SampleLog
from tflaunch.runtime.progress import ProgressLog, StepParser
from tflaunch.runtime.run import Run


class Insight:
    def __init__(self, plan: Plan, run: Run):
        sup = plan.supervision
        self.samples = SampleLog(run.dir)  # samples-<host>.jsonl
        self.progress = ProgressLog(run.dir, StepParser(sup.step_pattern, sup.rate_pattern))

    def write(self, host: str, event: Mapping[str, Any]) -> None:
        """A resource sample from ``host``'s agent."""
        self.samples.write(host, event)

    def output(self, task: str, line: str, at: float) -> int | None:
        """A line ``task`` printed, ``at`` the time its agent read it (unix): the step rate is
        measured on the agent's clock, whatever delays the link adds. The step it holds (added
        up), if any."""
        return self.progress.output(task, line, at)

    def close(self) -> None:
        """Write the last samples."""
        self.samples.close()
        self.progress.close()
