"""Every task's progress from its output, for any program: step numbers and images (or examples)
per second become samples in ``progress.jsonl`` in the run directory, read by ``status`` and
``report``.

A step line matches ``supervision.step_pattern`` (the step number is its first group that
matched). Left at its default, the patterns of :data:`DEFAULT_STEP_PATTERNS` are tried instead,
which recognise common output: ``step 100`` and TF1 logging's ``loss = 0.3, step = 100``,
``global_step: 100``, Keras ``fit``'s progress lines (``12/100 [====>...]``, ``100/100 - 2s -``;
the count restarts each epoch and is added up here), and tf_cnn_benchmarks' ``10  images/sec:``.
A rate line matches ``supervision.rate_pattern`` (default :data:`DEFAULT_RATE_PATTERN`:
``images/sec: 123.4``, ``examples/sec: 5``, ``123 img/s``): the number is kept as the task's
throughput. Samples are kept at most every :data:`MIN_INTERVAL_S` per task (the latest wins).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tflaunch.runtime.runfiles import RunFileError, json_lines, open_run_file

PROGRESS_FILE = "progress.jsonl"
MIN_INTERVAL_S = 0.5
CONFIG_DEFAULT_STEP = r"\bstep[ :=]+(\d+)"  # supervision.step_pattern's default
EPOCH_PATTERN = r"^\s*(\d+)/\d+ +(?:\[|- )"  # Keras fit: the count restarts every epoch
DEFAULT_STEP_PATTERNS = (
    CONFIG_DEFAULT_STEP,
    r"\bglobal[_ ]step\b[ :=]*(\d+)",
    EPOCH_PATTERN,
    r"^\s*(\d+)\s+images/sec",
)
DEFAULT_RATE_PATTERN = (
    r"(?:images|examples|samples)/sec:?\s*(\d+(?:\.\d+)?)"
    r"|(\d+(?:\.\d+)?)\s*(?:images|examples|samples|img)/s(?:ec)?\b(?!:)"
)


def _number(match: re.Match) -> str | None:
    return next((g for g in match.groups() if g is not None), None)


@dataclass
class _TaskProgress:
    base: int = 0  # steps of earlier epochs (Keras restarts its count each epoch)
    last: int | None = None
    last_raw: int = 0
    rate: float | None = None
    written: float = float("-inf")
    pending: dict[str, Any] | None = None


EPOCH_LINE = re.compile(r"^\s*Epoch \d+/\d+\s*$")
FRAME_BREAK = re.compile(r"[\r\x08]+")


class StepParser:
    """A task's step (added up across restarts of the count) and rate from its output lines."""

    def __init__(self, step_pattern: str = CONFIG_DEFAULT_STEP, rate_pattern: str = ""):
        sources = DEFAULT_STEP_PATTERNS if step_pattern == CONFIG_DEFAULT_STEP else (step_pattern,)
        self.steps = [re.compile(p) for p in sources]
        self.rate = re.compile(rate_pattern or DEFAULT_RATE_PATTERN)
        # Every default pattern needs "step" or a "/" in the line: most lines are skipped unread.
        self.prefilter = step_pattern == CONFIG_DEFAULT_STEP and not rate_pattern
        self.tasks: dict[str, _TaskProgress] = {}

    def parse(self, task: str, line: str) -> tuple[int | None, float | None]:
        """(cumulative step, rate) seen in ``line``; either may be None. A line may hold many
        frames of a progress bar (Keras redraws it with ``\\r`` and backspaces): the last
        frame that holds a step counts."""
        if self.prefilter and "/" not in line and "step" not in line:
            return None, None
        state = self.tasks.setdefault(task, _TaskProgress())
        if EPOCH_LINE.match(line) and state.last is not None:
            state.base, state.last_raw = state.last, 0  # Keras: the next count starts at 1
            return None, None
        step = None
        for frame in reversed(FRAME_BREAK.split(line)):
            step = self._step(state, frame)
            if step is not None:
                break
        rate = None
        match = self.rate.search(FRAME_BREAK.split(line)[-1]) or self.rate.search(line)
        if match and _number(match) is not None:
            rate = float(_number(match))  # type: ignore[arg-type]
            state.rate = rate
        return step, rate

    def _step(self, state: _TaskProgress, frame: str) -> int | None:
        for pattern in self.steps:
            match = pattern.search(frame)
            number = _number(match) if match else None
            if number is None:
                continue
            raw = int(number)
            if pattern.pattern != EPOCH_PATTERN:
                step = raw
            else:
                if state.last is not None and raw < state.last_raw:
                    state.base = state.last  # a new epoch: the count started again
                step = state.base + raw
                state.last_raw = raw
            state.last = step
            return step
        return None


class ProgressLog:
    """The coordinator's writer of ``progress.jsonl``: one sample per task per half second at
    most, with the step and the latest rate."""

    def __init__(self, run_dir: str | os.PathLike, parser: StepParser):
        self.path = Path(run_dir) / PROGRESS_FILE
        self.parser = parser
        self._out: IO[str] | None = None

    def output(self, task: str, line: str, now: float) -> int | None:
        """Note ``line``; the step it holds (added up), if any."""
        step, rate = self.parser.parse(task, line)
        if step is None and rate is None:
            return None
        state = self.parser.tasks[task]
        record = {"time": round(now, 3), "task": task, "step": state.last, "rate": state.rate}
        if now - state.written < MIN_INTERVAL_S:
            state.pending = record
            return step
        self._write(record)
        state.written, state.pending = now, None
        return step

    def close(self) -> None:
        for state in self.parser.tasks.values():
            if state.pending:
                self._write(state.pending)
                state.pending = None
        if self._out:
            self._out.close()
            self._out = None

    def _write(self, record: Mapping[str, Any]) -> None:
        if self._out is None:
            self._out = open_run_file(self.path, "a")
        self._out.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._out.flush()


@dataclass
class TaskSeries:
    """One task's samples: times (s since the epoch), steps, steps/s and rates between them."""

    task: str
    times: list[float] = field(default_factory=list)
    steps: list[int | None] = field(default_factory=list)
    rates: list[float | None] = field(default_factory=list)

    def step_rates(self) -> list[tuple[float, float]]:
        """(time, steps/s) between consecutive samples that carry a step."""
        points = [(t, s) for t, s in zip(self.times, self.steps, strict=True) if s is not None]
        out = []
        for (t0, s0), (t1, s1) in zip(points, points[1:], strict=False):
            if t1 > t0 and s1 >= s0:
                out.append((t1, (s1 - s0) / (t1 - t0)))
        return out

    def _points(self) -> list[tuple[float, int]]:
        return [(t, s) for t, s in zip(self.times, self.steps, strict=True) if s is not None]

    @staticmethod
    def _rate(points: list[tuple[float, int]]) -> float | None:
        """Steps gained over the time they took, between consecutive samples whose count did not
        fall: a count that starts again, or a stray mention of a step before training (MNIST's
        ``training to global step 200``), adds neither steps nor time (its time would make a
        task that trained faster look like the straggler)."""
        pairs = [(a, b) for a, b in zip(points, points[1:], strict=False) if b[1] >= a[1]]
        took = sum(b[0] - a[0] for a, b in pairs)
        if took <= 0:
            return None
        return sum(b[1] - a[1] for a, b in pairs) / took

    def latest_step_rate(self, window_s: float = 10.0) -> float | None:
        """Steps/s over the last ``window_s`` seconds of samples (the last two at least)."""
        points = self._points()
        if len(points) < 2:
            return None
        recent = [p for p in points if p[0] >= points[-1][0] - window_s]
        return self._rate(recent if len(recent) >= 2 else points[-2:])

    def mean_step_rate(self) -> float | None:
        return self._rate(self._points())


def read_progress(run_dir: str | os.PathLike) -> dict[str, TaskSeries]:
    """Every task's samples, in the order written."""
    out: dict[str, TaskSeries] = {}
    for record in _records(Path(run_dir) / PROGRESS_FILE):
        task = str(record.get("task", "?"))
        series = out.setdefault(task, TaskSeries(task))
        series.times.append(float(record.get("time", 0.0)))
        series.steps.append(record.get("step"))
        series.rates.append(record.get("rate"))
    return out


def _records(path: Path) -> Iterator[dict[str, Any]]:
    """progress.jsonl's samples (those with a time); none from a file that is not a regular
    file of the run directory."""
    try:
        for record in json_lines(path):
            if isinstance(record.get("time", 0.0), int | float):
                yield record
    except RunFileError:
        return


def straggler_figures(series: Sequence[TaskSeries]) -> dict[str, Any] | None:
    """Across the workers (and chief): mean steps/s of each, the spread ((max - min) / max) and
    the slowest. None with fewer than two that have a rate."""
    means = {
        s.task: rate
        for s in series
        if s.task.startswith(("worker:", "chief:")) and (rate := s.mean_step_rate()) is not None
    }
    if len(means) < 2:
        return None
    slowest = min(means, key=lambda t: means[t])
    fastest = max(means.values())
    return {
        "steps_per_s": means,
        "spread": (fastest - means[slowest]) / fastest if fastest > 0 else 0.0,
        "slowest": slowest,
    }
