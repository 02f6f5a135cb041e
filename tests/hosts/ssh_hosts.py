"""SSH test hosts: network namespaces with a real OpenSSH server each, as EC2 instances in a VPC.

Every host ``tfl-ssh-hostN`` (N = 1, 2, ...) has two interfaces:

* ``eth0`` on the "public" bridge ``tfl-ssh-pub`` (198.18.1.0/24, host N at 198.18.1.(10+N)), which the
  launcher reaches from the root namespace at 198.18.1.1 through its own veth pair
  (``tfl-ssh-l0`` in the root namespace, ``tfl-ssh-l1`` on the bridge), so that one test can cut
  exactly the launcher's link (:func:`cut_launcher_link`);
* ``eth1`` on the "private" bridge ``tfl-ssh-priv`` (198.18.2.0/24, host N at 198.18.2.(10+N)), which
  has no address in the root namespace, and the root namespace holds an ``unreachable`` route for
  198.18.2.0/24: the launcher has no route to it, as a laptop has none into a VPC.

Each host runs ``/usr/sbin/sshd`` inside its namespace, listening on port 22 of both addresses,
with its own generated host key, root login by key only, ``AuthorizedKeysFile`` and ``PidFile`` in
the state directory, ``StrictModes no`` and ``UsePAM no``. The hosts share the machine's file
system, so the project's Python environment is present on each.

Set-up is idempotent (it first removes what an interrupted run left) and :func:`teardown` removes
everything: sshd processes, namespaces, veths, bridges and the state directory.

**Shaped links.** ``setup(count, rate="1gbit")`` (or :func:`shape` on running hosts) gives every
host's private link the speed of a NIC of that rate, in both directions: a ``tbf`` qdisc on the
host's ``eth1`` (what it sends) and one on its root-side veth ``tfl-svN`` (what the bridge delivers
to it), so all its traffic to all peers shares R each way, as on a real full-duplex NIC. Both veth
ends also get ``gso_max_size``/``gro_max_size`` of 64 KiB, so that no super-packet larger than
tbf's bucket reaches it (a larger one is dropped or segmented, and loses throughput, not accuracy).
The public links (launcher, SSH) stay unshaped. :func:`unshape` removes the qdiscs; tear-down
removes them with the links.

CLI: ``python tests/hosts/ssh_hosts.py up [N] [--rate RATE]`` / ``shape RATE`` / ``unshape`` /
``down`` / ``status``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

if not __package__:  # run as a script (python tests/hosts/ssh_hosts.py): from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.hosts import hostlock  # noqa: E402
from tflaunch.launchers.clouds.lab import hosts as lab_hosts  # noqa: E402

STATE_DIR = Path(os.environ.get("TFL_SSH_STATE_DIR", "/tmp/tfl-ssh-hosts"))
LOCK_FILE = Path("/tmp/tfl-ssh-hosts.lock")
NS_PREFIX = "tfl-ssh-host"
PUBLIC_BRIDGE = "tfl-ssh-pub"
PRIVATE_BRIDGE = "tfl-ssh-priv"
LAUNCHER_VETH = "tfl-ssh-l0"  # root namespace side, holds 198.18.1.1
LAUNCHER_PEER = "tfl-ssh-l1"  # enslaved to the public bridge
LAUNCHER_ADDRESS = "198.18.1.1"
PRIVATE_NETWORK = "198.18.2.0/24"
MAX_HOSTS = 64  # addresses .11 to .74 of each /24 (host N at .10+N: hosts 1-9 at .11-.19)
SSHD = "/usr/sbin/sshd"
# Shaping is the lab cloud's (tflaunch.launchers.clouds.lab.hosts): the same tbf at both ends
RATE_UNITS = lab_hosts.RATE_UNITS
parse_rate = lab_hosts.parse_rate
shaped_rates = lab_hosts.shaped_rates
SFTP_SERVER = "/usr/lib/openssh/sftp-server"


@dataclasses.dataclass(frozen=True)
class TestHost:
    """One test host: its namespace and its two addresses."""

    index: int

    @property
    def name(self) -> str:
        return f"host{self.index}"

    @property
    def namespace(self) -> str:
        return f"{NS_PREFIX}{self.index}"

    @property
    def public_address(self) -> str:
        return f"198.18.1.{10 + self.index}"

    @property
    def private_address(self) -> str:
        return f"198.18.2.{10 + self.index}"

    @property
    def private_veth(self) -> str:
        """The root namespace's end of the host's private link."""
        return f"tfl-sv{self.index}"

    @property
    def host_key(self) -> Path:
        return STATE_DIR / f"host{self.index}_ed25519_key"

    @property
    def pid_file(self) -> Path:
        return STATE_DIR / f"sshd-host{self.index}.pid"

    @property
    def sshd_config(self) -> Path:
        return STATE_DIR / f"sshd-host{self.index}.conf"

    @property
    def sshd_log(self) -> Path:
        return STATE_DIR / f"sshd-host{self.index}.log"


@dataclasses.dataclass(frozen=True)
class TestHosts:
    """The running set of test hosts and the client credentials that reach them."""

    hosts: tuple[TestHost, ...]
    state_dir: Path
    client_key: Path
    known_hosts: Path  # a known_hosts file holding every host's public address and key

    def host(self, index: int) -> TestHost:
        return self.hosts[index - 1]


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=60)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *args], check=check)


def _ns(namespace: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", "netns", "exec", namespace, *argv], check=check)


def missing_requirements() -> str | None:
    """Why test hosts cannot be built here (not root, no sshd, no ip), or None if they can."""
    if os.geteuid() != 0:
        return "SSH test hosts need root (network namespaces)"
    for tool in (SSHD, "/usr/bin/ssh-keygen"):
        if not os.path.exists(tool):
            return f"SSH test hosts need {tool} (apt-get install openssh-server openssh-client)"
    if shutil.which("ip") is None:
        return "SSH test hosts need the ip tool (apt-get install iproute2)"
    return None


def _existing_namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if re.fullmatch(rf"{NS_PREFIX}\d+", n)]


def _kill_pid_file(pid_file: Path) -> None:
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return
    _kill_and_wait(pid)


def _kill_and_wait(pid: int, grace: float = 3.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def teardown() -> None:
    """Remove every test host, bridge and veth, and the state directory; safe to call anytime."""
    if STATE_DIR.is_dir():
        for pid_file in STATE_DIR.glob("sshd-host*.pid"):
            _kill_pid_file(pid_file)
    for namespace in _existing_namespaces():
        # Anything still running in the namespace (sshd children, stray tasks) goes with it.
        lab_hosts.kill_all(lab_hosts.namespace_pids(namespace))
        _ip("netns", "delete", namespace, check=False)
    _ip("route", "delete", "unreachable", PRIVATE_NETWORK, check=False)
    for link in (LAUNCHER_VETH, PUBLIC_BRIDGE, PRIVATE_BRIDGE):
        _ip("link", "delete", link, check=False)
    # Deleting a namespace destroys its veths asynchronously: wait until they are gone, so that
    # a set-up right after does not meet a half-deleted link of the same name.
    deadline = time.monotonic() + 10
    while (leftovers := _leftover_links()) and time.monotonic() < deadline:
        for link in leftovers:
            _ip("link", "delete", link, check=False)
        time.sleep(0.1)
    shutil.rmtree(STATE_DIR, ignore_errors=True)


def _leftover_links() -> list[str]:
    out = _ip("-o", "link", "show", check=False).stdout
    names = (LAUNCHER_VETH, LAUNCHER_PEER, PUBLIC_BRIDGE, PRIVATE_BRIDGE)
    found = re.findall(r"^\d+: ([\w.-]+)[@:]", out, flags=re.M)
    return [n for n in found if n in names or re.fullmatch(r"tfl-s[pv]\d+", n)]


def _keygen(path: Path) -> None:
    path.unlink(missing_ok=True)
    Path(f"{path}.pub").unlink(missing_ok=True)
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)])


def _make_bridges() -> None:
    for bridge in (PUBLIC_BRIDGE, PRIVATE_BRIDGE):
        _ip("link", "add", bridge, "type", "bridge")
        _ip("link", "set", bridge, "up")
    _ip("link", "add", LAUNCHER_VETH, "type", "veth", "peer", "name", LAUNCHER_PEER)
    _ip("link", "set", LAUNCHER_PEER, "master", PUBLIC_BRIDGE)
    _ip("link", "set", LAUNCHER_PEER, "up")
    _ip("addr", "add", f"{LAUNCHER_ADDRESS}/24", "dev", LAUNCHER_VETH)
    _ip("link", "set", LAUNCHER_VETH, "up")
    # Without this the default route would send private-network packets off the machine; with it
    # the launcher gets "no route to host" at once, as a laptop outside a VPC does.
    _ip("route", "replace", "unreachable", PRIVATE_NETWORK)


def _make_namespace(host: TestHost) -> None:
    ns = host.namespace
    _ip("netns", "add", ns)
    _ns(ns, "ip", "link", "set", "lo", "up")
    for root_side, inner, bridge, address in (
        (f"tfl-sp{host.index}", "eth0", PUBLIC_BRIDGE, host.public_address),
        (host.private_veth, "eth1", PRIVATE_BRIDGE, host.private_address),
    ):
        _ip("link", "add", root_side, "type", "veth", "peer", "name", f"{root_side}x")
        _ip("link", "set", f"{root_side}x", "netns", ns)
        _ns(ns, "ip", "link", "set", f"{root_side}x", "name", inner)
        _ns(ns, "ip", "addr", "add", f"{address}/24", "dev", inner)
        _ns(ns, "ip", "link", "set", inner, "up")
        _ip("link", "set", root_side, "master", bridge)
        _ip("link", "set", root_side, "up")


def write_sshd_config(host: TestHost, authorized_keys: Path) -> None:
    """The sshd configuration of one test host (both addresses, key-only root login)."""
    host.sshd_config.write_text(
        "\n".join(
            [
                "Port 22",
                f"ListenAddress {host.public_address}",
                f"ListenAddress {host.private_address}",
                f"HostKey {host.host_key}",
                f"AuthorizedKeysFile {authorized_keys}",
                f"PidFile {host.pid_file}",
                "StrictModes no",
                "UsePAM no",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "MaxStartups 200",
                "MaxSessions 50",
                "LogLevel ERROR",
                f"Subsystem sftp {SFTP_SERVER}",
                "",
            ]
        )
    )


def start_sshd(host: TestHost, hide_paths: tuple[str, ...] = ()) -> None:
    """Start (or restart) the host's sshd; wait until it accepts TCP on the public address.

    ``hide_paths`` vanish for this sshd and everything it starts: in a private mount namespace,
    each parent directory is overlaid with a layer of whiteouts for them (overlayfs), so on this
    host they do not exist at all. The honest way to make one host lack a package (its Python has
    no TensorFlow: ``import tensorflow`` raises ModuleNotFoundError) while hosts share one file
    system.
    """
    _kill_pid_file(host.pid_file)
    host.pid_file.unlink(missing_ok=True)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    sshd = [SSHD, "-f", str(host.sshd_config), "-E", str(host.sshd_log)]
    mounts = []
    for parent, names in _group_by_parent(hide_paths).items():
        whiteouts = Path(tempfile.mkdtemp(prefix=f"whiteouts-{host.name}-", dir=STATE_DIR))
        for name in names:
            os.mknod(whiteouts / name, 0o600 | stat.S_IFCHR, os.makedev(0, 0))
        options = f"lowerdir={whiteouts}:{parent}"
        mounts.append(f"mount -t overlay overlay -o {shlex.quote(options)} {shlex.quote(parent)}")
    if mounts:
        # Test-host plumbing of fixed paths (not user values), run in its own mount namespace.
        script = " && ".join([*mounts, "exec " + shlex.join(sshd)])
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    else:
        argv = sshd
    _ns(host.namespace, *argv)
    _wait_for_port(host, 22)


def _group_by_parent(paths: tuple[str, ...]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for path in paths:
        parent, name = os.path.split(os.path.normpath(path))
        grouped.setdefault(parent, []).append(name)
    return grouped


def _wait_for_port(host: TestHost, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host.public_address, port), timeout=1.0):
                return
        except OSError as exc:
            if time.monotonic() > deadline:
                log = host.sshd_log.read_text() if host.sshd_log.exists() else ""
                raise RuntimeError(f"sshd of {host.namespace} not reachable: {exc}\n{log}") from exc
            time.sleep(0.05)


def write_known_hosts(hosts: tuple[TestHost, ...], path: Path) -> None:
    """A known_hosts file with every host's key under its public and private address."""
    lines = []
    for host in hosts:
        key = Path(f"{host.host_key}.pub").read_text().split()
        for address in (host.public_address, host.private_address):
            lines.append(f"{address} {key[0]} {key[1]}")
    path.write_text("\n".join(lines) + "\n")


def shape(hosts: TestHosts | tuple[TestHost, ...], rate: str) -> int:
    """Limit every host's private link to ``rate`` each way (tbf at both ends); returns the rate
    in bits/s. Replaces any earlier shaping, so hosts can be re-shaped between measurements."""
    bits = parse_rate(rate)
    for host in hosts.hosts if isinstance(hosts, TestHosts) else hosts:
        lab_hosts.shape(host, rate)
    return bits


def unshape(hosts: TestHosts | tuple[TestHost, ...]) -> None:
    """Remove the shaping of every host's private link (no error where there is none)."""
    for host in hosts.hosts if isinstance(hosts, TestHosts) else hosts:
        lab_hosts.unshape(host)


def setup(count: int = 3, rate: str | None = None) -> TestHosts:
    """Build ``count`` test hosts from scratch (removing leftovers first) and start their sshd;
    with ``rate`` (``1gbit``), their private links are shaped to it (:func:`shape`)."""
    if not 1 <= count <= MAX_HOSTS:
        raise ValueError(f"between 1 and {MAX_HOSTS} test hosts, not {count}")
    if rate is not None:
        parse_rate(rate)  # a bad rate fails before anything is built
    teardown()
    STATE_DIR.mkdir(parents=True)
    client_key = STATE_DIR / "client_ed25519"
    _keygen(client_key)
    authorized_keys = STATE_DIR / "authorized_keys"
    shutil.copy(f"{client_key}.pub", authorized_keys)
    hosts = tuple(TestHost(i) for i in range(1, count + 1))
    _make_bridges()
    for host in hosts:
        _keygen(host.host_key)
        _make_namespace(host)
        write_sshd_config(host, authorized_keys)
        start_sshd(host)
    known_hosts = STATE_DIR / "known_hosts"
    write_known_hosts(hosts, known_hosts)
    if rate is not None:
        shape(hosts, rate)
    return TestHosts(hosts, STATE_DIR, client_key, known_hosts)


def current() -> TestHosts | None:
    """The test hosts left running by ``up`` (for the benchmark and manual runs), if any."""
    indices = sorted(int(n[len(NS_PREFIX) :]) for n in _existing_namespaces())
    client_key = STATE_DIR / "client_ed25519"
    if not indices or not client_key.exists():
        return None
    hosts = tuple(TestHost(i) for i in indices)
    return TestHosts(hosts, STATE_DIR, client_key, STATE_DIR / "known_hosts")


def regenerate_host_key(host: TestHost) -> None:
    """Give a host a new host key and restart its sshd: what a re-created VM looks like."""
    _keygen(host.host_key)
    start_sshd(host)


def cut_launcher_link() -> None:
    """Take the launcher's link to the public bridge down: packets to and from it vanish."""
    _ip("link", "set", LAUNCHER_PEER, "down")


def restore_launcher_link() -> None:
    """Bring the launcher's link to the public bridge back up."""
    _ip("link", "set", LAUNCHER_PEER, "up")


def cut_host_link(host: TestHost) -> None:
    """Take one host's link to the public bridge down: the launcher loses that host, while the
    hosts still reach each other on the private bridge (a host behind a failed route)."""
    _ip("link", "set", f"tfl-sp{host.index}", "down")


def restore_host_link(host: TestHost) -> None:
    """Bring one host's public link back up."""
    _ip("link", "set", f"tfl-sp{host.index}", "up")


def processes_in(host: TestHost, exclude_sshd: bool = True) -> list[str]:
    """Command lines of the processes running in a host's namespace (sshd itself left out)."""
    found = []
    for pid in lab_hosts.namespace_pids(host.namespace):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if exclude_sshd and cmdline.startswith(("sshd:", SSHD)):
            continue
        found.append(f"{pid} {cmdline.strip()}")
    return found


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="ssh_hosts.py", description="SSH test hosts.")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="build N hosts (removing any first)")
    up.add_argument("count", nargs="?", type=int, default=3)
    up.add_argument("--rate", help="shape each host's private link, e.g. 1gbit, 500mbit")
    commands.add_parser("shape", help="(re)shape running hosts").add_argument("rate")
    commands.add_parser("unshape", help="remove the shaping of running hosts")
    commands.add_parser("down", help="remove every host")
    commands.add_parser("status", help="list the hosts and their links' rates")
    args = parser.parse_args(argv)
    try:
        if args.command in ("up", "shape") and args.rate is not None:
            parse_rate(args.rate)
    except ValueError as exc:
        parser.error(str(exc))  # exit 2 with the usage line
    if args.command == "down":
        with exclusive():  # never under a test session or benchmark that is using them
            teardown()
        return 0
    if args.command == "up":
        problem = missing_requirements()
        if problem:
            print(problem, file=sys.stderr)
            return 2
        with exclusive():
            hosts = setup(args.count, rate=args.rate)
        for host in hosts.hosts:
            print(f"{host.namespace} public {host.public_address} private {host.private_address}")
        print(f"client key {hosts.client_key}\nknown_hosts {hosts.known_hosts}")
        if args.rate:
            print(f"private links shaped to {args.rate} each way")
        return 0
    hosts = current()
    if hosts is None:
        print("no SSH test hosts", file=sys.stderr)
        return 1
    if args.command == "shape":
        with exclusive():
            shape(hosts, args.rate)
    elif args.command == "unshape":
        with exclusive():
            unshape(hosts)
    for host in hosts.hosts:
        rates = set(shaped_rates(host).values())
        link = (
            "unshaped"
            if rates == {None}
            else "/".join(_rate_text(r) for r in sorted(rates, key=str))
        )
        print(f"{host.namespace} {host.public_address} {host.private_address} {link}")
    return 0


def _rate_text(bits: int | None) -> str:
    if bits is None:
        return "unshaped"
    for unit in ("gbit", "mbit", "kbit"):
        if bits >= RATE_UNITS[unit]:
            return f"{bits / RATE_UNITS[unit]:g}{unit}"
    return f"{bits}bit"


@contextlib.contextmanager
def exclusive(timeout: float = 1800.0) -> Iterator[None]:
    """Hold the test hosts for this process: other test sessions or benchmarks on the machine
    wait here instead of tearing down hosts that are in use."""
    with hostlock.exclusive(LOCK_FILE, "the SSH test hosts", timeout):
        yield


@contextlib.contextmanager
def session(count: int, timeout: float = 1800.0) -> Iterator[TestHosts]:
    """``count`` test hosts for a test session or a benchmark: the hosts' lock held throughout
    (no other session tears them down meanwhile), set up on entry and torn down on exit,
    however it exits."""
    with exclusive(timeout):
        hosts = setup(count)
        try:
            yield hosts
        finally:
            teardown()


_session_hosts: list[TestHosts] = []


@pytest.fixture(scope="session")
def ssh_test_hosts() -> Iterator[TestHosts]:
    """Three test hosts for the whole test session, removed after it (skips without root).

    Test modules each import this fixture; the first to run builds the hosts (holding the lock)
    and the others share them."""
    from tests.conftest import skip_or_fail

    if _session_hosts:
        yield _session_hosts[0]
        return
    problem = missing_requirements()
    if problem:
        skip_or_fail(problem)
    with session(3) as hosts:
        _session_hosts.append(hosts)
        try:
            yield hosts
        finally:
            _session_hosts.clear()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
