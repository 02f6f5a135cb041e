"""The coordinator: the one place that applies the cluster's policy to events from every agent.

- Success: the chief (worker 0 when there is no chief) and every worker exit 0; with
  ``supervision.success: chief``, the chief alone (TF2 ParameterServerStrategy workers serve until
  stopped). The others, PS included, are then stopped, and the run exits 0.
- Failure: any task exiting non-zero, a PS exiting at all, or a task stalled (no progress for
  ``supervision.stall_timeout``) goes to its role's restart policy (``tflaunch.runtime.restart``): the
  task is restarted in place by its agent, or every agent stops its tasks and starts them again
  (a cluster restart; programs resume from their checkpoints), after a backoff and within bounds.
  Otherwise — and always for an agent reporting an error, an agent lost, or a task its agent
  stopped on its own (signal, scancel) — every task on every node is torn down, one failure
  report is printed (task, host, exit code, the restarts so far and why there was none this time,
  the last lines of its output, its log), and the run exits with that task's code.
- Workers still running ``finish_timeout`` seconds after the chief finished fail the run too:
  a MonitoredTrainingSession worker that starts after the chief finished can wait forever.
- SIGINT, SIGTERM or SIGHUP (Ctrl-C, ``tflaunch down``): the same teardown, never a restart;
  exit 130, 143 or 129.
- A host that stops answering (its link's probe reports ``host_lost``) fails the run with a report
  naming the host and its tasks — unless the backend can start a new agent there (a
  :class:`Revive`: SSH with ``ssh.host_wait``): then the other hosts stop their tasks, the host
  gets up to ``host_wait`` seconds to answer again, a new agent starts its tasks there and the others
  start theirs (a cluster restart, counted in ``restart.max_cluster_restarts``); a host still
  silent after ``host_wait`` fails the run, naming it.
- SIGUSR1 or SIGUSR2 (Slurm's warning ahead of the time limit) is passed on to every task. Given
  a :class:`Requeue` (Slurm with ``slurm.requeue``), the run is then stopped ``after`` seconds
  later — time for the chief to checkpoint — with a ``requeued`` outcome, and the caller requeues
  the job; a signal that stops the run first (``scancel``, ``down``) wins, and nothing is requeued.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from tflaunch.cluster.plan import Plan
from tflaunch.runtime.insight import Insight
from tflaunch.runtime.link import AgentLink
from tflaunch.runtime.restart import STALLED, Decision, Failure, RestartBook, describe_code
from tflaunch.runtime.run import Outcome, Run
from tflaunch.runtime.runfiles import open_run_file

TAIL_LINES = 20
_EVENTS_KEPT = {
    "agent_started",
    "instance_replaced",
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
    "stalled",
    "tasks_stopped",
    "signal_passed_on",
}


@dataclass(frozen=True)
class Requeue:
    """What Slurm's warning signal leads to when the job may be requeued: the run stops for the
    requeue ``after`` seconds later. ``refused`` (the limit is reached) says why it does not."""

    after: float = 0.0
    note: str = ""  # "requeue 1 of at most 2"
    refused: str = ""


@dataclass(frozen=True)
class Revive:
    """How a backend waits for a host that stopped answering (SSH's ``ssh.host_wait``): up to
    ``wait`` seconds; ``start(host, deadline)`` returns a new agent's link on the host once it
    answers, and raises when it stays silent until the deadline (monotonic clock)."""

    wait: float
    start: Callable[[str, float], AgentLink]


@dataclass
class TaskState:
    name: str
    host: str
    state: str = "pending"  # pending, started, ready, exited, restarting
    pid: int | None = None
    code: int | None = None
    log: str | None = None
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))


class Coordinator:
    OLD_AGENT_MARGIN = 10.0  # seconds, beyond the grace period, for a lost host's agent to end

    def __init__(
        self,
        plan: Plan,
        run: Run,
        links: Sequence[AgentLink],
        out: IO[str] | None = None,
        on_ready: Any = None,
        requeue: Requeue | None = None,
        revive: Revive | None = None,
    ):
        self.plan, self.run, self.links = plan, run, list(links)
        self.revive = revive
        self.host_wait = revive.wait if revive else 0.0
        self.lost: dict[str, float] = {}  # hosts that stopped answering -> when
        self.revived: set[str] = set()  # hosts whose new agent started its own tasks
        self._new_links: dict[str, AgentLink] = {}  # from the revive threads
        self._ended = threading.Event()  # no new agent may start any more
        self._revive_lock = threading.Lock()
        self.requeue = requeue
        self.requeue_at: float | None = None
        self.warning = ""  # the first warning signal's name
        self.out = out or sys.stdout
        self.on_ready = on_ready
        self.events: queue.Queue = queue.Queue()
        self.tasks = {
            t.name: TaskState(t.name, t.host, log=str(run.log_path(t.log_name))) for t in plan.tasks
        }
        self.leader = "chief:0" if "chief:0" in self.tasks else "worker:0"
        self.success = plan.supervision.success
        self.book = RestartBook(plan.supervision.restart)
        # Restarts waiting for their backoff: (when, host or None for every agent, command).
        self.scheduled: list[tuple[float, str | None, dict[str, Any]]] = []
        self.cluster_phase = ""  # "", or "stopping" while a whole-cluster restart waits
        self.stopped_hosts: set[str] = set()
        self.cluster_delay = 0.0
        self.failed_at: dict[str, float] = {}  # task -> when its last failure was seen
        # Kept as states change, so that each event costs the same with 30,000 tasks as with 3:
        # tasks that keep the cluster from being ready, trainers that exited 0, tasks per host.
        self.unready = set(self.tasks)
        self.trainers = {n for n in self.tasks if n.startswith(("worker:", "chief:"))}
        self.trainers_done: set[str] = set()
        self.tasks_by_host: dict[str, list[TaskState]] = collections.defaultdict(list)
        for state in self.tasks.values():
            self.tasks_by_host[state.host].append(state)
        self.open_links = {link.host for link in self.links}
        self.outcome: Outcome | None = None
        self.leader_done_at: float | None = None
        self.ready = False
        self.started_at = time.monotonic()
        self.width = max(len(n) for n in self.tasks) + 2
        self._events_file = open_run_file(run.events_path, "a")
        self._samples = Insight(plan, run, self.leader, self._say)  # resources, steps, --trace
        self._signal: int | None = None
        self._passed_on: list[int] = []  # SIGUSR1/2 received, to pass on to every agent's tasks
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
            while self.outcome is None and (self.open_links or self.lost):
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
            with self._revive_lock:
                self._ended.set()
            self._teardown()
        finally:
            self._restore_signal_handlers(previous)
            self._events_file.close()
            self._samples.close()
        self._print_end()
        return self.outcome

    def _check_clock(self) -> None:
        while self._passed_on:
            name = signal.Signals(self._passed_on.pop(0)).name
            for link in self.links:
                link.send({"cmd": "pass_on", "signal": name})
            self._warned(name)
        now = time.monotonic()
        due = [item for item in self.scheduled if item[0] <= now]
        if due and self.outcome is None and self._signal is None:
            self.scheduled = [item for item in self.scheduled if item[0] > now]
            for _, host, command in due:
                for link in self.links:
                    if host is None or link.host == host:
                        link.send(command)
        if self._signal is not None and self.outcome is None:
            name = signal.Signals(self._signal).name
            self.outcome = Outcome(
                128 + self._signal,
                f"interrupted by {name}; the cluster was stopped",
                interrupted=True,
            )
        elif (
            self.requeue_at is not None
            and self.outcome is None
            and time.monotonic() >= self.requeue_at
        ):
            assert self.requeue is not None
            self._record({"event": "requeueing", "signal": self.warning})
            self.outcome = Outcome(
                0,
                f"stopped {self.requeue.after:g} s after Slurm's {self.warning} to be requeued "
                f"({self.requeue.note}); the requeued job resumes from the checkpoints",
                requeued=True,
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

    def _warned(self, name: str) -> None:
        """Slurm's warning arrived: schedule the stop for a requeue, or say why there is none."""
        if self.warning:
            return  # Slurm signals every process of the step: one warning, seen more than once
        self.warning = name
        if self.requeue is None:
            return
        if self.requeue.refused:
            self._say(f"{name} from Slurm passed on to the tasks; {self.requeue.refused}")
            return
        self.requeue_at = time.monotonic() + self.requeue.after
        self._record({"event": "requeue_scheduled", "signal": name, "after": self.requeue.after})
        self._say(
            f"{name} from Slurm passed on to the tasks; stopping the cluster in "
            f"{self.requeue.after:g} s (slurm.checkpoint_wait) to requeue the job "
            f"({self.requeue.note})"
        )

    # ---- events ----------------------------------------------------------------------------

    def _handle(self, host: str, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "output":
            return self._print_output(event.get("task", "?"), event.get("line", ""))
        if kind == "sample":
            self._samples.write(host, event)
            return
        if kind in _EVENTS_KEPT:
            self._record({"host": host, **event})
        state = self.tasks.get(event.get("task", ""))
        if kind == "started" and state:
            state.state, state.pid = "started", event.get("pid")
            self._track(state)
            state.log = event.get("log", state.log)
            if state.name in self.failed_at and event.get("restarts", 0) + event.get(
                "generation", 0
            ):
                seconds = time.monotonic() - self.failed_at.pop(state.name)
                self._record(
                    {"event": "running_again", "task": state.name, "seconds": round(seconds, 3)}
                )
            self._check_ready()
        elif kind == "ready" and state:
            state.state = "ready"
            self._track(state)
            self._check_ready()
        elif kind == "waiting":
            self._say(
                f"{host}: waiting for {event.get('what')} to accept connections: "
                f"{', '.join(event.get('tasks', []))}"
            )
        elif kind == "exited" and state:
            self._task_exited(state, int(event.get("code", 1)), event.get("stopped_by"))
        elif kind == "stalled" and state:
            self._say(f"{state.name} stalled: {event.get('what')}; stopping it")
        elif kind == "tasks_stopped":
            self.stopped_hosts.add(host)
            self._check_cluster_stopped()
        elif kind == "error" and self.outcome is None:
            self.outcome = self._fail_without_task(
                f"{host}: {event.get('message')}", int(event.get("code", 1))
            )
        elif kind == "host_lost":
            self._host_lost(host, str(event.get("message", "")))
        elif kind == "host_back":
            self._host_back(host)
        elif kind == "host_gone" and self.outcome is None:
            self.outcome = self._host_failed(
                host,
                f"did not answer again within {self.host_wait:g} s (ssh.host_wait): "
                f"{event.get('message')}",
            )
        elif kind == "link_closed":
            current = next((link for link in self.links if link.host == host), None)
            ended = getattr(current, "ended", None)
            if host in self.lost or (ended is not None and not ended.is_set()):
                return  # the old link of a host that is lost, or was since given a new agent
            self.open_links.discard(host)
            unfinished = [s.name for s in self.tasks_by_host[host] if s.state != "exited"]
            if unfinished and self.outcome is None:
                self.outcome = self._fail_without_task(
                    f"lost the agent on {host} while {', '.join(unfinished)} had not finished", 1
                )

    def _task_exited(self, state: TaskState, code: int, stopped_by: str | None = None) -> None:
        state.state, state.code = "exited", code
        self._track(state)
        if self.outcome is not None or self.cluster_phase:
            return  # the run is ending, or every task is being restarted anyway
        if stopped_by and stopped_by != STALLED:
            # Its agent stopped it without being asked (signalled, scancel, lost its launcher):
            # never a reason to restart.
            self.outcome = self._fail_task(
                state, code or 1, f"was stopped by its agent ({stopped_by})"
            )
            return
        cause = STALLED if stopped_by == STALLED else "exited"
        if state.name.startswith("ps:"):
            what = (
                "stalled"
                if cause == STALLED
                else f"exited by itself (code {describe_code(code)}); a PS serves until the "
                "launcher stops it"
            )
            self._task_failed(state, Failure(state.name, code, cause), what)
        elif code != 0 or cause == STALLED:
            what = (
                f"stalled and was stopped (exit {describe_code(code)})"
                if cause == STALLED
                else f"exited with code {describe_code(code)}"
            )
            self._task_failed(state, Failure(state.name, code, cause), what)
        elif self._training_done():
            elapsed = time.monotonic() - self.started_at
            message = (
                f"succeeded: {len(self.tasks)} tasks on "
                f"{len(self.plan.hosts_with_tasks())} host(s) in {elapsed:.1f} s"
            )
            restarts = self.book.summary()
            if restarts:
                message += "; restarts: " + "; ".join(restarts)
            self.outcome = Outcome(0, message)
        elif state.name == self.leader:
            self.leader_done_at = time.monotonic()

    def _training_done(self) -> bool:
        if self.success == "chief" and "chief:0" in self.tasks:
            chief = self.tasks["chief:0"]
            return chief.state == "exited" and chief.code == 0
        return self.trainers_done == self.trainers

    def _track(self, state: TaskState) -> None:
        """Note a task's new state in the sets readiness and success are read from."""
        ps = state.name.startswith("ps:")
        ok = state.state in ("ready", "exited") if ps else state.state != "pending"
        (self.unready.discard if ok else self.unready.add)(state.name)
        if state.name in self.trainers:
            done = state.state == "exited" and state.code == 0
            (self.trainers_done.add if done else self.trainers_done.discard)(state.name)

    # ---- restarts --------------------------------------------------------------------------

    def _task_failed(self, state: TaskState, failure: Failure, what: str) -> None:
        """Apply the task's restart policy to its failure: restart it, the cluster, or fail."""
        decision = self.book.decide(failure)
        if decision.action == "fail":
            self.outcome = self._fail_task(
                state, failure.code or 1, what, self._not_restarted(failure, decision)
            )
            return
        self.failed_at[state.name] = time.monotonic()
        role = self.plan.supervision.restart.of(failure.job)
        entry = {
            "task": state.name,
            "cause": failure.cause,
            "code": failure.code,
            "restart": decision.count,
            "delay": decision.delay,
        }
        if decision.action == "restart_task":
            state.state = "restarting"
            self._track(state)
            self._record({"event": "restarting", **entry})
            self._say(
                f"{state.name} {what}; restarting it in {decision.delay:g} s "
                f"(restart {decision.count} of at most {role.max_restarts})"
            )
            self.scheduled.append(
                (
                    time.monotonic() + decision.delay,
                    state.host,
                    {"cmd": "restart", "task": state.name},
                )
            )
            return
        self._record(
            {"event": "cluster_restarting", **entry, "generation": self.book.cluster_restarts}
        )
        self._say(
            f"{state.name} {what}; restarting the whole cluster from its checkpoints "
            f"(cluster restart {self.book.cluster_restarts} of at most "
            f"{self.plan.supervision.restart.max_cluster_restarts})"
        )
        for name in self.tasks:
            self.failed_at.setdefault(name, self.failed_at[state.name])
        self.scheduled = []
        self.cluster_phase, self.cluster_delay = "stopping", decision.delay
        self.stopped_hosts = set()
        self.leader_done_at = None
        for link in self.links:
            link.send({"cmd": "stop_tasks", "reason": "cluster restart"})

    def _check_cluster_stopped(self) -> None:
        """Once every agent stopped its tasks (and every lost host has a new agent), start them
        all again after the backoff."""
        if self.cluster_phase != "stopping" or not self.open_links <= self.stopped_hosts:
            return
        if self.lost:
            self.cluster_phase = "waiting"
            for host in self.lost:
                threading.Thread(target=self._wait_for_host, args=(host,), daemon=True).start()
            return
        self._start_again()

    def _start_again(self) -> None:
        self.cluster_phase = ""
        self.ready = False
        for state in self.tasks.values():
            state.state, state.code, state.pid = "pending", None, None
            self._track(state)
        command = {"cmd": "start_tasks", "generation": self.book.cluster_restarts}
        when = time.monotonic() + self.cluster_delay
        for host in sorted(self.open_links - self.revived):
            self.scheduled.append((when, host, command))
        self.revived = set()

    # ---- hosts that stop answering -----------------------------------------------------------

    def _host_lost(self, host: str, message: str) -> None:
        if host in self.lost or self.outcome is not None:
            return
        self._record({"event": "host_lost", "host": host, "message": message})
        self.open_links.discard(host)
        self.stopped_hosts.discard(host)
        if self.revive is None:
            self.outcome = self._host_failed(host, f"stopped answering: {message}")
            return
        decision = self.book.decide_host_lost(host)
        if decision.action == "fail":
            self.outcome = self._host_failed(
                host, f"stopped answering: {message}. Not waiting for it: {decision.reason}"
            )
            return
        now = time.monotonic()
        self.lost[host] = now
        for state in self.tasks.values():
            if state.host == host:
                state.state = "exited"
            self.failed_at.setdefault(state.name, now)
        self._record(
            {
                "event": "cluster_restarting",
                "cause": "host_lost",
                "host": host,
                "delay": decision.delay,
                "generation": self.book.cluster_restarts,
            }
        )
        self._say(
            f"{host} stopped answering ({message}); stopping the tasks on the other hosts and "
            f"waiting up to {self.host_wait:g} s (ssh.host_wait) for it to answer "
            "again, then restarting the whole cluster from its checkpoints (cluster restart "
            f"{self.book.cluster_restarts} of at most "
            f"{self.plan.supervision.restart.max_cluster_restarts})"
        )
        if self.cluster_phase == "waiting":  # another host is being waited for already
            threading.Thread(target=self._wait_for_host, args=(host,), daemon=True).start()
            return
        if self.cluster_phase != "stopping":
            self.scheduled = []
            self.cluster_phase, self.cluster_delay = "stopping", decision.delay
            self.stopped_hosts = set()
            self.leader_done_at = None
            for link in self.links:
                if link.host in self.open_links:
                    link.send({"cmd": "stop_tasks", "reason": f"{host} stopped answering"})
        self._check_cluster_stopped()

    def _wait_for_host(self, host: str) -> None:
        """(thread) Start a new agent on ``host`` once it answers; post host_back or host_gone.

        Not before the old agent is surely gone: it stops its tasks when it has heard nothing
        for its heartbeat timeout, which passed when the host was reported lost, and then takes
        at most the grace period."""
        lost_at = self.lost[host]
        deadline = lost_at + self.host_wait
        time.sleep(max(0.0, lost_at + self.grace + self.OLD_AGENT_MARGIN - time.monotonic()))
        try:
            assert self.revive is not None
            link = self.revive.start(host, deadline)
        except Exception as err:  # reported as the host's failure
            self.events.put((host, {"event": "host_gone", "message": str(err)}))
            return
        with self._revive_lock:
            if self._ended.is_set():
                link.close(timeout=5)  # the run ended meanwhile: the new agent stops at once
                return
            self._new_links[host] = link
            self.events.put((host, {"event": "host_back"}))

    def _host_back(self, host: str) -> None:
        link = self._new_links.pop(host)
        lost_at = self.lost.pop(host)
        self.links = [old for old in self.links if old.host != host] + [link]
        self.open_links.add(host)
        self.revived.add(host)
        seconds = time.monotonic() - lost_at
        self._record({"event": "host_back", "host": host, "seconds": round(seconds, 3)})
        self._say(f"{host} answers again after {seconds:.1f} s: a new agent starts its tasks")
        if not self.lost:
            self._start_again()
        link.start_reader(self.events)

    def _host_failed(self, host: str, what: str) -> Outcome:
        tasks = [s.name for s in self.tasks.values() if s.host == host]
        lines = [
            f"host {host} {what}.",
            f"Its tasks ({', '.join(tasks)}) are stopped by its agent once that has heard "
            f"nothing for {self.plan.supervision.heartbeat_timeout:g} s "
            "(supervision.heartbeat_timeout).",
        ]
        if self.revive is None:  # only SSH links report a lost host
            lines.append(
                "Set ssh.host_wait to wait for such a host and restart the cluster "
                "from its checkpoints."
            )
        restarts = self.book.summary()
        if restarts:
            lines.append("restarts: " + "; ".join(restarts))
        return self._fail_without_task("\n".join(lines), 1)

    def _not_restarted(self, failure: Failure, decision: Decision) -> str:
        if self.plan.supervision.restart.of(failure.job).policy == "never":
            return ""
        return f"Not restarted: {decision.reason}. Its failures: {self.book.history(failure.task)}."

    def _check_ready(self) -> None:
        if self.ready:
            return
        if not self.unready:  # every PS ready (or gone), every other task started
            self.ready = True
            elapsed = time.monotonic() - self.started_at
            self._record({"event": "cluster_ready", "seconds": round(elapsed, 3)})
            self._say(f"cluster ready: {len(self.tasks)} tasks started in {elapsed:.1f} s")
            if self.on_ready:
                self.on_ready()

    # ---- outcomes ----------------------------------------------------------------------------

    def _fail_task(self, state: TaskState, code: int, what: str, note: str = "") -> Outcome:
        lines = [f"{state.name} on {state.host} {what}."]
        if note:
            lines.append(note)
        restarts = self.book.summary()
        if restarts:
            lines.append("restarts: " + "; ".join(restarts))
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
        self._samples.output(task, line)  # steps, and --trace's window
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
        for sig in (signal.SIGUSR1, signal.SIGUSR2):  # Slurm's --signal: pass on, stop nothing
            previous[sig] = signal.signal(sig, lambda signum, _f: self._passed_on.append(signum))
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
    requeue: Requeue | None = None,
    revive: Revive | None = None,
) -> Outcome:
    """Coordinate ``links``' agents until the run ends, close the links, and record the end."""
    run.update_meta(state="running")
    try:
        coordinator = Coordinator(
            plan, run, links, out=out, on_ready=on_ready, requeue=requeue, revive=revive
        )
        outcome = coordinator.run_cluster()
    finally:
        for link in links:
            link.close(timeout=5)
    return run.finish(outcome)
