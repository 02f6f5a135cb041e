"""The stall watchdog's bookkeeping: which watched task has made no progress for too long.

Progress is output: a task that prints nothing for ``timeout`` seconds is stalled. Once a task has
printed a step number (a line matching ``supervision.step_pattern``), progress is a larger step
number instead: printing the same step over and over (a retry loop, a heartbeat) is no progress.
Pure: the caller passes the clock, so the rules are tested without waiting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass
class _Progress:
    since: float  # when the task last made progress
    step: int | None = None  # the largest step it reported


class StallWatch:
    def __init__(self, timeout: float, step_pattern: str):
        self.timeout = timeout
        self.pattern = re.compile(step_pattern)
        self._tasks: dict[str, _Progress] = {}

    def watch(self, task: str, now: float) -> None:
        """Start (or restart) watching ``task``, as of ``now``."""
        self._tasks[task] = _Progress(now)

    def forget(self, task: str) -> None:
        self._tasks.pop(task, None)

    def output(self, task: str, line: str, now: float) -> None:
        progress = self._tasks.get(task)
        if progress is None:
            return
        match = self.pattern.search(line)
        if match:
            step = int(match.group(1))
            if progress.step is None or step > progress.step:
                progress.step, progress.since = step, now
        elif progress.step is None:
            progress.since = now

    def stalled(self, now: float) -> list[tuple[str, str]]:
        """Watched tasks without progress for ``timeout`` seconds, with what they lacked; each
        is reported once (and forgotten)."""
        if self.timeout <= 0:
            return []
        found = []
        for task, progress in list(self._tasks.items()):
            idle = now - progress.since
            if idle >= self.timeout:
                what = (
                    f"no output for {idle:.0f} s"
                    if progress.step is None
                    else f"no step progress for {idle:.0f} s (last step {progress.step})"
                )
                found.append((task, what))
                del self._tasks[task]
        return found
