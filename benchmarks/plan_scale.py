"""Seconds and peak memory of planning large clusters: ``validate``, ``plan --json``, ``render
--task`` and the planning one Slurm node does at job start, for 64 to 4,096 nodes of 8 GPUs.

The clusters are the shape of the issue that asked for this (issue 11): 8 GPUs a node, 8 workers
a node (one per GPU), one co-located PS per 8 nodes. The SSH clusters list every node inline under
``hosts:`` (the cluster file grows with the cluster, as a user's would); the Slurm cluster gets its
nodes from ``SLURM_JOB_NODELIST``, as inside a job, where every node plans its own tasks and the
shared cluster; ``validate`` and ``plan`` run on that Slurm file too (``(slurm)``), which spares
them the SSH backend's paramiko import. Tasks read the cluster from ``{cluster_file}``
(``program.tf_config: false``):
past about 6,000 tasks a TF_CONFIG no longer fits one environment string.

Every measurement is a fresh process (``python -m tflaunch ...``, as a user runs it) timed by wall
clock; its peak RSS comes from ``wait4``. Each child runs under ``RLIMIT_AS`` (--memory-limit-mb)
and ``RLIMIT_CPU``, and so does this script, so a plan that runs away fails here instead of taking
the machine's memory. Prints one table and, with --json, the figures as JSON.

Usage: python benchmarks/plan_scale.py [--nodes 64 256 1024 4096] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
GPUS = 8

SLURM_NODE_PLAN = """
import os, sys
from pathlib import Path
from tflaunch.launchers.slurm.node import load_node
node = load_node(Path(sys.argv[1]), os.environ)
plan = node.own_plan()
assert plan.tasks_on(node.name), "the node got no tasks"
"""


def cluster_data(nodes: int, backend: str) -> dict:
    data = {
        "name": f"scale-{nodes}",
        "backend": backend,
        "program": {
            "argv": ["python3", "train.py", "--cluster_file", "{cluster_file}"],
            "tf_config": False,
        },
        "roles": {"ps": max(1, nodes // 8), "worker": nodes * GPUS},
        "placement": {"workers_per_host": GPUS},
    }
    if backend == "ssh":
        data["hosts"] = [
            {"name": f"nid{i:05d}", "address": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
             "gpus": GPUS}
            for i in range(nodes)
        ]  # fmt: skip
    else:
        data["slurm"] = {"nodes": nodes, "gpus_per_node": GPUS}
    return data


def limit_resources(memory_mb: int, cpu_s: int) -> None:
    """Soft limits (the children of this script may get their own, higher ones)."""
    for kind, value in ((resource.RLIMIT_AS, memory_mb << 20), (resource.RLIMIT_CPU, cpu_s)):
        resource.setrlimit(kind, (value, resource.getrlimit(kind)[1]))


def measure(
    argv: list[str], env: dict[str, str], memory_mb: int
) -> tuple[float, float, int, float]:
    """Wall seconds, peak RSS in MB, bytes written to stdout, and CPU seconds (user + system)
    of one child process. CPU time is the figure to trust on a machine shared with other work."""
    with tempfile.TemporaryFile() as out:
        started = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.PIPE,
            env=env,
            cwd=ROOT,
            preexec_fn=lambda: limit_resources(memory_mb, 120),
        )
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        stderr = proc.stderr.read().decode() if proc.stderr else ""
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv[:4])} ... failed ({proc.returncode}):\n{stderr}")
        size = out.tell()
    return seconds, usage.ru_maxrss / 1024, size, usage.ru_utime + usage.ru_stime


def slurm_run_dir(work: Path, nodes: int) -> Path:
    run_dir = work / f"slurm-run-{nodes}"
    run_dir.mkdir()
    text = yaml.safe_dump(cluster_data(nodes, "slurm"))
    (run_dir / "cluster.yaml").write_text(text)
    setup = {"run_id": f"scale-{nodes}", "cluster_file": str(run_dir / "cluster.yaml"),
             "base_dir": str(work)}  # fmt: skip
    (run_dir / "slurm.json").write_text(json.dumps(setup))
    return run_dir


def bench(nodes: int, work: Path, repeats: int, memory_mb: int) -> dict:
    ssh_file = work / f"ssh-{nodes}.yaml"
    ssh_file.write_text(yaml.safe_dump(cluster_data(nodes, "ssh")))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    last_worker = f"worker:{nodes * GPUS - 1}"
    mid_node = f"nid{nodes // 2:05d}"
    node_env = {
        **env,
        "SLURM_JOB_NODELIST": f"nid[00000-{nodes - 1:05d}]",
        "SLURMD_NODENAME": mid_node,
        "SLURM_PROCID": str(nodes // 2),
        "SLURM_JOB_ID": "1",
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(GPUS)),
    }
    run_dir = slurm_run_dir(work, nodes)
    tflaunch = [sys.executable, "-m", "tflaunch"]
    commands = {
        "validate": (tflaunch + ["validate", str(ssh_file)], env),
        "plan --json": (tflaunch + ["plan", "--json", str(ssh_file)], env),
        "render --task": (
            tflaunch + ["render", str(ssh_file), "--task", last_worker, "--format", "env"],
            env,
        ),
        "slurm node plan": ([sys.executable, "-c", SLURM_NODE_PLAN, str(run_dir)], node_env),
        # the same commands on the Slurm file: no paramiko import (0.2 s) and no host list
        "validate (slurm)": (tflaunch + ["validate", str(run_dir / "cluster.yaml")], env),
        "plan --json (slurm)": (tflaunch + ["plan", "--json", str(run_dir / "cluster.yaml")], env),
    }
    figures = {}
    for name, (argv, child_env) in commands.items():
        runs = [measure(argv, child_env, memory_mb) for _ in range(repeats)]
        figures[name] = {
            "seconds": statistics.median(r[0] for r in runs),
            "cpu_seconds": statistics.median(r[3] for r in runs),
            "peak_rss_mb": max(r[1] for r in runs),
            "stdout_bytes": runs[0][2],
        }
    return {"nodes": nodes, "tasks": nodes * GPUS + max(1, nodes // 8), "figures": figures}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--repeats", type=int, default=3, help="median of this many runs")
    parser.add_argument(
        "--memory-limit-mb",
        type=int,
        default=2048,
        help="address-space limit of each measured process (and 1 GB for this script)",
    )
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args()
    limit_resources(1024, 3600)
    results = []
    with tempfile.TemporaryDirectory(prefix="plan-scale-") as tmp:
        for nodes in args.nodes:
            results.append(bench(nodes, Path(tmp), args.repeats, args.memory_limit_mb))
            print_row(results[-1])
    print_ratios(results)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


def print_row(result: dict) -> None:
    if result is None:
        return
    cells = [
        f"{name} {f['seconds']:.2f} s ({f['cpu_seconds']:.2f} s CPU) {f['peak_rss_mb']:.0f} MB"
        for name, f in result["figures"].items()
    ]
    size = result["figures"]["plan --json"]["stdout_bytes"] / 1e6  # (the SSH file's plan)
    print(
        f"{result['nodes']:>5} nodes x {GPUS} ({result['tasks']:>6} tasks): "
        + " | ".join(cells)
        + f" | plan.json {size:.1f} MB",
        flush=True,
    )


def print_ratios(results: list[dict]) -> None:
    by_nodes = {r["nodes"]: r for r in results}
    if 4096 not in by_nodes or 1024 not in by_nodes:
        return
    big, small = by_nodes[4096]["figures"], by_nodes[1024]["figures"]
    cells = [
        f"{name} {big[name]['seconds'] / small[name]['seconds']:.2f}x time "
        f"({big[name]['cpu_seconds'] / small[name]['cpu_seconds']:.2f}x CPU), "
        f"{big[name]['peak_rss_mb'] / small[name]['peak_rss_mb']:.2f}x memory"
        for name in big
    ]
    print("4096 / 1024: " + " | ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
