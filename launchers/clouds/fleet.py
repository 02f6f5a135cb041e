"""A provisioned run's instances while it runs: which ended, and their replacement (spot
instances the cloud took back, or any that ended by themselves).

:class:`Fleet` takes the provisioning's state (:class:`~tflaunch.launchers.clouds.state.ProvisionState`):
during an attached ``up`` the one :mod:`tflaunch.launchers.clouds.provisioning` made; for a
detached run watched from the laptop, the one :func:`fleet_of_run` reads back from run.json.
"""

from __future__ import annotations

import threading
import time

from tflaunch.cluster.config import ClusterConfig
from tflaunch.cluster.plan import Host
from tflaunch.errors import LaunchError
from tflaunch.launchers.clouds import provider_for
from tflaunch.launchers.clouds.base import ProvisionSection, Say
from tflaunch.launchers.clouds.records import (
    ALIVE_STATES,
    GONE_STATES,
    CloudDetails,
    access_of,
    mark_terminated,
)
from tflaunch.launchers.clouds.state import Made, ProvisionState, Reach
from tflaunch.runtime.run import Run


class Fleet:
    """A provisioned run's instances while it runs: which ended (the provider says so), and
    their replacement by an instance of the same host name, role and type that takes the
    ended one's cluster address (so the plan stays true), waits until it runs and accepts SSH,
    and is recorded in run.json. Bounded by the cluster restarts the coordinator allows."""

    def __init__(self, state: ProvisionState):
        self.state = state
        self.planned = {p.name: p for p in state.planned}
        self._lock = threading.Lock()  # over state.made, which replacements change
        self._creating = threading.Lock()  # held while a replacement is created and recorded
        self._closed = False  # the run ended: no more replacements

    def ended(self) -> dict[str, str]:
        """Host -> why, for every instance of the run that is ending or ended."""
        provider = self.state.provider
        with self._lock:
            ids = dict(self.state.made.ids)
        listed = {
            i.id: i
            for i in provider.describe(ids=list(ids.values()), states=(*ALIVE_STATES, *GONE_STATES))
        }
        gone = {}
        for host, instance_id in ids.items():
            instance = listed.get(instance_id)
            state = instance.state if instance is not None else "gone"
            if state not in ("pending", "running"):
                gone[host] = f"its instance {instance_id} is {state}, says {provider.name}"
        return gone

    def replacing(self, host: str) -> str:
        """What replacing ``host``'s instance does, in words."""
        planned = self.planned[host]
        spot = "spot " if planned.spot else ""
        return f"creating a replacement {spot}instance ({planned.instance_type})"

    def replace(self, host: str, deadline: float) -> tuple[Host, str, str]:
        """A new instance for ``host`` (running, accepting SSH); returns it, the old id and
        the new id. Refuses when the old instance still runs, or once the run ended."""
        state = self.state
        with self._creating:
            new_id, old_id = self._create_replacement(host)
        timeout = max(1.0, deadline - time.monotonic())
        found = state.provider.wait_running([new_id], timeout)
        (made,) = state.provider.hosts(
            [self.planned[host]], {host: new_id}, found, state.reach.via_jump
        )
        state.reach.wait_for_ssh([made], max(1.0, deadline - time.monotonic()), state.say)
        return made, old_id, new_id

    @property
    def ready_timeout(self) -> float:
        """Seconds an instance may take to run and accept SSH (``ssh.provision``'s)."""
        return self.state.section.ready_timeout

    def close(self) -> None:
        """The run ends: wait for a replacement being created (so that it is among the run's
        instances when they are terminated or kept), and refuse any further one."""
        with self._creating:
            self._closed = True

    def _create_replacement(self, host: str) -> tuple[str, str]:
        """Create and record the new instance for ``host``; its id and the old one's."""
        state, provider = self.state, self.state.provider
        if self._closed:
            raise LaunchError(f"the run ended; {host} is not replaced")
        with self._lock:
            old_id = state.made.ids[host]
        listed = provider.describe(ids=[old_id], states=(*ALIVE_STATES, *GONE_STATES))
        old = listed[0] if listed else None
        if old is not None and old.state in ("pending", "running"):
            raise LaunchError(f"{host} stopped answering, but its instance {old_id} still runs.")
        if old is not None and old.state != "terminated":  # stopped or stopping: end it for good
            provider.terminate([old_id])
        planned = self.planned[host]
        created = provider.create(
            [planned], state.run.id, state.config.name, state.made.network or "", state.tags,
            state.user_data, {host: old} if old is not None else None,
        )  # fmt: skip
        new_id = created[host]
        state.say(f"{host}: replacement instance {new_id} created (for {old_id}); waiting for it")
        with self._lock:
            state.made.ids[host] = new_id
            state.made.replaced.append((host, old_id, new_id))
            mark_terminated(state.run, {old_id})
            state.record([planned], {host: new_id})
        return new_id, old_id


def fleet_of_run(
    section: ProvisionSection, config: ClusterConfig, run: Run, reach: Reach, say: Say
) -> Fleet:
    """The :class:`Fleet` of a run started earlier (a detached run, watched from the laptop):
    its instances and prices from run.json and the provider, ``config`` its cluster file and
    ``section`` the file's ``ssh.provision`` (types, image, spot, ...)."""
    record = run.record()
    provider = provider_for(section, say)
    access = access_of(record, provider.name)
    if access is None:
        raise LaunchError(f"run {run.id} made no instances: there is nothing to watch")
    cloud = record.part(CloudDetails)
    planned = provider.instances_for(provider.candidates(config), run.read_plan())
    made = Made(
        ids={r.name: r.id for r in cloud.records if r.terminated is None},
        network=provider.recorded_network(access),
        started=True,
    )
    prices = {line.instance_type: line.price for line in provider.cost_lines(planned)}
    state = ProvisionState(
        section, config, run, reach, provider, tuple(planned), prices, cloud.keep_cluster, made
    )
    return Fleet(state)
