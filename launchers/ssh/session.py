"""A session with the hosts of one SSH run: connections, paths, files, logs.

One :class:`HostSession` serves attached runs (the SSH backend), detached runs (start, refresh,
down) and anything else that works on a run's hosts: it connects to every host in parallel,
resolves each host's working and run directories, uploads ``ssh.upload``, runs the pre-flight
check (:mod:`tflaunch.launchers.ssh.preflight`) and writes each host's plan, and later copies
logs back and reconnects to the hosts of an existing run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import paramiko

from tflaunch.config import ClusterConfig
from tflaunch.errors import LaunchError
from tflaunch.launchers.ssh.connect import Connection, SshOptions, close_all, connect_all, parallel
from tflaunch.launchers.ssh.preflight import format_table, raise_on_problems, run_preflight
from tflaunch.launchers.ssh.preflight import warnings as preflight_warnings
from tflaunch.launchers.ssh.setup import prepare_hosts
from tflaunch.link import agent_argv
from tflaunch.plan import Plan
from tflaunch.run import Run
from tflaunch.runfiles import open_run_file


def _safe_name(name: str) -> str:
    """A host name usable as one path component (names come from user files)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "host"


def remote_path(home: str, path: str) -> str:
    """A path on the host: ``~``/relative paths are under the remote home directory."""
    if path == "~":
        return home
    if path.startswith("~/"):
        path = path[2:]
    return posixpath.normpath(posixpath.join(home, path))


def sftp_makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    """``mkdir -p`` over SFTP."""
    parts = [p for p in path.split("/") if p]
    current = "/" if path.startswith("/") else ""
    for part in parts:
        current = posixpath.join(current, part)
        try:
            sftp.stat(current)
        except OSError:
            sftp.mkdir(current)


@dataclasses.dataclass
class HostPaths:
    """Where things live on one host."""

    workdir: str
    run_dir: str


class HostSession:
    """Connections to the hosts of one run, and where things live on each."""

    def __init__(self, out: IO[str] | None = None) -> None:
        self.connections: dict[str, Connection] = {}
        self.paths: dict[str, HostPaths] = {}
        self.out = out or sys.stderr

    def open(
        self, config: ClusterConfig, plan: Plan, run: Run, extra: Mapping[str, str] | None = None
    ) -> None:
        """Connect in parallel, prepare directories and uploads, pre-flight, write host plans."""
        options = SshOptions.from_section(config.ssh, config.base_dir)
        hosts = plan.hosts_with_tasks()
        self.say(f"connecting to {len(hosts)} host(s) as {options.user}")
        self.connections = connect_all([(h.name, h.connect_address) for h in hosts], options)
        for conn in self.connections.values():
            for note in conn.notes:
                self.say(note)
        self.paths = self._prepare(config, run)
        workdirs = {name: p.workdir for name, p in self.paths.items()}
        prepare_hosts(config, self.connections, workdirs, self.say, self.out, (run.dir.parent,))
        reports = run_preflight(self.connections, plan, config.ssh.python, workdirs)
        self.say("pre-flight:\n" + format_table(reports, plan))
        for warning in preflight_warnings(reports):
            self.say(f"warning: {warning}")
        raise_on_problems(reports)
        self._write_host_plans(plan, extra)
        resolved = tuple(
            dataclasses.replace(t, workdir=self.paths[t.host].workdir) for t in plan.tasks
        )
        run.write_plan(dataclasses.replace(plan, tasks=resolved))  # what the hosts run
        run.update_meta(
            ssh_hosts={name: dataclasses.asdict(p) for name, p in self.paths.items()},
            ssh_options=dataclasses.asdict(options),
            ssh_python=config.ssh.python,
        )

    def _prepare(self, config: ClusterConfig, run: Run) -> dict[str, HostPaths]:
        """Resolve each host's workdir and run dir; create the run dir; upload listed files."""
        uploads = [Path(config.base_dir) / os.path.expanduser(f) for f in config.ssh.upload]
        for path in uploads:
            if not path.is_file():
                raise LaunchError(
                    f"ssh.upload: {path} is not a file here; list files relative "
                    "to the cluster file."
                )
        run_base = config.ssh.remote_runs_dir or config.runs_dir

        def prepare(conn: Connection) -> HostPaths:
            with conn.sftp() as sftp:
                home = sftp.normalize(".")
                paths = HostPaths(
                    workdir=remote_path(home, config.workdir),
                    run_dir=remote_path(
                        home, posixpath.join(run_base, run.id, _safe_name(conn.name))
                    ),
                )
                sftp_makedirs(sftp, paths.run_dir)
                for private in (posixpath.dirname(paths.run_dir), paths.run_dir):
                    sftp.chmod(private, int(config.run_dir_mode, 8))  # plans hold env values
                if uploads:
                    sftp_makedirs(sftp, paths.workdir)
                    for path in uploads:
                        sftp.put(str(path), posixpath.join(paths.workdir, path.name))
            return paths

        results = parallel(prepare, self.connections.values())
        failures = [f"{c.name}: {err}" for c, _, err in results if err is not None]
        if failures:
            raise LaunchError(
                "cannot prepare the hosts (SFTP); nothing was started.\n  " + "\n  ".join(failures)
            )
        if uploads:
            self.say(f"uploaded {', '.join(p.name for p in uploads)} to every host's workdir")
        return {c.name: paths for c, paths, _ in results}

    def _write_host_plans(self, plan: Plan, extra: Mapping[str, str] | None = None) -> None:
        """Each host's plan.json (its tasks' workdir resolved there) and any extra files."""

        def write(conn: Connection) -> None:
            paths = self.paths[conn.name]
            workdir = paths.workdir
            tasks = tuple(
                dataclasses.replace(t, workdir=workdir) if t.host == conn.name else t
                for t in plan.tasks
            )
            files = {"plan.json": json.dumps(dataclasses.replace(plan, tasks=tasks).to_dict())}
            files.update(extra or {})
            with conn.sftp() as sftp:
                for name, text in files.items():
                    with sftp.open(posixpath.join(paths.run_dir, name), "w") as out:
                        out.chmod(0o600)
                        out.write(text)

        for conn, _, err in parallel(write, self.connections.values()):
            if err is not None:
                raise LaunchError(f"{conn.name}: cannot write the run files there ({err}).")

    def agent_argv(self, python: str, host: str) -> list[str]:
        """The agent's command line on ``host`` (its plan and logs in the host's run dir)."""
        run_dir = self.paths[host].run_dir
        return agent_argv(python, posixpath.join(run_dir, "plan.json"), host, run_dir)

    def fetch_logs(self, plan: Plan, run: Run) -> None:
        """Bring every task's log (what is new of it) from its host into the local run dir."""
        if not self.paths:
            return
        live = [c for c in self.connections.values() if _is_active(c)]
        files = {
            c.name: [(posixpath.join(self.paths[c.name].run_dir, t.log_name),
                      run.log_path(t.log_name)) for t in plan.tasks_on(c.name)]
            for c in live
        }  # fmt: skip
        for conn, _, err in parallel(lambda c: fetch_new_bytes(c, files[c.name]), live):
            if err is not None:
                self.say(f"could not copy the logs of {conn.name}: {err}")
        lost = sorted(set(self.connections) - {c.name for c in live})
        if lost:
            self.say(
                f"logs of {', '.join(lost)} stay on the host(s): the connection was lost "
                f"(see {', '.join(self.paths[n].run_dir for n in lost)})"
            )

    def close(self) -> None:
        close_all(self.connections.values())
        self.connections.clear()

    def say(self, message: str) -> None:
        self.out.write(f"[tflaunch] {message}\n")
        self.out.flush()

    def reconnect(self, run: Run) -> None:
        """Connect to the hosts of an existing run, with the options it was started with."""
        if self.connections:
            return
        meta = run.read_meta()
        plan = run.read_plan()
        self.paths = {name: HostPaths(**p) for name, p in meta.get("ssh_hosts", {}).items()}
        self.connections = connect_all(
            [(h.name, h.connect_address) for h in plan.hosts_with_tasks()],
            SshOptions(**meta["ssh_options"]),
        )

    def read_file(self, host: str, path: str) -> str | None:
        """A text file on ``host``; None when it does not exist."""
        with self.connections[host].sftp() as sftp:
            try:
                with sftp.open(path, "r") as f:
                    return f.read().decode(errors="replace")
            except FileNotFoundError:
                return None


def _is_active(conn: Connection) -> bool:
    transport = conn.client.get_transport()
    return transport is not None and transport.is_active()


def fetch_new_bytes(conn: Connection, files: Sequence[tuple[str, Path]]) -> None:
    """Append what each remote file has beyond its local copy (logs only ever grow)."""
    with conn.sftp() as sftp:
        for remote, local in files:
            if _same_file(remote, local):
                continue  # a shared file system: the host's file is the local one
            try:
                size = sftp.stat(remote).st_size or 0
            except FileNotFoundError:
                continue
            have = local.stat().st_size if local.exists() else 0
            if size <= have:
                continue
            with sftp.open(remote, "rb") as source, open_run_file(local, "ab") as target:
                source.seek(have)
                target.write(source.read(size - have))


def _same_file(remote: str, local: Path) -> bool:
    try:
        return os.path.samefile(remote, local)
    except OSError:
        return False
