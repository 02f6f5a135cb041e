"""The CSCS-style sweep on one many-core host, with the performance model beside each row.

    python benchmarks/manycore_sweep.py --out DIR [--workers 1,2,4,8] [--ps 1,2,3,4]
        [--updates parameter_server,...] [--repeats 3] [--cpus-per-task K] [--intra N]
        [--batch 32] [--image 149] [--steps 30] [--warmup 10] [--phase calibrate|sweep|all]

calibrate: (1) one lone worker (no cluster), bound to K cores like a pinned task, gives the
compute time per step, and W lone workers at once on cores of their own (each worker count of
the sweep that fits) give it under contention for caches and memory bandwidth; (2) ``tflaunch netbench`` on a 1 PS + 1 worker cluster of this host gives
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
import statistics
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


def lone_workers(a: argparse.Namespace, count: int) -> float:
    """``count`` lone workers (no cluster) at once, each bound to K cores of its own (all cores
    if unpinned and alone): the median of their images/sec."""
    cores = sorted(os.sched_getaffinity(0))
    k = a.cpus_per_task or len(cores)
    if count * k > len(cores):
        raise SystemExit(f"{count} workers x {k} cores do not fit {len(cores)} cores")
    t0 = time.time()
    procs = [
        subprocess.Popen(
            bench_argv(a),
            cwd=ROOT,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda i=i: os.sched_setaffinity(0, cores[i * k : (i + 1) * k]),
        )
        for i in range(count)
    ]
    rates = []
    for proc in procs:
        out = proc.communicate()[0]
        m = re.search(r"^worker images/sec: ([\d.]+)$", out, re.M)
        if not m:
            raise SystemExit("lone worker failed:\n" + out[-3000:])
        rates.append(float(m.group(1)))
    rate = statistics.median(rates)
    print(
        f"{count} lone worker(s) on {k} cores each: {rate:.2f} images/sec ({time.time() - t0:.0f} s)"
    )
    return rate


def calibrate(a: argparse.Namespace) -> None:
    rate = lone_workers(a, 1)
    # Compute contention (the model's assumption 7): as many lone workers at once as the sweep
    # runs workers, each on cores of its own, when they fit.
    cores = len(os.sched_getaffinity(0))
    contention = [
        f"{w}={lone_workers(a, w)}"
        for w in sorted({int(w) for w in a.workers.split(",")})
        if w > 1 and a.cpus_per_task and w * a.cpus_per_task <= cores
    ]
    nb = cluster_file(a, a.out / "netbench.yaml", 1, 1, [sys.executable, "-c", "pass"])
    out = tflaunch("netbench", str(nb), "--sizes", "1K,1M,16M,64M", "--ps-model", "none")
    run = re.search(r"wrote (\S+)/netbench\.json", out).group(1)
    tflaunch(
        "model", "--netbench", run, "--compute-img-s", str(rate), "--batch-size", str(a.batch),
        "--save", str(a.out / "inputs.json"), "--workers", a.workers, "--ps", a.ps,
        "--no-nic",  # every task on this one host: loopback, no NIC shared by a host's streams
        *(f"--compute-img-s-at={c}" for c in contention),
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
