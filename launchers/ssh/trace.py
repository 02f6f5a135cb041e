"""``up --trace`` of any program on SSH hosts: the capture runs on the leader's host.

The launcher (an attached run's coordinator) reaches the hosts only through SSH: the tasks'
profiler ports are on the hosts' private network, and each task's hook leaves its notes on its
own host's disk. So this trace site (:class:`tflaunch.runtime.tracehook.TraceSite`):

- reads the notes from every host over SFTP, into the local trace directory's ``tasks/``;
- writes ``window.json`` on every host, where the tasks' hooks look for it;
- starts the capture helper (``python -m tflaunch.models.trace_capture``, ``ssh.python``) on the
  host of the leader (the chief, else worker 0), which reaches every task's private address and
  has TensorFlow; its order goes down the channel's input (``"merge": false``: capture only) and
  its output comes back into the local ``capture.log``;
- once it captured: every task's profiler server saved its XPlane under the helper's ``raw/``
  path *on its own host*, so the other hosts' files are copied to the leader's host, and the
  helper's merge runs there (``--merge``);
- then copies the host's trace directory (trace.json, the summary, ``raw/``) into the local one,
  where ``up`` shows it as for a local run.

Tunnelling every profiler port to the launcher instead would need TensorFlow on the laptop to
decode and merge, and would pull the raw XPlanes of every task through the launcher's link.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import paramiko

from tflaunch.cluster.plan import Plan
from tflaunch.launchers.ssh.connect import Connection, parallel, remote_command
from tflaunch.launchers.ssh.session import HostSession, remote_path, sftp_makedirs
from tflaunch.models.trace_format import DIR_ENV, TRACE_FILE
from tflaunch.runtime.run import Run
from tflaunch.runtime.runfiles import open_run_file, write_run_file
from tflaunch.runtime.tracehook import (
    CAPTURE_LOG,
    CAPTURE_MODULE,
    HELPER_MARGIN_S,
    NOTES_DIR,
    WINDOW_FILE,
    Helper,
    Notes,
    TraceSite,
    read_notes,
)

POLL_S = 0.1


class RemoteHelper(Helper):
    """The capture helper in an SSH channel: its order on the channel's input, its output
    (stdout and stderr) copied into the local ``capture.log`` as it comes."""

    def __init__(self, channel: paramiko.Channel, log: Path, ordered: Callable[[dict], None]):
        self.channel = channel
        self.ordered = ordered  # told the order (the tasks), to merge them later
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
        self.ordered(order)
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
    """The trace of an attached SSH run: notes and window on every host, the capture on the
    leader's host, the result copied back (see the module's docstring)."""

    def __init__(self, session: HostSession, plan: Plan, run: Run, python: str):
        super().__init__(run.dir / "trace")
        self.session = session
        self.python = python
        self.written = plan.program.env[DIR_ENV]  # as the tasks got it: ~ is each host's home
        self.hosts = [h.name for h in plan.hosts_with_tasks()]
        tasks = {t.name: t for t in plan.tasks}
        leader = tasks.get("chief:0") or tasks.get("worker:0") or plan.tasks[0]
        self.leader_host = leader.host
        self._homes: dict[str, str] = {}
        self.order: dict | None = None  # the capture's order, once given

    def _conn(self, host: str) -> Connection:
        return self.session.connections[host]

    def remote_dir(self, host: str, sftp: paramiko.SFTPClient) -> str:
        """The trace directory on ``host``, absolute."""
        if host not in self._homes:
            self._homes[host] = sftp.normalize(".")
        return remote_path(self._homes[host], self.written)

    def notes(self) -> Notes:
        """Every host's notes, copied into the local ``tasks/`` (each host holds its own)."""
        folder = self.dir / NOTES_DIR

        def fetch(host: str) -> None:
            with self._conn(host).sftp() as sftp:
                remote = posixpath.join(self.remote_dir(host, sftp), NOTES_DIR)
                try:
                    names = [n for n in sftp.listdir(remote) if not n.startswith(".")]
                except FileNotFoundError:
                    return
                for name in names:
                    with contextlib.suppress(FileNotFoundError):
                        with sftp.open(posixpath.join(remote, name), "r") as f:
                            text = f.read().decode(errors="replace")
                        write_run_file(folder / name, text)

        folder.mkdir(parents=True, exist_ok=True)
        parallel(fetch, self.hosts)  # a host that does not answer: its tasks are not traced
        return read_notes(self.dir)

    def publish_window(self, text: str) -> None:
        def put(host: str) -> None:
            with self._conn(host).sftp() as sftp:
                remote = self.remote_dir(host, sftp)
                sftp_makedirs(sftp, remote)
                with sftp.open(posixpath.join(remote, WINDOW_FILE), "w") as f:
                    f.write(text)

        write_run_file(self.dir / WINDOW_FILE, text)
        parallel(put, self.hosts)

    def start_helper(self) -> Helper:
        conn = self._conn(self.leader_host)
        with conn.sftp() as sftp:
            remote = self.remote_dir(self.leader_host, sftp)
            sftp_makedirs(sftp, remote)
        channel = conn.transport.open_session(timeout=30)
        channel.set_combine_stderr(True)
        channel.exec_command(remote_command([self.python, "-m", CAPTURE_MODULE, remote]))
        self.dir.mkdir(parents=True, exist_ok=True)
        return RemoteHelper(channel, self.dir / CAPTURE_LOG, self._ordered)

    def _ordered(self, order: dict) -> None:
        self.order = order

    def collect(self) -> None:
        """Every host's notes again; after a capture, the other hosts' profiles gathered on the
        leader's host and merged there; then the trace directory of the host that holds the
        trace (the leader's, else — a program's own hooks write from its first worker — the
        first other host that has one) into the local one, less the notes and log kept
        already."""
        self.notes()
        if self.order is not None:
            self._gather_and_merge(self.order["tasks"])
        others = [h for h in self.hosts if h != self.leader_host]
        for host in [self.leader_host, *others]:
            with self._conn(host).sftp() as sftp:
                remote = self.remote_dir(host, sftp)
                try:
                    sftp.stat(posixpath.join(remote, TRACE_FILE))
                except FileNotFoundError:
                    continue
                _get_tree(sftp, remote, self.dir, skip={NOTES_DIR, CAPTURE_LOG})
                return

    def _gather_and_merge(self, tasks: dict[str, str]) -> None:
        """Copy the profiles the other hosts' servers saved (under the leader's raw path, as
        the helper named it) to the leader's host; run the merge there, its output appended to
        the local capture.log."""
        leader = self._conn(self.leader_host)
        with leader.sftp() as sftp:
            raw = posixpath.join(self.remote_dir(self.leader_host, sftp), "raw")
        for host in self.hosts:
            if host != self.leader_host:
                with self._conn(host).sftp() as source, leader.sftp() as target:
                    _copy_tree(source, target, raw)
        argv = [self.python, "-m", CAPTURE_MODULE, posixpath.dirname(raw), "--merge"]
        result = leader.run(
            remote_command([*argv, "--tasks", json.dumps(tasks)]), timeout=HELPER_MARGIN_S
        )
        with open_run_file(self.dir / CAPTURE_LOG, "a") as log:
            log.write(result.stdout + result.stderr)


def _get_tree(sftp: paramiko.SFTPClient, remote: str, local: Path, skip: set[str]) -> None:
    """Copy ``remote`` (a folder) into ``local``, but not the names in ``skip`` at its top, nor
    a file that is the local one (a file system shared with the host)."""
    try:
        entries = sftp.listdir_attr(remote)
    except FileNotFoundError:
        return
    local.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        if entry.filename in skip:
            continue
        source, target = posixpath.join(remote, entry.filename), local / entry.filename
        if stat.S_ISDIR(entry.st_mode or 0):
            _get_tree(sftp, source, target, set())
        elif not _same_file(source, target):
            with open_run_file(target, "wb") as f:
                sftp.getfo(source, f)


def _copy_tree(source: paramiko.SFTPClient, target: paramiko.SFTPClient, path: str) -> None:
    """``path`` (a folder) from one host to the same path on another; files the target already
    has at the same size are left (a file system the hosts share)."""
    try:
        entries = source.listdir_attr(path)
    except FileNotFoundError:
        return
    sftp_makedirs(target, path)
    for entry in entries:
        name = posixpath.join(path, entry.filename)
        if stat.S_ISDIR(entry.st_mode or 0):
            _copy_tree(source, target, name)
            continue
        with contextlib.suppress(FileNotFoundError):
            if target.stat(name).st_size == entry.st_size:
                continue
        with source.open(name, "rb") as f:
            data = f.read()
        with target.open(name, "wb") as f:
            f.write(data)


def _same_file(remote: str, local: Path) -> bool:
    try:
        return os.path.samefile(remote, local)
    except OSError:
        return False
