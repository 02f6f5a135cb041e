"""Hosts that stop answering, and the new agents that take their place once they answer again.

A backend that can start a new agent on a host (SSH with ``ssh.host_wait``, or on a new instance
that replaces an ended one) hands the coordinator a :class:`Revive`. For each lost host,
:class:`HostRevival` asks the backend, in a thread of its own and at once, for a new agent within
the wait, and posts the outcome to the coordinator's event queue: ``host_back`` (the new link is
kept here until the coordinator takes it) or ``host_gone``. Once the run ends no new agent may
join: one that starts too late is closed at once.

Nothing waits for the lost host's old agent to end (it stops its tasks only once its heartbeat
times out, maybe long after the host answers again): the new agent is started with
``--await-start``, and before it starts its tasks it stops what the old one left running of them
on the host (:mod:`tflaunch.runtime.agent`, event ``old_tasks_stopped``), so ``host_wait`` is
only how long the host may take to answer again.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tflaunch.runtime import protocol
from tflaunch.runtime.link import AgentLink


@dataclass(frozen=True)
class Revive:
    """How a backend brings back a host that was lost: up to ``wait`` seconds;
    ``start(host, deadline)`` returns a new agent's link on the host once it answers (SSH's
    ``ssh.host_wait``), or on the instance that replaced it (a provisioned run), and raises when
    it cannot before the deadline (monotonic clock). ``doing(host)`` says what is being done
    meanwhile, and ``not_back`` how the failure reads ("host H {not_back}: {error}")."""

    wait: float
    start: Callable[[str, float], AgentLink]
    doing: Callable[[str], str] | None = None
    not_back: str = ""

    def what_is_done(self, host: str) -> str:
        if self.doing is not None:
            return self.doing(host)
        return f"waiting up to {self.wait:g} s (ssh.host_wait) for it to answer again"

    def why_not_back(self) -> str:
        return self.not_back or f"did not answer again within {self.wait:g} s (ssh.host_wait)"


class HostRevival:
    def __init__(self, revive: Revive | None, events: queue.Queue):
        self.revive, self.events = revive, events
        self.wait = revive.wait if revive else 0.0
        self.lost: dict[str, float] = {}  # hosts that stopped answering -> when
        self._waiting: set[str] = set()  # lost hosts a thread waits for
        self.revived: set[str] = set()  # hosts whose new agent started its own tasks
        self._new_links: dict[str, AgentLink] = {}  # from the waiting threads
        self._ended = threading.Event()  # no new agent may start any more
        self._lock = threading.Lock()

    def doing(self, host: str) -> str:
        """What is done to bring ``host`` back, in words."""
        assert self.revive is not None
        return self.revive.what_is_done(host)

    def why_not_back(self) -> str:
        assert self.revive is not None
        return self.revive.why_not_back()

    def lose(self, host: str, when: float) -> None:
        self.lost[host] = when

    def wait_for(self, host: str) -> None:
        """Start waiting for ``host`` (in a thread) unless that is done already: ``host_back``
        or ``host_gone`` follows."""
        if host in self._waiting:
            return
        self._waiting.add(host)
        threading.Thread(target=self._wait_for_host, args=(host,), daemon=True).start()

    def _wait_for_host(self, host: str) -> None:
        """Ask the backend for the host's new agent, by ``wait`` seconds after its loss."""
        deadline = self.lost[host] + self.wait
        try:
            assert self.revive is not None
            link = self.revive.start(host, deadline)
        except Exception as err:  # reported as the host's failure
            self.events.put((host, protocol.HostGone(message=str(err)).wire()))
            return
        with self._lock:
            if self._ended.is_set():
                link.close(timeout=5)  # the run ended meanwhile: the new agent stops at once
                return
            self._new_links[host] = link
            self.events.put((host, protocol.HostBack().wire()))

    def back(self, host: str) -> tuple[AgentLink, float]:
        """The new agent's link of a host that answers again, and how long it was lost."""
        link = self._new_links.pop(host)
        lost_at = self.lost.pop(host)
        self._waiting.discard(host)
        self.revived.add(host)
        return link, time.monotonic() - lost_at

    def forget_revived(self, host: str) -> None:
        """``host``'s new agent is treated as any other from now on."""
        self.revived.discard(host)

    def take_revived(self) -> set[str]:
        """The hosts whose new agents started their own tasks (forgotten from now on)."""
        revived, self.revived = self.revived, set()
        return revived

    def end(self) -> None:
        with self._lock:
            self._ended.set()
