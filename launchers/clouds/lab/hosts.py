"""Namespace hosts: the machines of the ``lab`` cloud, each a Linux network namespace on this
machine with its own OpenSSH server, built and removed with ``ip``, ``tc`` and ``sshd`` (root).

Where a family of hosts lives (names, addresses) is its address plan
(:mod:`tflaunch.launchers.clouds.lab.addresses`): the lab cloud's, the SSH test hosts' sets
(tests/hosts/ssh_hosts.py) and the Slurm test cluster's nodes (tests/hosts/slurm_cluster.py: one
network, no sshd, built by :func:`make_namespace`) are all built here.

Each host's sshd runs inside its namespace on port 22 of both addresses, with its own ed25519
host key, the authorized keys written for it (key login only, ``StrictModes no``, ``UsePAM no``)
and its pid file, configuration and log in the host's folder. A rate (``1gbit``) makes the private
link behave like a NIC of that speed, both ways: ``tbf`` on the host's ``eth1`` (what it sends)
and on its private veth (what the bridge delivers to it), as benchmarks/shaped_lab.py shapes its
links.

Every step is idempotent: :func:`make_host` first removes whatever an earlier, interrupted try
left under the same number, and :func:`remove_host` ends every process in the namespace (its
sshd, sessions and the tasks they started), deletes the namespace and waits until its links are
gone.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from tflaunch.launchers.clouds.lab.addresses import LAB, AddressPlan, NamespaceHost

# Where hosts live, named here too for the callers that build them
from tflaunch.launchers.clouds.lab.addresses import MAX_HOSTS as MAX_HOSTS
from tflaunch.launchers.clouds.lab.addresses import PUBLIC_BRIDGE as PUBLIC_BRIDGE
from tflaunch.launchers.clouds.lab.addresses import bridge_of as bridge_of
from tflaunch.plugin import LaunchError

NETNS_DIR = Path("/run/netns")  # where 'ip netns add' pins namespaces
SSHD, KEYGEN = "/usr/sbin/sshd", "ssh-keygen"
RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}  # tc's decimal bit units
SHAPER_LATENCY = "50ms"  # tbf's queue: how long a packet may wait for tokens before it is dropped
SEGMENT_BYTES = 65536  # largest GSO/GRO super-packet on a shaped veth (tbf's bucket holds it)
COMMAND_TIMEOUT = 60.0  # any one ip/tc/ssh-keygen call
SSHD_START_TIMEOUT = 10.0


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


def numbers_in_use(plan: AddressPlan = LAB) -> tuple[set[int], set[int]]:
    """The host and network numbers of ``plan`` that namespaces, links and bridges on this
    machine hold, whichever state directory made them: a number is taken again only when nothing
    has it."""
    names = set(link_aliases())
    with contextlib.suppress(OSError):
        names |= {entry.name for entry in NETNS_DIR.iterdir()}
    hosts_, networks = set(), set()
    for name in names:
        host, network = plan.numbers(name)
        if host is not None:
            hosts_.add(host)
        if network is not None:
            networks.add(network)
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


def ensure_public_bridge(plan: AddressPlan = LAB) -> None:
    """The public bridge with the launcher's address (on the bridge, or on the launcher's own
    veth onto it), and the private range unreachable from the root namespace; made once, left as
    it is when it exists."""
    present = links()
    if plan.public_bridge not in present:
        _ip("link", "add", plan.public_bridge, "type", "bridge")
    holder = plan.launcher_veth or plan.public_bridge
    if plan.launcher_veth is not None:
        peer = f"{plan.launcher_veth}x"
        if plan.launcher_veth not in present:
            _ip("link", "add", plan.launcher_veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "master", plan.public_bridge)
        _ip("link", "set", peer, "up")
    _ip("addr", "replace", f"{plan.launcher_address}/24", "dev", holder)
    _ip("link", "set", holder, "up")
    _ip("link", "set", plan.public_bridge, "up")
    # Without this the default route would send private-network packets off the machine; with it
    # the launcher gets "no route to host" at once, as a laptop outside a VPC does.
    if plan.has_private:
        _ip("route", "replace", "unreachable", plan.private_network)


def remove_public_bridge(plan: AddressPlan = LAB) -> None:
    """Remove the public bridge (and the launcher's veth) and the private range's route, once no
    host or network of the plan is left on this machine (of any state directory)."""
    if any(numbers_in_use(plan)):
        return
    if plan.has_private:
        _ip("route", "delete", "unreachable", plan.private_network, check=False)
    if plan.launcher_veth is not None:
        _ip("link", "delete", plan.launcher_veth, check=False)
    _ip("link", "delete", plan.public_bridge, check=False)


def make_network(network: int, plan: AddressPlan = LAB) -> str:
    """A fresh private bridge for network ``network`` (an old one of that number is replaced);
    returns its name."""
    bridge = plan.bridge(network)
    _ip("link", "delete", bridge, check=False)
    _ip("link", "add", bridge, "type", "bridge")
    _ip("link", "set", bridge, "up")
    return bridge


def bridge_ports(network: int, plan: AddressPlan = LAB) -> list[str]:
    """The links attached to network ``network``'s bridge (none when it does not exist)."""
    listed = _ip("-j", "link", "show", "master", plan.bridge(network), check=False)
    if listed.returncode != 0:
        return []
    try:
        return [str(link["ifname"]) for link in json.loads(listed.stdout or "[]")]
    except (ValueError, KeyError, TypeError) as err:
        raise LaunchError(f"lab: cannot read {plan.bridge(network)}'s ports ({err}).") from err


def remove_network(network: int, plan: AddressPlan = LAB) -> list[str]:
    """Remove network ``network``'s bridge, unless links are still attached to it (a host that
    lives on it, whatever the records say): then it is kept and those links are returned."""
    ports = bridge_ports(network, plan)
    if not ports:
        _ip("link", "delete", plan.bridge(network), check=False)
    return ports


def set_link(name: str, up: bool) -> None:
    """Take a link of the root namespace down (its packets vanish, as over a cut cable) or up."""
    _ip("link", "set", name, "up" if up else "down")


def neighbours_flush(*selector: str) -> None:
    """Drop the root namespace's ARP entries that ``selector`` names (``dev NAME``, ``to
    ADDRESS``): what was learned, or failed to be, over a link that was down.

    Whatever tried to reach the hosts while the link was down left ARP resolutions that are
    failing (INCOMPLETE, FAILED). A connection made just after the repair would wait on such a
    resolution's last unanswered probe and fail with "no route to host" up to 3 s later (seen
    on CI: the test after a cut-link test failed its pre-flight). Flushed, the next packet
    starts a fresh resolution over the working link."""
    _ip("neigh", "flush", *selector)


# ---- hosts ---------------------------------------------------------------------------------


def make_host(host: NamespaceHost, authorized_keys: str, rate: str | None = None) -> int:
    """Build the host from scratch (removing what an earlier try left under its number), start
    its sshd and wait until it greets on the public address; returns sshd's pid. The public
    bridge and the host's network bridge must exist."""
    make_namespace(host, rate)
    host.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    keygen(host.host_key)
    host.authorized_keys.write_text(authorized_keys)
    host.authorized_keys.chmod(0o600)
    return start_sshd(host)


def _links(host: NamespaceHost) -> list[tuple[str, str, str, str]]:
    """The host's links: (root namespace's end, name inside, bridge, address)."""
    plan = host.plan
    links_ = [(host.public_veth, "eth0", plan.public_bridge, host.public_address)]
    if plan.has_private:
        links_.append((host.private_veth, "eth1", plan.bridge(host.network), host.private_address))
    return links_


def make_namespace(host: NamespaceHost, rate: str | None = None) -> None:
    """Build the host's namespace and links from scratch (removing what an earlier try left
    under its number), without a server in it: a host whose daemons its user starts (the Slurm
    test cluster's slurmd). The public bridge and the host's network bridge must exist."""
    remove_host(dataclasses.replace(host, owner=""))
    ns = host.namespace
    _ip("netns", "add", ns)
    _in(ns, "ip", "link", "set", "lo", "up")
    for root_side, inner, bridge, address in _links(host):
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
    ends = {end for root_side, *_ in _links(host) for end in (root_side, f"{root_side}x")}
    deadline = time.monotonic() + wait
    while (left := ends & links()) and time.monotonic() < deadline:
        for link in left:
            _ip("link", "delete", link, check=False)
        time.sleep(0.1)
    if NETNS_DIR.joinpath(host.namespace).exists():  # a mount point 'ip netns delete' left
        with contextlib.suppress(OSError):
            NETNS_DIR.joinpath(host.namespace).unlink()


def keygen(path: Path) -> None:
    """A new ed25519 key pair without a passphrase at ``path`` (and ``path``.pub)."""
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
        *([f"ListenAddress {host.private_address}"] if host.plan.has_private else []),
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


def start_sshd(host: NamespaceHost, wrapper: Sequence[str] = ()) -> int:
    """Start (or restart) the host's sshd in its namespace, through ``wrapper`` (a command that
    runs the command line appended to it); wait until it greets; its pid. Sessions of an earlier
    sshd keep running."""
    stop_sshd(host)
    host.sshd_config.write_text(_sshd_config(host))
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    _in(host.namespace, *wrapper, SSHD, "-f", str(host.sshd_config), "-E", str(host.sshd_log))
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


def stop_sshd(host: NamespaceHost) -> None:
    """End the host's listening sshd (the one its pid file names, if it runs in the host's
    namespace); the sessions it started keep running."""
    try:
        pid = int(host.pid_file.read_text().strip())
    except (OSError, ValueError):
        pid = None
    if pid is not None and pid in namespace_pids(host.namespace):
        kill_all([pid])
    host.pid_file.unlink(missing_ok=True)


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
