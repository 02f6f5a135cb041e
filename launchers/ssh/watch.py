"""The laptop's watch over a detached provisioned run's instances.

A detached run's coordinator lives on the first host, which has no cloud credentials. So
``tflaunch up --detach`` on a provisioned cluster with a restart policy leaves this process behind
(``python -m tflaunch.launchers.ssh.watch --run-dir D``, its own session, output in ``watch.log``
of the run directory, pid in run.json), which does what an attached launcher does for its run:

* every few seconds it asks the provider whether the run's instances still run;
* for one that ended, it tells the coordinator — over SSH to the coordinator's host, then over the
  private network to its listener, with the run's token — that the host is lost (the coordinator
  cuts the old agent's connection, and restarts the host's tasks alone or the whole cluster once
  the host is back);
* it creates a replacement of the same host name, role, type and cluster address, syncs it, sets
  it up, pre-flights it, and starts an agent there that joins the coordinator, naming the old and
  new instance (the ``instance_replaced`` event).

It ends when the run ends (it reads the coordinator's run.json), when ``tflaunch down`` stops it,
or when the coordinator's own host is lost (nothing is left to rejoin; the run fails).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import posixpath
import sys
import time
from pathlib import Path

from tflaunch.cluster.config import ClusterConfig, load_config
from tflaunch.errors import TflaunchError
from tflaunch.launchers.clouds.base import CloudDetails
from tflaunch.launchers.ssh import detached, provision
from tflaunch.launchers.ssh.connect import Connection, SshOptions, connect_all
from tflaunch.launchers.ssh.details import SshDetails
from tflaunch.launchers.ssh.session import HostSession
from tflaunch.runtime.rendezvous import RENDEZVOUS_FILE, Rendezvous
from tflaunch.runtime.run import Run, RunRecord, remote_record_path

WATCH_SECONDS = 3.0  # between asking the provider whether the instances run
END_SECONDS = 10.0  # between reading whether the run ended


def say(message: str) -> None:
    print(f"[tflaunch watch] {message}", flush=True)


class Watch:
    def __init__(self, run: Run):
        self.run = run
        record = run.record()
        config = load_config(str(record.cluster_file))
        keep = record.part(CloudDetails).keep_cluster
        self.on_hosts: ClusterConfig = provision.on_instances(config, run, keep)
        self.fleet = provision.fleet_of_run(config, run, say)
        details = record.part(SshDetails)
        self.python = details.ssh_python
        self.coordinator_host = str(details.ssh_coordinator)
        self.remote_dir = details.ssh_hosts[self.coordinator_host]["run_dir"]
        self.grace = run.read_plan().supervision.grace_period
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
                    if self.run_ended():
                        say("the run ended")
                        return 0
                except (TflaunchError, OSError) as err:
                    say(f"cannot read the run's state from {self.coordinator_host}: {err}")
                    self.conn = None
            try:
                ended = self.fleet.ended()
            except TflaunchError as err:  # the provider did not answer: next round
                say(f"cannot ask for the instances: {err}")
                ended = {}
            for host, why in ended.items():
                if why in seen:
                    continue
                seen.add(why)
                if host == self.coordinator_host:
                    say(f"{host} ({why}) runs the coordinator: the run cannot go on without it")
                    return 1
                try:
                    self.replace(host, why)
                except (TflaunchError, OSError) as err:
                    say(f"{host}: not replaced: {err}")
            time.sleep(WATCH_SECONDS)

    def replace(self, host: str, why: str) -> None:
        """Tell the coordinator, replace the instance, prepare it, start its agent."""
        record = Rendezvous.from_json(self._read(posixpath.join(self.remote_dir, RENDEZVOUS_FILE)))
        if record is None or not record.port:
            raise TflaunchError(f"no coordinator record on {self.coordinator_host}")
        say(f"{host} was lost ({why}); telling the coordinator, creating a replacement")
        self._tell(record, {"hello": host, "token": record.token, "lost": why})
        time.sleep(self.grace + 2)  # the old agent, where it still runs, stops its tasks
        deadline = time.monotonic() + 2 * self.fleet.config.ssh.provision.ready_timeout
        made, old_id, new_id = self.fleet.replace(host, deadline)
        plan = self.run.read_plan()
        plan = dataclasses.replace(
            plan, hosts=tuple(made if h.name == host else h for h in plan.hosts)
        )
        self.run.write_plan(plan)  # status, logs and down reach the new instance
        session = HostSession(sys.stdout)
        try:
            extra = {RENDEZVOUS_FILE: Rendezvous(record.token).to_json()}
            session.open(self.on_hosts, plan, self.run, extra=extra, only=host)
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
