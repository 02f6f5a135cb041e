"""Traces of any Python TensorFlow program, from the launcher side (``tflaunch up --trace``).

Three parts, none of which imports TensorFlow:

- the hook: the agent puts ``tflaunch/runtime/sitehook`` first on a traced task's
  ``PYTHONPATH`` (:func:`with_hook`); its ``sitecustomize`` starts TensorFlow's profiler server
  in the task once the program has imported ``tensorflow`` and leaves notes in
  ``<trace dir>/tasks/`` (:func:`read_notes`);
- the window: :class:`TraceTrigger` watches the leader's output (worker 0 or the chief) for
  ``supervision.step_pattern`` (``--trace FIRST:COUNT``: from the first step line at or past
  FIRST, for COUNT steps at the rate seen so far) or the clock (``--trace-at``/``--trace-for``);
- the capture: a helper process (``python -m tflaunch.models.trace_capture``, which loads
  TensorFlow's profiler client) waits from the start; when the window opens it asks every task
  that imported TensorFlow for the same wall-clock window at once and merges what it gets into ``trace.json`` and the summary.

Each task's hook writes into its own host's trace directory (:func:`host_trace_dir`: the agent's
run directory's ``trace/``), and the agents carry its notes, the window and (asked) its files to
the coordinator over their links (:mod:`tflaunch.runtime.tracehost`). Where the helper runs and
how the hosts' profiles meet is a :class:`TraceSite`: by default beside the coordinator (local;
Slurm, whose coordinator runs inside the allocation; a detached SSH run's coordinator on the first
host), the other hosts' agents sending their profiles over their links; a backend whose
coordinator reaches no task's profiler port gives its own (``Backend.trace_site``: attached ssh
runs the helper on the leader's host and copies the profiles there).

Whatever happens, the run's trace directory ends with ``verdict.json``: a trace, or one line
saying why there is none (:func:`read_verdict`). Programs on ``tflaunch.models``' own trace hooks
(the benchmark) take their trace themselves, from their first worker: they leave an ``inprogram``
note, the launcher opens no window, and the site fetches what that worker wrote from its host (on
the note, every host whose directory is not the coordinator's is asked to send its files at its
end), so the verdict names the trace wherever it was written.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tflaunch.models.trace_format import DIR_ENV, PORT_OFFSET_ENV, STEPS_ENV, parse_window
from tflaunch.runtime import protocol
from tflaunch.runtime.runfiles import open_run_file, write_run_file

HOOK_ENV = "TFLAUNCH_TRACE_HOOK"  # "1": the agent installs the hook in the task's Python
AT_ENV = "TFLAUNCH_TRACE_AT"  # seconds after the cluster started
FOR_ENV = "TFLAUNCH_TRACE_FOR"  # seconds of capture
HOOK_DIR = Path(__file__).resolve().parent / "sitehook"
VERDICT_FILE = "verdict.json"
WINDOW_FILE = "window.json"  # read by the hook: tasks that end inside the window wait for it
NOTES_DIR = "tasks"
IN_PROGRAM_SUFFIX = ".inprogram"  # the note of a task on tflaunch.models' own trace hooks
CAPTURE_LOG = "capture.log"
CAPTURE_MODULE = "tflaunch.models.trace_capture"
# Tracing slows steps (2-3x measured on 2 cores); the capture covers the window at that pace,
# plus the time the profilers take to start.
PROFILED_SLOWDOWN = 3.0
CAPTURE_SLACK_S = 1.0
HELPER_MARGIN_S = 120.0  # after the capture's end, for decoding and merging
FIX_LOADED = "loaded"  # the hook's note when tflaunch's fix for TensorFlow's profiler is in
# A traced task that dies by one of these from the window's start until this long after its end
# (the profiler collects and hands its events over then) is reported as a likely profiler crash.
CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS)
COLLECT_MARGIN_S = 60.0


def host_trace_dir(run_dir: str | os.PathLike) -> Path:
    """The trace directory of the tasks whose agent's run directory is ``run_dir``: the run's
    own where the hosts share it (local, Slurm), each host's own over SSH."""
    return Path(os.path.expanduser(run_dir)).resolve() / "trace"


def with_hook(env: Mapping[str, str], run_dir: str | os.PathLike | None = None) -> dict[str, str]:
    """A traced task's environment: the hook's folder first on ``PYTHONPATH``, and (given the
    agent's ``run_dir``) the trace directory of its host (:func:`host_trace_dir`), where its
    notes and profile go."""
    out = dict(env)
    if out.get(HOOK_ENV) == "1":
        rest = out.get("PYTHONPATH", "")
        out["PYTHONPATH"] = str(HOOK_DIR) + (os.pathsep + rest if rest else "")
        if run_dir is not None:
            out[DIR_ENV] = str(host_trace_dir(run_dir))
    return out


@dataclass(frozen=True)
class TraceRequest:
    """What ``up --trace`` asked for, as the plan's environment carries it."""

    trace_dir: Path
    port_offset: int
    first_step: int | None = None
    steps: int | None = None
    at_s: float | None = None
    for_s: float | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TraceRequest | None:
        if env.get(HOOK_ENV) != "1" or not env.get(DIR_ENV):
            return None
        window = parse_window(env[STEPS_ENV]) if env.get(STEPS_ENV) else None
        return cls(
            Path(os.path.expanduser(env[DIR_ENV])),
            int(env.get(PORT_OFFSET_ENV) or 10000),
            window.first if window else None,
            window.count if window else None,
            float(env[AT_ENV]) if env.get(AT_ENV) else None,
            float(env[FOR_ENV]) if env.get(FOR_ENV) else None,
        )


def request_env(
    trace_dir: str,
    port_offset: int,
    steps: str | None,
    at_s: float | None,
    for_s: float | None,
) -> dict[str, str]:
    """The environment every task of a traced run gets (read back by :class:`TraceRequest`)."""
    env = {HOOK_ENV: "1", DIR_ENV: trace_dir, PORT_OFFSET_ENV: str(port_offset)}
    if steps:
        env[STEPS_ENV] = str(parse_window(steps))
    if at_s is not None:
        env[AT_ENV] = repr(float(at_s))
    if for_s is not None:
        env[FOR_ENV] = repr(float(for_s))
    return env


@dataclass(frozen=True)
class Notes:
    """What the tasks' hooks noted: which ran Python, which imported TensorFlow (and on which
    profiler port), which failed to start a server, which take their own trace, and what came
    of the fix for TensorFlow's profiler in each (``"loaded"`` or why not)."""

    python: frozenset[str]
    tf_ports: Mapping[str, int]
    errors: Mapping[str, str]
    in_program: frozenset[str]
    fixes: Mapping[str, str] = dataclasses.field(default_factory=dict)


def read_notes(trace_dir: Path) -> Notes:
    folder = trace_dir / NOTES_DIR
    python, in_program, ports, errors, fixes = set(), set(), {}, {}, {}
    for path in sorted(folder.glob("*.*")) if folder.is_dir() else []:
        task, kind = path.stem.replace("-", ":", 1), path.suffix[1:]
        if kind == "python":
            python.add(task)
        elif kind == "inprogram":
            in_program.add(task)
        elif kind == "tf":
            try:
                note = json.loads(path.read_text())
            except ValueError:
                continue
            if "error" in note:
                errors[task] = str(note["error"])
            else:
                ports[task] = int(note["port"])
                fixes[task] = str(note.get("profiler_fix", "not known (an older hook)"))
    return Notes(frozenset(python), ports, errors, frozenset(in_program), fixes)


def write_verdict(trace_dir: Path, ok: bool, line: str) -> None:
    trace_dir.mkdir(parents=True, exist_ok=True)
    write_run_file(trace_dir / VERDICT_FILE, json.dumps({"ok": ok, "line": line}) + "\n")


def read_verdict(trace_dir: Path) -> tuple[bool, str] | None:
    try:
        data = json.loads((trace_dir / VERDICT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return bool(data.get("ok")), str(data.get("line", ""))


class Helper:
    """The capture helper as the trigger drives it: started ahead of the window, given one
    order (or none: the end of its input), awaited. This one: a child process of this one."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def order(self, line: str) -> None:
        """Hand over the window's order and end the helper's input."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line)
            self.proc.stdin.close()
        except OSError:
            pass  # it died: the trigger says why from its log

    def end_input(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float) -> int | None:
        """Its exit code, or None when it did not end within ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


class TraceSite:
    """Where a traced run's files are and where its capture runs, as the trigger sees them.

    This one runs the capture helper on the coordinator's machine, which must reach every
    task's profiler port (local, Slurm's first node, a detached SSH run's first host). ``dir``
    is the coordinator's trace directory: the verdict, the capture's log and, at the end, the
    trace. Each host's tasks keep their notes and profiles in their host's own trace directory
    (:func:`host_trace_dir`); the agents report the notes over the link as they appear
    (:meth:`received`), write the window where their hooks read it (:meth:`publish_window`) and,
    when their directory is not this one, send their files at their end (``TraceCollect``), which
    are then merged here (:meth:`collect`). A backend whose coordinator reaches no profiler port
    subclasses it (``Backend.trace_site``)."""

    gathers = True  # the hosts' files come over the agents' links (a subclass may fetch them)

    def __init__(self, trace_dir: Path):
        self.dir = trace_dir
        self.send: Callable[[protocol.Command, str | None], None] | None = None
        self.host_dirs: dict[str, str] = {}  # host -> its trace directory (as the agent said)
        self.task_hosts: dict[str, str] = {}  # task -> host, from the notes' senders
        self.asked: set[str] = set()  # hosts told to send their files
        self.sent: dict[str, protocol.TraceSent] = {}
        self.merge_pending: dict[str, str] | None = None  # the order's tasks, to merge here

    def connect(self, send: Callable[[protocol.Command, str | None], None]) -> None:
        """The coordinator's way to its agents (commands to one host, or every host)."""
        self.send = send

    # -- what the agents report --------------------------------------------------------------

    def received(self, host: str, event: protocol.Event) -> None:
        if isinstance(event, protocol.TraceNote):
            self._note(host, event)
        elif isinstance(event, protocol.TraceFile):
            self._file(host, event)
        elif isinstance(event, protocol.TraceSent):
            self.sent[host] = event

    def _note(self, host: str, note: protocol.TraceNote) -> None:
        if note.dir:
            self.host_dirs[host] = note.dir
        name = note.name
        if not name or "/" in name or name.startswith("."):
            return
        self.task_hosts[name.rpartition(".")[0].replace("-", ":", 1)] = host
        if name.endswith(IN_PROGRAM_SUFFIX):
            self._ask_host(host)  # a program's own trace: the window may never open here
        path = self.dir / NOTES_DIR / name
        with contextlib.suppress(OSError):
            if path.read_text(errors="replace") == note.text:
                return  # a file system shared with the host: its own file
        path.parent.mkdir(parents=True, exist_ok=True)
        write_run_file(path, note.text)

    def _file(self, host: str, piece: protocol.TraceFile) -> None:
        parts = PurePosixPath(piece.path).parts
        if not parts or piece.path.startswith("/") or ".." in parts:
            return
        path = self.dir.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        if piece.offset and (not path.exists() or path.stat().st_size != piece.offset):
            return  # a piece out of order (one link keeps them in order): the file stays cut
        with open_run_file(path, "ab" if piece.offset else "wb") as f:
            f.write(base64.b64decode(piece.data))

    def _ask_host(self, host: str) -> None:
        """Have ``host``'s agent send its files at its end, if they are not here already.
        Programs on ``tflaunch.models``' own trace hooks write their trace from their first
        worker, on whichever host that is, whether or not the launcher's window opens: every
        host that notes such a task is asked as soon as the note comes."""
        folder = self.host_dirs.get(host)
        if self.send is None or not self.gathers or host in self.asked or folder is None:
            return
        if _same_path(folder, self.dir):
            return
        self.asked.add(host)
        self.send(protocol.TraceCollect(to=str(self.dir)), host)

    def drain_s(self) -> float:
        """How much longer the teardown should wait for hosts still sending files."""
        return HELPER_MARGIN_S / 2 if self.asked - set(self.sent) else 0.0

    # -- what the trigger asks ---------------------------------------------------------------

    def notes(self) -> Notes:
        return read_notes(self.dir)

    def publish_window(self, text: str) -> None:
        """``window.json`` here and, through the agents, where every task's hook reads it."""
        write_run_file(self.dir / WINDOW_FILE, text)
        if self.send is not None:
            window = json.loads(text)
            self.send(protocol.TraceWindow(start=window["start"], end=window["end"]), None)

    def ask_files(self) -> None:
        """Have every agent whose trace directory is not this one send its files at its end."""
        if self.send is None or not self.gathers:
            return
        self.asked |= {h for h, d in self.host_dirs.items() if not _same_path(d, self.dir)}
        if self.asked:
            self.send(protocol.TraceCollect(to=str(self.dir)), None)

    def task_dirs(self, tasks: Mapping[str, str]) -> dict[str, str]:
        """Each task's trace directory on its host, where that is not this site's."""
        out = {}
        for task in tasks:
            folder = self.host_dirs.get(self.task_hosts.get(task, ""))
            if folder and not _same_path(folder, self.dir):
                out[task] = folder
        return out

    def order(self, order: dict[str, Any]) -> dict[str, Any]:
        """The helper's order: every task's profile saved under its own host's directory;
        where some are elsewhere, capture only — the merge waits for their files
        (:meth:`collect`)."""
        dirs = self.task_dirs(order["tasks"])
        if not dirs:
            return order
        self.ask_files()
        self.merge_pending = dict(order["tasks"])
        return {**order, "dirs": dirs, "merge": False}

    def start_helper(self) -> Helper:
        """The capture helper, here. It stays in the launcher's process group: Ctrl-C ends it."""
        self.dir.mkdir(parents=True, exist_ok=True)
        log = open_run_file(self.dir / CAPTURE_LOG, "w")
        argv = [sys.executable, "-m", CAPTURE_MODULE, str(self.dir)]
        env = {k: v for k, v in os.environ.items() if k != HOOK_ENV}
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.PIPE, env=env, text=True
        )
        log.close()
        return Helper(proc)

    def collect(self) -> None:
        """Bring what the capture (or a program's own hooks) wrote into ``dir``: the other
        hosts' files came over the links (by now: their agents ended); merge them here."""
        missing = sorted(self.asked - set(self.sent))
        errors = [f"{h}: {e.error}" for h, e in sorted(self.sent.items()) if e.error]
        with open_run_file(self.dir / CAPTURE_LOG, "a") as log:
            for host, sent in sorted(self.sent.items()):
                log.write(f"{host} sent {len(sent.files)} file(s), {sent.bytes} bytes\n")
            if missing or errors:
                log.write(f"no files from {', '.join(missing + errors)}\n")
        if self.merge_pending is None:
            return
        argv = [sys.executable, "-m", CAPTURE_MODULE, str(self.dir), "--merge"]
        argv += ["--tasks", json.dumps(self.merge_pending)]
        env = {k: v for k, v in os.environ.items() if k != HOOK_ENV}
        with open_run_file(self.dir / CAPTURE_LOG, "a") as log:
            subprocess.run(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                timeout=HELPER_MARGIN_S,
                check=False,
            )


def _same_path(path: str, folder: Path) -> bool:
    """Whether ``path`` (a host's directory) is ``folder``: the same string, or (a file system
    shared with the host) the same directory."""
    if os.path.normpath(path) == os.path.normpath(str(folder)):
        return True
    try:
        return os.path.samefile(path, folder)
    except OSError:
        return False


class TraceTrigger:
    """Opens the capture window once, from the leader's step lines or the clock, and says at
    the end what came of it. ``now`` is ``time.monotonic()``; the caller feeds lines and ticks."""

    def __init__(
        self,
        request: TraceRequest,
        leader: str,
        addresses: Mapping[str, str],
        program: str,
        say: Callable[[str], None],
        started: float,
        site: TraceSite | None = None,
    ):
        self.request = request
        self.site = site or TraceSite(request.trace_dir)
        self.leader = leader
        self.addresses = dict(addresses)  # task -> cluster host:port
        self.program = program
        self.say = say
        self.started = started
        self.seen: list[tuple[float, int]] = []  # the leader's (time, step) so far
        self.helper: Helper | None = None
        self.helper_error = ""
        self.fired = False
        self.window: tuple[float, float] | None = None  # monotonic start and end of the capture
        self.fixes: dict[str, str] = {}  # traced task -> what became of the profiler fix
        self.helper_deadline = 0.0
        self.in_program = False  # the program takes its own trace (tflaunch.models' hooks)
        self.verdict: tuple[bool, str] | None = None

    # -- the window ---------------------------------------------------------------------------

    def step(self, task: str, step: int, now: float) -> None:
        """``task`` printed step ``step`` (added up as :mod:`tflaunch.runtime.progress` does) at
        ``now`` on any one clock (the agent's): only the rate between step lines is read."""
        if task != self.leader or self.request.first_step is None or self._done():
            return
        self.seen.append((now, step))
        if step < self.request.first_step:
            return
        seconds = self.request.for_s or self._window_seconds()
        if seconds is not None:
            self._fire(seconds, f"at step {step}")

    def tick(self, now: float) -> None:
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
        assert self.request.steps is not None
        per_step = (t1 - t0) / (s1 - s0)
        return self.request.steps * per_step * PROFILED_SLOWDOWN + CAPTURE_SLACK_S

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
            self._end(False, self._why_none(notes, f"when the window opened ({when})"))
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
        self.site.publish_window(
            json.dumps({"start": time.time(), "end": time.time() + seconds}) + "\n"
        )
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

    def _why_none(self, notes: Notes, when: str) -> str:
        if not notes.python:
            return (
                f"no trace because no task ran Python (program '{self.program}'): the trace hook "
                "works only in Python programs that import TensorFlow"
            )
        if notes.errors:
            task, error = sorted(notes.errors.items())[0]
            return f"no trace because {task}'s profiler server did not start: {error}"
        return (
            f"no trace because no task had imported TensorFlow {when} "
            f"({len(notes.python)} task(s) ran Python)"
        )

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
                return self._end(False, self._why_none(notes, "before the run ended"))
            if self.request.first_step is not None:
                last = f"its last was step {self.seen[-1][1]}" if self.seen else "it printed none"
                why = (
                    f"{self.leader} printed no step line at or past step "
                    f"{self.request.first_step} (see supervision.step_pattern; {last})"
                )
                if self.seen and self.seen[-1][1] >= self.request.first_step:
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
        """The verdict on a program that took its own trace (``tflaunch.models``' hooks, from
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

    def _end(self, ok: bool, line: str) -> tuple[bool, str]:
        self.verdict = (ok, line)
        write_verdict(self.site.dir, ok, line)
        return self.verdict


def _last_line(path: Path) -> str:
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "no log"
    errors = [x for x in lines if "rror" in x]
    return (errors or lines or ["no output"])[-1].strip()[:300]
