"""The launcher's side of detached SSH runs: start them, refresh them, bring them down.

A detached run's coordinator and agents live on the hosts (:mod:`tflaunch.launchers.ssh.on_host`); the local
run directory mirrors them. ``refresh`` appends what is new of the coordinator's events, resource
samples and console and of every task's log, and copies the run's state, so ``tflaunch status``
and ``logs [-f]`` read local files as for any run. ``down`` signals the coordinator (which tears the cluster down as on Ctrl-C) and then
makes sure no agent of the run is left on any host.
"""

from __future__ import annotations

import json
import posixpath
import time
from typing import TYPE_CHECKING, Any

from tflaunch.launchers.ssh.connect import Connection, SshOptions, close_all, connect_all, parallel
from tflaunch.launchers.ssh.connect import remote_command as _command
from tflaunch.launchers.ssh.on_host import COORDINATOR_FILE, TOKEN_FILE, new_token

from tflaunch.config import ClusterConfig
from tflaunch.errors import LaunchError
from tflaunch.plan import Plan
from tflaunch.run import Run

if TYPE_CHECKING:
    from tflaunch.launchers.ssh.backend import SshBackend

ENDED = ("succeeded", "failed", "stopped")

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


def _read_remote(conn: Connection, path: str) -> str | None:
    with conn.sftp() as sftp:
        try:
            with sftp.open(path, "r") as f:
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return None


def _wait_for_file(conn: Connection, path: str, timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = _read_remote(conn, path)
        if text:
            return text
        time.sleep(0.2)
    return None


def start_detached(backend: SshBackend, config: ClusterConfig, plan: Plan, run: Run) -> None:
    """Pre-flight as for an attached run, then coordinator on the first host, agents everywhere."""
    backend._connect_and_check(config, plan, run, extra={TOKEN_FILE: new_token()})
    python = config.ssh.python
    first = plan.hosts_with_tasks()[0]
    conn = backend.connections[first.name]
    run_dir = backend.paths[first.name].run_dir
    conn.run(_command(
        [python, "-m", "tflaunch.launchers.ssh.on_host", "coordinate", "--run-dir", run_dir,
         "--run-id", run.id, "--listen", first.cluster_address],
        background_output=posixpath.join(run_dir, "console.log"),
    ), timeout=30)  # fmt: skip
    text = _wait_for_file(conn, posixpath.join(run_dir, COORDINATOR_FILE), timeout=60)
    if text is None:
        console = _read_remote(conn, posixpath.join(run_dir, "console.log")) or "(no output)"
        raise LaunchError(f"the coordinator did not start on {first.name}:\n{console[-2000:]}")
    coordinator = json.loads(text)
    run.update_meta(
        detached=True,
        ssh_coordinator=first.name,
        ssh_coordinator_pid=coordinator["pid"],
        state="starting",
    )
    timeout = plan.supervision.heartbeat_timeout

    def start_agent(host_conn: Connection) -> None:
        host_dir = backend.paths[host_conn.name].run_dir
        agent_args = backend._agent_argv(config, host_conn.name, timeout)[3:]
        argv = [python, "-m", "tflaunch.launchers.ssh.on_host", "agent",
                "--address", coordinator["address"], "--port", str(coordinator["port"]),
                "--host", host_conn.name, "--token-file", posixpath.join(host_dir, TOKEN_FILE),
                "--", *agent_args]  # fmt: skip
        out = posixpath.join(host_dir, "agent.log")
        host_conn.run(_command(argv, background_output=out), timeout=30)

    failures = [f"{c.name}: {e}" for c, _, e in parallel(start_agent, backend.connections.values())
                if e is not None]  # fmt: skip
    if failures:
        down(backend, run, plan.supervision.grace_period)
        raise LaunchError("cannot start the agents:\n  " + "\n  ".join(failures))
    _wait_until_ready(backend, run, plan.supervision.ready_timeout + 60)
    backend._say(
        f"detached: the coordinator runs on {first.name}; follow with 'tflaunch logs "
        f"-f {run.id}', stop with 'tflaunch down {run.id}'"
    )


def _wait_until_ready(backend: SshBackend, run: Run, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        refresh(backend, run)
        if any(e.get("event") == "cluster_ready" for e in run.events()):
            return
        meta = run.read_meta()
        if meta.get("state") in ENDED:
            raise LaunchError(
                f"the detached run {run.id} ended before it was ready: "
                f"{meta.get('message', 'see its logs')}"
            )
        time.sleep(0.5)
    raise LaunchError(
        f"the detached run {run.id} was not ready after {timeout:g} s; see "
        f"'tflaunch status {run.id}', stop it with 'tflaunch down {run.id}'."
    )


def _connect(backend: SshBackend, run: Run) -> None:
    """Reconnect to a run's hosts with the options it was started with."""
    if backend.connections:
        return
    meta = run.read_meta()
    options = SshOptions(**meta["ssh_options"])
    plan = run.read_plan()
    hosts = [(h.name, h.connect_address) for h in plan.hosts_with_tasks()]
    from tflaunch.launchers.ssh.backend import HostPaths

    backend.paths = {name: HostPaths(**p) for name, p in meta.get("ssh_hosts", {}).items()}
    backend.connections = connect_all(hosts, options)


def refresh(backend: SshBackend, run: Run) -> None:
    """Append new events and log lines from the hosts; copy the run's state."""
    from tflaunch.launchers.ssh.backend import fetch_new_bytes

    opened_here = not backend.connections
    try:
        _connect(backend, run)
    except LaunchError as err:
        backend._say(f"cannot reach the hosts, showing the last copied state: {err}")
        return
    try:
        meta = run.read_meta()
        coordinator = meta["ssh_coordinator"]
        conn = backend.connections[coordinator]
        remote_dir = backend.paths[coordinator].run_dir
        with conn.sftp() as sftp:
            mirrored = ["events.jsonl", "console.log"] + [
                n for n in sftp.listdir(remote_dir) if n.startswith("samples-")
            ]
        fetch_new_bytes(conn, [(posixpath.join(remote_dir, n), run.dir / n) for n in mirrored])
        remote_meta = json.loads(_read_remote(conn, posixpath.join(remote_dir, "run.json")) or "{}")
        copied: dict[str, Any] = {
            k: remote_meta[k]
            for k in ("state", "exit_code", "message", "ended")
            if k in remote_meta
        }
        if copied:
            run.update_meta(**copied)
        backend._fetch_logs(run.read_plan(), run)
    finally:
        if opened_here:
            backend._disconnect()


def down(backend: SshBackend, run: Run, grace: float) -> str:
    """Stop the coordinator (it tears the cluster down), then any agent of the run still left."""
    _connect(backend, run)
    try:
        refresh(backend, run)  # the agents' pids are in the coordinator's events
        meta = run.read_meta()
        conn = backend.connections[meta["ssh_coordinator"]]
        interpreter = meta.get("ssh_python", "python3")
        stop = [interpreter, "-c", STOP_PROCESS]
        result = conn.run(
            _command([*stop, str(meta["ssh_coordinator_pid"]), run.id, f"{grace + 30:g}"]),
            timeout=grace + 60,
        )
        what = [f"coordinator on {conn.name}: {result.stdout.strip() or result.stderr.strip()}"]
        agents = {}
        for event in run.events():
            if event.get("event") == "agent_started" and event.get("pid"):
                agents[event.get("host")] = event["pid"]

        def stop_agent(host_conn: Connection) -> str:
            pid = agents.get(host_conn.name)
            if pid is None:
                return "no agent"
            reply = host_conn.run(
                _command([*stop, str(pid), run.id, f"{grace + 10:g}"]), timeout=grace + 40
            )
            return reply.stdout.strip()

        for host_conn, reply, err in parallel(stop_agent, backend.connections.values()):
            what.append(f"agent on {host_conn.name}: {reply if err is None else err}")
        refresh(backend, run)
        if run.read_meta().get("state") not in ENDED:
            run.update_meta(state="stopped", ended=time.time())
        return f"run {run.id} is down (state: {run.read_meta().get('state')}); " + "; ".join(what)
    finally:
        close_all(backend.connections.values())
        backend.connections.clear()
