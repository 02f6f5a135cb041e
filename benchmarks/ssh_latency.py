"""Seconds from ``tflaunch up`` to "cluster ready" on 3 and 8 SSH test hosts, next to the cost of
one TensorFlow import measured in the same run.

Each host is a network namespace with its own sshd (tests/hosts/ssh_hosts.py; needs root). For
every host count the launch is timed with two programs:

* ``fake``: a stand-in task without TensorFlow (tests/programs/fake_task.py): the launcher's own
  cost — parallel connect, pre-flight, plan upload, agent start, PS readiness;
* ``mnist``: the real distributed MNIST (models/mnist.py): what a user waits for, dominated by
  every task importing TensorFlow and starting its server (on this machine's shared cores).

The cluster has one worker per host and 2 PS; once ready it is stopped with SIGINT. Figures are
medians over ``--repeats`` launches. For the stand-in, where the time went is printed too, from
the run's ``ssh_timings``: opening every host (each host's connect, directories over SFTP,
pre-flight probe and plan upload run as one pipeline per host, all hosts at once), and the median
and slowest host of each step. The hosts run this checkout's tflaunch (``ssh.python`` is a
wrapper setting PYTHONPATH), not whatever is installed. Usage (as root)::

    python benchmarks/ssh_latency.py [--repeats 3] [--hosts 3 8 32 64] [--programs fake]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import checkout_python  # noqa: E402
from tests.hosts import ssh_hosts  # noqa: E402

FAKE_TASK = ROOT / "tests" / "programs" / "fake_task.py"
CHECKOUT = ROOT  # the tflaunch measured (--checkout)
SUPERVISION: dict = {}  # --sample-interval


def tf_import_seconds(repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import tensorflow"], check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def cluster_file(work: Path, hosts: ssh_hosts.TestHosts, count: int, program: str) -> Path:
    base = random.randint(20000, 32000)  # below the ephemeral range (32768-)
    if program == "fake":
        argv, workdir = [sys.executable, str(FAKE_TASK)], str(work)
        env = {"WORK_SECONDS": "600"}
    else:
        argv = [sys.executable, "-m", "tflaunch.models.mnist", "--train_steps", "100000"]
        workdir, env = str(ROOT), {}
    data = {
        "name": f"bench-{program}-{count}",
        "backend": "ssh",
        "program": {"argv": argv, "workdir": workdir, "env": env},
        "roles": {"ps": 2, "worker": count},
        "placement": {"workers_per_host": 1},
        "ports": {"ps": base, "worker": base + 100},
        "supervision": {"grace_period": 2, "ready_timeout": 300, **SUPERVISION},
        "runs_dir": str(work / "runs"),
        "hosts": hosts.cluster_hosts(count),
        "ssh": hosts.ssh_section(checkout_python(work, CHECKOUT), work / "remote"),
    }
    path = work / f"{program}-{count}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def step_figures(runs_dir: Path) -> dict[str, float]:
    """Where the newest run's opening went: the whole of it, and each step's median and max."""
    newest = max(runs_dir.iterdir(), key=lambda p: p.stat().st_mtime)
    meta = json.loads((newest / "run.json").read_text())
    if "ssh_timings" not in meta:
        return {}  # a checkout that does not record them
    timings = meta.get("ssh_timings", {})
    figures = {"open": meta.get("ssh_open_seconds", float("nan"))}
    for step in ("connect", "prepare", "preflight", "plan"):
        values = [t[step] for t in timings.values() if step in t]
        if values:
            figures[f"{step} median"] = statistics.median(values)
            figures[f"{step} max"] = max(values)
    return figures


def time_to_ready(cluster: Path, hosts: ssh_hosts.TestHosts) -> float:
    """Seconds from starting ``tflaunch up`` to its "cluster ready" line; then stop the run."""
    with tempfile.TemporaryFile("w+") as errors:  # read back only when the run fails
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tflaunch", "up", str(cluster)],
            env={**os.environ, "PYTHONPATH": str(CHECKOUT)},
            cwd=cluster.parent,  # not a checkout: `-m tflaunch` would import the one in the cwd
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
        ready = None
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if "[tflaunch] cluster ready" in line:
                    ready = time.perf_counter() - started
                    break
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate(timeout=10)
        if ready is None:
            errors.seek(0)
            raise RuntimeError(
                f"{cluster.name}: the run ended before it was ready:\n{errors.read()[-3000:]}"
            )
    deadline = time.monotonic() + 30
    while any(ssh_hosts.processes_in(h) for h in hosts.hosts) and time.monotonic() < deadline:
        time.sleep(0.2)
    return ready


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hosts", type=int, nargs="+", default=[3, 8])
    parser.add_argument(
        "--programs", nargs="+", choices=["fake", "mnist"], default=["fake", "mnist"]
    )
    parser.add_argument(
        "--checkout",
        type=Path,
        default=ROOT,
        help="the tflaunch checkout to measure, launcher and hosts (default: this one)",
    )
    parser.add_argument(
        "--sample-interval",
        type=float,
        default=None,
        help="supervision.sample_interval of the runs (default: the cluster file's, 1 s); the "
        "test hosts share one process table, so N agents each scan it every second",
    )
    args = parser.parse_args()
    global CHECKOUT
    CHECKOUT = args.checkout.resolve()
    if args.sample_interval is not None:
        SUPERVISION["sample_interval"] = args.sample_interval
    problem = ssh_hosts.missing_requirements()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    with ssh_hosts.session(max(args.hosts)) as hosts:  # no test session tears them down
        return _measure(args, hosts)


def _measure(args: argparse.Namespace, hosts: ssh_hosts.TestHosts) -> int:
    work = Path(tempfile.mkdtemp(prefix="tfl-ssh-bench-"))
    try:
        tf_import = tf_import_seconds(args.repeats) if "mnist" in args.programs else float("nan")
        print(
            f"one TensorFlow import (python -c 'import tensorflow'), median of {args.repeats}: "
            f"{tf_import:.2f} s"
        )
        print(
            f"{'hosts':>5}  {'tasks':>5}  {'program':<7}  {'up -> ready (median)':>20}  "
            f"{'runs':<24}  {'/ TF import':>10}"
        )
        for count in args.hosts:
            for program in args.programs:
                cluster = cluster_file(work, hosts, count, program)
                runs, steps = [], []
                for _ in range(args.repeats):
                    runs.append(time_to_ready(cluster, hosts))
                    steps.append(step_figures(work / "runs"))
                median = statistics.median(runs)
                shown = ", ".join(f"{r:.2f}" for r in runs)
                print(
                    f"{count:>5}  {count + 2:>5}  {program:<7}  {median:>18.2f} s  "
                    f"{shown:<24}  {median / tf_import:>9.1f}x",
                    flush=True,
                )
                if steps[0]:
                    where = {k: statistics.median(s[k] for s in steps) for k in steps[0]}
                    print("       " + ", ".join(f"{k} {v:.2f} s" for k, v in where.items()))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
