"""The coordinator: the one place that applies the cluster's policy to events from every agent.

- Success (``supervision.success``, :mod:`tflaunch.runtime.tasks`): by default (``auto``) the
  chief's exit 0, as Kubeflow's TFJob, with the workers still busy then let finish and those
  idle (TF2 ParameterServerStrategy workers serve until stopped) stopped; without a chief, worker
  0 and every worker exiting 0 (each benchmark worker's own total). ``workers`` always waits for
  every worker, ``chief`` stops them at once. The others, PS included, are then stopped, and
  the run exits 0.
- Failure: any task exiting non-zero, a PS exiting at all, or a task stalled (no progress for
  ``supervision.stall_timeout``) goes to its role's restart policy (``tflaunch.runtime.restart``): the
  task is restarted in place by its agent, or every agent stops its tasks and starts them again
  (a cluster restart; programs resume from their checkpoints), after a backoff and within bounds.
  Otherwise — and always for an agent reporting an error, an agent lost, or a task its agent
  stopped on its own (scancel, a lost launcher) — every task on every node is torn down, one failure
  report is printed (task, host, exit code, the restarts so far and why there was none this time,
  the last lines of its output, its log), and the run exits with that task's code.
- Workers still running ``finish_timeout`` seconds after the chief finished fail the run too:
  a MonitoredTrainingSession worker that starts after the chief finished can wait forever.
- SIGINT, SIGTERM or SIGHUP (Ctrl-C, ``tflaunch down``): the same teardown, never a restart;
  exit 130, 143 or 129, the run ``stopped``. So too when an agent was signalled and stopped its
  tasks (a batch scheduler's cancel or time limit reaches every process of the job first).
- A host that is lost (its link's probe reports ``host_lost``: it stopped answering, or its
  instance ended) fails the run with a report naming the host and its tasks — unless the backend
  can start a new agent there (a :class:`~tflaunch.runtime.revival.Revive`: SSH with
  ``ssh.host_wait``, or a replacement instance in a provisioned run). Then, when every task of
  the host may restart alone (its role's restart scope is ``task``), the other hosts keep
  running and the host's new agent starts its tasks (each counted as a task restart); otherwise
  the other hosts stop their tasks and start them again once the new agent started its own (a
  cluster restart, counted in ``restart.max_cluster_restarts``). A host not back within the
  backend's wait fails the run, naming it.
- SIGUSR1 or SIGUSR2 (Slurm's warning ahead of the time limit) is passed on to every task. Given
  a :class:`~tflaunch.runtime.signals.Requeue` (Slurm with ``slurm.requeue``), the run is then
  stopped ``after`` seconds later — time for the chief to checkpoint — with a ``requeued``
  outcome, and the caller requeues the job; a signal that stops the run first (``scancel``, ``down``) wins, and nothing is requeued.

Agents are reached through links (:class:`tflaunch.runtime.link.AgentLink`): a subprocess's pipes,
an SSH channel or a TCP socket. The protocol (:mod:`tflaunch.runtime.protocol`) is the same JSON
lines on all of them. The coordinator dispatches events and applies the verdict; the rest
is behind seams of its own: what a task's exit and the clock mean for the run
(:mod:`~tflaunch.runtime.verdict`), restart decisions (:mod:`~tflaunch.runtime.restart`) and carrying
them out (:mod:`~tflaunch.runtime.restarter`), task states (:mod:`~tflaunch.runtime.tasks`), lost
hosts' new agents (:mod:`~tflaunch.runtime.revival`), signals and Slurm's requeue
(:mod:`~tflaunch.runtime.signals`), and all it writes and prints
(:mod:`~tflaunch.runtime.reporter`).
"""

from __future__ import annotations

import queue
import sys
import time
from collections.abc import Sequence
from typing import IO, Any

from tflaunch.cluster.plan import Plan
from tflaunch.runtime import protocol
from tflaunch.runtime.link import AgentLink
from tflaunch.runtime.reporter import Reporter
from tflaunch.runtime.restarter import Restarter
from tflaunch.runtime.revival import HostRevival, Revive
from tflaunch.runtime.run import Outcome, Run
from tflaunch.runtime.signals import Requeue, RequeueTimer, SignalWatch
from tflaunch.runtime.tasks import TaskBoard, TaskState
from tflaunch.runtime.tracing import HeldTrace, Trace
from tflaunch.runtime.verdict import Verdict

__all__ = ["Coordinator", "Requeue", "Revive", "coordinate"]

MAX_PATH = 4096  # an agent's word on where a program is: longer is not a path


class Coordinator:
    def __init__(
        self,
        plan: Plan,
        run: Run,
        links: Sequence[AgentLink],
        out: IO[str] | None = None,
        on_ready: Any = None,
        requeue: Requeue | None = None,
        revive: Revive | None = None,
        trace: Trace | None = None,
    ):
        self.plan, self.run, self.links = plan, run, list(links)
        self.on_ready = on_ready
        self.events: queue.Queue = queue.Queue()
        self.board = TaskBoard(plan, run)
        # up --trace (handed in): its window opens on the leader's steps or the clock
        tracer = trace.begin(plan, self.board.leader, self._say, self._send) if trace else None
        self.trace = HeldTrace(tracer, self._say)
        self.report = Reporter(plan, run, self.board, out, self.trace)
        self.signals = SignalWatch()
        self.requeue = RequeueTimer(requeue, self.report)
        sup = plan.supervision
        self.revival = HostRevival(revive, self.events)
        self.open_links = {link.host for link in self.links}
        self.refused: set[str] = set()  # hosts whose link was closed for a malformed message
        self.restarter = Restarter(
            sup, self.board, self.report, self.revival, self.links, self.open_links
        )
        self.verdict = Verdict(plan, self.board, self.restarter)
        self.outcome: Outcome | None = None
        self.started_at = self.verdict.started_at
        self.heartbeat = sup.heartbeat
        self.grace = sup.grace_period

    # ---- main loop -------------------------------------------------------------------------

    def run_cluster(self) -> Outcome:
        """Start reading every agent, apply the policy until the run ends, tear down, report."""
        try:
            with self.signals:
                for link in self.links:
                    link.start_reader(self.events)
                self.report.record(protocol.CoordinatorStarted(hosts=sorted(self.open_links)))
                last_ping = time.monotonic()
                while self.outcome is None and (self.open_links or self.revival.lost):
                    self._next_event(0.2)
                    self._check_clock()
                    if time.monotonic() - last_ping >= self.heartbeat:
                        last_ping = time.monotonic()
                        self._send(protocol.Ping())
                if self.outcome is None:
                    self.outcome = self.report.failed(
                        "every agent ended before the run finished", 1
                    )
                self.revival.end()
                self._teardown()
        finally:
            self.report.close()
            self.trace.finish()
        self.report.end(self.outcome)
        return self.outcome

    def _say(self, message: str) -> None:
        self.report.say(message)

    def _next_event(self, timeout: float) -> None:
        try:
            host, event = self.events.get(timeout=timeout)
        except queue.Empty:
            return
        if host in self.refused and protocol.kind_of(event) != protocol.LinkClosed.NAME:
            return  # the rest of a link closed for a malformed message
        try:
            self._handle(host, event)
        except protocol.ProtocolError as e:
            self._refuse(host, str(e))

    def _refuse(self, host: str, why: str) -> None:
        """A malformed message from ``host``'s agent: close its link (one line says why); the
        run goes on as for a lost agent, never crashing the coordinator."""
        self.refused.add(host)
        self.report.say(f"{host}: closed its agent's link: a malformed message ({why})")
        for link in self.links:
            if link.host == host:
                link.close(timeout=1)

    def _send(self, command: protocol.Command, host: str | None = None) -> None:
        """Send ``command`` to every agent (``host``'s only, when given)."""
        wire = command.wire()
        for link in self.links:
            if host is None or link.host == host:
                link.send(wire)

    def _check_clock(self) -> None:
        self.trace.tick(time.monotonic())  # a window that opens by the clock (--trace-at)
        for name in self.signals.take_passed_on():
            self._send(protocol.PassOn(signal=name))
            self.requeue.warned(name)
        if self.outcome is None and self.signals.stopped_by is None:
            for host, command in self.restarter.due():
                self._send(command, host)
        if self.outcome is None:
            self.outcome = (
                self.signals.interrupted()
                or self.requeue.due()
                or self.verdict.by_clock(time.monotonic())
            )

    # ---- events ----------------------------------------------------------------------------

    def _handle(self, host: str, data: dict[str, Any]) -> None:
        event = protocol.event_of(data)
        if isinstance(event, protocol.Output):
            self.report.output(event.task or "?", event.line, data.get("time"))
            self.board.busy(event.task, time.monotonic())
            return
        if isinstance(event, protocol.Sample):
            self.report.sample(host, data)
            self._note_busy(data.get("tasks"))
            return
        if event is None:
            return
        if protocol.recorded(event):
            self.report.record_from(host, data)
        state = self.board.get(getattr(event, "task", None) or "")
        if isinstance(event, protocol.Started) and state:
            again = bool(event.restarts + event.generation) or state.state == "restarting"
            self.board.set(state, "started", pid=event.pid)
            state.log = event.log or state.log
            if isinstance(event.executable, str) and len(event.executable) <= MAX_PATH:
                state.executable = event.executable
            self.restarter.started(state, again)
            self._check_ready()
        elif isinstance(event, protocol.Ready) and state:
            self.board.set(state, "ready")
            self._check_ready()
        elif isinstance(event, protocol.Waiting):
            self.report.say(
                f"{host}: waiting for {event.what} to accept connections: {', '.join(event.tasks)}"
            )
        elif isinstance(event, protocol.Exited) and state:
            self._task_exited(state, int(event.code), event.stopped_by)
        elif isinstance(event, protocol.Stalled) and state:
            self.report.say(f"{state.name} stalled: {event.what}; stopping it")
        elif isinstance(event, protocol.TasksStopped):
            self.restarter.tasks_stopped(host)
        elif isinstance(event, protocol.AgentError) and self.outcome is None:
            self.outcome = self.report.failed(f"{host}: {event.message}", int(event.code))
        elif isinstance(event, protocol.HostLost):
            if host not in self.revival.lost and self.outcome is None:
                self.outcome = self.restarter.host_lost(host, str(event.message))
        elif isinstance(event, protocol.HostBack):
            self.restarter.host_back(host).start_reader(self.events)
        elif isinstance(event, protocol.HostGone) and self.outcome is None:
            self.outcome = self.restarter.host_failed(
                host, f"{self.revival.why_not_back()}: {event.message}"
            )
        elif isinstance(event, protocol.LinkClosed):
            self._link_closed(host)
        elif isinstance(event, protocol.TraceNote | protocol.TraceFile | protocol.TraceSent):
            self.trace.received(host, event)  # a full disk stops the trace, not the run

    def _note_busy(self, tasks: Any) -> None:
        """A sample's CPU per task, where the chief's exit decides: which workers still work."""
        if not self.board.chief_decides or not isinstance(tasks, dict):
            return
        now = time.monotonic()
        for name, usage in tasks.items():
            cpu = usage.get("cpu_percent") if isinstance(usage, dict) else None
            if isinstance(name, str) and isinstance(cpu, int | float):
                self.board.busy(name, now, float(cpu))

    def _link_closed(self, host: str) -> None:
        current = next((link for link in self.links if link.host == host), None)
        ended = getattr(current, "ended", None)
        if host in self.revival.lost or (ended is not None and not ended.is_set()):
            return  # the old link of a host that is lost, or was since given a new agent
        self.open_links.discard(host)
        unfinished = self.board.unfinished(host)
        if unfinished and self.outcome is None:
            self.outcome = self.report.failed(
                f"lost the agent on {host} while {', '.join(unfinished)} had not finished", 1
            )

    def _task_exited(self, state: TaskState, code: int, stopped_by: str | None = None) -> None:
        if state.host in self.revival.lost:
            return  # from the lost host's old agent: its restart is decided already
        self.board.set(state, "exited", code=code)
        if self.outcome is not None or self.restarter.cluster_restarting:
            return  # the run is ending, or every task is being restarted anyway
        self.outcome = self.verdict.task_exited(state, code, stopped_by)

    def _check_ready(self) -> None:
        if self.board.announced or not self.board.ready:
            return
        self.board.announced = True
        elapsed = time.monotonic() - self.started_at
        self.report.record(protocol.ClusterReady(seconds=round(elapsed, 3)))
        self.report.say(f"cluster ready: {len(self.board)} tasks started in {elapsed:.1f} s")
        if self.on_ready:
            self.on_ready()

    def _teardown(self) -> None:
        live = [link for link in self.links if link.host in self.open_links]
        if any(s.state != "exited" for s in self.board):
            self.report.record(protocol.StoppingCluster())
        self._send(protocol.Stop(reason="the run is ending"))
        # (agents asked for their trace files send them once their tasks ended)
        deadline = time.monotonic() + self.grace + 15 + self.trace.drain_s()
        while self.open_links and time.monotonic() < deadline:
            self._next_event(0.2)
        for link in live:
            link.close(timeout=max(0.0, deadline - time.monotonic()))


def coordinate(
    plan: Plan,
    run: Run,
    links: Sequence[AgentLink],
    on_ready: Any = None,
    out: IO[str] | None = None,
    requeue: Requeue | None = None,
    revive: Revive | None = None,
    trace: Trace | None = None,
    cluster_restarts: int = 0,
) -> Outcome:
    """Coordinate ``links``' agents until the run ends, close the links, and record the end.
    ``trace``: what ``up --trace`` asked of this run (:class:`tflaunch.trace.run.RunTrace`).
    ``cluster_restarts``: those the run had before this coordinator (a detached run restarted
    with a new coordinator after its host was lost): they count against the limit."""
    run.update_meta(state="running")
    try:
        coordinator = Coordinator(
            plan,
            run,
            links,
            out=out,
            on_ready=on_ready,
            requeue=requeue,
            revive=revive,
            trace=trace,
        )
        coordinator.restarter.book.cluster_restarts = cluster_restarts
        outcome = coordinator.run_cluster()
    finally:
        for link in links:
            link.close(timeout=5)
    try:
        return run.finish(outcome)
    except OSError as e:  # a full disk: the end is said, and the exit code is the run's own
        sys.stderr.write(f"tflaunch: could not record run {run.id}'s end in run.json ({e})\n")
        return outcome
