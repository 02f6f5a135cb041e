"""Detached SSH runs: the coordinator moves onto one host, so the laptop may disconnect.

``tflaunch up --detach`` on an ssh cluster does everything an attached run does up to the
pre-flight, then starts, each in its own session on the hosts (what ``screen`` gave the CSCS
scripts):

* ``python -m tflaunch.launchers.ssh.on_host coordinate`` on one host (the first, or an on-demand
  instance of a provisioned run with spot workers): the same coordinator as an attached run (same
  policy, same events and run.json), listening on that host's *cluster* address for the agents;
* ``python -m tflaunch.launchers.ssh.on_host agent`` on every host: connects to that coordinator over
  the private network, proves it belongs to the run (a random token: the launcher put the run's
  rendezvous record, still without an address, in each host's run directory), then serves its
  agent over that connection (:mod:`tflaunch.runtime.rendezvous`).

The coordinator pings the agents, so an agent whose coordinator vanished still stops its tasks;
the coordinator stops the PS when training ends, as always.

A provisioned run's coordinator (``--replace-wait S``) keeps listening after every agent joined:
the launcher's watcher (:mod:`tflaunch.launchers.ssh.watch`, which holds the cloud credentials the
hosts lack) reports a host whose instance ended (a hello with ``lost``), and, once it replaced and
prepared the instance, starts an agent there that joins again (a hello with ``replaced``: the old
and new instance ids) within S seconds; the coordinator restarts its tasks alone or the cluster,
as an attached run does. When the coordinator's own instance ends, the watcher starts a new
coordinator on its replacement with ``--cluster-restarts N`` (the run's cluster restarts so far,
this one included), and new agents everywhere. ``tflaunch status``, ``logs [-f]`` and
``down`` reconnect over SSH and work from the run directory (see ``SshBackend``).

``up --detach --trace``: the coordinator's host reaches every task's profiler port, so the
capture helper runs there, beside it, in the coordinator's trace directory (the first host's run
directory's ``trace/``); the agents report their hosts' trace notes over their connections and,
at their end, send the profiles their tasks saved on their own hosts
(:mod:`tflaunch.trace.links`); the merge runs there too. The launcher copies that
directory back with the run's logs (:func:`tflaunch.launchers.ssh.detached.refresh`).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tflaunch.launchers.agent import serve
from tflaunch.launchers.ssh.details import SshDetails
from tflaunch.plugin import (
    PLAN_FILE,
    LaunchError,
    Outcome,
    Plan,
    Revive,
    Run,
    TflaunchError,
    TraceRequest,
    TraceSite,
)
from tflaunch.runtime import protocol
from tflaunch.runtime.coordinator import coordinate
from tflaunch.runtime.link import SocketLink, socket_streams
from tflaunch.runtime.rendezvous import Listener, Rendezvous, connect, publish, read_published
from tflaunch.trace.files import read_verdict
from tflaunch.trace.run import RunTrace


def handed_over(run_dir: Path) -> Rendezvous:
    """The rendezvous record the launcher put in this host's run directory."""
    record = read_published(run_dir)
    if record is None:
        raise LaunchError(f"{run_dir} holds no rendezvous record from the launcher")
    return record


class Rejoins:
    """After the first join: the watcher's reports of lost hosts, and the agents of replaced
    instances, parked (and pinged, so that they keep their tasks) until the coordinator takes
    them."""

    def __init__(self, heartbeat: float):
        self.links: dict[str, SocketLink] = {}  # the coordinator's links, by host
        self.heartbeat = heartbeat
        self._parked: dict[str, SocketLink] = {}
        self._changed = threading.Condition()
        threading.Thread(target=self._ping_parked, daemon=True).start()

    def hello(self, sock: socket.socket, hello: dict[str, Any]) -> None:
        host = hello["hello"]
        if "lost" in hello:  # the watcher: the host's instance ended
            sock.close()
            current = self.links.get(host)
            if current is not None:
                current.report_lost(str(hello["lost"]))
            return
        old, new = (list(hello.get("replaced") or []) + ["", ""])[:2]
        first = [protocol.InstanceReplaced(old=str(old), new=str(new)).wire()] if old else []
        with self._changed:
            self._parked[host] = SocketLink(host, sock, first_events=first)
            self._changed.notify_all()

    def take(self, host: str, deadline: float) -> SocketLink:
        """The new agent of ``host`` once it joined; raises at ``deadline`` (monotonic)."""
        with self._changed:
            while host not in self._parked:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise LaunchError("no agent of its replacement joined")
                self._changed.wait(min(remaining, 1.0))
            link = self.links[host] = self._parked.pop(host)
            return link

    def _ping_parked(self) -> None:
        ping = protocol.Ping().wire()
        while True:
            time.sleep(self.heartbeat)
            with self._changed:
                parked = list(self._parked.values())
            for link in parked:
                link.send(ping)


def run_coordinator(
    run_dir: Path, run_id: str, listen: str, replace_wait: float = 0.0, cluster_restarts: int = 0
) -> int:
    """Listen on ``listen``, publish where, admit every host's agent, and coordinate the run;
    with ``replace_wait``, take replaced hosts' new agents for as long (see the module).
    ``cluster_restarts``: a coordinator started again on the replacement of its lost host (by
    the watcher) goes on from the run's cluster restarts so far, this one included."""
    plan = Plan.from_dict(json.loads((run_dir / PLAN_FILE).read_text()))
    run = Run(run_id, run_dir)
    hosts = [h.name for h in plan.hosts_with_tasks()]
    record = handed_over(run_dir)
    listener = Listener(listen, record.token, set(hosts))
    if cluster_restarts:  # the run goes on: whatever end a disk kept is not this run's
        run.update_meta(ended=None, exit_code=None, message=None)
    publish(run_dir, record.listening(listener, host=socket.gethostname()))
    run.start("ssh", hosts, SshDetails, detached=True)
    revive, rejoins = None, None
    if replace_wait > 0 and plan.supervision.restart.enabled:
        rejoins = Rejoins(plan.supervision.heartbeat)
        revive = Revive(
            replace_wait,
            rejoins.take,
            doing=lambda host: (
                "the launcher's watcher replaces its instance; waiting up to "
                f"{replace_wait:g} s for the replacement's agent"
            ),
            not_back=f"was not replaced within {replace_wait:g} s",
        )
    joined = listener.accept(
        plan.supervision.ready_timeout + 60, rejoins.hello if rejoins else None
    )
    missing = sorted(set(hosts) - set(joined))
    if missing:
        for agent in joined.values():
            agent.link.close(timeout=5)
        message = f"the agents of {', '.join(missing)} never connected to the coordinator"
        print(f"tflaunch: {message}", file=sys.stderr)
        return run.finish(Outcome(2, message)).code
    links = [joined[h].link for h in sorted(joined)]
    if rejoins is not None:
        rejoins.links.update({link.host: link for link in links})
    # up --trace's request, as the launcher put it in the plan: the capture runs here, beside us
    request = TraceRequest.from_env(plan.program.env)
    trace = RunTrace(request, TraceSite(run.dir / "trace")) if request else None
    outcome = coordinate(
        plan, run, links, revive=revive, cluster_restarts=cluster_restarts, trace=trace
    )
    verdict = read_verdict(run.dir / "trace") if trace is not None else None
    if verdict is not None and verdict[1]:
        print(f"[tflaunch] {verdict[1]}", flush=True)  # the console, as up shows it attached
    return outcome.code


def run_agent(
    run_dir: Path,
    host: str,
    address: str,
    port: int,
    timeout: float,
    replaced: list[str],
    cluster_restarts: int = 0,
) -> int:
    """Connect to the coordinator, then serve this host's agent over the connection.
    ``replaced``: the old and new instance ids of a replacement joining a running cluster;
    ``cluster_restarts``: the run's so far (a run its watcher started again)."""
    plan = Plan.from_dict(json.loads((run_dir / PLAN_FILE).read_text()))
    extra = {"replaced": replaced} if replaced else {}
    sock = connect(address, port, handed_over(run_dir).token, host, timeout, **extra)
    commands, events = socket_streams(sock)
    try:
        # a replacement's agent starts its tasks when the coordinator says so, counting their
        # restarts so far
        return serve(
            plan, host, run_dir, commands, events, await_start=bool(replaced),
            generation=cluster_restarts,
        )  # fmt: skip
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
    coord.add_argument(
        "--replace-wait", type=float, default=0.0, help="seconds for a replaced host's agent"
    )
    coord.add_argument(
        "--cluster-restarts", type=int, default=0, help="the run's cluster restarts so far"
    )
    ag = sub.add_parser("agent", help="connect to the coordinator, then run the agent")
    ag.add_argument("--run-dir", required=True, help="this host's run directory (plan, token)")
    ag.add_argument("--host", required=True)
    ag.add_argument("--address", required=True)
    ag.add_argument("--port", type=int, required=True)
    ag.add_argument("--connect-timeout", type=float, default=60.0)
    ag.add_argument("--replaced", nargs=2, default=[], metavar=("OLD", "NEW"))
    ag.add_argument(
        "--cluster-restarts", type=int, default=0, help="the run's cluster restarts so far"
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "coordinate":
            return run_coordinator(
                Path(args.run_dir), args.run_id, args.listen, args.replace_wait,
                args.cluster_restarts,
            )  # fmt: skip
        return run_agent(
            Path(args.run_dir),
            args.host,
            args.address,
            args.port,
            args.connect_timeout,
            args.replaced,
            args.cluster_restarts,
        )
    except TflaunchError as err:
        print(f"tflaunch: error: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
