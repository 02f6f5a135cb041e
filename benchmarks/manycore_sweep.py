"""The CSCS-style sweep on one many-core host, with the performance model beside each row.

    python benchmarks/manycore_sweep.py --out DIR [--workers 1,2,4,8] [--ps 1,2,3,4]
        [--updates parameter_server,...] [--repeats 3] [--cpus-per-task K] [--intra N]
        [--batch 32] [--image 149] [--steps 30] [--warmup 10] [--phase calibrate|sweep|all]

calibrate: (1) one lone worker (no cluster), bound to K cores like a pinned task, gives the
compute time per step; (2) ``tflaunch netbench`` on a 1 PS + 1 worker cluster of this host gives
the link; (3) ``tflaunch model`` turns both into DIR/inputs.json and prints its recommendation.
sweep: ``tflaunch bench`` over the grid on the local backend (tasks pinned with
``placement.cpus_per_task`` K when K > 0), with ``--predict DIR/inputs.json``: the CSCS table,
the best row per worker count with efficiency, and prediction beside measurement with the error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def tflaunch(*args: str) -> str:
    """Run a tflaunch command, printing its own lines as they come (tasks' lines only for their
    totals): a run cut short by a time limit still shows every finished point."""
    cmd = [sys.executable, "-m", "tflaunch", *args]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.Popen(
        cmd, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if not line.startswith("[") or "total images/sec" in line or line.startswith("[tflaunch]"):
            print(line, end="", flush=True)
    if proc.wait() != 0:
        print("".join(lines[-40:]), flush=True)
        raise SystemExit(f"tflaunch {args[0]} failed with {proc.returncode}")
    return "".join(lines)


def bench_argv(a: argparse.Namespace) -> list[str]:
    return [
        sys.executable, "-m", "tflaunch.models.benchmark", "--model", "inception3",
        "--batch_size", str(a.batch), "--image_size", str(a.image), "--num_batches", str(a.steps),
        "--num_warmup_batches", str(a.warmup), "--data_format", "NHWC", "--display_every",
        str(a.steps), "--num_intra_threads", str(a.intra), "--num_inter_threads", "2",
    ]  # fmt: skip


def cluster_file(a: argparse.Namespace, path: Path, ps: int, workers: int, argv) -> Path:
    data = {
        "name": path.stem,
        "backend": "local",
        "program": {"argv": argv, "workdir": str(ROOT)},
        "roles": {"ps": ps, "worker": workers},
        "ports": {"ps": 2230, "worker": 2220},
        "supervision": {"ready_timeout": 600, "finish_timeout": 900},
        "runs_dir": str(a.out / "runs"),
    }
    if a.cpus_per_task:
        data["placement"] = {"cpus_per_task": a.cpus_per_task}
    path.write_text(yaml.safe_dump(data))
    return path


def lone_worker(a: argparse.Namespace) -> float:
    cores = sorted(os.sched_getaffinity(0))[: a.cpus_per_task or None]
    t0 = time.time()
    out = subprocess.run(
        bench_argv(a),
        cwd=ROOT,
        text=True,
        capture_output=True,
        preexec_fn=lambda: os.sched_setaffinity(0, cores),
    )
    m = re.search(r"^worker images/sec: ([\d.]+)$", out.stdout, re.M)
    if not m:
        raise SystemExit("lone worker failed:\n" + out.stdout[-2000:] + out.stderr[-2000:])
    rate = float(m.group(1))
    print(f"lone worker on {len(cores)} cores: {rate:.2f} images/sec ({time.time() - t0:.0f} s)")
    return rate


def calibrate(a: argparse.Namespace) -> None:
    rate = lone_worker(a)
    nb = cluster_file(a, a.out / "netbench.yaml", 1, 1, [sys.executable, "-c", "pass"])
    out = tflaunch("netbench", str(nb), "--sizes", "1K,1M,16M,64M", "--ps-model", "none")
    run = re.search(r"wrote (\S+)/netbench\.json", out).group(1)
    tflaunch(
        "model", "--netbench", run, "--compute-img-s", str(rate), "--batch-size", str(a.batch),
        "--save", str(a.out / "inputs.json"), "--workers", a.workers, "--ps", a.ps,
        "--no-nic",  # every task on this one host: loopback, no NIC shared by a host's streams
    )  # fmt: skip


def sweep(a: argparse.Namespace) -> None:
    workers = [int(w) for w in a.workers.split(",")]
    cluster = cluster_file(a, a.out / "bench.yaml", 1, 1, bench_argv(a))
    spec = {
        "name": "manycore",
        "cluster": str(cluster),
        "workers": workers,
        "ps": [int(p) for p in a.ps.split(",")],
        "variable_updates": a.updates.split(","),
        "data": ["synthetic"],
        "repeats": a.repeats,
        "output_dir": str(a.out / "bench"),
    }
    path = a.out / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    args = ["bench", str(path)]
    if (a.out / "inputs.json").exists():
        args += ["--predict", str(a.out / "inputs.json")]
    tflaunch(*args)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--workers", default="1,2,4,8")
    p.add_argument("--ps", default="1,2,3,4")
    p.add_argument("--updates", default="parameter_server")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cpus-per-task", type=int, default=0, help="0: unpinned")
    p.add_argument("--intra", type=int, default=6)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--image", type=int, default=149)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--phase", choices=("calibrate", "sweep", "all"), default="all")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    print(json.dumps({k: str(v) for k, v in vars(a).items()}), flush=True)
    if a.phase in ("calibrate", "all"):
        calibrate(a)
    if a.phase in ("sweep", "all"):
        sweep(a)


if __name__ == "__main__":
    main()
