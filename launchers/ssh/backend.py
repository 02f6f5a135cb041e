"""SSH backend: one agent per host, started over paramiko, its event stream carried back.

The launcher connects to every host's *connect* (public) address in parallel, while the plan wires
the cluster on *cluster* (private) addresses. Before anything starts anywhere it resolves each
host's working and run directories, uploads the files ``ssh.upload`` lists (SFTP), and runs the
pre-flight check (:mod:`tflaunch.launchers.ssh.preflight`), printing one table. Then it writes the plan into
each host's run directory and starts ``python -m tflaunch.agent`` there over an SSH channel without
a PTY; the channel's stdout is the agent's JSON-lines event stream and its stdin carries the
coordinator's commands and heartbeats.

No orphans: a channel without a PTY does not kill its remote process, and sshd notices a cut link
only after TCP gives up, so the agent itself stops its tasks when its input closes *or* when no
heartbeat arrived for ``supervision.heartbeat_timeout`` seconds. The launcher in turn probes every
connection (an SSH global request, like ``ServerAliveInterval``) and reports a host whose
connection stopped answering as lost, which fails the run.

Per-task logs stay in the host's run directory (``<remote run dir>/<run id>/<host>/``) and are
copied into the local run directory when the run ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import posixpath
import queue
import re
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import paramiko
from tflaunch.launchers.base import Backend, StreamLink
from tflaunch.launchers.ssh.connect import (
    Connection,
    SshOptions,
    close_all,
    connect_all,
    parallel,
    remote_command,
)
from tflaunch.launchers.ssh.preflight import format_table, raise_on_problems, run_preflight
from tflaunch.launchers.ssh.preflight import warnings as preflight_warnings
from tflaunch.launchers.ssh.sources import resolve_hosts

from tflaunch.config import ClusterConfig
from tflaunch.coordinator import Outcome
from tflaunch.errors import LaunchError, TflaunchError
from tflaunch.plan import Host, Plan
from tflaunch.run import Run


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


class SshLink(StreamLink):
    """An agent's event stream over an SSH channel, with a liveness probe of the connection."""

    def __init__(
        self,
        host: str,
        conn: Connection,
        channel: paramiko.Channel,
        heartbeat: float,
        timeout: float,
    ):
        super().__init__(host, channel.makefile("r"), channel.makefile_stdin("w"))
        self.conn, self.channel = conn, channel
        self.heartbeat, self.timeout = heartbeat, timeout
        self._closed = threading.Event()

    def start_reader(self, sink: queue.Queue) -> None:
        super().start_reader(sink)
        threading.Thread(target=self._pump_stderr, args=(sink,), daemon=True).start()
        threading.Thread(target=self._probe, args=(sink,), daemon=True).start()

    def _pump_stderr(self, sink: queue.Queue) -> None:
        """The agent's stderr (Python warnings, a crash) shown as the agent's own output."""
        with contextlib.suppress(OSError, ValueError, EOFError):
            for line in self.channel.makefile_stderr("r"):
                sink.put(
                    (
                        self.host,
                        {"event": "output", "task": f"agent@{self.host}", "line": line.rstrip()},
                    )
                )

    def _probe(self, sink: queue.Queue) -> None:
        """Report the host lost when the connection stops answering for ``timeout`` seconds."""
        transport = self.conn.transport

        def ask(answered: threading.Event) -> None:
            with contextlib.suppress(Exception):  # any outcome but silence is an answer
                transport.global_request("keepalive@openssh.com", wait=True)
            answered.set()

        while not self._closed.wait(self.heartbeat):
            answered = threading.Event()
            threading.Thread(target=ask, args=(answered,), daemon=True).start()
            if not answered.wait(self.timeout) and not self._closed.is_set():
                sink.put(
                    (
                        self.host,
                        {
                            "event": "error",
                            "code": 1,
                            "message": f"the SSH connection to {self.conn.address} stopped "
                            f"answering for {self.timeout:g} s (link lost); its agent "
                            "stops its tasks when its heartbeat times out",
                        },
                    )
                )
                sink.put((self.host, {"event": "link_closed"}))
                self.conn.close()  # unblocks the reader
                return

    def send(self, command: dict[str, Any]) -> None:
        with contextlib.suppress(EOFError, OSError, paramiko.SSHException):
            super().send(command)  # a lost connection is reported by the probe and the reader

    def close(self, timeout: float) -> None:
        """Close the agent's input (it tears down), wait up to ``timeout``, then the channel."""
        self._closed.set()
        with contextlib.suppress(EOFError, OSError, ValueError, paramiko.SSHException):
            super().close(timeout)
        deadline = time.monotonic() + timeout
        while not self.channel.exit_status_ready() and time.monotonic() < deadline:
            if self.channel.closed:
                break
            time.sleep(0.05)
        self.channel.close()


class SshBackend(Backend):
    name = "ssh"

    def __init__(self) -> None:
        self.connections: dict[str, Connection] = {}
        self.paths: dict[str, HostPaths] = {}
        self.out = sys.stderr

    def hosts(self, config: ClusterConfig) -> list[Host]:
        return [
            Host(h.name, h.cluster_address, h.connect_address, tuple(str(i) for i in range(h.gpus)))
            for h in resolve_hosts(config)
        ]

    # ---- attached runs: the launcher is the coordinator ------------------------------------

    def launch(self, config: ClusterConfig, plan: Plan, run: Run, on_ready: Any = None) -> Outcome:
        try:
            return super().launch(config, plan, run, on_ready)
        except TflaunchError as err:
            _record_failure(run, err)
            raise
        finally:
            try:
                self._fetch_logs(plan, run)
            finally:
                self._disconnect()

    def start_agents(self, config: ClusterConfig, plan: Plan, run: Run) -> list[SshLink]:
        """Connect, prepare and check every host; only if all pass, start one agent on each."""
        self._connect_and_check(config, plan, run)
        heartbeat = plan.supervision.heartbeat
        timeout = plan.supervision.heartbeat_timeout

        def start(conn: Connection) -> SshLink:
            argv = self._agent_argv(config, conn.name, timeout)
            return SshLink(conn.name, conn, conn.start(remote_command(argv)), heartbeat, timeout)

        results = parallel(start, self.connections.values())
        links = [link for _, link, err in results if err is None]
        failures = [f"{c.name}: {err}" for c, _, err in results if err is not None]
        if failures:
            for link in links:
                link.send({"cmd": "stop", "reason": "another host failed to start"})
                link.close(timeout=10)
            raise LaunchError("cannot start the agents:\n  " + "\n  ".join(failures))
        return links

    def _connect_and_check(
        self, config: ClusterConfig, plan: Plan, run: Run, extra: Mapping[str, str] | None = None
    ) -> None:
        """Connect in parallel, prepare directories and uploads, pre-flight, write host plans."""
        options = SshOptions.from_section(config.ssh, config.base_dir)
        hosts = plan.hosts_with_tasks()
        self._say(f"connecting to {len(hosts)} host(s) as {options.user}")
        self.connections = connect_all([(h.name, h.connect_address) for h in hosts], options)
        for conn in self.connections.values():
            for note in conn.notes:
                self._say(note)
        self.paths = self._prepare(config, run)
        workdirs = {name: p.workdir for name, p in self.paths.items()}
        reports = run_preflight(self.connections, plan, config.ssh.python, workdirs)
        self._say("pre-flight:\n" + format_table(reports, plan))
        for warning in preflight_warnings(reports):
            self._say(f"warning: {warning}")
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
        run_base = config.ssh.remote_run_dir or config.run_dir

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
            self._say(f"uploaded {', '.join(p.name for p in uploads)} to every host's workdir")
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

    def _agent_argv(self, config: ClusterConfig, host: str, heartbeat_timeout: float) -> list[str]:
        run_dir = self.paths[host].run_dir
        return [
            config.ssh.python, "-m", "tflaunch.agent",
            "--plan", posixpath.join(run_dir, "plan.json"),
            "--host", host,
            "--run-dir", run_dir,
            "--heartbeat-timeout", f"{heartbeat_timeout:g}",
        ]  # fmt: skip

    def _fetch_logs(self, plan: Plan, run: Run) -> None:
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
                self._say(f"could not copy the logs of {conn.name}: {err}")
        lost = sorted(set(self.connections) - {c.name for c in live})
        if lost:
            self._say(
                f"logs of {', '.join(lost)} stay on the host(s): the connection was lost "
                f"(see {', '.join(self.paths[n].run_dir for n in lost)})"
            )

    def _disconnect(self) -> None:
        close_all(self.connections.values())
        self.connections.clear()

    def _say(self, message: str) -> None:
        self.out.write(f"[tflaunch] {message}\n")
        self.out.flush()

    # ---- detached runs: the coordinator runs on the first host -----------------------------

    def detach(
        self, config: ClusterConfig, plan: Plan, run: Run, cluster_file: str, run_root: str
    ) -> str:
        """``up --detach``: the run lives on the hosts; the laptop may disconnect."""
        self.launch_detached(config, plan, run)
        return run.id

    def describe(self, run: Run) -> list[str]:
        """For ``status``: refresh a detached run from its hosts first; say where it runs."""
        meta = run.read_meta()
        if not meta.get("detached"):
            return []
        self.refresh(run)
        return [
            f"detached: coordinator on {meta.get('ssh_coordinator')} "
            f"(pid {meta.get('ssh_coordinator_pid')})"
        ]

    def launch_detached(self, config: ClusterConfig, plan: Plan, run: Run) -> None:
        """Start a run that survives the launcher's disconnection; return once it is ready."""
        from tflaunch.launchers import ssh_runs

        try:
            ssh_runs.start_detached(self, config, plan, run)
        except TflaunchError as err:
            _record_failure(run, err)
            raise
        finally:
            self._disconnect()

    def refresh(self, run: Run) -> None:
        """Bring a detached run's events, state and logs from the hosts into the run dir."""
        from tflaunch.launchers import ssh_runs

        if run.read_meta().get("detached"):
            ssh_runs.refresh(self, run)

    def cluster_alive(self, run: Run) -> bool:
        if not run.read_meta().get("detached"):
            return super().cluster_alive(run)
        ended_before = run.read_meta().get("state") in ("succeeded", "failed", "stopped")
        self.refresh(run)
        # Alive for one more round after the end was copied, so that readers (logs -f) get the
        # last lines this refresh brought.
        return not ended_before

    def down(self, run: Run, grace: float) -> str:
        from tflaunch.launchers import ssh_runs

        if not run.read_meta().get("detached"):
            return super().down(run, grace)
        return ssh_runs.down(self, run, grace)


def _record_failure(run: Run, err: TflaunchError) -> None:
    run.update_meta(state="failed", exit_code=err.exit_code, ended=time.time(), message=str(err))


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
            with sftp.open(remote, "rb") as source, local.open("ab") as target:
                source.seek(have)
                target.write(source.read(size - have))


def _same_file(remote: str, local: Path) -> bool:
    try:
        return os.path.samefile(remote, local)
    except OSError:
        return False
