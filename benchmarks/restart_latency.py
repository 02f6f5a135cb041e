"""Seconds from a task's failure to the task running again, on the local backend and on the
Slurm test cluster (tests/hosts/slurm_cluster.py; needs root).

Stand-in tasks without TensorFlow (1 PS + 2 workers), so the figure is the launcher's own cost:
worker 1 exits with code 3 in its first run and its restart policy is ``on-failure`` with no
backoff. Two scopes:
  - task: the worker alone is restarted in place by its agent;
  - cluster: every task is stopped and the cluster started again (PS first, readiness, workers).
"Failure -> running again" is the agent's ``exited`` event of the failing run to the agent's
``started`` event of its next run (both stamped on the task's node), medians over ``--repeats``.

On Slurm, ``--requeue-repeats N`` (default 1) adds a third row, requeue: a job with a 1-minute limit,
``slurm.signal: USR1@50`` and ``slurm.requeue: 1`` whose first run outlasts the limit; the figure
is the coordinator's ``requeueing`` event (the cluster is stopped and the job requeued) to worker 1
started again in the requeued job. Slurm holds a requeued job back for ``cred_expire`` seconds (10
on the test cluster, 120 by default) and then starts it on its main scheduler's next pass (every 2 s
on the test cluster, 60 s by default), which dominates it.

Usage: python benchmarks/restart_latency.py [--repeats 5] [--backend local|slurm|both]
                                            [--requeue-repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import free_port_base  # noqa: E402
from tflaunch.runtime import protocol  # noqa: E402


def cluster_file(work: Path, backend: str, scope: str, n: int) -> Path:
    base = free_port_base() if backend == "local" else 32300
    data = {
        "name": f"restart-{scope}",
        "backend": backend,
        "program": {
            "argv": [sys.executable, str(ROOT / "tests" / "programs" / "fake_task.py")],
            "workdir": str(ROOT),
            "env": {"FAIL_INDEX": "1", "FAIL_CODE": "3", "FAIL_RUNS": "1", "WORK_SECONDS": "1"},
        },
        "roles": {"ps": 1, "worker": 2},
        "ports": {"ps": base, "worker": base + 10},
        "supervision": {
            "grace_period": 3,
            "ready_timeout": 120,
            "restart": {
                "worker": {"policy": "on-failure", "scope": scope},
                "backoff": 0,
            },
        },
        "runs_dir": str(work / "runs"),
    }
    if backend == "slurm":
        data["slurm"] = {"python": sys.executable}
    path = work / f"{backend}-{scope}-{n}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def requeue_file(work: Path, n: int) -> Path:
    """Stand-in tasks that outlast a 1-minute limit in the first run, and end soon once requeued."""
    fake = ROOT / "tests" / "programs" / "fake_task.py"
    first_long = (  # no braces: argv items are format strings for tflaunch's placeholders
        'case "$SLURM_RESTART_COUNT" in ""|0) export WORK_SECONDS=600;; esac; '
        f"exec {sys.executable} {fake}"
    )
    data = {
        "name": "restart-requeue",
        "backend": "slurm",
        "program": {
            "argv": ["bash", "-c", first_long],
            "workdir": str(ROOT),
            "env": {"WORK_SECONDS": "1"},
        },
        "roles": {"ps": 1, "worker": 2},
        "ports": {"ps": 32300, "worker": 32310},
        "supervision": {"grace_period": 3, "ready_timeout": 120},
        "runs_dir": str(work / "runs"),
        "slurm": {
            "python": sys.executable,
            "time": "1",
            "signal": "USR1@50",
            "requeue": 1,
            "checkpoint_wait": 1,
        },
    }
    path = work / f"slurm-requeue-{n}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def one_run(work: Path, backend: str, scope: str, n: int) -> float:
    path = requeue_file(work, n) if scope == "requeue" else cluster_file(work, backend, scope, n)
    runs = work / "runs"
    before = set(runs.iterdir()) if runs.exists() else set()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "tflaunch", "up", str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    if result.returncode != 0:
        raise SystemExit(f"{backend}/{scope} run failed: {result.stderr[-2000:]}")
    (run,) = [p for p in runs.iterdir() if p not in before]
    lines = (run / "events.jsonl").read_text().splitlines()
    records = list(protocol.records(json.loads(line) for line in lines))
    started = [r.time for r in records if isinstance(r.event, protocol.Started) and worker_1(r)]
    if scope == "requeue":
        requeued = next(r.time for r in records if isinstance(r.event, protocol.Requeueing))
        return next(t - requeued for t in started if t > requeued)
    failed = next(
        r.time
        for r in records
        if isinstance(r.event, protocol.Exited) and worker_1(r) and r.event.code == 3
    )
    return next(t for t in started if t >= failed) - failed


def worker_1(record: protocol.Record) -> bool:
    return getattr(record.event, "task", None) == "worker:1"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backend", choices=("local", "slurm", "both"), default="local")
    parser.add_argument(
        "--requeue-repeats", type=int, default=1, help="Slurm requeue runs (about 2 min each)"
    )
    args = parser.parse_args()
    backends = ["local", "slurm"] if args.backend == "both" else [args.backend]
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="restart-bench-", dir=str(ROOT / "runs")) as tmp:
        for backend in backends:
            if backend == "slurm":
                from tests.hosts import slurm_cluster

                reason = slurm_cluster.missing_requirements()
                if reason:
                    print(f"slurm: cannot run: {reason}", file=sys.stderr)
                    continue
                with slurm_cluster.session():
                    for scope in ("task", "cluster"):
                        results[backend, scope] = [
                            one_run(Path(tmp), backend, scope, i) for i in range(args.repeats)
                        ]
                    if args.requeue_repeats:
                        results[backend, "requeue"] = [
                            one_run(Path(tmp), backend, "requeue", i)
                            for i in range(args.requeue_repeats)
                        ]
            else:
                for scope in ("task", "cluster"):
                    results[backend, scope] = [
                        one_run(Path(tmp), backend, scope, i) for i in range(args.repeats)
                    ]
    print(
        f"failure -> running again (seconds), medians of {args.repeats} "
        f"(requeue: {args.requeue_repeats}); 1 PS + 2 workers"
    )
    print(f"{'backend':10}{'scope':10}{'median':>8}{'min':>8}{'max':>8}")
    for (backend, scope), values in results.items():
        print(
            f"{backend:10}{scope:10}{statistics.median(values):8.2f}"
            f"{min(values):8.2f}{max(values):8.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
