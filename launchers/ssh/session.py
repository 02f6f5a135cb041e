"""A session with the hosts of one SSH run: connections, paths, files, logs.

One :class:`HostSession` serves attached runs (the SSH backend), detached runs (start, refresh,
down) and anything else that works on a run's hosts: it connects to every host in parallel,
resolves each host's working and run directories, uploads ``ssh.upload``, runs the pre-flight
check (:mod:`tflaunch.launchers.ssh.preflight`) and writes each host's plan, and later copies
logs back and reconnects to the hosts of an existing run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import posixpath
import re
import secrets
import stat
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import paramiko

from tflaunch.launchers.ssh.connect import (
    Connection,
    SshOptions,
    Unreachable,
    close_all,
    connect,
    connect_all,
    connect_failure,
    connect_jump,
    parallel,
)
from tflaunch.launchers.ssh.details import SshDetails
from tflaunch.launchers.ssh.gpus import adopt_found_gpus
from tflaunch.launchers.ssh.preflight import (
    HostReport,
    check_host,
    format_table,
    raise_on_problems,
    start_host_check,
)
from tflaunch.launchers.ssh.preflight import warnings as preflight_warnings
from tflaunch.launchers.ssh.section import SshSection
from tflaunch.launchers.ssh.setup import prepare_hosts
from tflaunch.plugin import (
    PLAN_FILE,
    ClusterConfig,
    Host,
    LaunchError,
    Plan,
    Run,
    RunFileError,
    agent_args,
    agent_argv,
    open_run_file,
)


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
            try:
                sftp.mkdir(current)
            except OSError:  # another host sharing this disk (NFS) made it meanwhile
                if not stat.S_ISDIR(sftp.stat(current).st_mode or 0):
                    raise


@dataclasses.dataclass
class HostPaths:
    """Where things live on one host."""

    workdir: str
    run_dir: str


class HostSession:
    """Connections to the hosts of one run, and where things live on each."""

    def __init__(self, out: IO[str] | None = None) -> None:
        self.connections: dict[str, Connection] = {}
        self.probes: dict[str, paramiko.Channel] = {}
        self._reach_judged = False
        self.paths: dict[str, HostPaths] = {}
        self.out = out or sys.stderr
        # How to reach the hosts when not as the cluster file's ssh section says (provisioned
        # instances: a known_hosts file of the run's own; see launchers/ssh/cloud.py).
        self.options: SshOptions | None = None

    def open(
        self,
        config: ClusterConfig,
        plan: Plan,
        run: Run,
        extra: Mapping[str, str] | None = None,
        keep_probes: bool = False,
        only: str | None = None,
    ) -> Plan:
        """Connect, prepare directories and uploads, pre-flight and write the host plans; the
        plan the hosts run (with the GPUs pre-flight found where the file gives none).

        Each host goes through these steps in a pipeline of its own, all hosts at once; only
        the verdict waits for every host, so the run starts when the slowest host is through,
        not after the slowest host of every step in turn. Nothing starts unless every host
        passed. Where the time of each step went is kept in run.json (``ssh_timings``).

        With ``keep_probes`` each host's pre-flight probe stays on its channel, waiting to become
        the host's agent (:meth:`start_agent`): one remote command per host, not two.

        With ``only``, just that host (a replaced instance joining a running cluster); the
        run's own plan.json stays as it is."""
        options = self.options or SshOptions.from_section(
            config.section(SshSection), config.base_dir
        )
        uploads = _uploads(config)
        hosts = [h for h in plan.hosts_with_tasks() if only is None or h.name == only]
        self.say(f"connecting to {len(hosts)} host(s) as {options.user}")
        opening = time.monotonic()
        jump = connect_jump(options)
        steps = _HostSteps(config, plan, run, options, uploads, extra or {}, jump, keep_probes)
        try:
            opened = [result for _, result, _ in parallel(steps.open_host, hosts)]
            self.connections = {o.name: o.conn for o in opened if o.conn is not None}
            if steps.setup:
                # Syncing the code and running setup lines span the hosts (one report): the
                # hosts meet here, between connecting and pre-flight.
                self._judge_reach(opened, uploads)
                workdirs = {o.name: o.workdir for o in opened}
                prepare_hosts(
                    config, self.connections, workdirs, self.say, self.out, (run.dir.parent,)
                )
                opened = [result for _, result, _ in parallel(steps.check, opened)]
            self.probes = {o.name: o.probe for o in opened if o.probe is not None}
            self._judge(opened, plan, uploads)
            reports = [o.report for o in opened if o.report is not None]
            plan, gpu_notes = adopt_found_gpus(config, plan, reports)
            for note in gpu_notes:
                self.say(note)
        except LaunchError:
            self.end_probes()
            self.close()
            if jump is not None:
                jump.close()
            raise
        self.paths = {o.name: o.paths for o in opened if o.paths is not None}
        if gpu_notes:  # the hosts got the plan before pre-flight found their GPUs
            self._rewrite_plans(plan)
        if only is not None:
            known = run.record().part(SshDetails).ssh_hosts
            paths = {name: dataclasses.asdict(p) for name, p in self.paths.items()}
            run.update_part(SshDetails, ssh_hosts={**known, **paths})
            return plan
        resolved = tuple(
            dataclasses.replace(t, workdir=self.paths[t.host].workdir) for t in plan.tasks
        )
        run.write_plan(dataclasses.replace(plan, tasks=resolved))  # what the hosts run
        run.update_part(
            SshDetails,
            ssh_hosts={name: dataclasses.asdict(p) for name, p in self.paths.items()},
            ssh_options=dataclasses.asdict(options),
            ssh_python=config.section(SshSection).python,
            ssh_timings={o.name: o.seconds for o in opened},
            ssh_open_seconds=round(time.monotonic() - opening, 3),
        )
        return plan

    def _rewrite_plans(self, plan: Plan) -> None:
        """Write ``plan`` over every host's plan.json (private, as the probe wrote it)."""
        text = plan.to_json()

        def write(host: str) -> None:
            path = posixpath.join(self.paths[host].run_dir, "plan.json")
            with self.connections[host].sftp() as sftp:
                with sftp.open(path, "w") as f:
                    f.write(text)
                sftp.chmod(path, 0o600)

        failures = [f"{h}: {err}" for h, _, err in parallel(write, list(self.paths)) if err]
        if failures:
            self.end_probes()
            raise LaunchError("cannot write the plan on the hosts:\n  " + "\n  ".join(failures))

    def _judge(self, opened: list[_Opened], plan: Plan, uploads: list[Path]) -> None:
        """Report the hosts' steps in order: connection, uploads, pre-flight."""
        if not self._reach_judged:
            self._judge_reach(opened, uploads)
        reports = [o.report for o in opened if o.report is not None]
        self.say("pre-flight:\n" + format_table(reports, plan))
        for warning in preflight_warnings(reports):
            self.say(f"warning: {warning}")
        raise_on_problems(reports)

    def end_probes(self, timeout: float = 10.0) -> None:
        """Tell every waiting probe that no agent starts, and wait (bounded) until they ended:
        nothing of the run stays on the hosts."""

        def end(probe: paramiko.Channel) -> None:
            with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
                probe.sendall(b"{}\n")
                probe.shutdown_write()
                deadline = time.monotonic() + timeout
                while not probe.exit_status_ready() and time.monotonic() < deadline:
                    time.sleep(0.05)
            probe.close()

        parallel(end, self.probes.values())
        self.probes.clear()

    def _judge_reach(self, opened: list[_Opened], uploads: list[Path]) -> None:
        """Every host connected and took its uploads, or one error for those that did not."""
        self._reach_judged = True
        failed = {step: [o for o in opened if o.failed_step == step] for step in _STEPS}
        if failed["connect"]:
            raise connect_failure([o.error for o in failed["connect"]], len(opened))
        for conn in self.connections.values():
            for note in conn.notes:
                self.say(note)
        if failed["upload"]:
            raise LaunchError(
                "cannot upload ssh.upload to the hosts (SFTP); nothing was started.\n  "
                + "\n  ".join(f"{o.name}: {o.error}" for o in failed["upload"])
            )
        if uploads:
            self.say(f"uploaded {', '.join(p.name for p in uploads)} to every host's workdir")

    def start_agent(self, host: str) -> paramiko.Channel:
        """Turn ``host``'s waiting probe into its agent; returns the agent's channel."""
        probe = self.probes[host]
        run_dir = self.paths[host].run_dir
        args = agent_args(posixpath.join(run_dir, PLAN_FILE), host, run_dir)
        probe.sendall((json.dumps({"agent": args}) + "\n").encode())
        del self.probes[host]  # (one that could not be told stays, for end_probes)
        return probe

    def agent_argv(self, python: str, host: str, await_start: bool = False) -> list[str]:
        """The agent's command line on ``host`` (its plan and logs in the host's run dir);
        ``await_start``: a lost host's new agent, started by the coordinator's ``start``."""
        run_dir = self.paths[host].run_dir
        plan = posixpath.join(run_dir, PLAN_FILE)
        return agent_argv(python, plan, host, run_dir, await_start)

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
        details = run.record().part(SshDetails)
        try:
            plan = run.read_plan()
        except FileNotFoundError:  # its hosts are named there: the run cannot be reached
            raise RunFileError(f"no {PLAN_FILE} in {run.dir}") from None
        self.paths = {name: HostPaths(**p) for name, p in details.ssh_hosts.items()}
        try:
            self.connections = connect_all(
                [(h.name, h.connect_address) for h in plan.hosts_with_tasks()],
                SshOptions(**(details.ssh_options or {})),
            )
        except Unreachable as err:  # not 'nothing was started': the run was, long ago
            raise err.because(f"run {run.id} on them was not reached") from None

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
            if same_file(remote, local):
                continue  # a shared file system: the host's file is the local one
            try:
                size = sftp.stat(remote).st_size or 0
            except FileNotFoundError:
                continue
            if size <= (local.stat().st_size if local.exists() else 0):
                continue
            with open_run_file(local, "ab") as target:
                # Two mirrors at once (a watcher, a 'status') must not both append the same bytes.
                fcntl.flock(target.fileno(), fcntl.LOCK_EX)
                have = os.fstat(target.fileno()).st_size
                if size <= have:
                    continue
                with sftp.open(remote, "rb") as source:
                    source.seek(have)
                    target.write(source.read(size - have))


def same_file(remote: str, local: Path) -> bool:
    """Whether a host's ``remote`` path is ``local`` itself (a host sharing this machine's disk,
    as the namespace test hosts and an NFS home do)."""
    try:
        return os.path.samefile(remote, local)
    except OSError:
        return False


_STEPS = ("connect", "upload")  # steps whose failure stops the run before pre-flight


def _uploads(config: ClusterConfig) -> list[Path]:
    """The local files of ``ssh.upload``, checked before any host is contacted."""
    uploads = [
        Path(config.base_dir) / os.path.expanduser(f) for f in config.section(SshSection).upload
    ]
    for path in uploads:
        if not path.is_file():
            raise LaunchError(
                f"ssh.upload: {path} is not a file here; list files relative to the cluster file."
            )
    return uploads


@dataclasses.dataclass
class _Opened:
    """How far one host got, what it took, and what was found there."""

    name: str
    host: Host
    conn: Connection | None = None
    workdir: str = ""  # resolved on the host (only when sync or setup lines need it first)
    paths: HostPaths | None = None
    report: HostReport | None = None
    probe: paramiko.Channel | None = None  # a kept probe, waiting to become the agent
    failed_step: str | None = None
    error: str = ""
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    mark: float = dataclasses.field(default_factory=time.monotonic)


@dataclasses.dataclass
class _HostSteps:
    """One host's way from nothing to ready-to-start: connect, upload ``ssh.upload`` (SFTP, only
    when there is something to upload), then one pre-flight probe that also makes the host's run
    directory and writes its plan there — one round trip where SFTP took a dozen."""

    config: ClusterConfig
    plan: Plan
    run: Run
    options: SshOptions
    uploads: list[Path]
    extra: Mapping[str, str]
    jump: Connection | None
    keep_probe: bool = False

    def __post_init__(self) -> None:
        # The same plan for every host: each agent resolves its tasks' workdir there.
        self.files = {PLAN_FILE: self.plan.to_json(), **self.extra}

    @property
    def setup(self) -> bool:
        """Whether code sync or setup lines run between connecting and pre-flight."""
        return bool(self.config.section(SshSection).sync or self.config.section(SshSection).setup)

    def open_host(self, host: Host) -> _Opened:
        """Connect and upload; then, unless setup must run on every host first, pre-flight."""
        opened = _Opened(host.name, host)
        step = "connect"
        try:
            opened.conn = connect(host.name, host.connect_address, self.options, self.jump)
            _done(opened, step)
            if self.uploads or self.setup:
                step = "upload"
                opened.workdir = self._upload(opened.conn)
                _done(opened, step)
        except Exception as err:  # reported per host and step by HostSession._judge
            opened.failed_step, opened.error = step, str(err)
            return opened
        return opened if self.setup else self.check(opened)

    def check(self, opened: _Opened) -> _Opened:
        """The pre-flight probe, which also makes the run directory and writes the plan; kept,
        it waits to become the agent."""
        host = opened.host
        python, workdir, run_dir = (
            self.config.section(SshSection).python, self.config.workdir, self._run_dir(host.name)
        )  # fmt: skip
        mode = int(self.config.run_dir_mode, 8)  # plans hold env values
        try:
            if self.keep_probe:
                opened.report, opened.probe = start_host_check(
                    opened.conn, self.plan, python, workdir, run_dir, self.files, mode=mode
                )
            else:
                opened.report = check_host(
                    opened.conn,
                    self.plan,
                    python,
                    workdir,
                    run_dir=run_dir,
                    files=self.files,
                    mode=mode,
                )
            facts = opened.report.facts
            if facts.get("run_dir"):
                opened.paths = HostPaths(workdir=facts["workdir"], run_dir=facts["run_dir"])
        except Exception as err:  # a pre-flight problem, shown in the table
            opened.report = HostReport(
                host.name, host.connect_address, host.cluster_address, {}, [str(err)]
            )
        _done(opened, "preflight")
        return opened

    def _run_dir(self, host: str) -> str:
        """The host's run directory as written (absolute, ``~/...`` or under the remote home)."""
        run_base = self.config.section(SshSection).remote_runs_dir or self.config.runs_dir
        return posixpath.join(run_base, self.run.id, _safe_name(host))

    def _upload(self, conn: Connection) -> str:
        """Upload ``ssh.upload`` into the workdir (made if missing); returns the workdir."""
        with conn.sftp() as sftp:
            workdir = remote_path(sftp.normalize("."), self.config.workdir)
            if self.uploads:
                sftp_makedirs(sftp, workdir)
                for path in self.uploads:
                    put_whole(sftp, path, posixpath.join(workdir, path.name))
        return workdir


def put_whole(sftp: paramiko.SFTPClient, local: Path, target: str) -> None:
    """Copy ``local`` to ``target`` under a temporary name, then rename it over ``target``.
    Where the host shares this machine's disk and ``target`` is ``local`` itself (a workdir
    that is the file's own folder), a plain put would truncate the file before reading it and
    leave it empty; this way it is replaced by a whole copy. The temporary name is this
    upload's own: hosts sharing one disk (an NFS home) upload into the same workdir at once,
    and one host's rename must not take another's half-written copy away."""
    temporary = f"{target}.tflaunch-upload-{secrets.token_hex(6)}"
    try:
        sftp.put(str(local), temporary)
        sftp.chmod(temporary, local.stat().st_mode & 0o777)
        try:
            sftp.posix_rename(temporary, target)
        except OSError:  # a server without OpenSSH's posix-rename: rename refuses an existing name
            with contextlib.suppress(FileNotFoundError):
                sftp.remove(target)
            sftp.rename(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            sftp.remove(temporary)
        raise


def _done(opened: _Opened, step: str) -> None:
    """Record how long ``step`` took on the host (since the previous step ended)."""
    now = time.monotonic()
    opened.seconds[step] = round(now - opened.mark, 3)
    opened.mark = now
