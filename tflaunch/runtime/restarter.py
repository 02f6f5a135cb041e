"""Carrying out restarts: the restart book (:mod:`tflaunch.runtime.restart`) decides, the
:class:`Restarter` acts.

A task restarted alone gets a ``restart`` command after its backoff. A cluster restart — after a
task whose role restarts the cluster, or a host that stopped answering (given a backend that can
revive it, :mod:`tflaunch.runtime.revival`) — goes through phases: every agent stops its tasks
(``stop_tasks``), the lost hosts, if any, are waited for (``waiting``), and once every agent
answered ``tasks_stopped`` and every lost host has a new agent, every agent starts its tasks again
(``start_tasks``) after the backoff; a revived host's new agent starts its own when told ``start``,
which carries the restarts so far of its tasks and the cluster (``$TFLAUNCH_TASK_RESTARTS`` and
``$TFLAUNCH_CLUSTER_RESTARTS`` go on counting on the new agent). When a failure is
not restarted, the :class:`Restarter` returns the run's outcome with its failure report.
"""

from __future__ import annotations

import time
from typing import Literal

from tflaunch.cluster.supervision import Supervision
from tflaunch.runtime import protocol
from tflaunch.runtime.link import AgentLink
from tflaunch.runtime.reporter import Reporter
from tflaunch.runtime.restart import Decision, Failure, RestartBook
from tflaunch.runtime.revival import HostRevival
from tflaunch.runtime.run import Outcome
from tflaunch.runtime.tasks import TaskBoard, TaskState

# Where a cluster restart is: none under way; every agent stopping its tasks; every agent stopped,
# waiting for the lost hosts' new agents.
Phase = Literal["idle", "stopping", "waiting"]


class Restarter:
    def __init__(
        self,
        supervision: Supervision,
        board: TaskBoard,
        report: Reporter,
        revival: HostRevival,
        links: list[AgentLink],
        open_links: set[str],
    ):
        self.supervision, self.restart = supervision, supervision.restart
        self.board, self.report, self.revival = board, report, revival
        self.links, self.open_links = links, open_links  # the coordinator's, changed in place
        self.book = RestartBook(supervision.restart)
        # Commands waiting for their backoff: (when, host or None for every agent, command).
        self.scheduled: list[tuple[float, str | None, protocol.Command]] = []
        self.phase: Phase = "idle"
        self.stopped_hosts: set[str] = set()
        self.delay = 0.0
        self.failed_at: dict[str, float] = {}  # task -> when its last failure was seen
        # task -> its restarts alone (in place, or on a lost host's new agent): what its agent
        # counts in $TFLAUNCH_TASK_RESTARTS, handed to a new agent that takes over from it
        self.alone: dict[str, int] = {}

    @property
    def cluster_restarting(self) -> bool:
        return self.phase != "idle"

    def due(self) -> list[tuple[str | None, protocol.Command]]:
        """The scheduled commands whose backoff is over, taken off the schedule."""
        now = time.monotonic()
        due = [(host, command) for when, host, command in self.scheduled if when <= now]
        if due:
            self.scheduled = [item for item in self.scheduled if item[0] > now]
        for _, command in due:
            if isinstance(command, protocol.Restart):  # its agent counts it as it restarts it
                self.alone[command.task] = self.alone.get(command.task, 0) + 1
        return due

    def started(self, state: TaskState, again: bool) -> None:
        """A task started; ``again`` (a restart of it or the cluster): say how long it was down."""
        if state.name in self.failed_at and again:
            seconds = time.monotonic() - self.failed_at.pop(state.name)
            self.report.record(protocol.RunningAgain(task=state.name, seconds=round(seconds, 3)))

    # ---- a task failed -----------------------------------------------------------------------

    def task_failed(self, state: TaskState, failure: Failure, what: str) -> Outcome | None:
        """Apply the task's restart policy: restart it, or the cluster (None), or fail the run."""
        decision = self.book.decide(failure)
        if decision.action == "fail":
            return self.fail_task(state, failure.code or 1, what, self._why_not(failure, decision))
        self.failed_at[state.name] = time.monotonic()
        entry = {
            "task": state.name,
            "cause": failure.cause,
            "code": failure.code,
            "restart": decision.count,
            "delay": decision.delay,
        }
        if decision.action == "restart_task":
            self.board.set(state, "restarting")
            self.report.record(protocol.Restarting(**entry))
            self.report.say(
                f"{state.name} {what}; restarting it in {decision.delay:g} s (restart "
                f"{decision.count} of at most {self.restart.of(failure.job).max_restarts})"
            )
            when = time.monotonic() + decision.delay
            self.scheduled.append((when, state.host, protocol.Restart(task=state.name)))
            return None
        self.report.record(
            protocol.ClusterRestarting(**entry, generation=self.book.cluster_restarts)
        )
        self.report.say(
            f"{state.name} {what}; restarting the whole cluster from its checkpoints "
            f"(cluster restart {self.book.cluster_restarts} of at most "
            f"{self.restart.max_cluster_restarts})"
        )
        for name in self.board.tasks:
            self.failed_at.setdefault(name, self.failed_at[state.name])
        self._stop_cluster(decision.delay, "cluster restart")
        return None

    def _why_not(self, failure: Failure, decision: Decision) -> str:
        if self.restart.of(failure.job).policy == "never":
            return ""
        return f"Not restarted: {decision.reason}. Its failures: {self.book.history(failure.task)}."

    # ---- the cluster restart's phases ----------------------------------------------------------

    def _stop_cluster(self, delay: float, reason: str, hosts: set[str] | None = None) -> None:
        """Every agent (of ``hosts``) stops its tasks; the rest follows their ``tasks_stopped``."""
        self.scheduled = []
        self.phase, self.delay = "stopping", delay
        self.stopped_hosts = set()
        self.board.leader_done_at = None
        command = protocol.StopTasks(reason=reason).wire()
        for link in self.links:
            if hosts is None or link.host in hosts:
                link.send(command)

    def tasks_stopped(self, host: str) -> None:
        self.stopped_hosts.add(host)
        self._check_cluster_stopped()

    def _check_cluster_stopped(self) -> None:
        """Once every agent stopped its tasks (and every lost host has a new agent), start them
        all again after the backoff."""
        if self.phase != "stopping" or not self.open_links <= self.stopped_hosts:
            return
        if self.revival.lost:
            self.phase = "waiting"
            for host in self.revival.lost:
                self.revival.wait_for(host)
            return
        self._start_again()

    def _start_again(self) -> None:
        self.phase = "idle"
        self.board.reset()
        command = protocol.StartTasks(generation=self.book.cluster_restarts)
        when = time.monotonic() + self.delay
        for host in sorted(self.open_links - self.revival.take_revived()):
            self.scheduled.append((when, host, command))

    # ---- hosts that stop answering -----------------------------------------------------------

    def host_lost(self, host: str, message: str) -> Outcome | None:
        """A host was lost (it stopped answering, or its instance ended): bring it back and
        restart its tasks alone there, or the whole cluster; or fail the run."""
        self.report.record(protocol.HostLost(host=host, message=message))
        self.open_links.discard(host)
        self.stopped_hosts.discard(host)
        if self.revival.revive is None:
            return self.host_failed(host, f"stopped answering: {message}")
        tasks = self.board.names_on(host)
        decision = self.book.decide_host_lost(host, tasks)
        if decision.action == "fail":
            return self.host_failed(host, f"was lost: {message}. Not restarted: {decision.reason}")
        now = time.monotonic()
        self.revival.lose(host, now)
        if decision.action == "restart_task":
            return self._restart_lost_tasks(host, message, decision, now)
        for state in self.board:
            if state.host == host:
                state.state = "exited"
            self.failed_at.setdefault(state.name, now)
        self.report.record(
            protocol.ClusterRestarting(
                cause=protocol.HostLost.NAME,
                host=host,
                delay=decision.delay,
                generation=self.book.cluster_restarts,
            )
        )
        self.report.say(
            f"{host} was lost ({message}); stopping the tasks on the other hosts and "
            f"{self.revival.doing(host)}, then restarting the whole cluster from its "
            f"checkpoints (cluster restart {self.book.cluster_restarts} of at most "
            f"{self.restart.max_cluster_restarts})"
        )
        if self.phase == "waiting":  # another host is being waited for already
            self.revival.wait_for(host)
            return None
        if self.phase != "stopping":
            self._stop_cluster(decision.delay, f"{host} stopped answering", set(self.open_links))
        self._check_cluster_stopped()
        return None

    def _restart_lost_tasks(
        self, host: str, message: str, decision: Decision, now: float
    ) -> Outcome | None:
        """Every task of the lost host may restart alone: the other hosts keep running, and
        the host's new agent starts its tasks once it is back."""
        names = self.board.names_on(host)
        for name in names:
            state = self.board.tasks[name]
            self.failed_at[name] = now
            self.alone[name] = self.alone.get(name, 0) + 1
            self.board.set(state, "restarting")
            self.report.record(
                protocol.Restarting(
                    task=name,
                    cause=protocol.HostLost.NAME,
                    restart=self.book.task_restarts[name],
                    delay=0.0,
                )
            )
        self.report.say(
            f"{host} was lost ({message}); {self.revival.doing(host)}, then restarting its "
            f"tasks ({', '.join(names)}) there alone while the other hosts keep running "
            f"(restart {decision.count} of at most "
            f"{self.restart.of(names[0].partition(':')[0]).max_restarts} per task)"
        )
        self.revival.wait_for(host)
        self._check_cluster_stopped()  # a cluster restart under way no longer waits for its agent
        return None

    def host_back(self, host: str) -> AgentLink:
        """A lost host answers again: its new agent's link, to be read from."""
        link, seconds = self.revival.back(host)
        self.links[:] = [old for old in self.links if old.host != host] + [link]
        self.open_links.add(host)
        self.report.record(protocol.HostBack(host=host, seconds=round(seconds, 3)))
        self.report.say(f"{host} answers again after {seconds:.1f} s: a new agent starts its tasks")
        # it starts them counting every restart of them in the run, as its old agent did
        restarts = {name: self.alone.get(name, 0) for name in self.board.names_on(host)}
        link.send(protocol.Start(restarts=restarts, generation=self.book.cluster_restarts).wire())
        if self.phase == "waiting":
            if not self.revival.lost:
                self._start_again()
            return link
        self.revival.forget_revived(host)  # its tasks restart alone, as its new agent starts
        if self.phase == "stopping":
            # back while a cluster restart (since its loss) stops every agent: it stops its
            # tasks too, and starts them again with the others
            link.send(protocol.StopTasks(reason="cluster restart").wire())
        return link

    # ---- failure reports -----------------------------------------------------------------------

    def host_failed(self, host: str, what: str) -> Outcome:
        lines = [
            f"host {host} {what}.",
            f"Its tasks ({', '.join(self.board.names_on(host))}) are stopped by its agent once "
            f"that has heard nothing for {self.supervision.heartbeat_timeout:g} s "
            "(supervision.heartbeat_timeout).",
        ]
        if self.revival.revive is None:  # only SSH links report a lost host
            lines.append(
                "Set ssh.host_wait to wait for such a host and restart the cluster "
                "from its checkpoints."
            )
        restarts = self.book.summary()
        if restarts:
            lines.append("restarts: " + "; ".join(restarts))
        return self.report.failed("\n".join(lines), 1)

    def fail_task(self, state: TaskState, code: int, what: str, note: str = "") -> Outcome:
        return self.report.failed_by_task(state, code, what, note, self.book.summary())
