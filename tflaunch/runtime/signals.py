"""Signals to the coordinator, and Slurm's requeue.

SIGINT, SIGTERM or SIGHUP (Ctrl-C, ``tflaunch down``) become one stop that the main loop reads
(:class:`SignalWatch`); SIGUSR1 or SIGUSR2 (Slurm's warning ahead of the time limit) are collected
to be passed on to every task. Given a :class:`Requeue` (Slurm with ``slurm.requeue``), the first
warning schedules the run's stop for the requeue (:class:`RequeueTimer`). Before a coordinator
runs (while machines are made), SIGTERM and SIGHUP raise KeyboardInterrupt as Ctrl-C does
(:func:`interrupting`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Self

from tflaunch.runtime import protocol
from tflaunch.runtime.reporter import Reporter
from tflaunch.runtime.run import Outcome

STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PASSED_ON = (signal.SIGUSR1, signal.SIGUSR2)  # Slurm's --signal: pass on, stop nothing


@contextlib.contextmanager
def interrupting() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt (named after the signal), as Ctrl-C does, for
    the time of the block: for work before the coordinator runs (making machines) whose cleanup
    is a ``finally`` or ``except KeyboardInterrupt``. Main thread only, as every handler."""

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {s: signal.signal(s, interrupt) for s in STOPPING if s != signal.SIGINT}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class CaughtSignals:
    """Ctrl-C, SIGTERM and SIGHUP, recorded instead of acted on while in the block (main thread
    only); the first one is :attr:`signum`. Handlers are restored after. (A batch job's
    launcher, which cancels the job; the coordinator's :class:`SignalWatch` is one too.)"""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def handlers(self) -> dict[int, Callable[[int, Any], None]]:
        """The handler of each signal caught in the block."""
        return {sig: self._on_stop for sig in STOPPING}

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for sig, handler in self.handlers().items():
                self._previous[sig] = signal.signal(sig, handler)
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_stop(self, signum: int, _frame: Any) -> None:
        if self.signum is None:
            self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""


class SignalWatch(CaughtSignals):
    """Handlers for the coordinator's process while it runs: the stopping signals, and SIGUSR1
    and SIGUSR2 collected to be passed on."""

    def __init__(self) -> None:
        super().__init__()
        self.passed_on: list[int] = []

    def handlers(self) -> dict[int, Callable[[int, Any], None]]:
        return {**super().handlers(), **{sig: self._on_pass_on for sig in PASSED_ON}}

    @property
    def stopped_by(self) -> int | None:
        """The first stopping signal (:attr:`signum`), which ends the run."""
        return self.signum

    def _on_pass_on(self, signum: int, _frame: Any) -> None:
        self.passed_on.append(signum)

    def take_passed_on(self) -> list[str]:
        """The names of the signals received to pass on since the last call, in order."""
        names = []
        while self.passed_on:
            names.append(signal.Signals(self.passed_on.pop(0)).name)
        return names

    def interrupted(self) -> Outcome | None:
        if self.stopped_by is None:
            return None
        name = signal.Signals(self.stopped_by).name
        return Outcome(
            128 + self.stopped_by,
            f"interrupted by {name}; the cluster was stopped",
            interrupted=True,
        )


@dataclass(frozen=True)
class Requeue:
    """What Slurm's warning signal leads to when the job may be requeued: the run stops for the
    requeue ``after`` seconds later. ``refused`` (the limit is reached) says why it does not."""

    after: float = 0.0
    note: str = ""  # "requeue 1 of at most 2"
    refused: str = ""


class RequeueTimer:
    """Slurm's warning, seen once: schedules the stop for a requeue, or says why there is none."""

    def __init__(self, requeue: Requeue | None, reporter: Reporter):
        self.requeue, self.reporter = requeue, reporter
        self.warning = ""  # the first warning signal's name
        self.at: float | None = None

    def warned(self, name: str) -> None:
        if self.warning:
            return  # Slurm signals every process of the step: one warning, seen more than once
        self.warning = name
        if self.requeue is None:
            return
        if self.requeue.refused:
            self.reporter.say(f"{name} from Slurm passed on to the tasks; {self.requeue.refused}")
            return
        self.at = time.monotonic() + self.requeue.after
        self.reporter.record(protocol.RequeueScheduled(signal=name, after=self.requeue.after))
        self.reporter.say(
            f"{name} from Slurm passed on to the tasks; stopping the cluster in "
            f"{self.requeue.after:g} s (slurm.checkpoint_wait) to requeue the job "
            f"({self.requeue.note})"
        )

    def due(self) -> Outcome | None:
        """The requeue's outcome once its time has come."""
        if self.at is None or time.monotonic() < self.at:
            return None
        assert self.requeue is not None
        self.reporter.record(protocol.Requeueing(signal=self.warning))
        return Outcome(
            0,
            f"stopped {self.requeue.after:g} s after Slurm's {self.warning} to be requeued "
            f"({self.requeue.note}); the requeued job resumes from the checkpoints",
            requeued=True,
        )
