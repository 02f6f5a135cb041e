"""Process groups and ports: the small system layer the agent and the backends share.

Every task runs in its own session (so its process group holds it and every child it starts),
with the parent-death signal set, so that even a ``kill -9`` of the agent takes the task with it.
Teardown is SIGTERM to the group, a bounded grace period, then SIGKILL — always with a deadline.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence

import psutil

from tflaunch.threads import in_threads

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
RESOLVE_DEADLINE_S = 5.0  # all of a check's host-name look-ups together (see unresolved)
RESOLVERS = 128  # look-ups at once (past that, names wait their turn)
RUN_MARKER = "TFLAUNCH_RUN_DIR"  # in every task's environment, inherited by all it starts


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the agent's own teardown still applies


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
    stdin: int | None = subprocess.DEVNULL,
    stdout: int | None = subprocess.PIPE,
    stderr: int | None = subprocess.STDOUT,
    die_with_parent: bool = True,
    text: bool = False,
    cpus: Sequence[int] = (),
) -> subprocess.Popen:
    """Start ``argv`` as the leader of a new session (its own process group), bound to ``cpus``
    when given (set before exec, so every thread the program starts inherits it)."""

    def prepare() -> None:  # runs in the child between fork and exec
        if die_with_parent:
            _die_with_parent()
        if cpus:
            os.sched_setaffinity(0, cpus)

    return subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
        preexec_fn=prepare if die_with_parent or cpus else None,
        text=text,
        bufsize=1 if text else -1,
    )


def become_subreaper() -> bool:
    """Make orphaned descendants of this process its children instead of init's (Linux), so a
    task's grandchild that left its process group with ``setsid`` stays within reach."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def kill_descendants(timeout: float = 5.0) -> int:
    """SIGKILL every process below this one (strays that escaped their task's group) and reap
    them; returns how many there were. Call it once the tasks' own teardown is done."""
    try:
        strays = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    for proc in strays:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(strays, timeout=timeout)  # reaps those that are our children
    return len(strays)


def kill_marked(marker: str, value: str) -> int:
    """SIGKILL the processes of this machine whose environment has ``marker=value`` (what a
    crashed agent's tasks and their escaped descendants carry); returns how many."""
    killed = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if proc.pid != os.getpid() and proc.environ().get(marker) == value:
                proc.kill()
                killed.append(proc)
    psutil.wait_procs(killed, timeout=5)
    return len(killed)


def stop_marked(
    marks: Mapping[str, str], names: Sequence[str], key: str, grace: float
) -> list[str]:
    """Stop the processes of this machine whose environment has every ``marks`` entry and whose
    ``key`` variable is one of ``names`` (tasks a lost host's old agent left behind, with what
    they started): SIGTERM, up to ``grace`` seconds, then SIGKILL. Returns the names found."""
    found: dict[psutil.Process, str] = {}
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            env = proc.environ()
            if (
                proc.pid != os.getpid()
                and env.get(key) in names
                and all(env.get(k) == v for k, v in marks.items())
            ):
                found[proc] = env[key]
    alive = list(found)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [p for p in alive if _running(p)]
        if not alive:
            break
    return sorted(set(found.values()))


def _running(proc: psutil.Process) -> bool:
    """Alive and not a zombie (one its parent has not reaped yet is gone for our purpose)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a process group; False when the group is already gone."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def terminate_group(proc: subprocess.Popen, grace: float) -> int | None:
    """SIGTERM the process's group, wait up to ``grace`` seconds, then SIGKILL what is left.

    Returns the leader's exit status (negative for a signal), or None if it could not be reaped.
    """
    pgid = proc.pid  # the leader of its own session: pgid == pid
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc.poll() is not None and not group_alive(pgid):
            return proc.returncode
        time.sleep(0.05)
    signal_group(pgid, signal.SIGKILL)
    try:
        return proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when ``host:port`` accepts a TCP connection."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def tree_listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` or one of its descendants listens on TCP ``port``: a task's own
    readiness, which a foreign process answering on the port cannot fake."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return False
    for proc in tree:
        try:
            sockets = proc.net_connections(kind="tcp")
        except psutil.Error:
            continue
        if any(
            s.status == psutil.CONN_LISTEN and s.laddr and s.laddr.port == port for s in sockets
        ):
            return True
    return False


def listeners(port: int) -> str:
    """Who listens on TCP ``port`` here, as far as this user may see: ``pid 123 (nc)``."""
    try:
        sockets = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return "a process this user cannot see"
    found = []
    for s in sockets:
        if s.status != psutil.CONN_LISTEN or not s.laddr or s.laddr.port != port:
            continue
        try:
            found.append(f"pid {s.pid} ({psutil.Process(s.pid).name()})")
        except (psutil.Error, ValueError, TypeError):
            found.append("a process this user cannot see")
    return ", ".join(sorted(set(found))) or "a process this user cannot see"


def unresolved(names: Iterable[str], fix: str) -> list[str]:
    """Why host names (or addresses) among ``names`` are no use here, one sentence each: those
    this machine cannot resolve (``fix`` says where to mend them), and, in one sentence, those
    the resolver has not answered for within :data:`RESOLVE_DEADLINE_S`. Every name is looked
    up at once: a slow resolver (glibc waits 5 s a server, times its attempts) costs the
    deadline once, not its timeout per name."""
    answers = in_threads(_lookup, dict.fromkeys(names), RESOLVERS, RESOLVE_DEADLINE_S)
    problems = [
        f"host {a.item!r} does not resolve on this machine; {fix}"
        for a in answers
        if a.done and a.error is not None
    ]
    slow = [a.item for a in answers if not a.done]
    if slow:
        shown = ", ".join(repr(name) for name in slow[:5]) + (
            f" and {len(slow) - 5} more" if len(slow) > 5 else ""
        )
        problems.append(
            f"the resolver did not answer within {RESOLVE_DEADLINE_S:g} s for "
            f"{len(slow)} host name(s): {shown}; check the DNS servers in /etc/resolv.conf, "
            f"or {fix}"
        )
    return problems


def _lookup(name: str) -> None:
    try:
        socket.getaddrinfo(name, None)
    except UnicodeError as err:  # an over-long label: no name at all
        raise OSError(str(err)) from None


def port_free(port: int, host: str = "") -> bool:
    """True when this machine can bind ``port`` (nobody listens there), as TensorFlow's server will.

    SO_REUSEADDR matches gRPC, so connections lingering in TIME_WAIT do not count as busy.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


FREE_PORTS = (20000, 32700)  # below Linux's ephemeral range, where outgoing connections take theirs


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports of this machine that nobody listens on now, at random in
    FREE_PORTS: two runs that pick at once rarely meet, and a busy port is skipped."""
    import random

    chosen: list[int] = []
    for _ in range(count * 50):
        if len(chosen) == count:
            break
        port = random.randrange(*FREE_PORTS)
        if port not in chosen and port_free(port):
            chosen.append(port)
    if len(chosen) < count:
        raise OSError(f"found {len(chosen)} of {count} free ports in {FREE_PORTS}")
    return chosen


def port_holder(port: int, address: str = "") -> str | None:
    """Who listens on ``port`` of this machine: ``pid 123 (python3 -m x ...)``; None when
    nobody does, ``address`` is not this machine's, or the system does not say (another
    user's process, without the rights to see it)."""
    if address and not is_this_machine(address):
        return None
    try:
        listening = [
            c.pid
            for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
        ]
    except (psutil.Error, OSError):
        return None
    for pid in listening:
        if pid is None:
            continue
        try:
            command = shlex.join(psutil.Process(pid).cmdline())
        except psutil.Error:
            command = "?"
        shown = command if len(command) <= 200 else command[:197] + "..."
        return f"pid {pid} ({shown})"
    return "a process of another user" if listening else None


def is_this_machine(address: str) -> bool:
    """Whether ``address`` (a name or an IP) is one of this machine's interfaces."""
    try:
        ips = {info[4][0] for info in socket.getaddrinfo(address, None)}
    except (OSError, UnicodeError):
        return False
    if any(ip.startswith("127.") or ip == "::1" for ip in ips):
        return True
    mine = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
    return bool(ips & mine)


def exit_code(returncode: int) -> int:
    """A shell-style exit code: signals become 128 + signal number."""
    return 128 - returncode if returncode < 0 else returncode
