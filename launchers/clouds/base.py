"""The contract a cloud fills in, what the core knows of it before it is imported, and its errors.

A cloud is one folder, ``launchers/clouds/<name>/`` (or a package of its own), whose
``__init__.py`` exports ``PROVIDER``, a :class:`ProviderSpec`:

* ``name``: what ``ssh.provision.cloud`` (and ``--cloud``) say, and its key in run.json;
* ``provider``: ``"module:Class"`` of its :class:`Provider` subclass, imported only when used;
* ``section``: the dataclass of its own ``ssh.provision`` settings, a subclass of
  :class:`ProvisionSection` (the settings the provisioning reads). The registry types the
  section: ``ssh.provision: {cloud: NAME, ...}`` is read by NAME's class (the ``cloud`` key is
  the registry's, not a field of the class), with the file/line/did-you-mean errors of the rest
  of the cluster file (:class:`tflaunch.cluster.schema.Variants`);
* ``check(config, section, fail)``: its section's cross-field rules (``fail(path, message)``,
  paths from the top of the file: ``("ssh", "provision", "image")``);
* ``features``: the optional abilities it has (:class:`Feature`); the core refuses a request for
  one it lacks with one message, exit code 2 (:meth:`ProviderSpec.require`);
* ``admin_options``: the command-line options ``gc``, ``down --cluster`` and ``status --cloud``
  add beside ``--cloud NAME`` to name an account without a cluster file (EC2: ``--region``,
  ``--profile``); their values reach :meth:`Provider.account`;
* ``default``: whether an ``ssh.provision`` without ``cloud:`` means this cloud (EC2's, which
  came first; at most one cloud may say so);
* ``discovery`` / ``discover``: optionally, host discovery: the dataclass of ``ssh.<name>:``
  and ``"module:function"`` with ``function(section, allow_private_connect) -> list[Host]``
  (hosts that exist already, as opposed to ``ssh.provision``, which makes them).

It is registered by being a sub-package of :mod:`tflaunch.launchers.clouds` (built-ins), or by
the entry-point group ``tflaunch.clouds`` (``name = "package.module:PROVIDER"``); the registry
(:mod:`tflaunch.launchers.clouds`) refuses a spec whose name is not the one it was registered
under, and two packages claiming one name.

The :class:`Provider` itself has a required core, one method per operation the cloud-neutral
orchestration (:mod:`tflaunch.launchers.clouds.provisioning`) uses: ``candidates`` (the instances a
file's roles need), ``prices``, the network (``open_network``/``delete_network``), ``create``,
``describe``, ``tag``, ``terminate``, and ``access``/``from_access`` (what run.json keeps to reach
the account again, for ``down``, ``gc`` and ``status --cloud``). The optional abilities have
default bodies that refuse (:class:`Unsupported`): kept clusters (:attr:`Feature.KEEP`:
``take_lock``/``renew_lock``/``drop_lock``, ``kept_networks``) and spot instances
(:attr:`Feature.SPOT`: ``create`` honours :attr:`PlannedInstance.spot`).

What the provisioning hands around and keeps is in :mod:`tflaunch.launchers.clouds.records`
(the planned and the listed instances, the tags every instance carries, a lock's holder, run.json's
records), apart from this contract.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from tflaunch.cluster.bounds import MAX_SECONDS
from tflaunch.cluster.config import ClusterConfig
from tflaunch.cluster.plan import Host, Plan
from tflaunch.cluster.registry import load_attribute
from tflaunch.cluster.schema import field
from tflaunch.errors import ConfigError, LaunchError
from tflaunch.launchers.clouds.costs import CostLine, Price
from tflaunch.launchers.clouds.records import (
    ALIVE_STATES,
    GONE_STATES,
    NETWORK_KEY,
    Instance,
    LockHolder,
    PlannedInstance,
)

POLL_SECONDS = 2.0  # between state queries
Say = Callable[[str], None]


Fail = Callable[[tuple, str], None]  # fail(key path, message) raises the located ConfigError


class Feature(enum.Enum):
    """An optional ability a provider declares (SkyPilot's ``CloudImplementationFeatures``)."""

    KEEP = "kept clusters (up --keep, down --cluster)"  # with a lock every machine sees
    SPOT = "spot instances"  # made on request, replaced when the cloud takes them back


class Unsupported(ConfigError):
    """A request for an ability the cloud does not declare (exit code 2)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProvisionSection:
    """The settings every cloud's ``ssh.provision`` has, read by the cloud-neutral provisioning:
    a cloud's section class subclasses this one (``@dataclass(frozen=True)``) and adds its own
    fields."""

    ready_timeout: float = field(
        600.0,
        minimum=1,
        maximum=MAX_SECONDS,
        doc="seconds to wait for the instances to run and accept SSH",
    )
    idle_timeout: float = field(
        1800.0,
        minimum=60,
        maximum=MAX_SECONDS,
        doc="an instance that runs no tflaunch process and no SSH session this long terminates "
        "itself",
    )
    terminate_at_end: bool = field(
        False, doc="terminate the instances when the run ends (as 'up --down')"
    )


@dataclasses.dataclass(frozen=True)
class AdminOption:
    """A command-line option of the cloud-admin commands (``--region``): ``name`` is the key
    :meth:`Provider.account` gets, written ``--name`` with ``-`` for ``_``."""

    name: str
    help: str
    hidden: bool = False  # for tests (an API stand-in's endpoint)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class ProviderSpec:
    """What the core knows of a cloud before it is imported (see the module's docstring)."""

    name: str
    provider: str  # "module:Class" of its Provider subclass
    section: type  # its ssh.provision settings (without the 'cloud' key)
    section_doc: str = ""
    check: Callable[[Any, Any, Fail], None] | None = None  # check(config, section, fail)
    features: frozenset[Feature] = frozenset()
    admin_options: tuple[AdminOption, ...] = ()
    discovery: type | None = None  # ssh.<name>: settings of host discovery
    discovery_doc: str = ""
    discover: str | None = None  # "module:function"(section, allow_private_connect) -> hosts
    default: bool = False  # what ssh.provision means without a 'cloud' key (one cloud at most)
    aliases: tuple[str, ...] = ()  # other names ssh.provision.cloud and --cloud may give it

    def load(self) -> type[Provider]:
        """The provider class (imported on demand, so each cloud stays optional)."""
        return load_attribute(self.provider, f"the '{self.name}' cloud")

    def supports(self, feature: Feature) -> bool:
        return feature in self.features

    def require(self, feature: Feature, asked: str) -> None:
        """Refuse ``asked`` (what the user asked for, in words) unless the cloud has
        ``feature``: one paragraph, exit code 2."""
        if feature not in self.features:
            has = ", ".join(f.value for f in sorted(self.features, key=lambda f: f.name))
            raise Unsupported(
                f"{asked}: {feature.value} are not supported by cloud '{self.name}' "
                f"(ssh.provision.cloud){f'; it supports {has}' if has else ''}. Use a cloud "
                "that has them, or leave that out."
            )

    def discover_hosts(self, section: object, allow_private_connect: bool) -> list[Host]:
        """The hosts ``ssh.<name>`` finds (:attr:`discover`); ``section``: the file's
        ``ssh.<name>``, of the :attr:`discovery` class, which the discover function reads."""
        if self.discover is None:
            raise ConfigError(f"cloud '{self.name}' does not discover hosts.")
        return load_attribute(self.discover, f"the '{self.name}' cloud")(
            section, allow_private_connect
        )


SettingsT = TypeVar("SettingsT")  # what a provider reads its settings from


class Provider(ABC, Generic[SettingsT]):
    """A cloud account seen by tflaunch: instances in, instances out, and what they cost.

    The abstract methods are the core every cloud implements; the rest have default bodies
    (optional abilities refuse with :class:`Unsupported`; declare them in the spec's
    ``features``). ``section`` holds its settings, of the type it names as ``SettingsT``: its
    own ``ssh.provision`` dataclass (a :class:`ProvisionSection`), and where :meth:`from_access`
    builds it from run.json without a cluster file, what that builds (EC2:
    ``Provider[Ec2ProvisionSection | Access]``); ``say`` prints one line for the user."""

    name: ClassVar[str] = ""
    key: ClassVar[str] = "ssh.provision"  # where the settings are, for messages
    spot_setting: ClassVar[str] = ""  # Feature.SPOT: the setting that asks for spot instances

    def __init__(self, section: SettingsT, say: Say):
        self.section, self.say = section, say

    # ---- core: planning and prices ----------------------------------------------------------

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
        """The hourly price of each type, and where each figure comes from (a cloud without
        prices says ``Price(type, 0.0, "free")`` or ``None`` for unknown)."""

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

    # ---- core: the network ------------------------------------------------------------------

    @abstractmethod
    def open_network(
        self,
        run_id: str,
        cluster: str,
        ports: Sequence[int],
        ssh_port: int,
        ssh_from: str | None,
        tags: Mapping[str, str] | None = None,
    ) -> str:
        """Network rules admitting the cluster's ports between its members and SSH from
        ``ssh_from`` (a CIDR; None: the provider decides, e.g. this machine's public address),
        with ``tags`` beside tflaunch's (a kept cluster's :data:`TAG_KEEP`); returns their id."""

    @abstractmethod
    def delete_network(self, network: str, wait: float) -> None:
        """Delete the run's network rules (once no instance uses them; wait up to ``wait``)."""

    # ---- core: making, finding and ending instances ----------------------------------------

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
        """One instance per planned host, tagged (tflaunch's tags, :data:`TAG_HOST`,
        :data:`TAG_ROLE` and ``tags``), running ``user_data`` (a shell script: the idle and
        runtime watchdog) at boot; returns host name -> instance id. A host in
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

    # ---- core: reaching the account again ---------------------------------------------------

    @abstractmethod
    def access(self) -> dict[str, Any]:
        """What run.json keeps to reach this account again (``down``, ``gc``): plain JSON."""

    @classmethod
    @abstractmethod
    def from_access(cls, access: Mapping[str, Any], say: Say) -> Provider:
        """The provider for an account as :meth:`access` recorded it."""

    @classmethod
    def account(
        cls, section: ProvisionSection | None, options: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The access of the account the command line names (``gc``, ``down --cluster``,
        ``status --cloud``): each admin option given, else the cluster file's setting of that
        name (``section``: its ``ssh.provision``, or None). ``options`` holds every admin
        option the spec declares (None where not given)."""
        return {key: value or getattr(section, key, None) for key, value in options.items()}

    @classmethod
    def recorded_network(cls, access: Mapping[str, Any]) -> str | None:
        """The run's network rules, as run.json keeps them beside its :meth:`access`."""
        network = access.get(NETWORK_KEY)
        return network if isinstance(network, str) else None

    def where(self) -> str:
        """The account this provider asks, for messages."""
        return self.name

    # ---- optional: kept clusters (Feature.KEEP) ---------------------------------------------

    def take_lock(self, name: str, holder: LockHolder) -> LockHolder | None:
        """Take the lock called ``name`` in one atomic step that every machine sees: None when
        this call took it for ``holder``, else whoever holds it."""
        raise self._unsupported(Feature.KEEP)

    def renew_lock(self, name: str, holder: LockHolder, heartbeat: float) -> LockHolder | None:
        """Move the lock's heartbeat on while ``holder`` holds it: None when done, else whoever
        holds it now (the lock was broken and taken)."""
        raise self._unsupported(Feature.KEEP)

    def drop_lock(self, name: str, holder: LockHolder) -> None:
        """Remove the lock if (and only if) ``holder`` holds it: a release, or the break of a
        stale lock that leaves alone one taken meanwhile by someone else."""
        raise self._unsupported(Feature.KEEP)

    def kept_networks(self, name: str) -> list[str]:
        """The network rules tagged as kept cluster ``name``'s (:data:`TAG_KEEP`), found from
        any machine; not its lock."""
        raise self._unsupported(Feature.KEEP)

    def _unsupported(self, feature: Feature) -> Unsupported:
        return Unsupported(f"{feature.value} are not supported by cloud '{self.name}'.")

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
