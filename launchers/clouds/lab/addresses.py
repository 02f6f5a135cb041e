"""Where namespace hosts live: an :class:`AddressPlan` gives a family of hosts its names and
addresses, derived from a host number N and a private network number K alone, never from text
read back from disk; a :class:`NamespaceHost` is one host of a plan (built by
:mod:`tflaunch.launchers.clouds.lab.hosts`).

The lab cloud's plan, :data:`LAB`, takes a part of the benchmarking range 198.18.0.0/15 that no
test uses: host number N (1 to :data:`MAX_HOSTS`) has

* ``eth0`` on the public bridge ``tfl-lab-pub`` at 198.19.1.(9+N); the launcher reaches it from
  the root namespace, where the bridge itself holds 198.19.1.1;
* ``eth1`` on a private bridge ``tfl-lab-nK`` (the run's own network K) at 198.19.2.(9+N); the
  root namespace has an ``unreachable`` route for 198.19.2.0/24, as a laptop has none into a VPC.

The root-side ends of the two links are ``tfl-lpN`` and ``tfl-lvN``. The project's SSH test hosts
(tests/hosts/ssh_hosts.py) have plans of their own (``tfl-tS-*`` names and 198.18.16-215.x, one
plan per set S; the launcher there holds its address on a veth of its own, which a test can cut),
and so has the Slurm test cluster (tests/hosts/slurm_cluster.py: ``tfl-slurm-*`` at 198.18.0.x,
one network, no sshd); no plan's names match another's, so lab hosts, each set of test hosts and
the Slurm nodes live side by side without sharing a bridge or a lock.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

MAX_HOSTS = 240  # host N at .9+N of each /24: .10 to .249
MAX_NETWORKS = 99


@dataclasses.dataclass(frozen=True)
class AddressPlan:
    """Where one family of namespace hosts lives. Names are ``str.format`` patterns of the host
    number ``n`` or the network number ``k`` (a link's name is at most 14 characters, as its
    namespace-side end is first made as the name and ``x``); addresses are two /24 networks
    (``a.b.c``): the launcher at .1 of the public one, host N at .(first_host-1+N) of both
    (.(9+N) by default). A plan without the three private names has one network: its hosts have
    a public link only (``eth0``)."""

    namespace: str  # the host's namespace, e.g. tfl-lab{n}
    public_veth: str  # the root namespace's end of the host's public link
    public_bridge: str
    public_net: str  # e.g. 198.19.1
    private_veth: str | None = None  # the root namespace's end of the host's private link
    private_bridge: str | None = None  # network K's bridge, e.g. tfl-lab-n{k}
    private_net: str | None = None
    # The launcher's own veth onto the public bridge (its bridge-side end is this and 'x'), which
    # holds the launcher's address and can be cut; None: the public bridge holds the address.
    launcher_veth: str | None = None
    first_host: int = 10  # the last byte of host 1's addresses

    def __post_init__(self) -> None:
        private = (self.private_veth, self.private_bridge, self.private_net)
        if any(name is None for name in private) and any(name is not None for name in private):
            raise ValueError("a private network needs its veth, bridge and net, or none of them")
        if not 2 <= self.first_host <= 255 - MAX_HOSTS:
            raise ValueError(f"host 1's address byte is 2 to {255 - MAX_HOSTS}")

    @property
    def has_private(self) -> bool:
        """Whether the plan's hosts have a private link (a second network) besides the public."""
        return self.private_net is not None

    @property
    def launcher_address(self) -> str:
        return f"{self.public_net}.1"

    @property
    def private_network(self) -> str:
        return f"{self._private(self.private_net)}.0/24"

    def public_address(self, n: int) -> str:
        return f"{self.public_net}.{self.first_host - 1 + n}"

    def private_address(self, n: int) -> str:
        return f"{self._private(self.private_net)}.{self.first_host - 1 + n}"

    def private_link(self, n: int) -> str:
        """The root namespace's end of host ``n``'s private link."""
        return self._private(self.private_veth).format(n=n)

    def bridge(self, k: int) -> str:
        """The private bridge of network number ``k``."""
        return self._private(self.private_bridge).format(k=k)

    def numbers(self, name: str) -> tuple[int | None, int | None]:
        """(host number, network number) that a namespace or link name of this plan holds."""
        for pattern in (self.namespace, self.public_veth, self.private_veth):
            if pattern and (match := re.fullmatch(_number_pattern(pattern, "n") + "x?", name)):
                return int(match.group(1)), None
        if self.private_bridge and (
            match := re.fullmatch(_number_pattern(self.private_bridge, "k"), name)
        ):
            return None, int(match.group(1))
        return None, None

    def _private(self, name: str | None) -> str:
        if name is None:
            raise ValueError(f"the plan of {self.namespace} has no private network")
        return name


def _number_pattern(pattern: str, field: str) -> str:
    before, _, after = pattern.partition("{" + field + "}")
    return re.escape(before) + r"([1-9][0-9]*)" + re.escape(after)


LAB = AddressPlan(
    namespace="tfl-lab{n}",
    public_veth="tfl-lp{n}",
    private_veth="tfl-lv{n}",
    public_bridge="tfl-lab-pub",
    private_bridge="tfl-lab-n{k}",
    public_net="198.19.1",
    private_net="198.19.2",
)
PUBLIC_BRIDGE = LAB.public_bridge


@dataclasses.dataclass(frozen=True)
class NamespaceHost:
    """One namespace host: its number, its private network's number and its folder (host key,
    sshd configuration, pid file, log, authorized keys), under an address plan."""

    index: int
    network: int
    folder: Path
    owner: str = ""  # the instance id, written as its public link's alias: who the number is
    plan: AddressPlan = LAB

    def __post_init__(self) -> None:
        if not 1 <= self.index <= MAX_HOSTS or not 1 <= self.network <= MAX_NETWORKS:
            raise ValueError(f"host {self.index} / network {self.network} out of range")

    @property
    def namespace(self) -> str:
        return self.plan.namespace.format(n=self.index)

    @property
    def public_address(self) -> str:
        return self.plan.public_address(self.index)

    @property
    def private_address(self) -> str:
        return self.plan.private_address(self.index)

    @property
    def public_veth(self) -> str:
        return self.plan.public_veth.format(n=self.index)

    @property
    def private_veth(self) -> str:
        return self.plan.private_link(self.index)

    @property
    def host_key(self) -> Path:
        return self.folder / "ssh_host_ed25519_key"

    @property
    def authorized_keys(self) -> Path:
        return self.folder / "authorized_keys"

    @property
    def sshd_config(self) -> Path:
        return self.folder / "sshd_config"

    @property
    def pid_file(self) -> Path:
        return self.folder / "sshd.pid"

    @property
    def sshd_log(self) -> Path:
        return self.folder / "sshd.log"


def bridge_of(network: int, plan: AddressPlan = LAB) -> str:
    """The private bridge of network number ``network``."""
    return plan.bridge(network)
