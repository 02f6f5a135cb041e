"""The window policy of ``up --trace``: when the capture opens, and what came of it.

:class:`TraceTrigger` watches the leader's output (worker 0 or the chief) for
``supervision.step_pattern`` (``--trace FIRST:COUNT``: from the first step line at or past
FIRST, for COUNT steps at the rate seen so far) or the clock (``--trace-at``/``--trace-for``);
when the window opens it hands the order (every task that imported TensorFlow, by its profiler
address) to the capture helper on its :class:`~tflaunch.trace.site.TraceSite`. Whatever
happens, it ends with the verdict (:func:`~tflaunch.trace.files.write_verdict`). Programs on
:mod:`tflaunch.trace.profiler`'s own tracer (the benchmark) take their trace themselves, from
their first worker: they leave an ``inprogram`` note, no window opens, and the site fetches what
that worker wrote, so the verdict names the trace wherever it was written. It also tells a
task's death by a signal during the capture apart as a likely profiler crash
(:meth:`TraceTrigger.crash_note`). Nothing here imports TensorFlow.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tflaunch.runtime import protocol
from tflaunch.trace.files import CAPTURE_LOG, FIX_LOADED, VERDICT_FILE, Notes, write_verdict
from tflaunch.trace.request import PROFILER_PID_ENV, TraceRequest
from tflaunch.trace.site import HELPER_MARGIN_S, Helper, TraceSite

# Tracing slows steps (2-3x measured on 2 cores); the capture covers the window at that pace,
# plus the time the profilers take to start.
PROFILED_SLOWDOWN = 3.0
CAPTURE_SLACK_S = 1.0
# A traced task that dies by one of these from the window's start until this long after its end
# (the profiler collects and hands its events over then) is reported as a likely profiler crash.
CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS)
COLLECT_MARGIN_S = 60.0


class TraceTrigger:
    """Opens the capture window once, from the leader's step lines or the clock, and says at
    the end what came of it. ``now`` is ``time.monotonic()``; the caller feeds lines and ticks."""

    def __init__(
        self,
        request: TraceRequest,
        leader: str,
        addresses: Mapping[str, str],
        argv: Sequence[str],
        say: Callable[[str], None],
        started: float,
        site: TraceSite | None = None,
    ):
        self.request = request
        self.site = site or TraceSite(request.trace_dir)
        self.leader = leader
        self.addresses = dict(addresses)  # task -> cluster host:port
        self.argv = list(argv)  # the program's, to say why no task loaded the hook
        self.say = say
        self.started = started
        self.seen: list[tuple[float, int]] = []  # the leader's (time, step) so far
        self.helper: Helper | None = None
        self.helper_error = ""
        self.fired = False
        self.window: tuple[float, float] | None = None  # monotonic start and end of the capture
        self.fixes: dict[str, str] = {}  # traced task -> what became of the profiler fix
        self.helper_deadline = 0.0
        self.in_program = False  # the program takes its own trace (tflaunch.trace.profiler)
        self.verdict: tuple[bool, str] | None = None

    # -- the window ---------------------------------------------------------------------------

    def step(self, task: str, step: int, now: float) -> None:
        """``task`` printed step ``step`` (added up as :mod:`tflaunch.runtime.progress` does) at
        ``now`` on any one clock (the agent's): only the rate between step lines is read."""
        window = self.request.window
        if task != self.leader or window is None or self._done():
            return
        self.seen.append((now, step))
        if step < window.first:
            return
        seconds = self.request.for_s or self._window_seconds()
        if seconds is not None:
            self._fire(seconds, f"at step {step}")

    def tick(self, now: float) -> None:
        """The clock's window (``--trace-at``) opens once ``now`` is past its start."""
        if self.request.at_s is None or self._done():
            return
        if now - self.started >= self.request.at_s:
            self._fire(self.request.for_s or 5.0, f"{now - self.started:.0f} s after the start")

    def _done(self) -> bool:
        return self.fired or self.in_program or self.verdict is not None

    def _window_seconds(self) -> float | None:
        """COUNT steps at the leader's recent step rate (None until two step lines apart)."""
        tail = self.seen[-1:]
        for point in reversed(self.seen[:-1]):  # the last run of rising steps, 5 at most
            if point[1] >= tail[0][1] or len(tail) == 5:
                break
            tail.insert(0, point)
        (t0, s0), (t1, s1) = tail[0], tail[-1]
        if s1 <= s0 or t1 <= t0:
            return None
        assert self.request.window is not None
        per_step = (t1 - t0) / (s1 - s0)
        return self.request.window.count * per_step * PROFILED_SLOWDOWN + CAPTURE_SLACK_S

    def _fire(self, seconds: float, when: str) -> None:
        notes = self.site.notes()
        if notes.in_program:  # the program's own hooks take the trace; finish() fetches it
            self.site.ask_files()  # from whichever host writes it
            self.in_program = True
            return
        targets = {
            task: f"{self.addresses[task].rpartition(':')[0]}:{port}"
            for task, port in notes.tf_ports.items()
            if task in self.addresses
        }
        if not targets:
            self._end(False, _why_none(notes, f"when the window opened ({when})", self.argv))
            return
        missing = sorted(set(self.addresses) - set(targets))
        if missing:
            self.say(f"trace: {', '.join(missing)} had not imported TensorFlow {when}; not traced")
        self.fixes = {task: notes.fixes.get(task, "not known") for task in targets}
        unfixed = sorted(t for t, fix in self.fixes.items() if fix != FIX_LOADED)
        if unfixed:
            self.say(
                f"trace: {', '.join(unfixed)} {'runs' if len(unfixed) == 1 else 'run'} "
                "without tflaunch's fix for a crash in "
                f"TensorFlow's profiler ({self.fixes[unfixed[0]]}); the capture may kill such a "
                "task (docs/insight.md, profiler crashes)"
            )
        try:
            self.site.publish_window(
                json.dumps({"start": time.time(), "end": time.time() + seconds}) + "\n"
            )
        except OSError as e:  # a full disk: no capture, and the run goes on
            self._end(False, f"no trace because writing the capture window failed ({e})")
            return
        order = self.site.order({"tasks": targets, "duration_ms": max(1, int(seconds * 1000))})
        away = len(order.get("dirs") or {})
        elsewhere = f"; {away} save(s) on their own host, gathered at the end" if away else ""
        self.say(f"trace: capturing {seconds:.1f} s of {len(targets)} task(s) {when}{elsewhere}")
        helper = self.start_helper()
        if helper is None:
            self._end(
                False, f"no trace because the capture helper did not start: {self.helper_error}"
            )
            return
        helper.order(json.dumps(order) + "\n")  # a dead one: finish() says why from its log
        self.fired = True
        self.window = (time.monotonic(), time.monotonic() + seconds)
        self.helper_deadline = time.monotonic() + seconds + HELPER_MARGIN_S

    def start_helper(self) -> Helper | None:
        """The capture helper, started ahead of the window (on the trace site): it loads
        TensorFlow's profiler client and waits for the order on its input, so that the capture
        starts the moment it is given. None if it could not be started (``helper_error``)."""
        if self.helper is None and not self.helper_error:
            try:
                self.helper = self.site.start_helper()
            except Exception as exc:  # the run goes on; the verdict says why there is no trace
                self.helper_error = f"{type(exc).__name__}: {exc}"
        return self.helper

    def crash_note(self, task: str, code: int, now: float) -> str:
        """A line for the failure report of ``task``, dead with exit ``code`` at ``now``, when
        that death looks like a crash of TensorFlow's profiler under this capture; else ''."""
        if self.window is None or task not in self.fixes or code <= 128:
            return ""
        if code - 128 not in CRASH_SIGNALS:
            return ""
        start, end = self.window
        if not start <= now <= end + COLLECT_MARGIN_S:
            return ""
        name = signal.Signals(code - 128).name
        fix = self.fixes[task]
        fix_line = (
            "tflaunch's fix for the known crash was loaded, so this may be another one"
            if fix == FIX_LOADED
            else f"tflaunch's fix for the known crash was not in it: {fix}"
        )
        return (
            f"It died by {name} {now - start:.1f} s after tflaunch's trace capture began "
            f"profiling it (a {end - start:.1f} s window): TensorFlow's profiler is the likely "
            f"cause, not the program ({fix_line}). See docs/insight.md (profiler crashes); "
            "the same run without --trace tells."
        )

    # -- what the agents send ------------------------------------------------------------------

    def received(self, host: str, event: protocol.Event) -> None:
        """A host's trace note or file, kept by the site (ValueError: malformed; OSError: not
        written)."""
        self.site.received(host, event)

    def drain_s(self) -> float:
        return self.site.drain_s()

    # -- the end ------------------------------------------------------------------------------

    def finish(self) -> tuple[bool, str]:
        """Wait (bounded) for the capture; write and return the verdict."""
        if self.verdict is not None:
            self._stop_helper()
            return self.verdict
        if not self.fired:
            self._stop_helper()
            notes = self.site.notes()
            if self.in_program or notes.in_program:
                return self._program_trace()
            if not notes.tf_ports:
                return self._end(False, _why_none(notes, "before the run ended", self.argv))
            if self.request.window is not None:
                first = self.request.window.first
                last = f"its last was step {self.seen[-1][1]}" if self.seen else "it printed none"
                why = (
                    f"{self.leader} printed no step line at or past step "
                    f"{first} (see supervision.step_pattern; {last})"
                )
                if self.seen and self.seen[-1][1] >= first:
                    why = f"{self.leader}'s step rate was unknown (one step line only)"
            else:
                why = f"the run ended before the window at {self.request.at_s:g} s"
            return self._end(False, f"no trace because {why}")
        assert self.helper is not None
        code = self.helper.wait(max(1.0, self.helper_deadline - time.monotonic()))
        if code is None:
            self.helper.kill()
            return self._end(False, "no trace because the capture did not finish in time")
        self._collect()
        if code == 0 and (self.site.dir / "trace.json").exists():
            return self._end(True, f"trace: {self.site.dir / 'trace.json'}")
        tail = _last_line(self.site.dir / CAPTURE_LOG)
        return self._end(False, f"no trace because the capture failed: {tail}")

    def _program_trace(self) -> tuple[bool, str]:
        """The verdict on a program that took its own trace (:mod:`tflaunch.trace.profiler`'s tracer, from
        its first worker, on whichever host): fetched here (sent over the links, or copied by
        the site), then found or not."""
        self._collect()
        trace = self.site.dir / "trace.json"
        if trace.exists():
            return self._end(True, f"trace: {trace}")
        unsent = sorted(self.site.asked - set(self.site.sent))
        errors = [f"{h}: {e.error}" for h, e in sorted(self.site.sent.items()) if e.error]
        why = f"; {', '.join(unsent)} sent nothing" if unsent else ""
        why += f"; {'; '.join(errors)}" if errors else ""
        return self._end(
            False,
            "no trace because the program's own capture (tflaunch.models' trace hooks, from "
            f"{self.leader}) left no trace.json{why}: see {self.leader}'s log",
        )

    def _collect(self) -> None:
        try:
            self.site.collect()
        except Exception as exc:  # the trace stays where it was written; say so, once
            self.say(f"trace: could not fetch the trace from the hosts: {exc}")

    def _stop_helper(self) -> None:
        """The window never opened: the waiting helper ends at the end of its input."""
        if self.helper is None or not self.helper.running():
            return
        self.helper.end_input()
        if self.helper.wait(10) is None:
            self.helper.kill()

    def stop(self, why: str) -> None:
        """The trace collection stopped (writing the hosts' files here failed: a full disk):
        no trace, and the verdict says why; the run goes on."""
        if self.verdict is None:
            self._end(False, f"no trace because {why}")

    def _end(self, ok: bool, line: str) -> tuple[bool, str]:
        self.verdict = (ok, line)
        try:
            write_verdict(self.site.dir, ok, line)
        except OSError as e:  # a full disk: the line is still said; the run still ends
            self.say(f"trace: could not write {VERDICT_FILE} under {self.site.dir} ({e})")
        return self.verdict


def _why_none(notes: Notes, when: str, argv: Sequence[str]) -> str:
    """Why there is no trace, from the hooks' notes ``when`` it was decided, and the program's
    ``argv``."""
    if not notes.python and notes.old_python:
        task, version = sorted(notes.old_python.items())[0]
        return (
            f"no trace because {task} ran Python {version}: tflaunch's trace hook needs "
            "Python 3.7 or newer"
        )
    if not notes.python:
        return _why_no_hook(argv)
    if notes.errors:
        task, error = sorted(notes.errors.items())[0]
        return f"no trace because {task}'s profiler server did not start: {error}"
    if notes.tf_children:
        task, child = sorted(notes.tf_children.items())[0]
        return (
            f"no trace because {task} imported TensorFlow only in a child process (pid "
            f"{child['pid']}) of its first Python process (pid {child['claimant']}), which "
            "holds the task's profiler port and had not imported TensorFlow "
            f"{when}; a program that runs its trainer as a child hands the port over by "
            f"removing {PROFILER_PID_ENV} from the child's environment"
        )
    return (
        f"no trace because no task had imported TensorFlow {when} "
        f"({len(notes.python)} task(s) ran Python)"
    )


def _why_no_hook(argv: Sequence[str]) -> str:
    """No task's Python loaded the hook: what the program's argv tells of why."""
    program = argv[0] if argv else "?"
    flags = _python_flags(argv)
    skipping = [f for f in ("-I", "-E", "-S") if f[1] in flags]
    if skipping:
        what = "skips sitecustomize" if skipping[0] == "-S" else "ignores PYTHONPATH"
        return (
            f"no trace because the program runs Python with {skipping[0]}, which {what}, "
            f"where tflaunch puts its trace hook (program '{shlex.join(argv)[:200]}'): "
            f"no task could be traced; run it without {skipping[0]}"
        )
    if any("python" in os.path.basename(arg).lower() for arg in argv):
        return (
            "no trace because no task's Python process loaded tflaunch's trace hook "
            f"(program '{program}'): the hook comes in through PYTHONPATH, which "
            "python -I or -E ignores and -S skips, and a program may replace"
        )
    return (
        f"no trace because no task ran Python (program '{program}'): the trace hook "
        "works only in Python programs that import TensorFlow"
    )


def _python_flags(argv: Sequence[str]) -> str:
    """The one-letter options a Python ``argv`` gives the interpreter before its program
    (``python3 -I -u x.py`` -> "Iu"); '' where argv[0] is not a Python."""
    if not argv or not os.path.basename(argv[0]).lower().startswith("python"):
        return ""
    flags = ""
    for arg in argv[1:]:
        if not arg.startswith("-") or arg.startswith("--") or arg == "-":
            break
        for letter in arg[1:]:
            flags += letter
            if letter in "cmWX":  # what follows is this option's value, or the program
                return flags
    return flags


def _last_line(path: Path) -> str:
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "no log"
    errors = [x for x in lines if "rror" in x]
    return (errors or lines or ["no output"])[-1].strip()[:300]
