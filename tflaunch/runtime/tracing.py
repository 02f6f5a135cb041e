"""``up --trace`` as the runtime sees it: the two seams the tracing package fills, so that the
runtime drives a traced run without importing :mod:`tflaunch.trace` (a contract says so).

- The coordinator is handed a :class:`Trace` (``coordinate(..., trace=...)``;
  :class:`tflaunch.trace.run.RunTrace`, built by the launcher from the one request ``up`` made),
  begins it once it knows the leader, and feeds the :class:`Tracer` it gets the leader's steps,
  clock ticks and the agents' trace messages; the failure report asks it whether a death looks
  like the profiler's doing; the run's end asks for the verdict.
- The agent is handed a :data:`HostTraceMaker` (``serve(..., trace=...)``;
  :class:`tflaunch.trace.links.HostTrace`), which gives its host's side: the hook in each task's
  environment, the notes polled, the window written, the files sent when asked.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from tflaunch.cluster.plan import Plan
from tflaunch.runtime import protocol

Say = Callable[[str], None]
Send = Callable[[protocol.Command, str | None], None]  # a command to one host, or every host


class Tracer(Protocol):
    """A traced run's capture window and verdict, as the coordinator drives it (all on its
    thread): ``now`` is ``time.monotonic()``, ``at`` the agent's clock (unix)."""

    def step(self, task: str, step: int, at: float) -> None: ...

    def tick(self, now: float) -> None: ...

    def received(self, host: str, event: protocol.Event) -> None:
        """A host's trace note or file: ``ValueError`` for a malformed one, ``OSError`` when
        writing it failed."""

    def stop(self, why: str) -> None: ...

    def drain_s(self) -> float:
        """Extra seconds the teardown gives agents that still send trace files."""
        ...

    def crash_note(self, task: str, code: int, now: float) -> str: ...

    def finish(self) -> tuple[bool, str]:
        """Wait (bounded) for the capture; write and return the verdict."""
        ...


class Trace(Protocol):
    """What ``up --trace`` asked of one run, handed to its coordinator."""

    def begin(self, plan: Plan, leader: str, say: Say, send: Send) -> Tracer: ...


class HostTrace(Protocol):
    """One agent's side of a traced run."""

    def task_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """A task's environment with the trace hook in it."""
        ...

    def poll(self) -> None: ...

    def window(self, command: protocol.TraceWindow) -> None: ...

    def collect(self, command: protocol.TraceCollect) -> None: ...

    def ship(self) -> bool:
        """Send the files asked for; whether anything was sent (the link needs time)."""
        ...


# (the agent's run directory, its way to emit events, its host's tasks) -> its side of the trace
HostTraceMaker = Callable[
    [str | os.PathLike, Callable[[protocol.Event], None], Iterable[str]], HostTrace
]
