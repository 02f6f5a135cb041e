"""Detached SSH runs: the coordinator moves onto the first host, so the laptop may disconnect.

``tflaunch up --detach`` on an ssh cluster does everything an attached run does up to the
pre-flight, then starts, each in its own session on the hosts (what ``screen`` gave the CSCS
scripts):

* ``python -m tflaunch.launchers.ssh.on_host coordinate`` on the first host: the same coordinator as an
  attached run (same policy, same events and run.json), listening on that host's *cluster* address
  for the agents;
* ``python -m tflaunch.launchers.ssh.on_host agent`` on every host: connects to that coordinator over
  the private network, proves it belongs to the run (a random token: the launcher put the run's
  rendezvous record, still without an address, in each host's run directory), then serves its
  agent over that connection (:mod:`tflaunch.runtime.rendezvous`).

The coordinator pings the agents, so an agent whose coordinator vanished still stops its tasks;
the coordinator stops the PS when training ends, as always. ``tflaunch status``, ``logs [-f]`` and
``down`` reconnect over SSH and work from the run directory (see ``SshBackend``).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

from tflaunch.cluster.plan import Plan
from tflaunch.errors import LaunchError, TflaunchError
from tflaunch.launchers.ssh.details import SshDetails
from tflaunch.runtime.agent import serve
from tflaunch.runtime.coordinator import coordinate
from tflaunch.runtime.link import socket_streams
from tflaunch.runtime.rendezvous import Listener, Rendezvous, connect, publish, read_published
from tflaunch.runtime.run import Outcome, Run
from tflaunch.runtime.runfiles import PLAN_FILE


def handed_over(run_dir: Path) -> Rendezvous:
    """The rendezvous record the launcher put in this host's run directory."""
    record = read_published(run_dir)
    if record is None:
        raise LaunchError(f"{run_dir} holds no rendezvous record from the launcher")
    return record


def run_coordinator(run_dir: Path, run_id: str, listen: str) -> int:
    """Listen on ``listen``, publish where, admit every host's agent, and coordinate the run."""
    plan = Plan.from_dict(json.loads((run_dir / PLAN_FILE).read_text()))
    run = Run(run_id, run_dir)
    hosts = [h.name for h in plan.hosts_with_tasks()]
    record = handed_over(run_dir)
    listener = Listener(listen, record.token, set(hosts))
    publish(run_dir, record.listening(listener, host=socket.gethostname()))
    run.start("ssh", hosts, SshDetails, detached=True)
    joined = listener.accept(plan.supervision.ready_timeout + 60)
    missing = sorted(set(hosts) - set(joined))
    if missing:
        for agent in joined.values():
            agent.link.close(timeout=5)
        message = f"the agents of {', '.join(missing)} never connected to the coordinator"
        print(f"tflaunch: {message}", file=sys.stderr)
        return run.finish(Outcome(2, message)).code
    return coordinate(plan, run, [joined[h].link for h in sorted(joined)]).code


def run_agent(run_dir: Path, host: str, address: str, port: int, timeout: float) -> int:
    """Connect to the coordinator, then serve this host's agent over the connection."""
    plan = Plan.from_dict(json.loads((run_dir / PLAN_FILE).read_text()))
    sock = connect(address, port, handed_over(run_dir).token, host, timeout)
    commands, events = socket_streams(sock)
    try:
        return serve(plan, host, run_dir, commands, events)
    finally:
        sock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tflaunch.launchers.ssh.on_host", description=__doc__
    )
    sub = parser.add_subparsers(dest="command", required=True)
    coord = sub.add_parser("coordinate", help="run a detached run's coordinator on this host")
    coord.add_argument("--run-dir", required=True)
    coord.add_argument("--run-id", required=True)
    coord.add_argument("--listen", required=True, help="this host's cluster address")
    ag = sub.add_parser("agent", help="connect to the coordinator, then run the agent")
    ag.add_argument("--run-dir", required=True, help="this host's run directory (plan, token)")
    ag.add_argument("--host", required=True)
    ag.add_argument("--address", required=True)
    ag.add_argument("--port", type=int, required=True)
    ag.add_argument("--connect-timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    try:
        if args.command == "coordinate":
            return run_coordinator(Path(args.run_dir), args.run_id, args.listen)
        return run_agent(
            Path(args.run_dir), args.host, args.address, args.port, args.connect_timeout
        )
    except TflaunchError as err:
        print(f"tflaunch: error: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
