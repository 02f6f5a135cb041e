"""A lost host's new agent in an attached SSH run (``SshBackend.reviver``): two ways back to
the host, one way to its agent.

- ``ssh.host_wait``: the same host, connected to again until it answers or the wait ends;
- a provisioned run whose agents stay up: a new instance in place of one that ended (the fleet's,
  :mod:`tflaunch.launchers.clouds.fleet`), prepared as at the start (sync, setup,
  pre-flight, its plan); its link first reports :class:`protocol.InstanceReplaced`.

Either way the old connection is closed, the new one takes its place in the run's session, and an
agent is started there that waits for its coordinator's ``start`` (``--await-start``); its link
replaces the old one among those the instance watch reports lost hosts on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from tflaunch.launchers.ssh.connect import (
    Connection,
    SshOptions,
    connect,
    connect_all,
    remote_command,
)
from tflaunch.launchers.ssh.link import SshLink
from tflaunch.launchers.ssh.section import SshSection
from tflaunch.launchers.ssh.session import HostSession
from tflaunch.plugin import ClusterConfig, LaunchError, Plan, Revive, Run
from tflaunch.runtime import protocol


class SshRevival:
    """New agents for the lost hosts of one attached run. ``links``: the run's agents by host,
    kept current for the instance watch; ``fleet``: a provisioned run's instances, or None."""

    def __init__(
        self,
        session: HostSession,
        links: dict[str, SshLink],
        fleet: Any,
        config: ClusterConfig,
        plan: Plan,
        run: Run,
    ):
        self.session, self.links, self.fleet = session, links, fleet
        self.config, self.plan, self.run = config, plan, run
        self.section = config.section(SshSection)

    def revive(self) -> Revive | None:
        """How the coordinator gets a new agent on a lost host; None: it cannot (the lost host
        fails the run)."""
        if self.fleet is not None and self.plan.supervision.restart.enabled:
            budget = self.section.host_wait or 2 * self.fleet.ready_timeout
            return Revive(
                budget,
                self._new_instance,
                doing=lambda host: (
                    f"{self.fleet.replacing(host)} on the same cluster address and "
                    f"preparing it as at the start (sync, setup, pre-flight) within {budget:g} s"
                ),
                not_back=f"was not replaced within {budget:g} s",
            )
        if not self.section.host_wait:
            return None
        return Revive(self.section.host_wait, self._same_host)

    def _same_host(self, host: str, deadline: float) -> SshLink:
        """Connect to ``host`` until it answers or ``deadline``; a new agent there."""
        options = SshOptions.from_section(self.section, self.config.base_dir)
        address = self.plan.host(host).connect_address
        while True:
            try:
                if options.jump_host:
                    conn = connect_all([(host, address)], options)[host]
                else:
                    conn = connect(host, address, options)
                break
            except LaunchError as err:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LaunchError(f"the last try to connect said: {err}") from None
                time.sleep(min(2.0, left))  # the last try is at the deadline
        return self._agent(host, conn)

    def _new_instance(self, host: str, deadline: float) -> SshLink:
        """A new instance for ``host``, prepared as at the start, with a new agent."""
        made, old_id, new_id = self.fleet.replace(host, deadline)
        fresh = HostSession(self.session.out)
        fresh.options = self.session.options  # the run's known_hosts
        fresh.open(self.config, self.plan.with_hosts(made), self.run, only=host)
        self.session.paths[host] = fresh.paths[host]
        replaced = protocol.InstanceReplaced(old=old_id, new=new_id).wire()
        return self._agent(host, fresh.connections[host], [replaced])

    def _agent(
        self, host: str, conn: Connection, first_events: Sequence[dict[str, Any]] = ()
    ) -> SshLink:
        """``conn`` in place of the host's old connection, and a new agent over it."""
        old = self.session.connections.get(host)
        if old is not None:
            with contextlib.suppress(Exception):
                old.close()
        self.session.connections[host] = conn
        argv = self.session.agent_argv(self.section.python, host, await_start=True)
        sup = self.plan.supervision
        link = SshLink(
            host, conn, conn.start(remote_command(argv)), sup.heartbeat, sup.heartbeat_timeout,
            first_events=first_events,
        )  # fmt: skip
        self.links[host] = link
        return link
