"""The records the clouds hand around and keep, apart from the contract a cloud fills in
(:mod:`tflaunch.launchers.clouds.base`), as SkyPilot keeps ``provision/common.py`` beside the
routed operations of ``provision/__init__.py``: the instances a run needs
(:class:`PlannedInstance`) and those a provider lists (:class:`Instance`), the tags every
instance carries (how a later command, on this machine or another, finds the run, cluster and
host an instance belongs to), a kept cluster's lock holder (:class:`LockHolder`), and what a
provisioned run keeps in run.json, with its one reader and writer:

* :class:`CloudDetails`: the run's instances (one :class:`InstanceRecord` each), its kept
  cluster and whether it was detached;
* its provider's access (:func:`access_part`): how ``down``, ``gc`` and ``status --cloud`` reach
  the account again, with the run's network rules under :data:`NETWORK_KEY`.

run.json is untrusted input: an instance entry that is not a record is left out when read.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tflaunch.cluster.plan import Host
from tflaunch.runtime.identity import Launcher
from tflaunch.runtime.run import Run, RunRecord

TAG_RUN, TAG_CLUSTER, TAG_HOST = "tflaunch:run", "tflaunch:cluster", "tflaunch:host"
TAG_ROLE, TAG_LAUNCHER, TAG_RUN_DIR = "tflaunch:role", "tflaunch:launcher", "tflaunch:run-dir"
TAG_KEEP = "tflaunch:keep"  # a kept cluster's instances: 'up' of that cluster name reuses them
TAG_AUTOSTOP = "tflaunch:autostop"  # seconds idle after which the instance ends itself
# What the launcher says of an instance's use, for 'status --cloud' on any machine, whether the
# instance answers or not: the run using it now, or when the last run on it ended.
TAG_BUSY, TAG_IDLE_SINCE = "tflaunch:busy", "tflaunch:idle-since"  # run id; epoch seconds
ALIVE_STATES = ("pending", "running", "stopping", "stopped")
GONE_STATES = ("shutting-down", "terminated")
NETWORK_KEY = "network"  # the run's network rules, beside its provider's access in run.json
NETWORK_PREFIX = "tflaunch-"  # of the network rules' names: a run's own, a kept cluster's lock


def network_name(run_id: str) -> str:
    """The name of the network rules (security group) a run makes for itself."""
    return f"{NETWORK_PREFIX}{run_id}"


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


@dataclasses.dataclass(frozen=True)
class InstanceRecord:
    """One instance a run made or took, as run.json's ``instances`` keeps it: its id, host name
    in the plan, type, role, spot or not, hourly price, when it was launched and when it ended
    (None while it runs), and the kept cluster it belongs to (if any)."""

    id: str
    name: str
    instance_type: str
    role: str
    spot: bool = False
    hourly_usd: float | None = None
    launched: float | None = None
    terminated: float | None = None
    kept: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = {
            "id": self.id, "name": self.name, "type": self.instance_type, "role": self.role,
            "spot": self.spot, "hourly_usd": self.hourly_usd, "launched": self.launched,
            "terminated": self.terminated,
        }  # fmt: skip
        return {**data, "kept": self.kept} if self.kept else data

    @classmethod
    def from_json(cls, data: Any) -> InstanceRecord | None:
        """The record of one run.json entry; None for one that is not (hand-edited, corrupt)."""
        if not isinstance(data, dict):
            return None
        text = {key: data.get(key) for key in ("id", "name", "type", "role")}
        numbers = {key: data.get(key) for key in ("hourly_usd", "launched", "terminated")}
        kept = data.get("kept")
        if (
            not all(isinstance(v, str) for v in text.values())
            or not all(_number_or_none(v) for v in numbers.values())
            or not isinstance(data.get("spot", False), bool)
            or not (kept is None or isinstance(kept, str))
        ):
            return None
        return cls(
            text["id"], text["name"], text["type"], text["role"], data.get("spot", False),
            **numbers, kept=kept,
        )  # fmt: skip


def _number_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


@dataclasses.dataclass(frozen=True)
class CloudDetails:
    """What a provisioned run adds to run.json (:class:`tflaunch.runtime.run.RunRecord`'s
    details), beside its provider's access (:func:`access_part`). ``instances`` holds the JSON
    of :class:`InstanceRecord`; read them as :attr:`records`, write them with
    :func:`add_instances` and :func:`mark_terminated`."""

    instances: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    keep_cluster: str | None = None  # the run's instances are this kept cluster's
    detached: bool = False  # written by the backend: a detached run's instances outlive 'up'

    @property
    def records(self) -> list[InstanceRecord]:
        found = (InstanceRecord.from_json(entry) for entry in self.instances)
        return [record for record in found if record is not None]


def instance_records(run: Run) -> list[InstanceRecord]:
    """The instances ``run`` made or took, as run.json records them."""
    return run.record().part(CloudDetails).records


def add_instances(run: Run, made: Iterable[InstanceRecord]) -> None:
    """Record instances the run made or took, after those recorded already."""
    records = [*instance_records(run), *made]
    run.update_part(CloudDetails, instances=[r.to_json() for r in records])


def mark_terminated(run: Run, ids: set[str] | None = None) -> None:
    """Record in run.json when the run's instances (or those of ``ids``) ended."""
    now = time.time()
    records = [
        dataclasses.replace(r, terminated=r.terminated or now) if ids is None or r.id in ids else r
        for r in instance_records(run)
    ]
    run.update_part(CloudDetails, instances=[r.to_json() for r in records])


@functools.cache
def access_part(cloud: str) -> type:
    """The run.json part that holds how to reach a run's account again: one field named after
    its provider (e.g. ``ec2: {region, profile, endpoint_url, subnet, network}``)."""
    return dataclasses.make_dataclass(
        f"{cloud.capitalize()}Access",
        [(cloud, dict[str, Any] | None, dataclasses.field(default=None))],
        frozen=True,
    )


def access_of(record: RunRecord, cloud: str) -> dict[str, Any] | None:
    """How to reach the account ``cloud`` made the run's instances in, as run.json keeps it."""
    access = getattr(record.part(access_part(cloud)), cloud)
    return access if isinstance(access, dict) and access else None


def write_access(run: Run, cloud: str, access: Mapping[str, Any], network: str | None) -> None:
    """Record how ``down`` and ``gc`` reach the run's account and network rules again."""
    run.update_part(access_part(cloud), **{cloud: {**access, NETWORK_KEY: network}})
