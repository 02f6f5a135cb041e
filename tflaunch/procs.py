"""Process groups and ports: the small system layer the agent and the backends share.

Every task runs in its own session (so its process group holds it and every child it starts),
with the parent-death signal set, so that even a ``kill -9`` of the agent takes the task with it.
Teardown is SIGTERM to the group, a bounded grace period, then SIGKILL — always with a deadline.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence

_PR_SET_PDEATHSIG = 1


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
) -> subprocess.Popen:
    """Start ``argv`` as the leader of a new session (its own process group)."""
    return subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
        preexec_fn=_die_with_parent if die_with_parent else None,
        text=text,
        bufsize=1 if text else -1,
    )


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


def exit_code(returncode: int) -> int:
    """A shell-style exit code: signals become 128 + signal number."""
    return 128 - returncode if returncode < 0 else returncode
