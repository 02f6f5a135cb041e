"""Detached SSH runs: the coordinator moves onto the first host, so the laptop may disconnect.

``tflaunch up --detach`` on an ssh cluster does everything an attached run does up to the
pre-flight, then starts, each in its own session on the hosts (what ``screen`` gave the CSCS
scripts):

* ``python -m tflaunch.launchers.ssh.on_host coordinate`` on the first host: the same coordinator as an
  attached run (same policy, same events and run.json), listening on that host's *cluster* address
  for the agents;
* ``python -m tflaunch.launchers.ssh.on_host agent`` on every host: connects to that coordinator over the
  private network, proves it belongs to the run (a random token the launcher put in each host's run
  directory), then becomes ``python -m tflaunch.agent`` with the connection as its stdin/stdout.

The coordinator pings the agents, so an agent whose coordinator vanished still stops its tasks;
the coordinator stops the PS when training ends, as always. ``tflaunch status``, ``logs [-f]`` and
``down`` reconnect over SSH and work from the run directory (see ``SshBackend``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import secrets
import socket
import sys
import threading
import time
from pathlib import Path

from tflaunch.launchers.base import StreamLink

from tflaunch.coordinator import Coordinator
from tflaunch.plan import Plan
from tflaunch.run import Run

COORDINATOR_FILE = "coordinator.json"
TOKEN_FILE = "token"


def new_token() -> str:
    return secrets.token_hex(16)


class SocketLink(StreamLink):
    """An agent connected to a detached coordinator over TCP."""

    def __init__(self, host: str, sock: socket.socket, reader, writer):
        super().__init__(host, reader, writer)
        self.sock = sock
        self.ended = threading.Event()

    def _pump(self, sink: queue.Queue) -> None:
        try:
            super()._pump(sink)
        finally:
            self.ended.set()

    def close(self, timeout: float) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)  # the agent's input ends: it tears down
        self.ended.wait(timeout)
        with contextlib.suppress(OSError):
            self.sock.close()


def _accept_agents(
    server: socket.socket, hosts: set[str], token: str, deadline: float
) -> list[SocketLink]:
    """Accept one authenticated connection per host until all are in or the deadline passes."""
    links: dict[str, SocketLink] = {}
    while set(links) != hosts:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            missing = ", ".join(sorted(hosts - set(links)))
            for link in links.values():
                link.close(timeout=5)
            raise TimeoutError(f"the agents of {missing} never connected to the coordinator")
        server.settimeout(remaining)
        try:
            sock, _ = server.accept()
        except TimeoutError:
            continue
        sock.settimeout(10)
        reader, writer = sock.makefile("r"), sock.makefile("w")
        try:
            hello = json.loads(reader.readline() or "{}")
        except (OSError, ValueError):
            hello = {}
        host = hello.get("host")
        if not secrets.compare_digest(str(hello.get("token", "")), token) or host not in hosts:
            sock.close()  # not one of this run's agents
            continue
        sock.settimeout(None)
        links[host] = SocketLink(host, sock, reader, writer)
    return [links[h] for h in sorted(links)]


def coordinate(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    plan = Plan.from_dict(json.loads((run_dir / "plan.json").read_text()))
    run = Run(args.run_id, run_dir)
    token = (run_dir / TOKEN_FILE).read_text().strip()
    server = socket.create_server((args.listen, 0))
    port = server.getsockname()[1]
    info = {"pid": os.getpid(), "address": args.listen, "port": port}
    (run_dir / COORDINATOR_FILE).write_text(json.dumps(info))
    run.update_meta(
        backend="ssh",
        detached=True,
        state="starting",
        coordinator_pid=os.getpid(),
        started=time.time(),
        hosts=[h.name for h in plan.hosts_with_tasks()],
    )
    hosts = {h.name for h in plan.hosts_with_tasks()}
    timeout = plan.supervision.ready_timeout + 60
    try:
        links = _accept_agents(server, hosts, token, time.monotonic() + timeout)
    except TimeoutError as err:
        run.update_meta(state="failed", exit_code=2, ended=time.time(), message=str(err))
        print(f"tflaunch: {err}", file=sys.stderr)
        return 2
    finally:
        server.close()
    run.update_meta(state="running")
    outcome = Coordinator(plan, run, links).run_cluster()
    for link in links:
        link.close(timeout=5)
    interrupted = getattr(outcome, "interrupted", False)
    state = "succeeded" if outcome.code == 0 else "stopped" if interrupted else "failed"
    run.update_meta(state=state, exit_code=outcome.code, ended=time.time(), message=outcome.message)
    return outcome.code


def agent(args: argparse.Namespace) -> int:
    """Connect to the coordinator, then exec the agent with the connection as stdin/stdout."""
    token = Path(args.token_file).read_text().strip()
    deadline = time.monotonic() + args.connect_timeout
    while True:
        try:
            sock = socket.create_connection((args.address, args.port), timeout=5)
            break
        except OSError as err:
            if time.monotonic() > deadline:
                print(
                    f"tflaunch: cannot reach the coordinator at {args.address}:{args.port}: {err}",
                    file=sys.stderr,
                )
                return 2
            time.sleep(0.2)
    sock.settimeout(None)
    sock.sendall((json.dumps({"host": args.host, "token": token}) + "\n").encode())
    os.dup2(sock.fileno(), 0)
    os.dup2(sock.fileno(), 1)
    sock.close()
    argv = [sys.executable, "-m", "tflaunch.agent", *args.agent_args]
    os.execv(sys.executable, argv)
    return 1  # not reached


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
    ag.add_argument("--address", required=True)
    ag.add_argument("--port", type=int, required=True)
    ag.add_argument("--host", required=True)
    ag.add_argument("--token-file", required=True)
    ag.add_argument("--connect-timeout", type=float, default=60.0)
    ag.add_argument("agent_args", nargs=argparse.REMAINDER, help="-- then the agent's arguments")
    args = parser.parse_args(argv)
    if args.command == "coordinate":
        return coordinate(args)
    if args.agent_args[:1] == ["--"]:
        args.agent_args = args.agent_args[1:]
    return agent(args)


if __name__ == "__main__":
    sys.exit(main())
