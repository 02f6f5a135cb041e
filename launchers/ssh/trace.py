"""``up --trace`` of any program on SSH hosts, attached: the capture runs on the leader's host.

The launcher (an attached run's coordinator) reaches the hosts only through SSH: the tasks'
profiler ports are on the hosts' private network, and each task's hook leaves its notes in its
own host's trace directory (``<the host's run directory>/trace``). The agents report the notes
and write the capture window on their hosts over their links (:mod:`tflaunch.trace.links`,
as in every run); this trace site (:class:`tflaunch.trace.site.TraceSite`) then:

- starts the capture helper (``python -m tflaunch.trace.capture``, ``ssh.python``) on the
  host of the leader (the chief, else worker 0), which reaches every task's private address and
  has TensorFlow; its order goes down the channel's input (``"merge": false``: capture only,
  each task's profile under its own host's trace directory) and its output comes back into the
  local ``capture.log``;
- once it captured: copies the other hosts' profiles over SFTP into the leader host's ``raw/``
  (``copied ...`` lines in capture.log), and runs the merge there (``--merge``);
- then copies the host's trace directory (trace.json, the summary, ``raw/``) into the local one,
  where ``up`` shows it as for a local run.

Tunnelling every profiler port to the launcher instead would need TensorFlow on the laptop to
decode and merge, and would pull the raw XPlanes of every task through the launcher's link. A
detached run's coordinator runs on the first host, which reaches the profiler ports: it uses the
plain :class:`~tflaunch.trace.site.TraceSite`, the other agents sending their files over
their links.
"""

from __future__ import annotations

import contextlib
import errno
import json
import posixpath
import stat
import threading
import time
from pathlib import Path

import paramiko

from tflaunch.launchers.ssh.connect import Connection, remote_command
from tflaunch.launchers.ssh.session import HostSession, same_file, sftp_makedirs
from tflaunch.plugin import Plan, Run, TraceSite, is_component, open_run_file
from tflaunch.trace.files import CAPTURE_LOG, NOTES_DIR
from tflaunch.trace.format import TRACE_FILE
from tflaunch.trace.site import CAPTURE_MODULE, HELPER_MARGIN_S, Helper

POLL_S = 0.1


class RemoteHelper(Helper):
    """The capture helper in an SSH channel: its order on the channel's input, its output
    (stdout and stderr) copied into the local ``capture.log`` as it comes."""

    def __init__(self, channel: paramiko.Channel, log: Path):
        self.channel = channel
        self._pump = threading.Thread(target=self._copy, args=(log,), daemon=True)
        self._pump.start()

    def _copy(self, log: Path) -> None:
        with open_run_file(log, "w") as out, contextlib.suppress(OSError, EOFError):
            for line in self.channel.makefile("r"):
                out.write(line)
                out.flush()

    def order(self, line: str) -> None:
        """The order, as capture only: the merge waits for the other hosts' profiles."""
        order = {**json.loads(line), "merge": False}
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self.channel.sendall((json.dumps(order) + "\n").encode())
        self.end_input()

    def end_input(self) -> None:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self.channel.shutdown_write()

    def running(self) -> bool:
        return not self.channel.exit_status_ready() and not self.channel.closed

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while self.running():
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)
        self._pump.join(max(0.0, deadline - time.monotonic()) + 1)
        return self.channel.recv_exit_status() if self.channel.exit_status_ready() else 1

    def kill(self) -> None:
        """Close the channel (the helper's capture ends on its own: it reads no more input)."""
        self.channel.close()


class SshTraceSite(TraceSite):
    """The trace of an attached SSH run: notes and window through the agents, the capture on
    the leader's host, the other hosts' profiles copied to it over SFTP, the result copied back
    (see the module's docstring)."""

    gathers = False  # the profiles go host to host over SFTP, not through the launcher's links

    def __init__(self, session: HostSession, plan: Plan, run: Run, python: str):
        super().__init__(run.dir / "trace")
        self.session = session
        self.python = python
        self.hosts = [h.name for h in plan.hosts_with_tasks()]
        tasks = {t.name: t for t in plan.tasks}
        leader = tasks.get("chief:0") or tasks.get("worker:0") or plan.tasks[0]
        self.leader_host = leader.host
        # each host's trace directory (the agents say the same in their notes)
        self.host_dirs = {h: posixpath.join(session.paths[h].run_dir, "trace") for h in self.hosts}
        self.task_hosts = {t.name: t.host for t in plan.tasks}

    def _conn(self, host: str) -> Connection:
        return self.session.connections[host]

    def start_helper(self) -> Helper:
        conn = self._conn(self.leader_host)
        remote = self.host_dirs[self.leader_host]
        with conn.sftp() as sftp:
            sftp_makedirs(sftp, remote)
        channel = conn.transport.open_session(timeout=30)
        channel.set_combine_stderr(True)
        channel.exec_command(remote_command([self.python, "-m", CAPTURE_MODULE, remote]))
        self.dir.mkdir(parents=True, exist_ok=True)
        return RemoteHelper(channel, self.dir / CAPTURE_LOG)

    def collect(self) -> None:
        """After a capture: the other hosts' profiles gathered on the leader's host and merged
        there; then the trace directory of the host that holds the trace (the leader's, else —
        a program's own hooks write from its first worker — the first other host that has one)
        into the local one, less the notes and log kept already."""
        if self.merge_pending is not None:
            self._gather_and_merge(self.merge_pending)
        others = [h for h in self.hosts if h != self.leader_host]
        for host in [self.leader_host, *others]:
            remote = self.host_dirs[host]
            with self._conn(host).sftp() as sftp:
                try:
                    sftp.stat(posixpath.join(remote, TRACE_FILE))
                except FileNotFoundError:
                    continue
                fetch_tree(sftp, remote, self.dir, frozenset({NOTES_DIR, CAPTURE_LOG}))
                return

    def _gather_and_merge(self, tasks: dict[str, str]) -> None:
        """Copy the profiles the other hosts' servers saved (under their own trace directory's
        raw/) into the leader host's raw/; run the merge there, its output appended to the local
        capture.log."""
        leader = self._conn(self.leader_host)
        raw = posixpath.join(self.host_dirs[self.leader_host], "raw")
        copied = []
        for host in self.hosts:
            if host != self.leader_host:
                source_raw = posixpath.join(self.host_dirs[host], "raw")
                with self._conn(host).sftp() as source, leader.sftp() as target:
                    copied += _copy_tree(source, target, source_raw, raw)
        argv = [self.python, "-m", CAPTURE_MODULE, posixpath.dirname(raw), "--merge"]
        result = leader.run(
            remote_command([*argv, "--tasks", json.dumps(tasks)]), timeout=HELPER_MARGIN_S
        )
        with open_run_file(self.dir / CAPTURE_LOG, "a") as log:
            for line in copied:
                log.write(f"copied {line}\n")
            log.write(result.stdout + result.stderr)


FETCH_DEPTH = 8  # a trace directory is trace/raw/plugins/profile/<run>/: deeper is not ours


def fetch_tree(
    sftp: paramiko.SFTPClient,
    remote: str,
    local: Path,
    skip: frozenset[str] = frozenset(),
    depth: int = FETCH_DEPTH,
) -> None:
    """Copy ``remote`` (a folder) into ``local``, but not the names in ``skip`` at its top, nor
    a file that is the local one (a file system shared with the host), nor one whose local copy
    has its size and is no older.

    The host's listing is untrusted: only names that are one path component
    (:func:`~tflaunch.runtime.runfiles.is_component`) of regular files and folders are copied,
    at most ``depth`` folders deep; a symlink on either side is never followed, so nothing is
    written outside ``local``."""
    if depth <= 0 or local.is_symlink():
        return
    try:
        entries = sftp.listdir_attr(remote)
    except FileNotFoundError:
        return
    local.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        name, mode = entry.filename, entry.st_mode or 0
        if name in skip or not is_component(name):
            continue
        source, target = posixpath.join(remote, name), local / name
        if stat.S_ISDIR(mode):
            fetch_tree(sftp, source, target, depth=depth - 1)
        elif stat.S_ISREG(mode) and not same_file(source, target) and not _have(target, entry):
            try:
                with open_run_file(target, "wb") as f:
                    sftp.getfo(source, f)
            except IsADirectoryError:
                continue  # a folder here where the host has a file: left as it is
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise  # ELOOP: a symlink planted at the name, never written through


def _have(local: Path, entry: paramiko.SFTPAttributes) -> bool:
    try:
        info = local.stat()
    except OSError:
        return False
    return info.st_size == entry.st_size and info.st_mtime >= (entry.st_mtime or 0)


def _copy_tree(
    source: paramiko.SFTPClient, target: paramiko.SFTPClient, path: str, to: str
) -> list[str]:
    """The folder ``path`` of one host into ``to`` on another; files the target already has
    at the same size are left. What was copied, as ``from -> to`` lines."""
    try:
        entries = source.listdir_attr(path)
    except FileNotFoundError:
        return []
    sftp_makedirs(target, to)
    copied = []
    for entry in entries:
        if not is_component(entry.filename):
            continue  # a listing is untrusted: nothing is written outside ``to``
        name, there = posixpath.join(path, entry.filename), posixpath.join(to, entry.filename)
        if stat.S_ISDIR(entry.st_mode or 0):
            copied += _copy_tree(source, target, name, there)
            continue
        if not stat.S_ISREG(entry.st_mode or 0):
            continue
        with contextlib.suppress(FileNotFoundError):
            if target.stat(there).st_size == entry.st_size:
                continue
        with source.open(name, "rb") as f:
            data = f.read()
        with target.open(there, "wb") as f:
            f.write(data)
        copied.append(f"{name} -> {there}")
    return copied
