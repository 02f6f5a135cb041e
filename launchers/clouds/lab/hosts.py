"""Namespace hosts: the machines of the ``lab`` cloud, each a Linux network namespace on this
machine with its own OpenSSH server, built and removed with ``ip``, ``tc`` and ``sshd`` (root).

Addresses come from the benchmarking range 198.18.0.0/15, in a part the project's test hosts
do not use (they hold 198.18.0-3.x): host number N (1 to :data:`MAX_HOSTS`) has

* ``eth0`` on the public bridge ``tfl-lab-pub`` at 198.19.1.(9+N); the launcher reaches it from
  the root namespace, where the bridge itself holds 198.19.1.1;
* ``eth1`` on a private bridge ``tfl-lab-nK`` (the run's own network K) at 198.19.2.(9+N); the
  root namespace has an ``unreachable`` route for 198.19.2.0/24, as a laptop has none into a VPC.

The root-side ends of the two links are ``tfl-lpN`` and ``tfl-lvN``. None of these names match
the test hosts' (``tfl-ssh-*``, ``tfl-s[pv]N``, ``tfl-slurm-*``, ``tfls-nN``), so lab hosts and test
hosts live side by side without sharing a bridge or a lock.

Each host's sshd runs inside its namespace on port 22 of both addresses, with its own ed25519
host key, the authorized keys written for it (key login only, ``StrictModes no``, ``UsePAM no``)
and its pid file, configuration and log in the host's folder. A rate (``1gbit``) makes the private
link behave like a NIC of that speed, both ways: ``tbf`` on the host's ``eth1`` (what it sends)
and on ``tfl-lvN`` (what the bridge delivers to it), as tests/hosts/ssh_hosts.py and
benchmarks/shaped_lab.py shape their links.

Every step is idempotent: :func:`make_host` first removes whatever an earlier, interrupted try
left under the same number, and :func:`remove_host` ends every process in the namespace (its
sshd, sessions and the tasks they started), deletes the namespace and waits until its links are
gone. Names and addresses derive from the numbers alone, never from text read back from disk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Protocol

from tflaunch.plugin import LaunchError

MAX_HOSTS = 240  # host N at .9+N of each /24: .10 to .249
MAX_NETWORKS = 99
PUBLIC_BRIDGE = "tfl-lab-pub"
LAUNCHER_ADDRESS = "198.19.1.1"  # the public bridge's own address, in the root namespace
PUBLIC_PREFIX, PRIVATE_PREFIX = "198.19.1.", "198.19.2."
PRIVATE_NETWORK = "198.19.2.0/24"
NETNS_DIR = Path("/run/netns")  # where 'ip netns add' pins namespaces
SSHD, KEYGEN = "/usr/sbin/sshd", "ssh-keygen"
RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}  # tc's decimal bit units
SHAPER_LATENCY = "50ms"  # tbf's queue: how long a packet may wait for tokens before it is dropped
SEGMENT_BYTES = 65536  # largest GSO/GRO super-packet on a shaped veth (tbf's bucket holds it)
COMMAND_TIMEOUT = 60.0  # any one ip/tc/ssh-keygen call
SSHD_START_TIMEOUT = 10.0


@dataclasses.dataclass(frozen=True)
class NamespaceHost:
    """One namespace host: its number, its private network's number and its folder (host key,
    sshd configuration, pid file, log, authorized keys)."""

    index: int
    network: int
    folder: Path
    owner: str = ""  # the instance id, written as its public link's alias: who the number is

    def __post_init__(self) -> None:
        if not 1 <= self.index <= MAX_HOSTS or not 1 <= self.network <= MAX_NETWORKS:
            raise ValueError(f"host {self.index} / network {self.network} out of range")

    @property
    def namespace(self) -> str:
        return f"tfl-lab{self.index}"

    @property
    def public_address(self) -> str:
        return f"{PUBLIC_PREFIX}{9 + self.index}"

    @property
    def private_address(self) -> str:
        return f"{PRIVATE_PREFIX}{9 + self.index}"

    @property
    def public_veth(self) -> str:
        return f"tfl-lp{self.index}"

    @property
    def private_veth(self) -> str:
        return f"tfl-lv{self.index}"

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


def bridge_of(network: int) -> str:
    """The private bridge of network number ``network``."""
    return f"tfl-lab-n{network}"


def missing_requirements() -> str | None:
    """Why namespace hosts cannot be made here, in words; None when they can."""
    if os.geteuid() != 0:
        return "lab hosts are network namespaces: run tflaunch as root"
    if not os.path.exists(SSHD):
        return f"lab hosts need {SSHD} (apt-get install openssh-server)"
    for tool in ("ip", "tc", KEYGEN):
        if shutil.which(tool) is None:
            return f"lab hosts need {tool} (apt-get install iproute2 openssh-client)"
    return None


# ---- commands ------------------------------------------------------------------------------


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise LaunchError(f"lab: {' '.join(argv)} failed: {err}") from err
    if check and done.returncode != 0:
        raise LaunchError(
            f"lab: {' '.join(argv)} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}"
        )
    return done


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *args], check=check)


def _in(namespace: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", "netns", "exec", namespace, *argv], check=check)


def link_aliases() -> dict[str, str]:
    """The root namespace's network links: name -> alias ('' when it has none)."""
    out = _ip("-j", "link", "show", check=False).stdout
    try:
        return {str(link["ifname"]): str(link.get("ifalias", "")) for link in json.loads(out)}
    except (ValueError, KeyError, TypeError) as err:
        raise LaunchError(
            f"lab: cannot read the network links ('ip -j link show': {err})."
        ) from err


def links() -> set[str]:
    """The names of the root namespace's network links."""
    return set(link_aliases())


def numbers_in_use() -> tuple[set[int], set[int]]:
    """The host and network numbers that namespaces, links and bridges on this machine hold,
    whichever state directory made them: a number is taken again only when nothing has it."""
    names = set(link_aliases())
    with contextlib.suppress(OSError):
        names |= {entry.name for entry in NETNS_DIR.iterdir()}
    hosts_, networks = set(), set()
    for name in names:
        if match := re.fullmatch(r"tfl-(?:lab|l[pv])(\d+)x?", name):
            hosts_.add(int(match.group(1)))
        elif match := re.fullmatch(r"tfl-lab-n(\d+)", name):
            networks.add(int(match.group(1)))
    return hosts_, networks


def owner(host: NamespaceHost, aliases: dict[str, str]) -> str | None:
    """The instance id a host's number belongs to now (the alias of its public link), or None
    when no host of that number is fully made."""
    return aliases.get(host.public_veth) or None


def namespace_exists(namespace: str) -> bool:
    return (NETNS_DIR / namespace).exists()


def namespace_pids(namespace: str) -> list[int]:
    """Every process whose network namespace is ``namespace``."""
    if not namespace_exists(namespace):
        return []
    out = _ip("netns", "pids", namespace, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def kill_all(pids: list[int], grace: float = 2.0) -> None:
    """SIGTERM every pid, wait up to ``grace`` seconds for all of them, SIGKILL the rest."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if os.path.exists(f"/proc/{p}")]
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def sshd_running(host: NamespaceHost) -> bool:
    """Whether an sshd runs in the host's namespace (its pid file is not trusted for this)."""
    for pid in namespace_pids(host.namespace):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if name == "sshd":
            return True
    return False


# ---- bridges -------------------------------------------------------------------------------


def ensure_public_bridge() -> None:
    """The public bridge with the launcher's address, and the private range unreachable from
    the root namespace; made once, left as it is when it exists."""
    if PUBLIC_BRIDGE not in links():
        _ip("link", "add", PUBLIC_BRIDGE, "type", "bridge")
    _ip("addr", "replace", f"{LAUNCHER_ADDRESS}/24", "dev", PUBLIC_BRIDGE)
    _ip("link", "set", PUBLIC_BRIDGE, "up")
    _ip("route", "replace", "unreachable", PRIVATE_NETWORK)


def remove_public_bridge() -> None:
    """Remove the public bridge and the private range's route, once no lab host or network is
    left on this machine (of any state directory)."""
    if any(numbers_in_use()):
        return
    _ip("route", "delete", "unreachable", PRIVATE_NETWORK, check=False)
    _ip("link", "delete", PUBLIC_BRIDGE, check=False)


def make_network(network: int) -> str:
    """A fresh private bridge for network ``network`` (an old one of that number is replaced);
    returns its name."""
    bridge = bridge_of(network)
    _ip("link", "delete", bridge, check=False)
    _ip("link", "add", bridge, "type", "bridge")
    _ip("link", "set", bridge, "up")
    return bridge


def bridge_ports(network: int) -> list[str]:
    """The links attached to network ``network``'s bridge (none when it does not exist)."""
    listed = _ip("-j", "link", "show", "master", bridge_of(network), check=False)
    if listed.returncode != 0:
        return []
    try:
        return [str(link["ifname"]) for link in json.loads(listed.stdout or "[]")]
    except (ValueError, KeyError, TypeError) as err:
        raise LaunchError(f"lab: cannot read {bridge_of(network)}'s ports ({err}).") from err


def remove_network(network: int) -> list[str]:
    """Remove network ``network``'s bridge, unless links are still attached to it (a host that
    lives on it, whatever the records say): then it is kept and those links are returned."""
    ports = bridge_ports(network)
    if not ports:
        _ip("link", "delete", bridge_of(network), check=False)
    return ports


# ---- hosts ---------------------------------------------------------------------------------


def make_host(host: NamespaceHost, authorized_keys: str, rate: str | None = None) -> int:
    """Build the host from scratch (removing what an earlier try left under its number), start
    its sshd and wait until it greets on the public address; returns sshd's pid. The public
    bridge and the host's network bridge must exist."""
    remove_host(dataclasses.replace(host, owner=""))
    host.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    _keygen(host.host_key)
    host.authorized_keys.write_text(authorized_keys)
    host.authorized_keys.chmod(0o600)
    ns = host.namespace
    _ip("netns", "add", ns)
    _in(ns, "ip", "link", "set", "lo", "up")
    for root_side, inner, bridge, address in (
        (host.public_veth, "eth0", PUBLIC_BRIDGE, host.public_address),
        (host.private_veth, "eth1", bridge_of(host.network), host.private_address),
    ):
        _ip("link", "add", root_side, "type", "veth", "peer", "name", f"{root_side}x")
        _ip("link", "set", f"{root_side}x", "netns", ns)
        _in(ns, "ip", "link", "set", f"{root_side}x", "name", inner)
        _in(ns, "ip", "addr", "add", f"{address}/24", "dev", inner)
        _in(ns, "ip", "link", "set", inner, "up")
        _ip("link", "set", root_side, "master", bridge)
        _ip("link", "set", root_side, "up")
    if host.owner:
        _ip("link", "set", host.public_veth, "alias", host.owner)
    # The root namespace may still know an earlier host's link address for this address (its
    # entry stays reachable for a while): without the flush the first packets go nowhere.
    _ip("neigh", "flush", "to", host.public_address, check=False)
    if rate is not None:
        shape(host, rate)
    return start_sshd(host)


def remove_host(host: NamespaceHost, wait: float = 10.0) -> None:
    """End every process in the host's namespace, delete the namespace and its links; no
    error for what is already gone. A host whose number another instance holds now (its
    public link's alias says so) is left alone."""
    holder = owner(host, link_aliases())
    if host.owner and holder and holder != host.owner:
        return
    kill_all(namespace_pids(host.namespace))
    if namespace_exists(host.namespace):
        _ip("netns", "delete", host.namespace, check=False)
    # Deleting a namespace destroys its veths asynchronously: wait until they are gone, so that
    # a host made right after does not meet a half-deleted link of the same name.
    ends = {host.public_veth, host.private_veth, f"{host.public_veth}x", f"{host.private_veth}x"}
    deadline = time.monotonic() + wait
    while (left := ends & links()) and time.monotonic() < deadline:
        for link in left:
            _ip("link", "delete", link, check=False)
        time.sleep(0.1)
    if NETNS_DIR.joinpath(host.namespace).exists():  # a mount point 'ip netns delete' left
        with contextlib.suppress(OSError):
            NETNS_DIR.joinpath(host.namespace).unlink()


def _keygen(path: Path) -> None:
    path.unlink(missing_ok=True)
    Path(f"{path}.pub").unlink(missing_ok=True)
    _run([KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)])


def host_public_key(host: NamespaceHost) -> str:
    """The host's public key line (``ssh-ed25519 AAAA...``)."""
    return " ".join(Path(f"{host.host_key}.pub").read_text().split()[:2])


def _sshd_config(host: NamespaceHost) -> str:
    return "\n".join([
        "Port 22",
        f"ListenAddress {host.public_address}",
        f"ListenAddress {host.private_address}",
        f"HostKey {host.host_key}",
        f"AuthorizedKeysFile {host.authorized_keys}",
        f"PidFile {host.pid_file}",
        "StrictModes no",
        "UsePAM no",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "MaxStartups 200",
        "MaxSessions 50",
        "LogLevel ERROR",
        "Subsystem sftp internal-sftp",
        "",
    ])  # fmt: skip


def start_sshd(host: NamespaceHost) -> int:
    """Start the host's sshd in its namespace; wait until it greets; its pid."""
    host.sshd_config.write_text(_sshd_config(host))
    host.pid_file.unlink(missing_ok=True)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    _in(host.namespace, SSHD, "-f", str(host.sshd_config), "-E", str(host.sshd_log))
    deadline = time.monotonic() + SSHD_START_TIMEOUT
    while True:
        try:
            with socket.create_connection((host.public_address, 22), timeout=1.0) as sock:
                sock.settimeout(1.0)
                if sock.recv(4).startswith(b"SSH-"):
                    break
        except OSError as err:
            if time.monotonic() > deadline:
                log = host.sshd_log.read_text()[-1000:] if host.sshd_log.exists() else ""
                raise LaunchError(
                    f"lab: the sshd of {host.namespace} did not answer on "
                    f"{host.public_address}:22 within {SSHD_START_TIMEOUT:g} s ({err}). {log}"
                ) from err
            time.sleep(0.05)
    try:
        return int(host.pid_file.read_text().strip())
    except (OSError, ValueError) as err:
        raise LaunchError(f"lab: the sshd of {host.namespace} wrote no pid file") from err


# ---- link rate -----------------------------------------------------------------------------


def parse_rate(text: str) -> int:
    """A link rate as tc writes it (``1gbit``, ``500mbit``, ``100kbit``) in bits per second."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?bit)\s*", text.lower())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(
            f"a link rate is a number and a unit ({', '.join(RATE_UNITS)}), e.g. 1gbit, not "
            f"{text!r}"
        )
    return int(float(match.group(1)) * RATE_UNITS[match.group(2)])


def canonical_rate(text: object) -> object:
    """The one form a rate is kept in once read: bits per second as tc writes them
    (``" 1Gbit"`` -> ``"1000000000bit"``). What :func:`parse_rate` refuses is returned as given,
    for the caller's check to name."""
    if not isinstance(text, str):
        return text
    try:
        return f"{parse_rate(text)}bit"
    except ValueError:
        return text


class PrivateLink(Protocol):
    """What shaping needs of a host (a lab host, or one of the tests' SSH hosts): its namespace,
    whose ``eth1`` is its private end, and the root namespace's end of that link."""

    @property
    def namespace(self) -> str: ...

    @property
    def private_veth(self) -> str: ...


def _private_ends(host: PrivateLink) -> tuple[tuple[str | None, str], ...]:
    """The two ends of a host's private link: (namespace or None for the root one, device)."""
    return ((host.namespace, "eth1"), (None, host.private_veth))


def _at(namespace: str | None, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", namespace, *argv] if namespace else list(argv)


def shape(host: PrivateLink, rate: str) -> int:
    """Limit the host's private link to ``rate`` each way (tbf at both ends); the rate in
    bits/s. The bucket holds at least one super-packet and 1 ms at the rate (tbf's timer then
    never starves a fast link), at most what tc's 32-bit burst field takes."""
    bits = parse_rate(rate)
    burst = min(max(2 * SEGMENT_BYTES, bits // 8 // 1000), 2**31 // 8)
    for namespace, device in _private_ends(host):
        for limit in ("gso_max_size", "gro_max_size"):
            _run(_at(namespace, "ip", "link", "set", device, limit, str(SEGMENT_BYTES)))
        _run(
            _at(
                namespace,
                "tc", "qdisc", "replace", "dev", device, "root", "tbf",
                "rate", f"{bits}bit", "burst", str(burst), "latency", SHAPER_LATENCY,
            )
        )  # fmt: skip
    return bits


def unshape(host: PrivateLink) -> None:
    """Remove the shaping of the host's private link (no error where there is none)."""
    for namespace, device in _private_ends(host):
        _run(_at(namespace, "tc", "qdisc", "del", "dev", device, "root"), check=False)


def shaped_rates(host: PrivateLink) -> dict[str, int | None]:
    """Each end of the host's private link -> its tbf rate in bits/s (None: unshaped)."""
    rates: dict[str, int | None] = {}
    for namespace, device in _private_ends(host):
        out = _run(_at(namespace, "tc", "-j", "qdisc", "show", "dev", device)).stdout
        tbf = [q for q in json.loads(out or "[]") if q.get("kind") == "tbf" and q.get("root")]
        rates[f"{namespace}:{device}" if namespace else device] = (
            int(tbf[0]["options"]["rate"]) * 8 if tbf else None
        )
    return rates
