"""The coordinator: the one place that applies the cluster's policy to events from every agent.

- Success: the chief (worker 0 when there is no chief) and every worker exit 0. The PS, which
  never exit by themselves, are then stopped, and the run exits 0.
- Failure: any task exiting non-zero, a PS exiting at all, an agent reporting an error, or an
  agent lost — every task on every node is torn down, one failure report is printed (task, host,
  exit code, the last lines of its output, its log), and the run exits with that task's code.
- Workers still running ``finish_timeout`` seconds after the chief finished fail the run too:
  a MonitoredTrainingSession worker that starts after the chief finished can wait forever.
- SIGINT, SIGTERM or SIGHUP: the same teardown; exit 130, 143 or 129.

Agents are reached through links (``tflaunch.launchers.base.AgentLink``): a subprocess's pipes, an SSH
channel or a TCP socket. The protocol is the same JSON lines on all of them.
"""

from __future__ import annotations

import collections
import json
import queue
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from tflaunch.link import AgentLink
from tflaunch.monitor import SampleLog
from tflaunch.plan import Plan
from tflaunch.run import Outcome, Run

TAIL_LINES = 20
_EVENTS_KEPT = {
    "agent_started",
    "started",
    "ready",
    "waiting",
    "exited",
    "error",
    "stopping",
    "agent_exit",
    "host_started",
    "link_closed",
    "cluster_ready",
    "finished",
}


@dataclass
class TaskState:
    name: str
    host: str
    state: str = "pending"  # pending, started, ready, exited
    pid: int | None = None
    code: int | None = None
    log: str | None = None
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))


class Coordinator:
    def __init__(
        self,
        plan: Plan,
        run: Run,
        links: Sequence[AgentLink],
        out: IO[str] | None = None,
        on_ready: Any = None,
    ):
        self.plan, self.run, self.links = plan, run, list(links)
        self.out = out or sys.stdout
        self.on_ready = on_ready
        self.events: queue.Queue = queue.Queue()
        self.tasks = {
            t.name: TaskState(t.name, t.host, log=str(run.log_path(t.log_name))) for t in plan.tasks
        }
        self.leader = "chief:0" if "chief:0" in self.tasks else "worker:0"
        self.open_links = {link.host for link in self.links}
        self.outcome: Outcome | None = None
        self.leader_done_at: float | None = None
        self.ready = False
        self.started_at = time.monotonic()
        self.width = max(len(n) for n in self.tasks) + 2
        self._events_file = run.events_path.open("a")
        self._samples = SampleLog(run.dir)  # resource samples: samples-<host>.jsonl, not events
        self._signal: int | None = None
        sup = plan.supervision
        self.heartbeat = sup.heartbeat
        self.finish_timeout = sup.finish_timeout
        self.grace = sup.grace_period

    # ---- main loop -------------------------------------------------------------------------

    def run_cluster(self) -> Outcome:
        """Start reading every agent, apply the policy until the run ends, tear down, report."""
        previous = self._install_signal_handlers()
        try:
            for link in self.links:
                link.start_reader(self.events)
            self._record({"event": "coordinator_started", "hosts": sorted(self.open_links)})
            last_ping = time.monotonic()
            while self.outcome is None and self.open_links:
                try:
                    host, event = self.events.get(timeout=0.2)
                    self._handle(host, event)
                except queue.Empty:
                    pass
                self._check_clock()
                if time.monotonic() - last_ping >= self.heartbeat:
                    last_ping = time.monotonic()
                    for link in self.links:
                        link.send({"cmd": "ping"})
            if self.outcome is None:
                self.outcome = self._fail_without_task(
                    "every agent ended before the run finished", 1
                )
            self._teardown()
        finally:
            self._restore_signal_handlers(previous)
            self._events_file.close()
            self._samples.close()
        self._print_end()
        return self.outcome

    def _check_clock(self) -> None:
        if self._signal is not None and self.outcome is None:
            name = signal.Signals(self._signal).name
            self.outcome = Outcome(
                128 + self._signal,
                f"interrupted by {name}; the cluster was stopped",
                interrupted=True,
            )
        elif (
            self.leader_done_at is not None
            and self.outcome is None
            and time.monotonic() - self.leader_done_at > self.finish_timeout
        ):
            late = [
                s
                for s in self.tasks.values()
                if s.name.startswith(("worker:", "chief:")) and s.state != "exited"
            ]
            self.outcome = self._fail_task(
                late[0],
                1,
                f"was still running {self.finish_timeout:g} s after {self.leader} "
                "finished (supervision.finish_timeout); a worker that starts after the chief "
                "finished can wait forever",
            )

    # ---- events ----------------------------------------------------------------------------

    def _handle(self, host: str, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "output":
            self._print_output(event.get("task", "?"), event.get("line", ""))
            return
        if kind == "sample":
            self._samples.write(host, event)
            return
        if kind in _EVENTS_KEPT:
            self._record({"host": host, **event})
        state = self.tasks.get(event.get("task", ""))
        if kind == "started" and state:
            state.state, state.pid = "started", event.get("pid")
            state.log = event.get("log", state.log)
            self._check_ready()
        elif kind == "ready" and state:
            state.state = "ready"
            self._check_ready()
        elif kind == "waiting":
            self._say(
                f"{host}: waiting for {event.get('what')} to accept connections: "
                f"{', '.join(event.get('tasks', []))}"
            )
        elif kind == "exited" and state:
            self._task_exited(state, int(event.get("code", 1)))
        elif kind == "error" and self.outcome is None:
            self.outcome = self._fail_without_task(
                f"{host}: {event.get('message')}", int(event.get("code", 1))
            )
        elif kind == "link_closed":
            self.open_links.discard(host)
            unfinished = [
                s.name for s in self.tasks.values() if s.host == host and s.state != "exited"
            ]
            if unfinished and self.outcome is None:
                self.outcome = self._fail_without_task(
                    f"lost the agent on {host} while {', '.join(unfinished)} had not finished", 1
                )

    def _task_exited(self, state: TaskState, code: int) -> None:
        state.state, state.code = "exited", code
        if self.outcome is not None:
            return
        if state.name.startswith("ps:"):
            self.outcome = self._fail_task(
                state, code or 1, "exited by itself; a PS serves until the launcher stops it"
            )
        elif code != 0:
            self.outcome = self._fail_task(state, code, f"exited with code {_describe_code(code)}")
        elif self._training_done():
            elapsed = time.monotonic() - self.started_at
            self.outcome = Outcome(
                0,
                f"succeeded: {len(self.tasks)} tasks on "
                f"{len(self.plan.hosts_with_tasks())} host(s) in {elapsed:.1f} s",
            )
        elif state.name == self.leader:
            self.leader_done_at = time.monotonic()

    def _training_done(self) -> bool:
        trainers = [s for s in self.tasks.values() if s.name.startswith(("worker:", "chief:"))]
        return all(s.state == "exited" and s.code == 0 for s in trainers)

    def _check_ready(self) -> None:
        if self.ready:
            return
        if all(
            s.state in ("ready", "exited") if s.name.startswith("ps:") else s.state != "pending"
            for s in self.tasks.values()
        ):
            self.ready = True
            elapsed = time.monotonic() - self.started_at
            self._record({"event": "cluster_ready", "seconds": round(elapsed, 3)})
            self._say(f"cluster ready: {len(self.tasks)} tasks started in {elapsed:.1f} s")
            if self.on_ready:
                self.on_ready()

    # ---- outcomes ----------------------------------------------------------------------------

    def _fail_task(self, state: TaskState, code: int, what: str) -> Outcome:
        lines = [f"{state.name} on {state.host} {what}."]
        if state.tail:
            lines.append(f"last {len(state.tail)} lines of its output:")
            lines += [f"    {line}" for line in state.tail]
        lines.append(f"log: {state.log}")
        self._record({"event": "failed", "task": state.name, "code": code})
        return Outcome(code, "\n".join(lines))

    def _fail_without_task(self, message: str, code: int) -> Outcome:
        self._record({"event": "failed", "code": code, "message": message})
        return Outcome(code, message)

    def _teardown(self) -> None:
        live = [link for link in self.links if link.host in self.open_links]
        if any(s.state != "exited" for s in self.tasks.values()):
            self._record({"event": "stopping_cluster"})
        for link in self.links:
            link.send({"cmd": "stop", "reason": "the run is ending"})
        deadline = time.monotonic() + self.grace + 15
        while self.open_links and time.monotonic() < deadline:
            try:
                host, event = self.events.get(timeout=0.2)
                self._handle(host, event)
            except queue.Empty:
                pass
        for link in live:
            link.close(timeout=max(0.0, deadline - time.monotonic()))

    # ---- output ----------------------------------------------------------------------------

    def _record(self, event: dict[str, Any]) -> None:
        event.setdefault("time", round(time.time(), 3))
        self._events_file.write(json.dumps(event) + "\n")
        self._events_file.flush()

    def _print_output(self, task: str, line: str) -> None:
        state = self.tasks.get(task)
        if state:
            state.tail.append(line)
        self.out.write(f"{'[' + task + ']':<{self.width}} {line}\n")
        self.out.flush()

    def _say(self, message: str) -> None:
        self.out.write(f"[tflaunch] {message}\n")
        self.out.flush()

    def _print_end(self) -> None:
        assert self.outcome is not None
        if self.outcome.code == 0:
            self._say(f"run {self.run.id} {self.outcome.message}; run directory {self.run.dir}")
        else:
            sys.stderr.write(f"tflaunch: run {self.run.id} failed: {self.outcome.message}\n")
            sys.stderr.flush()

    # ---- signals ---------------------------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, self._on_signal)
        return previous

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self._signal is None:
            self._signal = signum

    @staticmethod
    def _restore_signal_handlers(previous: dict[int, Any]) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def coordinate(
    plan: Plan,
    run: Run,
    links: Sequence[AgentLink],
    on_ready: Any = None,
    out: IO[str] | None = None,
) -> Outcome:
    """Coordinate ``links``' agents until the run ends, close the links, and record the end."""
    run.update_meta(state="running")
    try:
        outcome = Coordinator(plan, run, links, out=out, on_ready=on_ready).run_cluster()
    finally:
        for link in links:
            link.close(timeout=5)
    return run.finish(outcome)


def _describe_code(code: int) -> str:
    if code > 128:
        try:
            return f"{code} ({signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return str(code)
