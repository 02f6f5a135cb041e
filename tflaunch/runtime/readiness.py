"""Readiness: when an agent may start its chief, workers and evaluator — once every PS of the
whole cluster accepts connections, never after a fixed sleep.

A PS of the agent's own host is ready when its own process or one of its children listens on its
port (psutil), not when anything answers there: a foreign process that took the port after the
busy-port check is an error naming the port. Another host's PS counts once its port accepts
connections; its own agent vouches for who listens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection

from tflaunch.cluster.plan import Plan
from tflaunch.runtime import procs, protocol

Emit = Callable[[protocol.Event], None]


def wait_for_ps(
    plan: Plan,
    host: str,
    own: Collection[str],
    live_pid: Callable[[str], int | None],
    emit: Emit,
    stopping: threading.Event,
) -> bool:
    """Wait until every PS of ``plan``'s cluster accepts connections, ``own`` (this host's PS,
    whose running pid ``live_pid`` gives) by their own processes; each of those is reported
    ready. False on timeout (reported) or when ``stopping`` is set."""
    ps = plan.ps_addresses()
    if not ps:
        return True  # (a PS-only node waits too: it reports its PS ready, for cluster_ready)
    timeout = plan.supervision.ready_timeout
    deadline = time.monotonic() + timeout
    # From the shared cluster: a Slurm node's plan holds only its own tasks.
    pending = {f"ps:{i}": address for i, address in enumerate(ps)}
    emit(protocol.Waiting(what="PS ports", tasks=sorted(pending)))
    while pending and not stopping.is_set():
        for name, address in list(pending.items()):
            address_host, _, port = address.rpartition(":")
            if name in own:
                verdict = _own_ps_listens(name, host, address_host, int(port), live_pid, emit)
                if verdict is False:
                    return False
                if verdict:
                    del pending[name]
                    emit(protocol.Ready(task=name))
            elif procs.port_open(address_host, int(port), timeout=0.3):
                del pending[name]  # another node's PS: its own agent checks who listens
        if not pending:
            break
        if time.monotonic() > deadline:
            missing = ", ".join(f"{n} at {pending[n]}" for n in sorted(pending))
            emit(
                protocol.AgentError(
                    code=1,
                    message=f"readiness timeout: after {timeout:g} s these PS still do not "
                    f"accept connections: {missing}. Check their logs, or raise "
                    "supervision.ready_timeout.",
                )
            )
            return False
        stopping.wait(0.2)
    return not stopping.is_set()


def _own_ps_listens(
    name: str,
    host: str,
    address: str,
    port: int,
    live_pid: Callable[[str], int | None],
    emit: Emit,
) -> bool | None:
    """Whether this host's PS ``name`` (its process or a child) listens on its port: True;
    not yet: None; another process holds the port, so it never will: False, reported."""
    pid = live_pid(name)
    if pid is None:
        return None  # not started, or exited: its exit is reported as such
    if procs.tree_listens(pid, port):
        return True
    if not procs.port_open(address, port, timeout=0.3):
        return None
    if procs.tree_listens(pid, port):  # it bound the port between the two looks
        return True
    emit(
        protocol.AgentError(
            code=1,
            message=f"{name}: port {port} on {host} answers, but not from {name} "
            f"(pid {pid}) or its children: {procs.listeners(port)} took it after the "
            f"busy-port check, so {name} cannot serve there. Stop that process or change "
            "ports.ps, and start the run again.",
        )
    )
    return False
