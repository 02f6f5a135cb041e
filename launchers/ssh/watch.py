"""The laptop's watch over a detached provisioned run's instances.

A detached run's coordinator lives on one of its hosts (an on-demand instance when there is one),
which has no cloud credentials. So ``tflaunch up --detach`` on a provisioned cluster with a
restart policy leaves this process behind (``python -m tflaunch.launchers.ssh.watch --run-dir D``,
its own session, output in ``watch.log`` of the run directory, pid in run.json), which does what an
attached launcher does for its run:

* every few seconds it asks the provider whether the run's instances still run, and every
  ``END_SECONDS`` it reads the coordinator's run.json (has the run ended?) and mirrors its events
  and console into the local run directory (so that they outlive the coordinator's host);
* for one that ended, it tells the coordinator — over SSH to the coordinator's host, then over the
  private network to its listener, with the run's token — that the host is lost (the coordinator
  cuts the old agent's connection, and restarts the host's tasks alone or the whole cluster once
  the host is back);
* it creates a replacement of the same host name, role, type and cluster address, syncs it, sets
  it up, pre-flights it, and starts an agent there that joins the coordinator, naming the old and
  new instance (the ``instance_replaced`` event).

When the instance that ended is the coordinator's own, nothing is left to rejoin: the watcher
restarts the run, as a cluster restart within ``supervision.restart.max_cluster_restarts``. It
stops the old agents on the other hosts, replaces the instance, gives every host a new token,
copies the mirrored events and console onto the replacement (they go on there, with the host's
loss and the restart added), starts a new coordinator there that counts the run's cluster
restarts so far, and new agents everywhere: every task starts again and the programs resume from
their checkpoints. Past the limit it fails the run naming the instance and the limit, and stops
the other hosts' agents.

It ends when the run ends (it reads the coordinator's run.json), or when ``tflaunch down`` stops it.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import posixpath
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import paramiko

from tflaunch.launchers.clouds.fleet import fleet_of_run
from tflaunch.launchers.clouds.records import CloudDetails
from tflaunch.launchers.ssh import cloud, detached
from tflaunch.launchers.ssh.connect import Connection, SshOptions, connect_all, parallel
from tflaunch.launchers.ssh.details import SshDetails
from tflaunch.launchers.ssh.section import SshSection
from tflaunch.launchers.ssh.session import HostSession, fetch_new_bytes, put_whole, same_file
from tflaunch.plugin import (
    CONSOLE_FILE,
    EVENTS_FILE,
    SAMPLES_PREFIX,
    ClusterConfig,
    Host,
    Outcome,
    Run,
    RunRecord,
    TflaunchError,
    load_config,
    open_run_file,
    remote_record_path,
)
from tflaunch.runtime import protocol
from tflaunch.runtime.rendezvous import RENDEZVOUS_FILE, Rendezvous

WATCH_SECONDS = 3.0  # between asking the provider whether the instances run
END_SECONDS = 10.0  # between reading whether the run ended
READ_SECONDS = 30.0  # for one read from the coordinator's host
T = TypeVar("T")


def say(message: str) -> None:
    print(f"[tflaunch watch] {message}", flush=True)


class Watch:
    def __init__(self, run: Run):
        self.run = run
        record = run.record()
        config = load_config(str(record.cluster_file))
        keep = record.part(CloudDetails).keep_cluster
        self.config: ClusterConfig = config
        self.options = cloud.instance_options(config, run, keep)  # the run's known_hosts
        self.fleet = fleet_of_run(
            config.section(SshSection).provision, config, run, cloud.reach(config, run.id), say
        )
        details = record.part(SshDetails)
        self.python = details.ssh_python
        self.coordinator_host = str(details.ssh_coordinator)
        self.remote_dir = details.ssh_hosts[self.coordinator_host]["run_dir"]
        self.conn: Connection | None = None

    def _coordinator(self) -> Connection:
        if self.conn is None:
            plan = self.run.read_plan()
            options = SshOptions(**(self.run.record().part(SshDetails).ssh_options or {}))
            address = plan.host(self.coordinator_host).connect_address
            self.conn = connect_all([(self.coordinator_host, address)], options)[
                self.coordinator_host
            ]
        return self.conn

    def _read(self, path: str) -> str:
        with self._coordinator().sftp() as sftp, sftp.open(path) as f:
            return f.read().decode(errors="replace")

    def run_ended(self) -> bool:
        return (
            RunRecord.from_json(self._read(remote_record_path(self.remote_dir)) or "{}").ended
            is not None
        )

    def loop(self) -> int:
        seen: set[str] = set()  # the reasons already acted on (they name the instance)
        checked = 0.0
        while True:
            if time.monotonic() - checked > END_SECONDS:
                checked = time.monotonic()
                try:
                    if self.bounded(self.run_ended):
                        say("the run ended")
                        return 0
                    self.bounded(self.mirror)
                except (TflaunchError, OSError, paramiko.SSHException) as err:
                    say(f"cannot read the run's state from {self.coordinator_host}: {err}")
                    self.drop_connection()
            try:
                ended = self.fleet.ended()
            except TflaunchError as err:  # the provider did not answer: next round
                say(f"cannot ask for the instances: {err}")
                ended = {}
            fresh = {host: why for host, why in ended.items() if why not in seen}
            seen.update(fresh.values())
            if self.coordinator_host in fresh:  # with any other host lost at the same time
                if not CoordinatorRestart(self, fresh).go():
                    return 1
                fresh = {}
            for host, why in fresh.items():
                try:
                    self.replace(host, why)
                except (TflaunchError, OSError) as err:
                    say(f"{host}: not replaced: {err}")
            time.sleep(WATCH_SECONDS)

    def bounded(self, read: Callable[[], T]) -> T:
        """``read`` from the coordinator's host, given up after ``READ_SECONDS``: an SSH read
        from an instance that vanished would wait for TCP to give up (many minutes), while its
        loss is to be seen within seconds. The connection is dropped then (its reads end)."""
        done: dict[str, Any] = {}

        def reading() -> None:
            try:
                done["value"] = read()
            except BaseException as err:  # handed to the caller
                done["error"] = err

        thread = threading.Thread(target=reading, daemon=True)
        thread.start()
        thread.join(READ_SECONDS)
        if thread.is_alive():
            self.drop_connection()
            raise TflaunchError(f"no answer within {READ_SECONDS:g} s")
        if "error" in done:
            raise done["error"]
        return done["value"]

    def mirror(self) -> None:
        """Copy what is new of the coordinator's events and console into the run directory."""
        names = [EVENTS_FILE, CONSOLE_FILE]
        pairs = [(posixpath.join(self.remote_dir, n), self.run.dir / n) for n in names]
        fetch_new_bytes(self._coordinator(), pairs)

    def moved(self, host: str) -> None:
        """The coordinator runs on ``host`` again, on a new instance: reach it anew."""
        self.drop_connection()
        self.coordinator_host = host
        self.remote_dir = self.run.record().part(SshDetails).ssh_hosts[host]["run_dir"]

    def drop_connection(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def replace(self, host: str, why: str) -> None:
        """Tell the coordinator, replace the instance, prepare it, start its agent."""
        record = Rendezvous.from_json(self._read(posixpath.join(self.remote_dir, RENDEZVOUS_FILE)))
        if record is None or not record.port:
            raise TflaunchError(f"no coordinator record on {self.coordinator_host}")
        say(f"{host} was lost ({why}); telling the coordinator, creating a replacement")
        self._tell(record, {"hello": host, "token": record.token, "lost": why})
        # no wait for the old agent: the new one stops what it left running of its tasks
        deadline = time.monotonic() + 2 * self.fleet.ready_timeout
        made, old_id, new_id = self.fleet.replace(host, deadline)
        plan = self.run.read_plan().with_hosts(made)
        self.run.write_plan(plan)  # status, logs and down reach the new instance
        session = HostSession(sys.stdout)
        session.options = self.options
        try:
            extra = {RENDEZVOUS_FILE: Rendezvous(record.token).to_json()}
            session.open(self.config, plan, self.run, extra=extra, only=host)
            conn = session.connections[host]
            detached.start_agent(session, conn, self.python, record, (old_id, new_id))
        finally:
            session.close()
        say(f"{host}: replacement {new_id} (for {old_id}) prepared; its agent joins the run")

    def _tell(self, record: Rendezvous, hello: dict) -> None:
        """One line to the coordinator's listener, through an SSH channel to its host."""
        transport = self._coordinator().transport
        channel = transport.open_channel(
            "direct-tcpip", (record.address, record.port), ("127.0.0.1", 0), timeout=15
        )
        try:
            channel.sendall((json.dumps(hello) + "\n").encode())
            time.sleep(0.5)  # the listener reads the line before the channel closes
        finally:
            channel.close()


class CoordinatorRestart:
    """The coordinator's own instance ended: the run starts again on its replacement, as a
    cluster restart, or fails past the limit (see the module). ``lost``: host -> why, for every
    host whose instance ended, the coordinator's among them; each is replaced."""

    def __init__(self, watch: Watch, lost: dict[str, str]):
        self.watch, self.run = watch, watch.run
        self.host = watch.coordinator_host
        self.why = lost[self.host]
        self.lost = {self.host: self.why, **lost}  # the coordinator's host first
        plan = self.run.read_plan()
        self.limit = plan.supervision.restart.max_cluster_restarts
        self.grace = plan.supervision.grace_period
        self.old_pid = self.run.record().part(SshDetails).ssh_coordinator_pid
        self.new_pid: int | None = None
        self.lost_events = [
            protocol.HostLost(host=host, message=why).wire() for host, why in self.lost.items()
        ]

    def go(self) -> bool:
        """Restart the run on a replacement; False when the run failed instead."""
        self.watch.drop_connection()  # its host is gone (what it wrote last was mirrored)
        used = sum(
            isinstance(r.event, protocol.ClusterRestarting)
            for r in protocol.records(self.run.events())
        )
        if self.ending():
            return self.fail(
                "its coordinator was ending the run (the events show the cluster stopping), and "
                "the run's outcome was recorded on that host"
            )
        if used >= self.limit:
            return self.fail(
                f"the cluster was restarted {used} time(s), the limit of "
                f"supervision.restart.max_cluster_restarts ({self.limit})"
            )
        also = "".join(f"; {h} too ({why})" for h, why in self.lost.items() if h != self.host)
        say(
            f"{self.host} was lost ({self.why}) and ran the coordinator{also}: stopping the "
            "agents on the other hosts, replacing the instance, then a new coordinator there and "
            f"the whole cluster again from its checkpoints (cluster restart {used + 1} of at most "
            f"{self.limit})"
        )
        try:
            self.restart(used + 1)
        except (TflaunchError, OSError, paramiko.SSHException) as err:
            return self.fail(f"starting it again failed: {err}")
        return True

    def ending(self) -> bool:
        """Whether the mirrored events show the run ending since the coordinator's last start
        (it stopped the cluster, or every host's agent exited): the run was over, not to be
        started again."""
        stopping, hosts, exited = False, set(), set()
        for record in protocol.records(self.run.events()):
            event = record.event
            if isinstance(event, protocol.CoordinatorStarted):
                stopping, hosts, exited = False, set(event.hosts), set()
            elif isinstance(event, protocol.StoppingCluster):
                stopping = True
            elif isinstance(event, protocol.AgentStarted):
                exited.discard(record.host)
            elif isinstance(event, protocol.AgentExit):
                exited.add(record.host)
        return stopping or bool(hosts) and hosts <= exited

    def restart(self, generation: int) -> None:
        fleet = self.watch.fleet
        deadline = time.monotonic() + 2 * fleet.ready_timeout
        made = {host: fleet.replace(host, deadline) for host in self.lost}  # (host, old, new)
        plan = self.run.read_plan()
        plan = plan.with_hosts(*(host for host, _, _ in made.values()))
        self.run.write_plan(plan)  # status, logs and down reach the new instances
        session = HostSession(sys.stdout)
        try:
            session.reconnect(self.run)  # every host, the replacements at their new addresses
            self.stop_old(session)
            token = Rendezvous.ahead()  # a new one: no agent of the old cluster may join
            for host in made:  # synced, set up and checked, as at the start
                opened = HostSession(sys.stdout)
                opened.options = self.watch.options
                try:
                    extra = {RENDEZVOUS_FILE: token.to_json()}
                    opened.open(self.watch.config, plan, self.run, extra=extra, only=host)
                    session.connections.pop(host).close()
                    session.connections[host] = opened.connections.pop(host)
                    session.paths[host] = opened.paths[host]
                finally:
                    opened.close()
            for name, conn in session.connections.items():
                if name not in made:
                    path = posixpath.join(session.paths[name].run_dir, RENDEZVOUS_FILE)
                    with conn.sftp() as sftp, sftp.open(path, "w") as f:
                        f.write(token.to_json())
            restarting = protocol.ClusterRestarting(
                cause=protocol.HostLost.NAME, host=self.host, generation=generation
            )
            replaced = [
                {"host": host, **protocol.InstanceReplaced(old=old, new=new).wire()}
                for host, (_, old, new) in made.items()
            ]
            self.carry_over(session, [*self.lost_events, restarting.wire(), *replaced])
            wait = detached.replace_wait(self.watch.config, plan)
            python = self.watch.python
            new_host, old_id, new_id = made[self.host]
            record = detached.start_coordinator(
                session, new_host, self.run, python, wait, generation
            )
            self.new_pid = record.pid
            self.run.update_part(SshDetails, ssh_coordinator_pid=record.pid)
            results = parallel(
                lambda conn: detached.start_agent(
                    session, conn, python, record, cluster_restarts=generation
                ),
                session.connections.values(),
            )
            failures = [f"{c.name}: {e}" for c, _, e in results if e is not None]
            if failures:
                raise TflaunchError("cannot start the agents: " + "; ".join(failures))
        finally:
            session.close()
        self.watch.moved(self.host)
        say(
            f"{self.host}: replacement {new_id} (for {old_id}) runs the coordinator (pid "
            f"{record.pid}); the run goes on from its checkpoints"
        )

    def stop_old(self, session: HostSession) -> None:
        """End the old cluster's processes wherever they still run: each host's agent (it stops
        its tasks), and the old coordinator, killed so that it records no end of the run. (On a
        new instance neither is there; a host whose processes outlive its instance's end, as
        the namespace test hosts do, has them.)"""
        agents = detached.agent_pids(self.run)
        python, run_id = self.watch.python, self.run.id
        # The coordinator first: one that saw its agents stop would record the run's failure.
        conn = session.connections.get(self.host)
        coordinators = [p for p in (self.old_pid, self.new_pid) if p is not None]
        for pid in coordinators if conn is not None else []:
            stopped = detached.stop_process(conn, python, pid, run_id, 0, kill=True)
            say(f"  {self.host}: coordinator {stopped}")

        def stop(conn: Connection) -> str:
            if conn.name not in agents:
                return "no agent"
            return detached.stop_process(conn, python, agents[conn.name], run_id, self.grace + 10)

        for conn, reply, err in parallel(stop, session.connections.values()):
            say(f"  {conn.name}: agent {reply if err is None else err}")

    def carry_over(self, session: HostSession, events: list[dict]) -> None:
        """Add ``events`` to the mirrored events, and copy the mirrored files onto the
        coordinator's new host, where the new coordinator goes on writing them (the mirror
        copies what is new of them, as before)."""
        conn, remote_dir = session.connections[self.host], session.paths[self.host].run_dir
        names = [EVENTS_FILE, CONSOLE_FILE] + sorted(
            p.name for p in self.run.dir.glob(f"{SAMPLES_PREFIX}*")
        )
        with open_run_file(self.run.events_path, "a") as mirrored:
            fcntl.flock(mirrored.fileno(), fcntl.LOCK_EX)  # no mirroring meanwhile
            now = round(time.time(), 3)
            mirrored.writelines(json.dumps({**e, "time": now}) + "\n" for e in events)
            mirrored.flush()
            with conn.sftp() as sftp:
                for name in names:
                    local, remote = self.run.dir / name, posixpath.join(remote_dir, name)
                    if local.exists() and not same_file(remote, local):
                        put_whole(sftp, local, remote)

    def fail(self, why_not: str) -> bool:
        """The run ends here: every process of it that still runs is stopped, and its end is
        recorded in the run directory."""
        message = (
            f"{self.host} was lost ({self.why}), and with it the run's coordinator. Not "
            f"restarted: {why_not}"
        )
        say(message)
        plan = self.run.read_plan()
        options = SshOptions(**(self.run.record().part(SshDetails).ssh_options or {}))
        session = HostSession(sys.stdout)

        def reach(host: Host) -> Connection:
            return connect_all([(host.name, host.connect_address)], options)[host.name]

        for host, conn, err in parallel(reach, plan.hosts_with_tasks()):
            if err is None:
                session.connections[host.name] = conn
            else:
                say(f"  {host.name}: not reached ({err})")
        try:
            self.stop_old(session)
        finally:
            session.close()
        failed = protocol.Failed(code=1, message=message).wire()
        with open_run_file(self.run.events_path, "a") as mirrored:
            fcntl.flock(mirrored.fileno(), fcntl.LOCK_EX)
            now = round(time.time(), 3)
            ended = [*self.lost_events, failed]
            mirrored.writelines(json.dumps({**e, "time": now}) + "\n" for e in ended)
        self.run.finish(Outcome(1, message))
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tflaunch.launchers.ssh.watch")
    parser.add_argument("--run-dir", required=True)
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    try:
        return Watch(Run(run_dir.name, run_dir)).loop()
    except TflaunchError as err:
        say(f"stopped: {err}")
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
