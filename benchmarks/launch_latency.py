"""Launch latency of the local backend on examples/local.yaml, next to the cost of importing TF.

Prints, as medians over --repeats runs (one machine, one run of this script):
  - `python -c "import tensorflow"`: the floor any TensorFlow task pays before it can listen;
  - up -> cluster ready: from starting `tflaunch up` to every task started and every PS port
    accepting connections (the PS have imported TensorFlow by then);
  - last worker exit -> up returns: the teardown (PS stopped, agents ended, run state written).

Usage: python benchmarks/launch_latency.py [--repeats 3] [--train-steps 40]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import ready_and_last_worker_exit  # noqa: E402


def free_base() -> int:
    for base in range(21000, 32000, 50):  # below the ephemeral range (32768-)
        ok = True
        for port in range(base, base + 20):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free ports")


def time_import() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import tensorflow"], check=True, capture_output=True)
    return time.perf_counter() - start


def one_run(work: Path, train_steps: int) -> dict[str, float]:
    config = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
    config["program"]["argv"] += ["--train_steps", str(train_steps)]
    base = free_base()
    config["ports"] = {"ps": base, "worker": base + 10}
    config["runs_dir"] = str(work / "runs")
    cluster = work / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(config))
    started = time.time()
    result = subprocess.run(
        [sys.executable, "-m", "tflaunch", "up", str(cluster)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    ended = time.time()
    if result.returncode != 0:
        raise RuntimeError(f"run failed ({result.returncode}):\n{result.stderr[-2000:]}")
    run_dir = max((work / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    ready, last_exit = ready_and_last_worker_exit(run_dir)
    return {"up_to_ready": ready - started, "teardown": ended - last_exit}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=40)
    args = parser.parse_args()
    imports = [time_import() for _ in range(args.repeats)]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            runs.append(one_run(Path(tmp), args.train_steps))
    tf_import = statistics.median(imports)
    ready = statistics.median(r["up_to_ready"] for r in runs)
    teardown = statistics.median(r["teardown"] for r in runs)
    print(f"runs: {args.repeats} (medians)")
    print(f"python -c 'import tensorflow':      {tf_import:6.2f} s")
    print(
        f"tflaunch up -> cluster ready:       {ready:6.2f} s  ({ready / tf_import:.2f}x one TF import)"
    )
    print(f"last worker exit -> up returns:     {teardown:6.2f} s")


if __name__ == "__main__":
    main()
