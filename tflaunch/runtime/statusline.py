"""One status line kept under streamed output on a terminal, and the cluster progress it shows.

On a terminal, :class:`StatusLine` prints every line above a line that redraws itself twice a
second (rich's ``Live``, transient: gone when the run ends); elsewhere (a pipe, a file, CI, or
``TERM=dumb``) it writes plain lines and draws nothing, so logs stay clean. rich is imported only
on a terminal.

:class:`ClusterProgress` is what ``up`` shows there: every worker's steps/s over the last
seconds (from the step lines :mod:`tflaunch.runtime.progress` finds), the slowest worker, the
time elapsed and, where the output says the total (``step 40/500``, Keras's ``Epoch 2/5`` with
``12/100 [...``, ``training to global step 200``), the slowest worker's step against it and an
estimate of the time left.
"""

from __future__ import annotations

import collections
import os
import re
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from tflaunch.text import is_terminal, terminal_text

WINDOW_S = 10.0  # steps/s over this many seconds of step lines
SHOWN_WORKERS = 4  # workers named one by one; past that, their count and the slowest
REDRAW_S = 0.1  # a step line redraws the status line at once, at most this often
_FRAME_BREAK = re.compile(r"[\r\x08]+")
_TOTALS = (
    re.compile(r"\bstep[ :=]+\d+\s*(?:/|of)\s*(\d+)"),
    re.compile(r"\btraining to (?:global[_ ])?step (\d+)"),
)
_EPOCHS = re.compile(r"^\s*Epoch \d+/(\d+)\s*$")
_EPOCH_STEPS = re.compile(r"^\s*\d+/(\d+) +(?:\[|- )")


def wants_status_line(out: IO[str]) -> bool:
    """Whether ``out`` is a terminal that can keep a line under the output."""
    return is_terminal(out) and os.environ.get("TERM", "") not in ("", "dumb")


def shown_line(line: str) -> str:
    """A line of a task's output as a terminal is shown it: the last frame of a line a progress
    bar redrew (``\r``, backspaces), colour kept and every other control dropped
    (:func:`tflaunch.text.terminal_text`)."""
    frames = [f for f in _FRAME_BREAK.split(line) if f.strip()]
    return terminal_text(frames[-1] if frames else "")


def clock(seconds: float) -> str:
    s = max(0, int(seconds))
    return (
        f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


class StatusLine:
    """Lines above, one status line below, on a terminal; plain lines elsewhere."""

    def __init__(self, out: IO[str], render: Callable[[], str]):
        self.out, self.render = out, render
        self._live: Any = None
        self._lock = threading.Lock()
        self._redrawn = 0.0  # when a written line last redrew the status line
        self._terminal = is_terminal(out)
        if not wants_status_line(out):
            return
        from rich.console import Console
        from rich.live import Live

        self._console = Console(file=out, highlight=False, markup=False, emoji=False)
        self._live = Live(
            get_renderable=self._renderable,
            console=self._console,
            refresh_per_second=2,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._live.start()

    @property
    def active(self) -> bool:
        return self._live is not None

    def _renderable(self):
        from rich.text import Text

        try:
            text = self.render()
        except Exception as err:  # never let a drawing problem end the run
            text = f"(status line: {err})"
        return Text(text, no_wrap=True, overflow="ellipsis", style="bold")

    def write(self, line: str, prefix: str = "", redraw: bool = False) -> None:
        """One line of output, above the status line, after ``prefix`` (ours: the task's name);
        on a terminal the line as :func:`shown_line` shows it, where a pipe or a file gets it
        as it came. ``redraw``: the line changed what the status line says (a step), so it is
        drawn anew under it at once (at most every REDRAW_S), not with the last periodic
        refresh's text, a step behind."""
        if self._live is None:
            self.out.write(prefix + (shown_line(line) if self._terminal else line) + "\n")
            self.out.flush()
            return
        from rich.text import Text

        with self._lock:
            self._console.print(Text(prefix) + Text.from_ansi(shown_line(line)), soft_wrap=True)
            now = time.monotonic()
            if redraw and now - self._redrawn >= REDRAW_S:
                self._redrawn = now
                self._live.refresh()

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


class ClusterProgress:
    """The trainers' steps as their lines come, and the status line they make."""

    def __init__(self, trainers: int, clock_start: float | None = None):
        self.trainers = trainers
        self.started = time.monotonic() if clock_start is None else clock_start
        self.points: dict[str, collections.deque] = {}
        self.total: int | None = None
        self._epochs: dict[str, int] = {}
        self._lock = threading.Lock()

    def line(self, task: str, line: str) -> None:
        """A trainer's line: a total it states, if any."""
        if "/" not in line and "step" not in line:
            return
        for pattern in _TOTALS:
            match = pattern.search(line)
            if match:
                self.total = int(match.group(1))
                return
        match = _EPOCHS.match(line)
        if match:
            self._epochs[task] = int(match.group(1))
            return
        match = _EPOCH_STEPS.match(_FRAME_BREAK.split(line)[-1] or line)
        if match and task in self._epochs:
            self.total = self._epochs[task] * int(match.group(1))

    def step(self, task: str, step: int, at: float) -> None:
        with self._lock:
            points = self.points.setdefault(task, collections.deque())
            if points and step < points[-1][1]:
                points.clear()  # the count started again (a restart)
            points.append((at, step))
            while len(points) > 2 and at - points[0][0] > WINDOW_S:
                points.popleft()

    def rates(self) -> dict[str, tuple[int, float | None]]:
        """Each trainer's latest step and steps/s over the window (None: not yet known)."""
        out = {}
        with self._lock:
            for task, points in self.points.items():
                (t0, s0), (t1, s1) = points[0], points[-1]
                out[task] = (s1, (s1 - s0) / (t1 - t0) if t1 > t0 else None)
        return out

    def render(self) -> str:
        elapsed = clock(time.monotonic() - self.started)
        rates = self.rates()
        if not rates:
            return f"{elapsed} elapsed; {self.trainers} trainer(s), no step line yet"
        known = {t: r for t, (_, r) in rates.items() if r is not None}
        parts = [f"{elapsed} elapsed"]
        shown = sorted(known, key=_order)[:SHOWN_WORKERS]
        parts += [f"{t} {known[t]:.2f} steps/s" for t in shown]
        if len(known) > len(shown):
            parts.append(f"{len(known) - len(shown)} more")
        if not known:
            return "; ".join(parts + ["measuring steps/s"])
        slowest = min(known, key=lambda t: known[t])
        step = rates[slowest][0]
        if len(known) > 1:
            parts.append(f"slowest {slowest}")
        if self.total:
            parts.append(f"step {step}/{self.total}")
            if known[slowest] > 0 and step < self.total:
                parts.append(f"~{clock((self.total - step) / known[slowest])} left")
        else:
            parts.append(f"step {step}")
        return "; ".join(parts)


def _order(task: str) -> tuple[str, int]:
    job, _, index = task.partition(":")
    return job, int(index) if index.isdigit() else 0
