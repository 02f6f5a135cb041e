"""The launcher's side of detached SSH runs: start them, refresh them, bring them down.

A detached run's coordinator and agents live on the hosts (:mod:`tflaunch.launchers.ssh.on_host`);
the local run directory mirrors them. ``refresh`` appends what is new of the coordinator's events,
resource samples, step samples (``progress.jsonl``) and console and of every task's log, copies
what changed of its trace directory (``up --trace``) and the run's state, so ``tflaunch status``,
``logs [-f]`` and ``trace`` read local files as for any run. ``down`` signals the coordinator
(which tears the cluster down as on Ctrl-C) and then makes sure no agent of the run is left on
any host.
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

from tflaunch.launchers.ssh.connect import Connection, Unreachable, parallel, remote_command
from tflaunch.launchers.ssh.details import SshDetails
from tflaunch.launchers.ssh.section import SshSection
from tflaunch.launchers.ssh.session import HostSession, fetch_new_bytes
from tflaunch.launchers.ssh.trace import fetch_tree
from tflaunch.plugin import (
    CONSOLE_FILE,
    EVENTS_FILE,
    PROGRESS_FILE,
    SAMPLES_PREFIX,
    ClusterConfig,
    Host,
    LaunchError,
    LaunchOptions,
    Outcome,
    Plan,
    Run,
    RunRecord,
    TflaunchError,
    open_run_file,
    remote_record_path,
)
from tflaunch.runtime import protocol
from tflaunch.runtime.rendezvous import RENDEZVOUS_FILE, Rendezvous
from tflaunch.runtime.runctl import cluster_ready

ON_HOST = "tflaunch.launchers.ssh.on_host"
WATCH = "tflaunch.launchers.ssh.watch"
AGENT_LOG = "agent.log"  # a detached agent's own output, in its host's run directory
WATCH_LOG = "watch.log"  # the laptop's watcher's output, in the local run directory
TRACE_DIR = "trace"  # up --trace: the coordinator's trace directory, in its run directory

# Runs on a host: SIGTERM a process if (and only if) its command line names the run, then wait;
# SIGKILL it at once with a fourth argument "kill".
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
os.kill(pid, signal.SIGKILL if sys.argv[4:] == ["kill"] else signal.SIGTERM)
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
    cluster_restarts: int = 0,
) -> None:
    """Start ``conn``'s host's agent in the background; it connects to ``coordinator``.
    ``replaced``: the old and new instance ids of a replacement joining a running cluster;
    ``cluster_restarts``: the run's so far, for a run its watcher starts again (its tasks see
    them in ``$TFLAUNCH_CLUSTER_RESTARTS``)."""
    host_dir = session.paths[conn.name].run_dir
    argv = [
        python, "-m", ON_HOST, "agent", "--run-dir", host_dir, "--host", conn.name,
        "--address", coordinator.address, "--port", str(coordinator.port),
    ]  # fmt: skip
    if replaced:
        argv += ["--replaced", *replaced]
    if cluster_restarts:
        argv += ["--cluster-restarts", str(cluster_restarts)]
    out = posixpath.join(host_dir, AGENT_LOG)
    conn.run(remote_command(argv, background_output=out), timeout=30)


def replace_wait(config: ClusterConfig, plan: Plan) -> float:
    """How long a provisioned detached run's coordinator waits for a replaced host's agent: 0
    (none) without a restart policy, else ``ssh.host_wait`` or twice the instances' ready
    timeout (the watcher creates, syncs and sets the instance up in that time)."""
    if config.section(SshSection).provision is None or not plan.supervision.restart.enabled:
        return 0.0
    return (
        config.section(SshSection).host_wait
        or 2 * config.section(SshSection).provision.ready_timeout
    )


def start_coordinator(
    session: HostSession,
    host: Host,
    run: Run,
    python: str,
    replace_wait: float,
    cluster_restarts: int = 0,
) -> Rendezvous:
    """Start the coordinator on ``host`` (its run directory holds the plan and the rendezvous
    record); its record once it listens. ``cluster_restarts``: a coordinator started again (see
    :mod:`tflaunch.launchers.ssh.watch`), whose output goes on in the run's console file."""
    run_dir = session.paths[host.name].run_dir
    argv = [
        python, "-m", ON_HOST, "coordinate", "--run-dir", run_dir, "--run-id", run.id,
        "--listen", host.cluster_address, "--replace-wait", f"{replace_wait:g}",
    ]  # fmt: skip
    if cluster_restarts:
        argv += ["--cluster-restarts", str(cluster_restarts)]
    console = posixpath.join(run_dir, CONSOLE_FILE)
    command = remote_command(argv, background_output=console, append=bool(cluster_restarts))
    session.connections[host.name].run(command, timeout=30)
    path = posixpath.join(run_dir, RENDEZVOUS_FILE)
    coordinator = _wait_for_coordinator(session, host.name, path, 60)
    if coordinator is None:
        output = session.read_file(host.name, console) or "(no output)"
        raise LaunchError(f"the coordinator did not start on {host.name}:\n{output[-2000:]}")
    return coordinator


def launch(
    session: HostSession,
    config: ClusterConfig,
    plan: Plan,
    run: Run,
    wait: float = 0.0,
    where: tuple[str, str] | None = None,
) -> str:
    """``up --detach``: pre-flight as for an attached run, then the coordinator on one host
    (``where``: a host and why, in words; default: the first host) and agents everywhere; a
    failure is recorded in the run. With ``wait``, a watcher here replaces ended instances
    (:mod:`tflaunch.launchers.ssh.watch`) and the coordinator waits as long for a replaced
    host's agent. The run's id."""
    try:
        session.open(config, plan, run, extra={RENDEZVOUS_FILE: Rendezvous.ahead().to_json()})
        python = config.section(SshSection).python
        name, why = where or (plan.hosts_with_tasks()[0].name, "the first host")
        coordinator = start_coordinator(session, plan.host(name), run, python, wait)
        run.update_part(
            SshDetails,
            detached=True,
            ssh_coordinator=name,
            ssh_coordinator_pid=coordinator.pid,
            state="starting",
        )
        results = parallel(
            lambda conn: start_agent(session, conn, python, coordinator),
            session.connections.values(),
        )
        failures = [f"{c.name}: {e}" for c, _, e in results if e is not None]
        if failures:
            down(session, run, plan.supervision.grace_period)
            raise LaunchError("cannot start the agents:\n  " + "\n  ".join(failures))
        _wait_until_ready(session, run, plan.supervision.ready_timeout + 60)
        session.say(
            f"detached: the coordinator runs on {name} ({why}); follow with 'tflaunch logs "
            f"-f {run.id}', stop with 'tflaunch down {run.id}'"
        )
    except TflaunchError as err:
        run.finish(Outcome(err.exit_code, str(err)))
        raise
    finally:
        session.close()
    if wait:
        start_watcher(run, session.say)
    return run.id


def launch_provisioned(
    session: HostSession,
    config: ClusterConfig,
    plan: Plan,
    run: Run,
    options: LaunchOptions,
    provider: Any = None,
) -> str:
    """``up --detach`` of a provisioned cluster: make the instances (they outlive this command;
    :mod:`tflaunch.launchers.clouds.provisioning`), start the run on them, its coordinator on an
    on-demand instance when there is one, and watch them from here (the hosts have no cloud
    credentials). ``provider``: the cloud the plan was made with, if the backend built it."""
    from tflaunch.launchers.clouds.provisioning import Provisioning
    from tflaunch.launchers.ssh import cloud

    keep = config.name if options.keep else None
    wait = replace_wait(config, plan)
    provisioning = Provisioning(
        provider or cloud.provider(config, session.say), config, run,
        cloud.reach(config, run.id), plan=plan, detach=True, keep=keep, recreate=options.recreate,
    )  # fmt: skip
    with provisioning as made:
        assert made.plan is not None
        session.options = cloud.instance_options(config, run, keep)
        where = cloud.coordinator_host(made.state.planned, made.plan, watched=wait > 0)
        return launch(session, config, made.plan, run, wait, where)


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
            mirrored = [EVENTS_FILE, CONSOLE_FILE, PROGRESS_FILE] + [
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
        # An end recorded here ('down', or the watcher failing a run whose coordinator's host
        # was lost) stands against a coordinator that recorded none.
        if copied and not (run.ended and remote.ended is None):
            run.update_meta(**copied)
        session.fetch_logs(run.read_plan(), run)
        with conn.sftp() as sftp:  # up --trace: after run.json, which ends after the trace
            fetch_tree(sftp, posixpath.join(remote_dir, TRACE_DIR), run.dir / TRACE_DIR)
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


def agent_pids(run: Run) -> dict[str, int]:
    """Each host's latest agent process, from the coordinator's events (mirrored here)."""
    agents = {}
    for record in protocol.records(run.events()):
        if isinstance(record.event, protocol.AgentStarted) and record.event.pid and record.host:
            agents[record.host] = record.event.pid
    return agents


def stop_process(
    conn: Connection, python: str, pid: int, run_id: str, wait: float, kill: bool = False
) -> str:
    """End process ``pid`` on ``conn``'s host if its command line names the run: SIGTERM, and
    SIGKILL after ``wait`` seconds (at once with ``kill``). What happened: gone, stopped,
    killed."""
    argv = [python, "-c", STOP_PROCESS, str(pid), run_id, f"{wait:g}"] + (["kill"] if kill else [])
    result = conn.run(remote_command(argv), timeout=wait + 30)
    return result.stdout.strip() or result.stderr.strip()


def down(session: HostSession, run: Run, grace: float) -> str:
    """Stop the coordinator (it tears the cluster down), then any agent of the run still left.
    :class:`Unreachable` when the hosts cannot be reached (see :func:`down_unreachable`)."""
    try:
        session.reconnect(run)
    except Unreachable as err:
        raise err.because("the run's coordinator and agents were not asked to stop") from None
    stop_watcher(run)  # it would replace the instances 'down' ends
    try:
        refresh(session, run)  # the agents' pids are in the coordinator's events
        details = run.record().part(SshDetails)
        conn = session.connections[details.ssh_coordinator]
        python = details.ssh_python
        try:
            reply = stop_process(conn, python, details.ssh_coordinator_pid, run.id, grace + 30)
        except TflaunchError as err:
            reply = str(err)
        what = [f"coordinator on {conn.name}: {reply}"]
        agents = agent_pids(run)

        def stop_agent(host_conn: Connection) -> str:
            pid = agents.get(host_conn.name)
            if pid is None:
                return "no agent"
            return stop_process(host_conn, python, pid, run.id, grace + 10)

        for host_conn, reply, err in parallel(stop_agent, session.connections.values()):
            what.append(f"agent on {host_conn.name}: {reply if err is None else err}")
        refresh(session, run)
        if not run.ended:
            run.finish(Outcome(143, "stopped with tflaunch down", interrupted=True))
        return f"run {run.id} is down (state: {run.record().state}); " + "; ".join(what)
    finally:
        session.close()


def down_unreachable(run: Run, err: Unreachable, terminate: Callable[[], str]) -> str:
    """``down`` of a detached run whose hosts cannot be reached (the laptop changed networks,
    a firewall): ending its instances needs only the cloud account, so ``terminate`` ends them
    (and the tasks on them) and the run is recorded stopped; what the hosts held since the last
    refresh cannot be collected, and the result says so. A run on hosts tflaunch did not make,
    or on a kept cluster (which outlives runs), is refused: nothing can stop it now."""
    from tflaunch.launchers.clouds.records import CloudDetails

    cloud = run.record().part(CloudDetails)
    if not cloud.instances:
        raise err.because(
            "nothing was stopped: its hosts are not tflaunch's to end; run "
            f"'tflaunch down {run.id}' again once they can be reached"
        ) from None
    if cloud.keep_cluster:
        raise err.because(
            f"nothing was stopped: the run's tasks run on kept cluster {cloud.keep_cluster}, "
            f"which outlives runs; run 'tflaunch down {run.id}' again once its hosts can be "
            f"reached, or end the cluster with 'tflaunch down --cluster {cloud.keep_cluster}'"
        ) from None
    stop_watcher(run)  # it would replace the instances 'down' ends
    terminated = terminate()
    lost = (
        "the coordinator's last events and state, the tasks' last log lines and resource "
        "samples, and the trace (up --trace), if any"
    )
    if not run.ended:
        run.finish(
            Outcome(
                143,
                "stopped with tflaunch down, which could not reach the hosts: its instances "
                f"were terminated; not collected: {lost}",
                interrupted=True,
            )
        )
    return (
        f"run {run.id} is down (state: {run.record().state}): {terminated}. Its hosts could "
        f"not be reached ({len(err.failures)} of {err.hosts}), so what they held since the "
        f"last 'tflaunch status' was not collected: {lost}.\n  " + "\n  ".join(err.failures)
    )
