"""A cluster program without TensorFlow, to try tflaunch, a backend or a plugin anywhere:
``python -m tflaunch.models.smoke`` (``examples/smoke.yaml``).

Every task finds its cluster as a TensorFlow program does, from ``TF_CONFIG`` (else as tflaunch's
own programs do, :mod:`tflaunch.models.cluster`: TF1 flags or a cluster file) and prints what
it got. A PS listens on its cluster port,
as a TensorFlow server would, and serves until the launcher stops it. A worker (or chief)
connects to every PS, prints ``step N/TOTAL`` lines for ``--steps`` steps of ``--step-seconds``
each (what ``status`` and ``up``'s progress line read), and exits 0; it exits 1, saying which,
when a PS cannot be reached. An evaluator prints what it got and exits 0.

With ``--checkpoint-dir`` it stands in for a program that checkpoints (tflaunch.models.pss): the
chief (worker 0 without one) resumes from the step saved there (``resumed from PATH at step
N``), and saves its step when SIGUSR1 or SIGUSR2 arrives (Slurm's ``--signal`` ahead of the time
limit, which reaches every task: the others ignore it; once, whatever copies follow) and after
its last step.
"""

from __future__ import annotations

import argparse
import os
import signal
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


class Checkpoint:
    """The step a checkpointing task has reached, in one file, and the warning signals seen."""

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, "smoke-step")
        self.warned: list[int] = []
        for number in (signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(number, lambda signum, _frame: self.warned.append(signum))

    def ignore_warnings(self) -> None:
        """One checkpoint per warning, however many copies arrive (Slurm's, the agent's, the
        launcher's: a step apart, each would save another step)."""
        for number in (signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(number, signal.SIG_IGN)
        self.warned.clear()

    def resume(self, name: str) -> int:
        try:
            with open(self.path) as f:
                step = int(f.read())
        except FileNotFoundError:
            print(f"{name}: no checkpoint at {self.path}: starting at step 0", flush=True)
            return 0
        print(f"{name}: resumed from {self.path} at step {step}", flush=True)
        return step

    def save(self, name: str, step: int) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(self.path + ".tmp", self.path)
        print(f"{name}: saved checkpoint {self.path} at step {step}", flush=True)


def train(
    info: ClusterInfo, steps: int, step_seconds: float, checkpoint: Checkpoint | None = None
) -> int:
    """A worker or chief: reach every PS, then count ``steps`` steps (from a checkpoint's)."""
    unreachable = [a for a in info.cluster.get("ps", []) if not reach(a, CONNECT_TIMEOUT_S)]
    if unreachable:
        print(f"{info.name}: cannot reach PS at {', '.join(unreachable)}", flush=True)
        return 1
    if info.num_ps:
        print(f"{info.name}: reached all {info.num_ps} PS", flush=True)
    first = checkpoint.resume(info.name) + 1 if checkpoint else 1
    for step in range(first, steps + 1):
        time.sleep(step_seconds)
        print(f"{info.name} step {step}/{steps}", flush=True)
        if checkpoint and checkpoint.warned:
            number = checkpoint.warned[0]
            print(f"{info.name}: got signal {number}: checkpointing now", flush=True)
            checkpoint.save(info.name, step)
            checkpoint.ignore_warnings()
    if checkpoint:
        checkpoint.save(info.name, steps)
    print(f"{info.name} done", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tflaunch.models.smoke", description=__doc__)
    add_cluster_flags(parser)
    parser.add_argument("--steps", type=int, default=5, help="steps each worker counts")
    parser.add_argument("--step-seconds", type=float, default=0.2, help="seconds per step")
    parser.add_argument(
        "--checkpoint-dir",
        help="the chief (worker 0 without one) resumes from its step saved here and saves it on "
        "SIGUSR1/SIGUSR2; every task then ignores those signals",
    )
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
    checkpoint = None
    if args.checkpoint_dir:
        for number in (signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(number, signal.SIG_IGN)
        if info.is_chief:
            checkpoint = Checkpoint(args.checkpoint_dir)
    if info.job_name == "ps":
        return serve(info)
    if info.is_training_task:
        return train(info, args.steps, args.step_seconds, checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
