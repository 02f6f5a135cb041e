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


class HeldTrace:
    """A run's :class:`Tracer` as the coordinator holds it (None: an untraced run, where every
    call does nothing). Writing the hosts' trace files failing (a full disk) stops the trace with
    one line, never the run; a trace message the tracer cannot use is a malformed message
    (:class:`~tflaunch.runtime.protocol.ProtocolError`); the verdict never keeps the run from
    ending in its state."""

    def __init__(self, tracer: Tracer | None, say: Say):
        self.tracer, self.say = tracer, say
        self.stopped = False  # writing trace files failed: no more are taken

    def step(self, task: str, step: int, at: float) -> None:
        if self.tracer is not None:
            self.tracer.step(task, step, at)

    def tick(self, now: float) -> None:
        if self.tracer is not None:
            self.tracer.tick(now)

    def received(self, host: str, event: protocol.Event) -> None:
        if self.tracer is None or self.stopped:
            return
        try:
            self.tracer.received(host, event)
        except OSError as e:
            self.stopped = True
            why = f"writing {host}'s trace files failed ({e})"
            self.say(f"trace collection stopped: {why}; the run goes on without its trace")
            self.tracer.stop(why)
        except ValueError as e:
            raise protocol.ProtocolError(f"{event.NAME}: {e}") from e

    def drain_s(self) -> float:
        return self.tracer.drain_s() if self.tracer is not None else 0.0

    def crash_note(self, task: str, code: int, now: float) -> str:
        return self.tracer.crash_note(task, code, now) if self.tracer is not None else ""

    def finish(self) -> None:
        """Wait (bounded) for a capture and write the verdict."""
        if self.tracer is None:
            return
        try:
            self.tracer.finish()
        except Exception as e:  # the trace never keeps the run from ending in its state
            self.say(f"trace: ended without a verdict ({type(e).__name__}: {e})")


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
