"""A cluster program without TensorFlow, to try tflaunch, a backend or a plugin anywhere:
``python -m tflaunch.models.smoke`` (``examples/smoke.yaml``).

Every task finds its cluster as a TensorFlow program does, from ``TF_CONFIG`` (else as tflaunch's
own programs do, :mod:`tflaunch.models.cluster`: TF1 flags or a cluster file) and prints what
it got. A PS listens on its cluster port,
as a TensorFlow server would, and serves until the launcher stops it. A worker (or chief)
connects to every PS, prints ``step N/TOTAL`` lines for ``--steps`` steps of ``--step-seconds``
each (what ``status`` and ``up``'s progress line read), and exits 0; it exits 1, saying which,
when a PS cannot be reached. An evaluator prints what it got and exits 0.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

from tflaunch.models.cluster import (
    CLUSTER_FILE_ENV,
    ClusterError,
    ClusterInfo,
    add_cluster_flags,
    cluster_from_args,
)

CONNECT_TIMEOUT_S = 30.0


def _address(entry: str) -> tuple[str, int]:
    host, _, port = entry.rpartition(":")
    return host.strip("[]"), int(port)


def serve(info: ClusterInfo) -> int:
    """A PS: listen on this task's cluster port and accept connections until stopped."""
    host, port = _address(info.cluster["ps"][info.task_index])
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((host, port))
        server.listen()
        print(f"{info.name} serving on {host}:{port}", flush=True)
        while True:
            connection, _ = server.accept()
            connection.close()


def reach(address: str, timeout: float) -> bool:
    """Whether ``address`` accepts a connection within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(_address(address), timeout=2).close()
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)


def train(info: ClusterInfo, steps: int, step_seconds: float) -> int:
    """A worker or chief: reach every PS, then count ``steps`` steps."""
    unreachable = [a for a in info.cluster.get("ps", []) if not reach(a, CONNECT_TIMEOUT_S)]
    if unreachable:
        print(f"{info.name}: cannot reach PS at {', '.join(unreachable)}", flush=True)
        return 1
    if info.num_ps:
        print(f"{info.name}: reached all {info.num_ps} PS", flush=True)
    for step in range(1, steps + 1):
        time.sleep(step_seconds)
        print(f"{info.name} step {step}/{steps}", flush=True)
    print(f"{info.name} done", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tflaunch.models.smoke", description=__doc__)
    add_cluster_flags(parser)
    parser.add_argument("--steps", type=int, default=5, help="steps each worker counts")
    parser.add_argument("--step-seconds", type=float, default=0.2, help="seconds per step")
    args = parser.parse_args(argv)
    environ = dict(os.environ)
    if environ.get("TF_CONFIG", "").strip():  # as a TensorFlow program: TF_CONFIG first
        environ.pop(CLUSTER_FILE_ENV, None)
    try:
        info = cluster_from_args(args, environ)
    except ClusterError as err:
        print(f"smoke: {err}", file=sys.stderr)
        return 2
    if info is None:
        print("smoke: no cluster: give TF_CONFIG, a cluster file or the TF1 flags", flush=True)
        return 2
    jobs = ", ".join(f"{job} {len(hosts)}" for job, hosts in info.cluster.items())
    print(
        f"{info.name}: cluster from {info.source} ({jobs}); "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}",
        flush=True,
    )
    if info.job_name == "ps":
        return serve(info)
    if info.is_training_task:
        return train(info, args.steps, args.step_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
