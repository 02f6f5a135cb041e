"""A real three-node Slurm cluster on this machine, for end-to-end tests of the Slurm backend.

Each node is a Linux network namespace ``tfl-slurm-node1..3`` with its own address
(198.18.0.11-13) on the bridge ``tfl-slurm-br``; the controller sits on the bridge at 198.18.0.1
in the root namespace. The nodes are the lab cloud's namespace hosts
(:mod:`tflaunch.launchers.clouds.lab.hosts` builds and removes them) under an address plan of
their own, :data:`PLAN`, with one network and no sshd. One ``munged`` (own key and socket), one
``slurmctld`` in the root namespace and one ``slurmd -N nodeX`` per namespace, all configured under
:data:`STATE_DIR`; Slurm commands find that configuration through ``SLURM_CONF``. The namespaces
share the file system, so a run directory under /tmp is "shared storage" as on a real cluster.

Each node declares ``CPUs=2`` (a PS and a worker fit on one node) and four GPUs backed by character
devices with /dev/null's numbers: Slurm allocates them and sets ``CUDA_VISIBLE_DEVICES`` exactly as
on a GPU cluster, although no GPU exists (the tests run tensorflow-cpu, which ignores the variable).

Namespaces, the bridge, /etc/hosts lines and daemons outlive the process that made them, so
:func:`up` first clears whatever an interrupted run left, and :func:`down` removes everything.

    python tests/hosts/slurm_cluster.py up|down|status
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

if not __package__:  # run as a script (python tests/hosts/slurm_cluster.py): from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.hosts import hostlock  # noqa: E402
from tflaunch.launchers.clouds.lab import hosts as lab_hosts  # noqa: E402

STATE_DIR = Path(os.environ.get("TFL_SLURM_DIR", "/tmp/tfl-slurm"))
# Node N is the namespace tfl-slurm-nodeN at 198.18.0.(10+N), its root-side veth tfls-nN; the
# bridge holds the controller's address, 198.18.0.1.
PLAN = lab_hosts.AddressPlan(
    namespace="tfl-slurm-node{n}",
    public_veth="tfls-n{n}",
    public_bridge="tfl-slurm-br",
    public_net="198.18.0",
    first_host=11,
)
BRIDGE = PLAN.public_bridge
CONTROLLER_ADDRESS = PLAN.launcher_address
NODE_COUNT = 3
CPUS_PER_NODE = 2
GPUS_PER_NODE = 4
MEMORY_MB_PER_NODE = 2000
PARTITION = "debug"
HOSTS_FILE = Path("/etc/hosts")
HOSTS_BEGIN = "# BEGIN tflaunch slurm test cluster"
HOSTS_END = "# END tflaunch slurm test cluster"
REQUIRED_PROGRAMS = ("ip", "munged", "slurmctld", "slurmd", "scontrol", "sinfo", "sbatch", "srun")
READY_TIMEOUT_S = 60.0
LOCK_FILE = Path("/tmp/tfl-slurm.lock")
# A step credential's lifetime, which is also how long a requeued job waits before it may start
# again (Slurm's default 120 s would make every requeue test wait two minutes). A step is launched
# within a second of its credential's creation here, so 10 s leaves a wide margin.
CRED_EXPIRE_S = 10
# How often the main scheduler looks at the queue (Slurm's default is 60 s). Backfill (every 1 s
# here) does not start a requeued job, so without this it waits up to a minute once eligible.
SCHED_INTERVAL_S = 2


class Node(lab_hosts.NamespaceHost):
    """One test node: a namespace host of :data:`PLAN`, the Slurm node ``nodeN``."""

    @property
    def name(self) -> str:
        return f"node{self.index}"

    @property
    def netns(self) -> str:
        return self.namespace

    @property
    def address(self) -> str:
        return self.public_address


def _node(number: int) -> Node:
    # The plan has one network; the number 1 a host needs is never used. The folder stays empty.
    return Node(number, 1, STATE_DIR / f"node{number}", plan=PLAN)


NODES = tuple(_node(i) for i in range(1, NODE_COUNT + 1))


def conf_path() -> Path:
    """The slurm.conf the cluster runs from; export it as ``SLURM_CONF`` for Slurm commands."""
    return STATE_DIR / "etc" / "slurm.conf"


def slurm_env() -> dict[str, str]:
    """The process environment with ``SLURM_CONF`` pointing at the test cluster."""
    return {**os.environ, "SLURM_CONF": str(conf_path())}


def missing_requirements() -> str | None:
    """Why the cluster cannot be started here (not root, missing programs), or None."""
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (network namespaces, /etc/hosts, slurmd)"
    missing = [p for p in REQUIRED_PROGRAMS if shutil.which(p) is None]
    if missing:
        return f"the Slurm test cluster needs {', '.join(missing)} (apt: slurm-wlm munge iproute2)"
    return None


def _run(argv: list[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, check=check, capture_output=True, text=True, timeout=timeout, env=slurm_env()
    )


# --- network -----------------------------------------------------------------------------------


def _create_network() -> None:
    lab_hosts.ensure_public_bridge(PLAN)
    for node in NODES:
        lab_hosts.make_namespace(node)


def _remove_network() -> None:
    """Remove every node of :data:`PLAN` found on the machine (whatever run made it) and the
    bridge; names of no other plan are touched."""
    numbers = sorted(lab_hosts.numbers_in_use(PLAN)[0])
    # Anything still running in our namespaces (daemons, job steps) belongs to this cluster.
    _kill_pids([pid for n in numbers for pid in lab_hosts.namespace_pids(_node(n).namespace)])
    for number in numbers:
        lab_hosts.remove_host(_node(number))
    lab_hosts.remove_public_bridge(PLAN)


# --- /etc/hosts --------------------------------------------------------------------------------


def _without_hosts_block(text: str) -> str:
    lines, inside = [], False
    for line in text.splitlines():
        if line.strip() == HOSTS_BEGIN:
            inside = True
        elif line.strip() == HOSTS_END:
            inside = False
        elif not inside:
            lines.append(line)
    return "\n".join(lines) + "\n"


def _write_hosts(text: str) -> None:
    # /etc/hosts may be a bind mount: rewrite in place rather than replacing the file.
    with HOSTS_FILE.open("r+") as f:
        f.seek(0)
        f.write(text)
        f.truncate()


def _add_hosts_block() -> None:
    block = [HOSTS_BEGIN, *(f"{n.address} {n.name}" for n in NODES), HOSTS_END]
    _write_hosts(_without_hosts_block(HOSTS_FILE.read_text()) + "\n".join(block) + "\n")


def _remove_hosts_block() -> None:
    text = HOSTS_FILE.read_text()
    if HOSTS_BEGIN in text:
        _write_hosts(_without_hosts_block(text))


# --- daemons -----------------------------------------------------------------------------------


def _pid_files() -> Iterator[Path]:
    yield STATE_DIR / "run" / "slurmctld.pid"
    for node in NODES:
        yield STATE_DIR / "run" / f"slurmd-{node.name}.pid"
    yield STATE_DIR / "munge" / "munged.pid"


def _kill_pids(pids: list[int], grace_s: float = 5.0) -> None:
    """SIGTERM, wait up to ``grace_s`` for them to go, then SIGKILL the rest."""
    alive = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            alive.append(pid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if _exists(p)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # Reap if it is our child (daemons started by this process after fork).
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return Path(f"/proc/{pid}").exists() and _state(pid) != "Z"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def _our_daemon_pids() -> list[int]:
    """Daemons of this cluster: listed in our pid files or started with our config/key paths."""
    pids = set()
    for path in _pid_files():
        with contextlib.suppress(OSError, ValueError, IndexError):
            pids.add(int(path.read_text().split()[0]))
    marker = str(STATE_DIR).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if cmdline.split(b"\0")[0].endswith((b"slurmctld", b"slurmd", b"munged")) and (
            marker in cmdline or marker in environ
        ):
            pids.add(int(proc.name))
    return sorted(p for p in pids if p != os.getpid())


def _write_munge_key() -> None:
    munge_dir = STATE_DIR / "munge"
    munge_dir.mkdir(mode=0o700, parents=True)
    key = munge_dir / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)


def _start_munged() -> None:
    d = STATE_DIR / "munge"
    _run(
        [
            "munged",
            f"--socket={d / 'munge.socket'}",
            f"--key-file={d / 'munge.key'}",
            f"--pid-file={d / 'munged.pid'}",
            f"--log-file={d / 'munged.log'}",
            f"--seed-file={d / 'munged.seed'}",
            "--force",
        ]
    )


def _make_gpu_devices() -> Path:
    """Character devices standing in for GPUs (the numbers of /dev/null: harmless to open)."""
    dev = STATE_DIR / "dev"
    dev.mkdir()
    for i in range(GPUS_PER_NODE):
        os.mknod(dev / f"nvidia{i}", 0o666 | 0o020000, os.makedev(1, 3))
    return dev


def render_slurm_conf(controller_host: str) -> str:
    """slurm.conf for the test cluster (pure; ``controller_host`` is ``hostname -s``)."""
    d = STATE_DIR
    first, last = NODES[0], NODES[-1]
    nodes = f"node[{first.name[4:]}-{last.name[4:]}]"
    addrs = ",".join(n.address for n in NODES)
    return f"""\
ClusterName=tflaunch-test
SlurmctldHost={controller_host}({CONTROLLER_ADDRESS})
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge/munge.socket,cred_expire={CRED_EXPIRE_S}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval={SCHED_INTERVAL_S}
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
MinJobAge=600
KillWait=10
InactiveLimit=0
SlurmdTimeout=60
MessageTimeout=20
GresTypes=gpu
NodeName={nodes} NodeAddr={addrs} CPUs={CPUS_PER_NODE} RealMemory={MEMORY_MB_PER_NODE} \
Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _write_config() -> None:
    etc = STATE_DIR / "etc"
    etc.mkdir()
    for sub in ("state", "spool", "run", "log"):
        (STATE_DIR / sub).mkdir()
    dev = _make_gpu_devices()
    controller = socket.gethostname().split(".")[0]
    (etc / "slurm.conf").write_text(render_slurm_conf(controller))
    (etc / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
    (etc / "gres.conf").write_text(
        f"NodeName={','.join(n.name for n in NODES)} Name=gpu "
        f"File={dev}/nvidia[0-{GPUS_PER_NODE - 1}]\n"
    )


def _start_slurm() -> None:
    _run(["slurmctld", "-f", str(conf_path())])
    for node in NODES:
        _run(["ip", "netns", "exec", node.netns, "slurmd", "-f", str(conf_path()), "-N", node.name])


def _wait_idle() -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    states = ""
    while time.monotonic() < deadline:
        result = _run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
        states = result.stdout.strip()
        lines = states.splitlines()
        if len(lines) == NODE_COUNT and all(line.split()[1] == "idle" for line in lines):
            return
        time.sleep(0.5)
    raise RuntimeError(
        f"Slurm nodes not idle after {READY_TIMEOUT_S:.0f} s: {states!r}; see {STATE_DIR / 'log'}"
    )


# --- public ------------------------------------------------------------------------------------


def down() -> None:
    """Remove every trace of the cluster: daemons, job processes, namespaces, hosts lines, files."""
    _kill_pids(_our_daemon_pids())
    _remove_network()
    _remove_hosts_block()
    shutil.rmtree(STATE_DIR, ignore_errors=True)


def up() -> None:
    """Start the cluster from scratch (clearing leftovers first); return once all nodes are idle."""
    reason = missing_requirements()
    if reason:
        raise RuntimeError(reason)
    down()
    STATE_DIR.mkdir(mode=0o755, parents=True)
    try:
        _create_network()
        _add_hosts_block()
        _write_munge_key()
        _start_munged()
        _write_config()
        _start_slurm()
        _wait_idle()
    except BaseException:
        logs = STATE_DIR / "log"
        tail = _tail_logs(logs)
        down()
        if tail:
            print(tail, file=sys.stderr)
        raise


def _tail_logs(logs: Path, lines: int = 20) -> str:
    out = []
    for log in sorted(logs.glob("*.log")) if logs.exists() else []:
        out.append(f"== {log.name}")
        out.extend(log.read_text(errors="replace").splitlines()[-lines:])
    return "\n".join(out)


def is_up() -> bool:
    """True if the controller answers and every node is up (idle, mixed or allocated)."""
    if not conf_path().exists():
        return False
    result = _run(["sinfo", "-h", "-N", "-o", "%t"], check=False, timeout=10)
    states = result.stdout.split()
    return (
        result.returncode == 0
        and len(states) == NODE_COUNT
        and all(s.rstrip("*") in ("idle", "mix", "alloc") for s in states)
    )


@contextlib.contextmanager
def session(lock_timeout_s: float = 1800.0) -> Iterator[Path]:
    """The cluster for one test session or benchmark: exclusive, up, ``SLURM_CONF`` set, down.

    A file lock serialises concurrent users on this machine (two pytest sessions would otherwise
    tear down each other's cluster); the second waits up to ``lock_timeout_s``.
    """
    with hostlock.exclusive(LOCK_FILE, "the Slurm test cluster", lock_timeout_s):
        previous = os.environ.get("SLURM_CONF")
        up()
        os.environ["SLURM_CONF"] = str(conf_path())
        try:
            yield conf_path()
        finally:
            if previous is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = previous
            down()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("up", "down", "status"))
    args = parser.parse_args(argv)
    if args.action == "up":
        up()
        print(f"Slurm test cluster up; export SLURM_CONF={conf_path()}")
    elif args.action == "down":
        down()
        print("Slurm test cluster removed")
    else:
        print("up" if is_up() else "down")
        return 0 if is_up() else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
