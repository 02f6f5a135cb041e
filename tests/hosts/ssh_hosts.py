"""SSH test hosts: network namespaces with a real OpenSSH server each, as EC2 instances in a VPC.

They are the lab cloud's namespace hosts (:mod:`tflaunch.launchers.clouds.lab.hosts` builds and
removes them, sshd included) under an address plan of their own. Hosts come in sets, one per
pytest-xdist worker: set S (the worker ``gwS``, or 0 without xdist; a benchmark takes the first
free set) has its own names, addresses, state directory and lock, so two workers' sets live side
by side and neither tears down the other's. Host N of set S is the namespace ``tfl-tS-hostN``:

* ``eth0`` on the "public" bridge ``tfl-tS-pub`` at 198.18.(16+2S).(9+N) (set 0: 198.18.16.10 and
  up), which the launcher reaches from the root namespace at 198.18.(16+2S).1 through a veth of
  its own (``tfl-tS-l``; its end on the bridge ``tfl-tS-lx``), so that a test can cut exactly
  the launcher's link (:func:`cut_launcher_link`);
* ``eth1`` on the "private" bridge ``tfl-tS-n1`` at 198.18.(17+2S).(9+N), which has no address in
  the root namespace, and the root namespace holds an ``unreachable`` route for that /24: the
  launcher has no route to it, as a laptop has none into a VPC.

The root-side ends of the host's links are ``tfl-tSpN`` and ``tfl-tSvN``. None of these names or
addresses is the lab cloud's (198.19.x), the Slurm cluster's (198.18.0.x) or another set's. Each
host runs sshd inside its namespace on port 22 of both addresses (root login by key only, its
host key and files under the set's state directory). The hosts share the machine's file system,
so the project's Python environment is present on each.

Set-up is idempotent (it first removes whatever of its set an interrupted run left) and
:func:`teardown` removes the set: sshd and every process in its namespaces, the namespaces, veths,
bridges, route and state directory; nothing of another set.

**Shaped links.** ``setup(count, rate="1gbit")`` (or :func:`shape` on running hosts) gives every
host's private link the speed of a NIC of that rate, in both directions, as the lab cloud's
``rate`` does: a ``tbf`` qdisc on the host's ``eth1`` (what it sends) and one on its root-side
veth ``tfl-tSvN`` (what the bridge delivers to it), so all its traffic to all peers shares R each
way, as on a real full-duplex NIC, with ``gso_max_size``/``gro_max_size`` of 64 KiB on both ends
so that no super-packet larger than tbf's bucket reaches it. The public links stay unshaped.

CLI: ``python tests/hosts/ssh_hosts.py [--set S] up [N] [--rate RATE]`` / ``shape RATE`` /
``unshape`` / ``down`` / ``status``. Hosts it leaves up hold no lock: the next test session or
benchmark sweeps them away with what killed sessions left (:func:`sweep`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if not __package__:  # run as a script (python tests/hosts/ssh_hosts.py): from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.hosts import hostlock  # noqa: E402
from tflaunch.launchers.clouds.lab import hosts as lab_hosts  # noqa: E402

STATE_ROOT = os.environ.get("TFL_SSH_STATE_DIR", "/tmp/tfl-ssh-hosts")  # set S: STATE_ROOT-S
SETS = 100  # set S holds 198.18.(16+2S) and 198.18.(17+2S): 198.18.16-215.x in all
FREE_SETS = 8  # where a session looks for a free set when its own is busy
MAX_HOSTS = 64
NETWORK = 1  # the one private network of a set
# Shaping is the lab cloud's: the same tbf at both ends
RATE_UNITS = lab_hosts.RATE_UNITS
parse_rate = lab_hosts.parse_rate
shaped_rates = lab_hosts.shaped_rates


def plan_of(index: int) -> lab_hosts.AddressPlan:
    """The names and addresses of test-host set ``index``."""
    if not 0 <= index < SETS:
        raise ValueError(f"a test-host set is 0 to {SETS - 1}, not {index}")
    return lab_hosts.AddressPlan(
        namespace=f"tfl-t{index}-host{{n}}",
        public_veth=f"tfl-t{index}p{{n}}",
        private_veth=f"tfl-t{index}v{{n}}",
        public_bridge=f"tfl-t{index}-pub",
        private_bridge=f"tfl-t{index}-n{{k}}",
        public_net=f"198.18.{16 + 2 * index}",
        private_net=f"198.18.{17 + 2 * index}",
        launcher_veth=f"tfl-t{index}-l",
    )


def state_dir(index: int) -> Path:
    return Path(f"{STATE_ROOT}-{index}")


def lock_file(index: int) -> Path:
    return Path(f"/tmp/tfl-ssh-hosts-{index}.lock")


def worker_set() -> int:
    """This process's set: the pytest-xdist worker's number (gw1 -> 1), or 0."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    number = worker.removeprefix("gw")
    return int(number) % SETS if number.isdigit() else 0


class TestHost(lab_hosts.NamespaceHost):
    """One test host: a lab namespace host of its set's plan, called ``hostN``."""

    @property
    def name(self) -> str:
        return f"host{self.index}"


@dataclasses.dataclass(frozen=True)
class TestHosts:
    """The running set of test hosts and the client credentials that reach them."""

    hosts: tuple[TestHost, ...]
    state_dir: Path
    client_key: Path
    known_hosts: Path  # a known_hosts file holding every host's public address and key
    index: int = 0  # the set

    @property
    def plan(self) -> lab_hosts.AddressPlan:
        return plan_of(self.index)

    @property
    def launcher_address(self) -> str:
        """The launcher's address on the public bridge."""
        return self.plan.launcher_address

    @property
    def ghost(self) -> TestHost:
        """A host of the set's plan that is never built: nobody answers at its addresses."""
        return _host(self.index, len(self.hosts) + 1)

    def host(self, index: int) -> TestHost:
        return self.hosts[index - 1]

    def cluster_hosts(self, count: int | None = None) -> list[dict[str, str]]:
        """A cluster file's ``hosts:`` for the first ``count`` hosts (all by default): each by
        name, reached at its public address, its tasks at its private one."""
        return [
            {"name": h.name, "connect": h.public_address, "address": h.private_address}
            for h in self.hosts[:count]
        ]

    def ssh_section(
        self, python: str, remote_runs_dir: Path, known_hosts: Path | None = None, **more: Any
    ) -> dict[str, Any]:
        """A cluster file's ``ssh:`` reaching these hosts as root with the client key, trusting
        ``known_hosts`` (default: the set's own file); ``more``: the section's other keys."""
        return {
            "user": "root",
            "identity_file": str(self.client_key),
            "known_hosts": str(known_hosts or self.known_hosts),
            "python": python,
            "remote_runs_dir": str(remote_runs_dir),
            **more,
        }


def _host(index: int, number: int) -> TestHost:
    return TestHost(number, NETWORK, state_dir(index) / f"host{number}", plan=plan_of(index))


def missing_requirements() -> str | None:
    """Why test hosts cannot be built here (not root, no sshd, no ip), or None if they can."""
    if os.geteuid() != 0:
        return "SSH test hosts need root (network namespaces)"
    for tool in (lab_hosts.SSHD, "/usr/bin/ssh-keygen"):
        if not os.path.exists(tool):
            return f"SSH test hosts need {tool} (apt-get install openssh-server openssh-client)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"SSH test hosts need the {tool} tool (apt-get install iproute2)"
    return None


def teardown(index: int = 0) -> None:
    """Remove every host, bridge and veth of set ``index`` and its state directory; safe to
    call anytime. Other sets are left alone."""
    plan = plan_of(index)
    numbers, networks = lab_hosts.numbers_in_use(plan)
    found = [_host(index, n) for n in sorted(numbers)]
    # Everything still running in the namespaces (sshd, sessions, stray tasks) goes at once.
    lab_hosts.kill_all([pid for h in found for pid in lab_hosts.namespace_pids(h.namespace)])
    for host in found:
        lab_hosts.remove_host(host)
    for network in networks:
        lab_hosts.remove_network(network, plan)
    lab_hosts.remove_public_bridge(plan)
    shutil.rmtree(state_dir(index), ignore_errors=True)


def write_known_hosts(hosts: tuple[TestHost, ...], path: Path) -> None:
    """A known_hosts file with every host's key under its public and private address."""
    lines = []
    for host in hosts:
        key = lab_hosts.host_public_key(host)
        lines += [f"{address} {key}" for address in (host.public_address, host.private_address)]
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


def setup(count: int = 3, index: int = 0, rate: str | None = None) -> TestHosts:
    """Build ``count`` hosts of set ``index`` from scratch (removing its leftovers first) and
    start their sshd; with ``rate`` (``1gbit``), their private links are shaped to it."""
    if not 1 <= count <= MAX_HOSTS:
        raise ValueError(f"between 1 and {MAX_HOSTS} test hosts, not {count}")
    if rate is not None:
        parse_rate(rate)  # a bad rate fails before anything is built
    teardown(index)
    root = state_dir(index)
    root.mkdir(mode=0o700, parents=True)
    client_key = root / "client_ed25519"
    lab_hosts.keygen(client_key)
    authorized = Path(f"{client_key}.pub").read_text()
    plan = plan_of(index)
    lab_hosts.ensure_public_bridge(plan)
    lab_hosts.make_network(NETWORK, plan)
    hosts = tuple(_host(index, n) for n in range(1, count + 1))
    for host in hosts:
        lab_hosts.make_host(host, authorized, rate)
    known_hosts = root / "known_hosts"
    write_known_hosts(hosts, known_hosts)
    return TestHosts(hosts, root, client_key, known_hosts, index)


def current(index: int = 0) -> TestHosts | None:
    """The hosts of set ``index`` left running by ``up`` (for benchmarks and manual runs)."""
    numbers = sorted(lab_hosts.numbers_in_use(plan_of(index))[0])
    client_key = state_dir(index) / "client_ed25519"
    if not numbers or not client_key.exists():
        return None
    hosts = tuple(_host(index, n) for n in numbers)
    return TestHosts(hosts, state_dir(index), client_key, state_dir(index) / "known_hosts", index)


def start_sshd(host: TestHost, hide_paths: tuple[str, ...] = ()) -> None:
    """Start (or restart) the host's sshd; wait until it greets.

    ``hide_paths`` vanish for this sshd and everything it starts: in a private mount namespace,
    each parent directory is overlaid with a layer of whiteouts for them (overlayfs), so on this
    host they do not exist at all. The honest way to make one host lack a package (its Python has
    no TensorFlow: ``import tensorflow`` raises ModuleNotFoundError) while hosts share one file
    system.
    """
    by_parent: dict[str, list[str]] = {}
    for path in hide_paths:
        parent, name = os.path.split(os.path.normpath(path))
        by_parent.setdefault(parent, []).append(name)
    mounts = []
    for parent, names in by_parent.items():
        whiteouts = Path(tempfile.mkdtemp(prefix="whiteouts-", dir=host.folder))
        for name in names:
            os.mknod(whiteouts / name, 0o600 | stat.S_IFCHR, os.makedev(0, 0))
        options = f"lowerdir={whiteouts}:{parent}"
        mounts.append(f"mount -t overlay overlay -o {shlex.quote(options)} {shlex.quote(parent)}")
    # Fixed paths of ours, not user values; sshd's command line follows as "$@".
    script = " && ".join([*mounts, 'exec "$@"'])
    private = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
    lab_hosts.start_sshd(host, private if mounts else ())


def regenerate_host_key(host: TestHost) -> None:
    """Give a host a new host key and restart its sshd: what a re-created VM looks like."""
    lab_hosts.keygen(host.host_key)
    lab_hosts.start_sshd(host)


def cut_launcher_link(hosts: TestHosts) -> None:
    """Take the launcher's link to the public bridge down: packets to and from it vanish."""
    lab_hosts.set_link(f"{hosts.plan.launcher_veth}x", up=False)


def restore_launcher_link(hosts: TestHosts) -> None:
    """Bring the launcher's link to the public bridge back up, as a repaired cable: nothing
    learned while it was cut outlives it (:func:`lab_hosts.neighbours_flush` says why)."""
    lab_hosts.set_link(f"{hosts.plan.launcher_veth}x", up=True)
    lab_hosts.neighbours_flush("dev", hosts.plan.launcher_veth)


def cut_host_link(host: TestHost) -> None:
    """Take one host's link to the public bridge down: the launcher loses that host, while the
    hosts still reach each other on the private bridge (a host behind a failed route)."""
    lab_hosts.set_link(host.public_veth, up=False)


def restore_host_link(host: TestHost) -> None:
    """Bring one host's public link back up (and forget what was learned while it was down)."""
    lab_hosts.set_link(host.public_veth, up=True)
    lab_hosts.neighbours_flush("to", host.public_address)


def processes_in(host: TestHost, exclude_sshd: bool = True) -> list[str]:
    """Command lines of the processes running in a host's namespace (sshd itself left out)."""
    found = []
    for pid in lab_hosts.namespace_pids(host.namespace):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if exclude_sshd and cmdline.startswith(("sshd:", lab_hosts.SSHD)):
            continue
        found.append(f"{pid} {cmdline.strip()}")
    return found


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="ssh_hosts.py", description="SSH test hosts.")
    parser.add_argument("--set", type=int, default=0, dest="index", help="the host set (0)")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="build N hosts (removing any first)")
    up.add_argument("count", nargs="?", type=int, default=3)
    up.add_argument("--rate", help="shape each host's private link, e.g. 1gbit, 500mbit")
    commands.add_parser("shape", help="(re)shape running hosts").add_argument("rate")
    commands.add_parser("unshape", help="remove the shaping of running hosts")
    commands.add_parser("down", help="remove every host of the set")
    commands.add_parser("status", help="list the hosts and their links' rates")
    args = parser.parse_args(argv)
    try:
        plan_of(args.index)
        if args.command in ("up", "shape") and args.rate is not None:
            parse_rate(args.rate)
    except ValueError as exc:
        parser.error(str(exc))  # exit 2 with the usage line
    if args.command == "down":
        with exclusive(args.index):  # never under a test session or benchmark that uses them
            teardown(args.index)
        return 0
    if args.command == "up":
        problem = missing_requirements()
        if problem:
            print(problem, file=sys.stderr)
            return 2
        with exclusive(args.index):
            hosts = setup(args.count, args.index, rate=args.rate)
        for host in hosts.hosts:
            print(f"{host.namespace} public {host.public_address} private {host.private_address}")
        print(f"client key {hosts.client_key}\nknown_hosts {hosts.known_hosts}")
        if args.rate:
            print(f"private links shaped to {args.rate} each way")
        return 0
    hosts = current(args.index)
    if hosts is None:
        print(f"no SSH test hosts in set {args.index}", file=sys.stderr)
        return 1
    if args.command == "shape":
        with exclusive(args.index):
            shape(hosts, args.rate)
    elif args.command == "unshape":
        with exclusive(args.index):
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
def exclusive(index: int = 0, timeout: float = 1800.0) -> Iterator[None]:
    """Hold set ``index`` for this process: other test sessions or benchmarks on the machine
    wait here instead of tearing down hosts that are in use."""
    with hostlock.exclusive(lock_file(index), f"the SSH test hosts of set {index}", timeout):
        yield


@contextlib.contextmanager
def claim(index: int | None = None, timeout: float = 1800.0) -> Iterator[int]:
    """Hold a set and say which: ``index``, or else this worker's own set if it is free, or
    else the first free one of the first :data:`FREE_SETS` (another session's worker of the same
    number may hold it), or else wait for this worker's own."""
    if index is None:
        own = worker_set()
        for candidate in (own, *(i for i in range(FREE_SETS) if i != own)):
            with contextlib.ExitStack() as held:
                try:
                    held.enter_context(exclusive(candidate, timeout=0))
                except TimeoutError:
                    continue
                yield candidate
                return
        index = own
    with exclusive(index, timeout):
        yield index


def sweep(sets: int = FREE_SETS) -> list[int]:
    """Remove what killed sessions left in the first ``sets`` sets that nobody holds now (a
    session ended by a signal releases its lock but skips its tear-down); the sets swept."""
    swept = []
    for index in range(sets):
        if not state_dir(index).exists() and not any(lab_hosts.numbers_in_use(plan_of(index))):
            continue
        try:
            with exclusive(index, timeout=0):
                teardown(index)
        except TimeoutError:
            continue  # in use
        swept.append(index)
    return swept


@contextlib.contextmanager
def session(count: int, timeout: float = 1800.0, index: int | None = None) -> Iterator[TestHosts]:
    """``count`` test hosts for a test session or a benchmark, in a set of its own (see
    :func:`claim`): the set's lock held throughout (no other session tears them down
    meanwhile), set up on entry and torn down on exit, however it exits; first, what killed
    sessions left in sets nobody holds is swept away."""
    sweep()
    with claim(index, timeout) as held:
        hosts = setup(count, held)
        try:
            yield hosts
        finally:
            teardown(held)


_session_hosts: list[TestHosts] = []


@pytest.fixture(scope="session")
def ssh_test_hosts() -> Iterator[TestHosts]:
    """Three test hosts for the whole test session (of this worker), removed after it (skips
    without root).

    Test modules each import this fixture; the first to run builds the hosts (holding their
    set's lock) and the others share them."""
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
