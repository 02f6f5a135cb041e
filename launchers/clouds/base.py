"""The interface a cloud fills in to make machines for a run, and what it reports about them.

The SSH backend provisions through this interface only (:mod:`tflaunch.launchers.ssh.provision`):
it asks the provider which instances a plan needs and what they cost, opens the cluster's network
rules, creates the instances, waits until they run, takes their addresses as the plan's hosts and
terminates them. ``tflaunch gc``, ``tflaunch down`` and ``tflaunch status --cloud`` ask the
provider for the instances tflaunch tagged. A provider lives in a folder of its own
(``launchers/clouds/<name>/``) and is found through the registry in
:mod:`tflaunch.launchers.clouds`.

Every instance carries tflaunch's tags (below); they are how a later command, on this machine or
another, finds the run, cluster and host an instance belongs to.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from tflaunch.cluster.config import ClusterConfig
from tflaunch.cluster.plan import Host, Plan
from tflaunch.errors import LaunchError
from tflaunch.launchers.clouds.costs import CostLine, Price
from tflaunch.runtime.identity import Launcher

TAG_RUN, TAG_CLUSTER, TAG_HOST = "tflaunch:run", "tflaunch:cluster", "tflaunch:host"
TAG_ROLE, TAG_LAUNCHER, TAG_RUN_DIR = "tflaunch:role", "tflaunch:launcher", "tflaunch:run-dir"
TAG_KEEP = "tflaunch:keep"  # a kept cluster's instances: 'up' of that cluster name reuses them
TAG_AUTOSTOP = "tflaunch:autostop"  # seconds idle after which the instance ends itself
# What the launcher says of an instance's use, for 'status --cloud' on any machine, whether the
# instance answers or not: the run using it now, or when the last run on it ended.
TAG_BUSY, TAG_IDLE_SINCE = "tflaunch:busy", "tflaunch:idle-since"  # run id; epoch seconds
ALIVE_STATES = ("pending", "running", "stopping", "stopped")
GONE_STATES = ("shutting-down", "terminated")
POLL_SECONDS = 2.0  # between state queries
Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class PlannedInstance:
    """One instance the run needs: its host name in the plan, role and type."""

    name: str
    role: str  # "worker" (chief, workers, evaluator and co-located PS) or "ps" (dedicated)
    instance_type: str
    gpus: int
    spot: bool


@dataclasses.dataclass(frozen=True)
class Instance:
    """One instance as the provider reports it."""

    id: str
    state: str  # pending, running, stopping, stopped, shutting-down, terminated
    instance_type: str
    tags: Mapping[str, str]
    launched: float  # seconds since the epoch
    connect_address: str | None = None  # reachable from the launcher (public)
    cluster_address: str | None = None  # between the cluster's hosts (private)
    networks: Mapping[str, str] = dataclasses.field(default_factory=dict)  # id -> name
    spot: bool = False
    zone: str | None = None  # where it runs (EC2: its availability zone)

    @property
    def host(self) -> str:
        return self.tags.get(TAG_HOST, "")


@dataclasses.dataclass(frozen=True)
class CloudDetails:
    """What a provisioned run adds to run.json (:class:`tflaunch.runtime.run.RunRecord`'s
    details), beside its provider's access (:func:`access_part`)."""

    # One dict per instance the run made or took: id, name, type, role, spot, hourly_usd,
    # launched, terminated (when it ended, or None) and kept (the kept cluster's name, if any).
    instances: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    keep_cluster: str | None = None  # the run's instances are this kept cluster's
    detached: bool = False  # written by the backend: a detached run's instances outlive 'up'


@functools.cache
def access_part(cloud: str) -> type:
    """The run.json part that holds how to reach a run's account again: one field named after
    its provider (e.g. ``ec2: {region, profile, endpoint_url, security_group}``)."""
    return dataclasses.make_dataclass(
        f"{cloud.capitalize()}Access",
        [(cloud, dict[str, Any] | None, dataclasses.field(default=None))],
        frozen=True,
    )


@dataclasses.dataclass(frozen=True)
class LockHolder:
    """Who holds a kept cluster's lock, as the cloud keeps it (so every machine sees it): what
    holds it ("run ID", "tflaunch down --cluster"), its process (a
    :class:`~tflaunch.runtime.identity.Launcher`'s tag: machine, pid, start time), since when,
    and its last heartbeat (epoch seconds)."""

    what: str
    launcher: str
    since: float
    heartbeat: float

    @property
    def identity(self) -> Launcher | None:
        """The holder's process; None for a tag that is not one (an older tflaunch's)."""
        return Launcher.from_tag(self.launcher)

    @property
    def laptop(self) -> str:
        return self.launcher.partition(":")[0] or "?"

    @property
    def pid(self) -> str:
        return self.launcher.split(":")[1] if self.launcher.count(":") >= 1 else "?"

    def describe(self, now: float) -> str:
        since = time.strftime("%H:%M:%S UTC", time.gmtime(self.since))
        return (
            f"{self.what} on {self.laptop} (pid {self.pid}, since {since}, last heartbeat "
            f"{max(0.0, now - self.heartbeat):.0f} s ago)"
        )


def pending_hosts(planned: Sequence[PlannedInstance]) -> list[Host]:
    """Hosts for planning before the instances exist: their addresses are not known yet."""
    return [
        Host(p.name, f"{p.name}.pending", f"{p.name}.pending", tuple(map(str, range(p.gpus))))
        for p in planned
    ]


NETWORK_PREFIX = "tflaunch-"  # of the network rules' names: a run's own, a kept cluster's lock


def network_name(run_id: str) -> str:
    """The name of the network rules (security group) a run makes for itself."""
    return f"{NETWORK_PREFIX}{run_id}"


class Provider(ABC):
    """A cloud account seen by tflaunch: instances in, instances out, and what they cost."""

    name: ClassVar[str] = ""
    key: ClassVar[str] = "ssh.provision"  # where the settings are, for messages

    def __init__(self, section: Any, say: Say):
        self.section, self.say = section, say

    # ---- planning and prices ---------------------------------------------------------------

    @abstractmethod
    def candidates(self, config: ClusterConfig) -> list[PlannedInstance]:
        """Every instance the plan may place tasks on, in plan order (workers, then PS)."""

    def instances_for(
        self, candidates: Sequence[PlannedInstance], plan: Plan
    ) -> list[PlannedInstance]:
        """The candidates the plan placed tasks on: the instances to create."""
        used = {h.name for h in plan.hosts_with_tasks()}
        return [p for p in candidates if p.name in used]

    @abstractmethod
    def prices(self, instance_types: Sequence[str]) -> dict[str, Price]:
        """The hourly price of each type, and where each figure comes from."""

    def cost_lines(self, planned: Sequence[PlannedInstance]) -> list[CostLine]:
        """One line per (role, type, spot) with its count and price, in the planned order."""
        prices = self.prices([p.instance_type for p in planned])
        groups: dict[tuple[str, str, bool], int] = {}
        for p in planned:
            key = (p.role, p.instance_type, p.spot)
            groups[key] = groups.get(key, 0) + 1
        return [
            CostLine(role, kind, count, spot, prices[kind])
            for (role, kind, spot), count in groups.items()
        ]

    # ---- making and ending instances -------------------------------------------------------

    @abstractmethod
    def open_network(
        self,
        run_id: str,
        cluster: str,
        ports: Sequence[int],
        ssh_port: int,
        ssh_from: str,
        tags: Mapping[str, str] | None = None,
    ) -> str:
        """Network rules admitting the cluster's ports between its members and SSH from
        ``ssh_from``, with ``tags`` beside tflaunch's (a kept cluster's :data:`TAG_KEEP`);
        returns their id."""

    @abstractmethod
    def create(
        self,
        planned: Sequence[PlannedInstance],
        run_id: str,
        cluster: str,
        network: str,
        tags: Mapping[str, str],
        user_data: str,
        same_address: Mapping[str, Instance] | None = None,
    ) -> dict[str, str]:
        """One instance per planned host, tagged; returns host name -> instance id. A host in
        ``same_address`` replaces that (ended) instance and takes its cluster address, so that
        the plan's cluster spec stays true."""

    @abstractmethod
    def describe(
        self,
        ids: Sequence[str] | None = None,
        tags: Mapping[str, str | None] | None = None,
        states: Sequence[str] = ALIVE_STATES,
    ) -> list[Instance]:
        """Instances by id and/or tag (a None value: the tag is present), in the given states."""

    @abstractmethod
    def tag(self, ids: Sequence[str], tags: Mapping[str, str], remove: Sequence[str] = ()) -> None:
        """Set ``tags`` on the instances and take the ``remove`` keys off them."""

    @abstractmethod
    def terminate(self, ids: Sequence[str], network: str | None = None, wait: float = 300) -> None:
        """Terminate the instances, wait until the provider says so, then delete ``network``."""

    @abstractmethod
    def delete_network(self, network: str, wait: float) -> None:
        """Delete the run's network rules (once no instance uses them)."""

    @abstractmethod
    def kept_networks(self, name: str) -> list[str]:
        """The network rules tagged as kept cluster ``name``'s (:data:`TAG_KEEP`), found from
        any machine; not its lock."""

    @abstractmethod
    def where(self) -> str:
        """The account and region this provider asks, for messages."""

    # ---- a kept cluster's lock, held in the cloud so that it holds across machines ----------

    @abstractmethod
    def take_lock(self, name: str, holder: LockHolder) -> LockHolder | None:
        """Take the lock called ``name`` in one atomic step: None when this call took it for
        ``holder``, else whoever holds it."""

    @abstractmethod
    def renew_lock(self, name: str, holder: LockHolder, heartbeat: float) -> LockHolder | None:
        """Move the lock's heartbeat on while ``holder`` holds it: None when done, else whoever
        holds it now (the lock was broken and taken)."""

    @abstractmethod
    def drop_lock(self, name: str, holder: LockHolder) -> None:
        """Remove the lock if (and only if) ``holder`` holds it: a release, or the break of a
        stale lock that leaves alone one taken meanwhile by someone else."""

    @abstractmethod
    def access(self) -> dict[str, Any]:
        """What run.json keeps to reach this account again (``down``, ``gc``)."""

    @classmethod
    @abstractmethod
    def from_access(cls, access: Mapping[str, Any], say: Say) -> Provider:
        """The provider for an account as :meth:`access` recorded it."""

    # ---- shared behaviour --------------------------------------------------------------------

    def addresses(
        self, name: str, instance: Instance, via_jump: bool
    ) -> tuple[str | None, str | None]:
        """(connect, cluster) address of the instance that is host ``name``."""
        cluster = instance.cluster_address
        return instance.connect_address or (cluster if via_jump else None), cluster

    def hosts(
        self,
        planned: Sequence[PlannedInstance],
        ids: Mapping[str, str],
        found: Sequence[Instance],
        via_jump: bool,
    ) -> list[Host]:
        """Plan hosts with the addresses the provider gave each instance (``found``)."""
        by_id = {i.id: i for i in found}
        hosts = []
        for p in planned:
            instance = by_id.get(ids[p.name])
            if instance is None:
                raise LaunchError(f"{p.name} ({ids[p.name]}) is not running.")
            connect, cluster = self.addresses(p.name, instance, via_jump)
            if not cluster or not connect:
                raise LaunchError(
                    f"{p.name} ({ids[p.name]}) has no public address; use a subnet that assigns "
                    "public addresses, or set ssh.jump_host to a host inside the VPC."
                )
            hosts.append(Host(p.name, cluster, connect, tuple(map(str, range(p.gpus)))))
        return hosts

    def wait_running(self, ids: Sequence[str], timeout: float) -> list[Instance]:
        """Poll until every instance runs, saying how many do whenever that changes."""
        deadline, started, shown = time.monotonic() + timeout, time.monotonic(), -1
        while True:
            found = self.describe(ids=ids, states=(*ALIVE_STATES, *GONE_STATES))
            running = sum(1 for i in found if i.state == "running")
            if running != shown:
                self.say(
                    f"instances running: {running}/{len(ids)} ({time.monotonic() - started:.0f} s)"
                )
                shown = running
            if running == len(ids):
                return found
            gone = [i.id for i in found if i.state in GONE_STATES]
            if gone:
                raise LaunchError(
                    f"instance(s) {', '.join(gone)} ended while starting (spot reclaimed, or capacity)."
                )
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"only {running} of {len(ids)} instances ran within {timeout:g} s "
                    f"({self.key}.ready_timeout)."
                )
            time.sleep(POLL_SECONDS)
