"""What ``tflaunch up --trace`` asks for, as one typed value from the command line to the agents.

:class:`TraceRequest` is parsed once from ``up``'s options (:meth:`TraceRequest.from_options`),
carried in :class:`~tflaunch.launchers.base.LaunchOptions` (and given back as the same options to
a detached run's background half, :meth:`TraceRequest.argv`), put into the program's environment
for every task (:meth:`TraceRequest.to_env`, through the plan) and read back there by the agents,
the coordinator and the program library (:meth:`TraceRequest.from_env`). The environment is the
one place it is text; its variables are named here and nowhere else.

The window is either steps (``--trace FIRST:COUNT``, a :class:`TraceWindow`: from the leader's
first step line at or past FIRST, for COUNT steps at the rate seen) or the clock (``--trace-at``
seconds after the start, for ``--trace-for`` seconds). Nothing here imports TensorFlow.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tflaunch.errors import TflaunchError

HOOK_ENV = "TFLAUNCH_TRACE_HOOK"  # "1": the agent installs the hook in the task's Python
DIR_ENV = "TFLAUNCH_TRACE_DIR"  # the trace directory (each host's own, set by its agent)
PORT_OFFSET_ENV = "TFLAUNCH_TRACE_PORT_OFFSET"
STEPS_ENV = "TFLAUNCH_TRACE_STEPS"  # FIRST:COUNT
AT_ENV = "TFLAUNCH_TRACE_AT"  # seconds after the cluster started
FOR_ENV = "TFLAUNCH_TRACE_FOR"  # seconds of capture
# Set by the hook: the pid of the task's process that owns its profiler port (children inherit it)
PROFILER_PID_ENV = "TFLAUNCH_PROFILER_PID"
DEFAULT_PORT_OFFSET = 10000
DEFAULT_FIRST_STEP = 2  # the first timed step pays for the barrier; start just after it


class TraceError(TflaunchError):
    """A bad --trace value, or a trace file that is missing or not a tflaunch trace."""


@dataclass(frozen=True)
class TraceWindow:
    """Which timed steps to trace: ``count`` steps from ``first`` (1-based)."""

    first: int
    count: int

    def __str__(self) -> str:
        return f"{self.first}:{self.count}"


def parse_window(text: str) -> TraceWindow:
    """``N`` (N steps from step 2) or ``FIRST:N``."""
    parts = text.split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if len(numbers) == 1:
        window = TraceWindow(DEFAULT_FIRST_STEP, numbers[0])
    elif len(numbers) == 2:
        window = TraceWindow(numbers[0], numbers[1])
    else:
        raise TraceError(
            f"--trace {text!r}: give the number of timed steps to trace (e.g. 5) or the first "
            "step and the count (e.g. 10:5)."
        )
    if window.first < 1 or window.count < 1:
        raise TraceError(f"--trace {text!r}: the first step and the count must be at least 1.")
    return window


def parse_seconds(text: str, option: str) -> float:
    """``30``, ``30s``, ``2m`` or ``1h`` as seconds (a positive number)."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    body, scale = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1.0)
    try:
        seconds = float(body) * scale
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise TraceError(f"{option} {text!r}: give a positive duration such as 30, 30s or 2m.")
    return seconds


def profiler_port(task_port: int, offset: int) -> int:
    """The port of a task's profiler server: its cluster port plus the offset (minus, past
    65535), so that every task's profiler address follows from the ClusterSpec alone."""
    port = task_port + offset
    return port if port <= 65535 else task_port - offset


def trace_dir(runs_dir: str, run_id: str, host_run_dir: str | None) -> Path:
    """Where a run's trace goes: its run directory's ``trace/`` here where the nodes share this
    machine's files (local, Slurm), else the run directory on the hosts (``host_run_dir``:
    ssh; a path there, which may start with ``~``)."""
    if host_run_dir is not None:
        return Path(posixpath.join(host_run_dir, "trace"))
    return Path(runs_dir).resolve() / run_id / "trace"


@dataclass(frozen=True)
class TraceRequest:
    """What ``up --trace`` asked for: where the trace goes, the profilers' port offset, and the
    window (steps, or ``at_s``/``for_s`` seconds)."""

    trace_dir: Path
    port_offset: int = DEFAULT_PORT_OFFSET
    window: TraceWindow | None = None
    at_s: float | None = None
    for_s: float | None = None

    @classmethod
    def from_options(
        cls,
        trace_dir: Path,
        steps: str | None,
        at: str | None,
        length: str | None,
        port_offset: int = DEFAULT_PORT_OFFSET,
    ) -> TraceRequest:
        """``up``'s ``--trace STEPS``, ``--trace-at TIME``, ``--trace-for TIME`` and
        ``--trace-port-offset``, checked (TraceError, exit 2)."""
        if at is None and length is not None and steps is None:
            raise TraceError("--trace-for needs --trace-at (or --trace STEPS) to say when.")
        if steps and at:
            raise TraceError("give --trace STEPS or --trace-at, not both.")
        return cls(
            Path(trace_dir),
            port_offset,
            parse_window(steps) if steps else None,
            parse_seconds(at, "--trace-at") if at else None,
            parse_seconds(length, "--trace-for") if length else None,
        )

    def argv(self) -> list[str]:
        """The same request as ``up``'s options (for the background half of ``up --detach``,
        which makes the same trace directory from the same run id)."""
        words = ["--trace", str(self.window)] if self.window else []
        words += ["--trace-at", repr(self.at_s)] if self.at_s is not None else []
        words += ["--trace-for", repr(self.for_s)] if self.for_s is not None else []
        return [*words, "--trace-port-offset", str(self.port_offset)]

    def to_env(self) -> dict[str, str]:
        """The environment every task of the traced run gets (read back by :meth:`from_env`)."""
        env = {HOOK_ENV: "1", DIR_ENV: str(self.trace_dir), PORT_OFFSET_ENV: str(self.port_offset)}
        if self.window is not None:
            env[STEPS_ENV] = str(self.window)
        if self.at_s is not None:
            env[AT_ENV] = repr(float(self.at_s))
        if self.for_s is not None:
            env[FOR_ENV] = repr(float(self.for_s))
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TraceRequest | None:
        """The request a traced run's environment carries; None for an untraced run."""
        if env.get(HOOK_ENV) != "1" or not env.get(DIR_ENV):
            return None
        return cls(
            Path(os.path.expanduser(env[DIR_ENV])),
            int(env.get(PORT_OFFSET_ENV) or DEFAULT_PORT_OFFSET),
            parse_window(env[STEPS_ENV]) if env.get(STEPS_ENV) else None,
            float(env[AT_ENV]) if env.get(AT_ENV) else None,
            float(env[FOR_ENV]) if env.get(FOR_ENV) else None,
        )

    def applied(self, config: Any) -> Any:
        """``config`` (a ClusterConfig) with this request in its program's environment: every
        task gets the trace hook (any Python TensorFlow program)."""
        program = config.program
        return replace(config, program=replace(program, env={**program.env, **self.to_env()}))
