"""Slurm backend latency on the 3-node test cluster (tests/hosts/slurm_cluster.py; needs root).

For a 1 PS + 3 worker cluster on 3 nodes, submitted with ``tflaunch up``, prints medians over
``--repeats`` runs of:
  - submit -> job running: Slurm's scheduling (not ours; shown for context);
  - job running -> all tasks ready: from the moment Slurm runs the job to the coordinator's
    ``cluster_ready`` event (every agent connected, every task started, every PS port open);
  - last worker exit -> job ended: from the last worker's ``exited`` event to Slurm reporting the
    job finished (PS stopped, agents ended, srun step and batch script done).
for two workloads: stand-in tasks without TensorFlow (the launcher's own cost) and the real
distributed MNIST (models/mnist.py, PS readiness includes its TensorFlow import), next to the cost
of one ``import tensorflow`` measured in the same run. "Job running" and "job ended" are the first
``squeue`` poll (every 50 ms) that shows the state, so they are late by up to 50 ms + one squeue.

Usage: python benchmarks/slurm_latency.py [--repeats 3] [--train-steps 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import mnist_argv, ready_and_last_worker_exit  # noqa: E402
from tests.hosts import slurm_cluster  # noqa: E402

FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def cluster_file(work: Path, workload: str, train_steps: int) -> Path:
    if workload == "mnist":
        argv = mnist_argv(sys.executable, "--train_steps", str(train_steps))
        env = {}
    else:
        argv = [sys.executable, str(ROOT / "tests" / "programs" / "fake_task.py")]
        env = {"WORK_SECONDS": "1"}
    data = {
        "name": f"bench-{workload}",
        "backend": "slurm",
        "program": {"argv": argv, "workdir": str(ROOT), "env": env},
        "roles": {"ps": 1, "worker": 3},
        "ports": {"ps": 32200, "worker": 32210},
        "supervision": {"grace_period": 3, "ready_timeout": 300},
        "runs_dir": str(work / "runs"),
        "slurm": {"python": sys.executable},
    }
    path = work / f"{workload}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def job_state(job_id: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()


def one_run(work: Path, workload: str, train_steps: int) -> dict[str, float]:
    path = cluster_file(work, workload, train_steps)
    runs = work / "runs"
    before = set(runs.iterdir()) if runs.exists() else set()
    submitted = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tflaunch", "up", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    job_id, running_at, ended_at = None, None, None
    deadline = time.monotonic() + 900
    while ended_at is None and time.monotonic() < deadline:
        if job_id is None:
            new = [p for p in runs.iterdir() if p not in before] if runs.exists() else []
            meta = new[0] / "run.json" if new else None
            if meta and meta.exists():
                job_id = json.loads(meta.read_text()).get("job_id")
        else:
            state = job_state(job_id)
            now = time.time()
            if state in ("RUNNING", "COMPLETING") and running_at is None:
                running_at = now
            if state in FINAL:
                running_at = running_at or now
                ended_at = now
        time.sleep(0.05)
    code = proc.wait(timeout=120)
    if code != 0 or ended_at is None or running_at is None:
        raise SystemExit(f"{workload} run failed (exit {code}): {proc.stderr.read()[-2000:]}")
    (run,) = [p for p in runs.iterdir() if p not in before]
    ready, last_exit = ready_and_last_worker_exit(run)
    return {
        "scheduling": running_at - submitted,
        "start_to_ready": ready - running_at,
        "exit_to_end": ended_at - last_exit,
    }


def time_import() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import tensorflow"], check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=30)
    args = parser.parse_args()
    reason = slurm_cluster.missing_requirements()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    results: dict[str, list[dict[str, float]]] = {"fake": [], "mnist": []}
    with slurm_cluster.session(), tempfile.TemporaryDirectory(prefix="slurm-bench-") as tmp:
        imports = [time_import() for _ in range(args.repeats)]
        for _ in range(args.repeats):
            for workload in results:
                results[workload].append(one_run(Path(tmp), workload, args.train_steps))
    print(f"Slurm backend, 3 nodes, 1 PS + 3 workers; medians of {args.repeats} runs (seconds)")
    print(f"{'':34}{'stand-in tasks':>16}{'MNIST (TF)':>12}")
    for key, label in (
        ("scheduling", "submit -> job running (Slurm)"),
        ("start_to_ready", "job running -> all tasks ready"),
        ("exit_to_end", "last worker exit -> job ended"),
    ):
        fake = statistics.median(r[key] for r in results["fake"])
        real = statistics.median(r[key] for r in results["mnist"])
        print(f"{label:34}{fake:16.2f}{real:12.2f}")
    print(f"{'import tensorflow (baseline)':34}{'':16}{statistics.median(imports):12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
