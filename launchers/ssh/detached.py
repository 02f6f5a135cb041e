"""The launcher's side of detached SSH runs: start them, refresh them, bring them down.

A detached run's coordinator and agents live on the hosts (:mod:`tflaunch.launchers.ssh.on_host`);
the local run directory mirrors them. ``refresh`` appends what is new of the coordinator's events,
resource samples and console and of every task's log, and copies the run's state, so ``tflaunch
status`` and ``logs [-f]`` read local files as for any run. ``down`` signals the coordinator (which
tears the cluster down as on Ctrl-C) and then makes sure no agent of the run is left on any host.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from tflaunch.cluster.config import ClusterConfig
from tflaunch.cluster.plan import Plan
from tflaunch.errors import LaunchError
from tflaunch.launchers.ssh.connect import Connection, parallel, remote_command
from tflaunch.launchers.ssh.details import SshDetails
from tflaunch.launchers.ssh.session import HostSession, fetch_new_bytes
from tflaunch.runtime import protocol
from tflaunch.runtime.rendezvous import RENDEZVOUS_FILE, Rendezvous
from tflaunch.runtime.run import Outcome, Run, RunRecord, remote_record_path
from tflaunch.runtime.runctl import cluster_ready
from tflaunch.runtime.runfiles import (
    CONSOLE_FILE,
    EVENTS_FILE,
    SAMPLES_PREFIX,
    open_run_file,
)

ON_HOST = "tflaunch.launchers.ssh.on_host"
WATCH = "tflaunch.launchers.ssh.watch"
AGENT_LOG = "agent.log"  # a detached agent's own output, in its host's run directory
WATCH_LOG = "watch.log"  # the laptop's watcher's output, in the local run directory

# Runs on a host: SIGTERM a process if (and only if) its command line names the run, then wait.
STOP_PROCESS = r"""
import os, signal, sys, time
pid, marker, wait = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
def cmdline():
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
if marker not in cmdline():
    print("gone")
    sys.exit(0)
os.kill(pid, signal.SIGTERM)
deadline = time.time() + wait
while time.time() < deadline:
    if marker not in cmdline():
        print("stopped")
        sys.exit(0)
    time.sleep(0.1)
os.kill(pid, signal.SIGKILL)
print("killed")
"""


def _wait_for_coordinator(
    session: HostSession, host: str, path: str, timeout: float
) -> Rendezvous | None:
    """The rendezvous record once the coordinator on ``host`` listens (it has a port)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = Rendezvous.from_json(session.read_file(host, path) or "")
        if record is not None and record.port:
            return record
        time.sleep(0.2)
    return None


def start_agent(
    session: HostSession,
    conn: Connection,
    python: str,
    coordinator: Rendezvous,
    replaced: Sequence[str] = (),
) -> None:
    """Start ``conn``'s host's agent in the background; it connects to ``coordinator``.
    ``replaced``: the old and new instance ids of a replacement joining a running cluster."""
    host_dir = session.paths[conn.name].run_dir
    argv = [
        python, "-m", ON_HOST, "agent", "--run-dir", host_dir, "--host", conn.name,
        "--address", coordinator.address, "--port", str(coordinator.port),
    ]  # fmt: skip
    if replaced:
        argv += ["--replaced", *replaced]
    out = posixpath.join(host_dir, AGENT_LOG)
    conn.run(remote_command(argv, background_output=out), timeout=30)


def start(
    session: HostSession, config: ClusterConfig, plan: Plan, run: Run, replace_wait: float = 0.0
) -> None:
    """Pre-flight as for an attached run, then coordinator on the first host, agents everywhere.
    ``replace_wait``: how long the coordinator waits for a replaced host's agent (a provisioned
    run, watched by :mod:`tflaunch.launchers.ssh.watch`); 0 for none."""
    session.open(config, plan, run, extra={RENDEZVOUS_FILE: Rendezvous.ahead().to_json()})
    python = config.ssh.python
    first = plan.hosts_with_tasks()[0]
    run_dir = session.paths[first.name].run_dir
    argv = [
        python,
        "-m",
        ON_HOST,
        "coordinate",
        "--run-dir",
        run_dir,
        "--run-id",
        run.id,
        "--listen",
        first.cluster_address,
        "--replace-wait",
        f"{replace_wait:g}",
    ]
    console = posixpath.join(run_dir, CONSOLE_FILE)
    session.connections[first.name].run(remote_command(argv, background_output=console), timeout=30)
    path = posixpath.join(run_dir, RENDEZVOUS_FILE)
    coordinator = _wait_for_coordinator(session, first.name, path, 60)
    if coordinator is None:
        output = session.read_file(first.name, console) or "(no output)"
        raise LaunchError(f"the coordinator did not start on {first.name}:\n{output[-2000:]}")
    run.update_part(
        SshDetails,
        detached=True,
        ssh_coordinator=first.name,
        ssh_coordinator_pid=coordinator.pid,
        state="starting",
    )

    results = parallel(
        lambda conn: start_agent(session, conn, python, coordinator), session.connections.values()
    )
    failures = [f"{c.name}: {e}" for c, _, e in results if e is not None]
    if failures:
        down(session, run, plan.supervision.grace_period)
        raise LaunchError("cannot start the agents:\n  " + "\n  ".join(failures))
    _wait_until_ready(session, run, plan.supervision.ready_timeout + 60)
    session.say(
        f"detached: the coordinator runs on {first.name}; follow with 'tflaunch logs "
        f"-f {run.id}', stop with 'tflaunch down {run.id}'"
    )


def _wait_until_ready(session: HostSession, run: Run, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        refresh(session, run)
        if cluster_ready(run):
            return
        if run.ended:
            raise LaunchError(
                f"the detached run {run.id} ended before it was ready: "
                f"{run.record().message or 'see its logs'}"
            )
        time.sleep(0.5)
    raise LaunchError(
        f"the detached run {run.id} was not ready after {timeout:g} s; see "
        f"'tflaunch status {run.id}', stop it with 'tflaunch down {run.id}'."
    )


def refresh(session: HostSession, run: Run) -> None:
    """Append new events and log lines from the hosts; copy the run's state."""
    opened_here = not session.connections
    try:
        session.reconnect(run)
    except LaunchError as err:
        session.say(f"cannot reach the hosts, showing the last copied state: {err}")
        return
    try:
        coordinator = run.record().part(SshDetails).ssh_coordinator
        conn = session.connections[coordinator]
        remote_dir = session.paths[coordinator].run_dir
        with conn.sftp() as sftp:
            mirrored = [EVENTS_FILE, CONSOLE_FILE] + [
                n for n in sftp.listdir(remote_dir) if n.startswith(SAMPLES_PREFIX)
            ]
        fetch_new_bytes(conn, [(posixpath.join(remote_dir, n), run.dir / n) for n in mirrored])
        remote = RunRecord.from_json(
            session.read_file(coordinator, remote_record_path(remote_dir)) or "{}"
        )
        copied: dict[str, Any] = {
            k: getattr(remote, k)
            for k in ("state", "exit_code", "message", "ended")
            if getattr(remote, k) is not None
        }
        if copied:
            run.update_meta(**copied)
        session.fetch_logs(run.read_plan(), run)
    finally:
        if opened_here:
            session.close()


def start_watcher(run: Run, say: Callable[[str], None]) -> int:
    """Start the laptop's watch over the run's instances (:mod:`tflaunch.launchers.ssh.watch`)
    in a session of its own, outliving this command; its pid goes into run.json."""
    log = open_run_file(run.dir / WATCH_LOG, "ab")
    with log:
        proc = subprocess.Popen(
            [sys.executable, "-m", WATCH, "--run-dir", str(run.dir)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    run.update_part(SshDetails, ssh_watcher_pid=proc.pid)
    say(
        "the run's instances are watched from here: one that ends is replaced "
        f"(watcher pid {proc.pid}, log {run.dir / WATCH_LOG})"
    )
    return proc.pid


def stop_watcher(run: Run) -> None:
    """End the run's watcher, if one runs (its command line names the run directory)."""
    pid = run.record().part(SshDetails).ssh_watcher_pid
    if not pid:
        return
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().decode(errors="replace")
    except OSError:
        return
    if str(run.dir) in cmdline and WATCH in cmdline:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def down(session: HostSession, run: Run, grace: float) -> str:
    """Stop the coordinator (it tears the cluster down), then any agent of the run still left."""
    stop_watcher(run)  # it would replace the instances 'down' ends
    session.reconnect(run)
    try:
        refresh(session, run)  # the agents' pids are in the coordinator's events
        details = run.record().part(SshDetails)
        conn = session.connections[details.ssh_coordinator]
        stop = [details.ssh_python, "-c", STOP_PROCESS]
        result = conn.run(
            remote_command([*stop, str(details.ssh_coordinator_pid), run.id, f"{grace + 30:g}"]),
            timeout=grace + 60,
        )
        what = [f"coordinator on {conn.name}: {result.stdout.strip() or result.stderr.strip()}"]
        agents = {}
        for record in protocol.records(run.events()):
            if isinstance(record.event, protocol.AgentStarted) and record.event.pid:
                agents[record.host] = record.event.pid

        def stop_agent(host_conn: Connection) -> str:
            pid = agents.get(host_conn.name)
            if pid is None:
                return "no agent"
            reply = host_conn.run(
                remote_command([*stop, str(pid), run.id, f"{grace + 10:g}"]), timeout=grace + 40
            )
            return reply.stdout.strip()

        for host_conn, reply, err in parallel(stop_agent, session.connections.values()):
            what.append(f"agent on {host_conn.name}: {reply if err is None else err}")
        refresh(session, run)
        if not run.ended:
            run.finish(Outcome(143, "stopped with tflaunch down", interrupted=True))
        return f"run {run.id} is down (state: {run.record().state}); " + "; ".join(what)
    finally:
        session.close()
