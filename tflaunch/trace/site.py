"""Where a traced run's capture runs and how the hosts' files meet: the trace site, the part of
``up --trace`` beside the coordinator.

:class:`TraceSite` runs the capture helper (``python -m tflaunch.trace.capture``, a child process
that loads TensorFlow's profiler client, driven as a :class:`Helper`) on the coordinator's
machine, which must reach every task's profiler port: local, Slurm (whose coordinator runs inside
the allocation), a detached SSH run's coordinator on the first host. The agents
(:mod:`tflaunch.trace.links`) report their hosts' notes over their links, write the window where
their hooks read it and, asked, send their files at their end, which are merged here. A backend
whose coordinator reaches no task's profiler port gives a subclass (``Backend.trace_site``:
attached ssh, :mod:`tflaunch.launchers.ssh.trace`, runs the helper on the leader's host and
copies the profiles there over SFTP). Nothing here imports TensorFlow.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tflaunch.runtime import protocol
from tflaunch.runtime.runfiles import (
    RunFileError,
    is_component,
    open_run_file,
    open_run_folder,
    write_run_file,
)
from tflaunch.trace.files import (
    CAPTURE_LOG,
    IN_PROGRAM_SUFFIX,
    MAX_SHIP,
    NOTES_DIR,
    VERDICT_FILE,
    WINDOW_FILE,
    Notes,
    read_notes,
)
from tflaunch.trace.request import HOOK_ENV

CAPTURE_MODULE = "tflaunch.trace.capture"
HELPER_MARGIN_S = 120.0  # after the capture's end, for decoding and merging
NOTE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*\.[A-Za-z0-9_]+")  # worker-1.tf
MAX_NAME = 255  # bytes of one path component (Linux's NAME_MAX)
MAX_PATH = 4096  # characters of a path from a host
RESERVED = frozenset({NOTES_DIR, WINDOW_FILE, VERDICT_FILE, CAPTURE_LOG})  # this site's own
# What a host's file path running into something else than a file gives: its message's fault.
NOT_A_FILE = frozenset({errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ELOOP, errno.ENAMETOOLONG})


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
        self.bytes_in: dict[str, int] = {}  # host -> bytes of trace files written here
        self.written: set[tuple[str, ...]] = set()  # the hosts' files written here, as parts

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
        """A host's note, kept under ``tasks/`` here. A name that is not a note's (one
        component, ``<task>.<kind>``) or a ``dir`` that is not a clean absolute path is a
        malformed message (``ValueError``)."""
        name = note.name
        if not NOTE_NAME.fullmatch(name) or len(name.encode()) > MAX_NAME:
            raise ValueError(f"name {name[:80]!r}: not a trace note's file name (TASK.KIND)")
        if note.dir:
            self.host_dirs[host] = _host_dir(note.dir)
        self.task_hosts[name.rpartition(".")[0].replace("-", ":", 1)] = host
        if name.endswith(IN_PROGRAM_SUFFIX):
            self._ask_host(host)  # a program's own trace: the window may never open here
        data = note.text.encode(errors="replace")
        try:
            with self._folder([NOTES_DIR]) as folder:
                if _read_at(folder, name, len(data) + 1) == data:
                    return  # a file system shared with the host: its own file
                _write_at(folder, name, data, append=False)
        except RunFileError as e:  # tasks/ is a symlink (planted) or a file
            raise ValueError(f"name {name!r}: {e}") from e

    def _file(self, host: str, piece: protocol.TraceFile) -> None:
        """A piece of a host's file, written under this directory. A path that is not relative
        and clean (``..``, absolute, NUL, a hidden component), data that is not base64, an
        offset or size out of bounds, or more than a host may send, is a malformed message
        (``ValueError``); a write that fails (a full disk) raises ``OSError``."""
        parts = _relative_parts(piece.path)
        if parts[0] in RESERVED:
            return  # this site's own files (the agent never sends them)
        if not 0 <= piece.offset <= piece.size <= MAX_SHIP:
            raise ValueError(
                f"offset {piece.offset}, size {piece.size}: not 0 <= offset <= size <= {MAX_SHIP}"
            )
        try:
            data = base64.b64decode(piece.data, validate=True)
        except binascii.Error as e:
            raise ValueError(f"data: not base64 ({e})") from e
        if piece.offset + len(data) > piece.size:
            raise ValueError(f"{len(data)} bytes at offset {piece.offset}: past its size")
        received = self.bytes_in.get(host, 0) + len(data)
        if received > MAX_SHIP:
            raise ValueError(f"more than the {MAX_SHIP} bytes of trace files a host sends")
        self.bytes_in[host] = received
        try:
            with self._folder(parts[:-1]) as folder:
                if piece.offset and _size_at(folder, parts[-1]) != piece.offset:
                    return  # a piece out of order (one link keeps them in order): it stays cut
                self.written.add(tuple(parts))
                _write_at(folder, parts[-1], data, append=bool(piece.offset))
        except RunFileError as e:  # a folder of the path is a symlink (planted) or a file
            raise ValueError(f"path {piece.path[:200]!r}: {e}") from e
        except OSError as e:
            if e.errno in NOT_A_FILE:  # the path runs into a file, a directory or a symlink
                raise ValueError(f"path {piece.path[:200]!r}: {e.strerror}") from e
            self.discard()  # a full disk: no part of the hosts' files stays to take its room
            raise

    @contextlib.contextmanager
    def _folder(self, parts: Sequence[str]) -> Iterator[int]:
        """The folder ``parts`` under this directory, made where missing, reached without
        following a symlink at any component (:func:`open_run_folder`)."""
        self.dir.mkdir(parents=True, exist_ok=True)  # the site's own, as it was given
        folder = open_run_folder(self.dir, parts, create=True)
        try:
            yield folder
        finally:
            os.close(folder)

    def discard(self) -> None:
        """Remove every file the hosts sent here (the collection stopped: what came is no
        trace, and a full disk gets its room back for the run's own end record)."""
        for parts in sorted(self.written):
            with contextlib.suppress(OSError), self._folder(parts[:-1]) as folder:
                os.unlink(parts[-1], dir_fd=folder)
        self.written.clear()

    def _ask_host(self, host: str) -> None:
        """Have ``host``'s agent send its files at its end, if they are not here already.
        Programs on :mod:`tflaunch.trace.profiler`'s own tracer write their trace from their first
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


def _write_at(folder: int, name: str, data: bytes, append: bool) -> None:
    """``data`` into ``name`` in ``folder`` (a descriptor), never through a symlink; a new file
    with the folder's mode without the search bits, as a run directory's files get."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    mode = stat.S_IMODE(os.fstat(folder).st_mode) & 0o666
    fd = os.open(name, flags | (os.O_APPEND if append else os.O_TRUNC), mode, dir_fd=folder)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _read_at(folder: int, name: str, limit: int) -> bytes | None:
    """At most ``limit`` bytes of the regular file ``name`` in ``folder``; None if none."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder
        )
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(limit) if stat.S_ISREG(os.fstat(fd).st_mode) else None


def _size_at(folder: int, name: str) -> int | None:
    try:
        return os.stat(name, dir_fd=folder, follow_symlinks=False).st_size
    except FileNotFoundError:
        return None


def _relative_parts(path: str) -> list[str]:
    """``path`` (a host's, relative to its trace directory) as components, each one clean: not
    empty, ``.``, ``..`` or hidden, no NUL, not too long; else ``ValueError``."""
    parts = path.split("/")
    if (
        not path
        or len(path) > MAX_PATH
        or not all(
            is_component(p) and not p.startswith(".") and len(p.encode()) <= MAX_NAME for p in parts
        )
    ):
        raise ValueError(f"path {path[:200]!r}: not a clean relative path")
    return parts


def _host_dir(path: str) -> str:
    """A host's trace directory as its agent gave it: a clean absolute POSIX path, else
    ``ValueError`` (it is only compared with this site's and named in the capture's order)."""
    parts = path.split("/")[1:]
    if (
        not path.startswith("/")
        or len(path) > MAX_PATH
        or not all(is_component(p) and len(p.encode()) <= MAX_NAME for p in parts)
    ):
        raise ValueError(f"dir {path[:200]!r}: not a clean absolute path")
    return path


def _same_path(path: str, folder: Path) -> bool:
    """Whether ``path`` (a host's directory) is ``folder``: the same string, or (a file system
    shared with the host) the same directory."""
    if os.path.normpath(path) == os.path.normpath(str(folder)):
        return True
    try:
        return os.path.samefile(path, folder)
    except OSError:
        return False
