"""What tracing costs a run: ``tflaunch up`` of the benchmark (1 PS + 1 worker, models.benchmark)
three ways, interleaved, --repeats times each:

  - plain:  no tracing;
  - hooked: ``--trace-at 24h``: every task gets the trace hook (sitecustomize on PYTHONPATH,
            the profiler server started when TensorFlow loads, the capture helper waiting) but the
            window never opens: what the hook costs an untraced stretch of a run;
  - traced: ``--trace 10:10``: a real capture of 10 timed steps in the middle of the run.

For each it prints the benchmark's own ``total images/sec`` (its timed loop only) and the run's
wall time, as medians, and the ratios against plain from the same run (the claim: hooked
costs at most 2 %, i.e. plain/hooked images/sec <= 1.02). Also the start-up of ``python -c pass``
with and without the hook, for a task that never imports TensorFlow.

The machine may be shared: quote the ratios, which are measured side by side, not the rates.

Usage: python benchmarks/trace_cost.py [--repeats 3] [--num_batches 60] [--modes plain,hooked,traced]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tflaunch.trace.files import with_hook  # noqa: E402

MODES = {"plain": [], "hooked": ["--trace-at", "24h"], "traced": ["--trace", "10:10"]}
TOTAL = re.compile(r"total images/sec: ([\d.]+)")


def cluster_file(folder: Path, num_batches: int, port: int) -> Path:
    argv = [sys.executable, "-m", "tflaunch.models.benchmark", "--model", "resnet50"]
    argv += ["--image_size", "32", "--batch_size", "8", "--num_batches", str(num_batches)]
    argv += ["--num_warmup_batches", "5", "--display_every", "5"]
    data = {
        "name": "trace-cost",
        "backend": "local",
        "program": {"argv": argv, "env": {"OMP_NUM_THREADS": "1"}},
        "roles": {"ps": 1, "worker": 1},
        "ports": {"ps": port, "worker": port + 10},
        "supervision": {"ready_timeout": 300, "sample_interval": 0},
        "runs_dir": str(folder / "runs"),
    }
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def one_run(cluster: Path, mode: str) -> tuple[float, float, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "tflaunch", "up", str(cluster), *MODES[mode]],
        cwd=ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=900,
    )
    wall = time.perf_counter() - started
    found = TOTAL.findall(result.stdout)
    if result.returncode != 0 or not found:
        raise SystemExit(f"{mode} run failed ({result.returncode}):\n{result.stdout[-3000:]}")
    verdict = [x for x in result.stdout.splitlines() if x.startswith(("trace:", "no trace"))]
    return float(found[-1]), wall, (verdict[-1] if verdict else "")


def startup_ms(repeats: int) -> dict[str, tuple[float, float]]:
    """Start-up of `python -c pass` without and with the hook (interleaved): (median, fastest)
    in ms of each; the fastest is the figure a busy machine disturbs least."""
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Path(tmp) / "cluster_spec.json"
        cluster.write_text('{"cluster": {"worker": ["127.0.0.1:21000"]}}')
        plain = {k: v for k, v in os.environ.items() if not k.startswith("TFLAUNCH_")}
        hooked = with_hook(
            {
                **plain,
                "TFLAUNCH_TRACE_HOOK": "1",
                "TFLAUNCH_TRACE_DIR": str(Path(tmp) / "trace"),
                "TFLAUNCH_TASK": "worker:0",
                "TFLAUNCH_CLUSTER_FILE": str(cluster),
            }
        )
        times: dict[str, list[float]] = {"plain": [], "hooked": []}
        for _ in range(repeats):
            for name, env in (("plain", plain), ("hooked", hooked)):
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
                times[name].append(time.perf_counter() - t0)
    return {k: (statistics.median(v) * 1e3, min(v) * 1e3) for k, v in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--num_batches", type=int, default=60)
    p.add_argument("--port", type=int, default=26230)
    p.add_argument("--modes", default=",".join(MODES), help="which of plain,hooked,traced")
    args = p.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if "plain" not in modes or any(m not in MODES for m in modes):
        p.error(f"--modes: plain and any of {', '.join(MODES)}")
    start = startup_ms(21)
    (plain_med, plain_min), (hooked_med, hooked_min) = start["plain"], start["hooked"]
    print(
        f"python -c pass start-up, 21 interleaved runs: plain median {plain_med:.1f} ms, fastest "
        f"{plain_min:.1f} ms; with the hook median {hooked_med:.1f} ms, fastest "
        f"{hooked_min:.1f} ms (+{hooked_min - plain_min:.1f} ms fastest to fastest)",
        flush=True,
    )
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = cluster_file(Path(tmp), args.num_batches, args.port)
        for i in range(args.repeats):
            for mode in modes:
                img_s, wall, verdict = one_run(cluster, mode)
                results[mode].append((img_s, wall))
                print(
                    f"repeat {i + 1} {mode:7s} {img_s:8.1f} img/s  {wall:6.1f} s wall  {verdict}",
                    flush=True,
                )
    med = {
        m: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
        for m, rs in results.items()
    }
    print(
        f"\nmedians of {args.repeats} interleaved runs (resnet50 32x32, batch 8, 1 PS + 1 worker):"
    )
    for mode, (img_s, wall) in med.items():
        ratio = med["plain"][0] / img_s
        # Each repeat's own pair (run back to back): the ratio least moved by the machine's load.
        pairs = [p[0] / m[0] for p, m in zip(results["plain"], results[mode], strict=True)]
        print(
            f"  {mode:7s} {img_s:8.1f} img/s  plain/{mode} = {ratio:.3f} (median of paired "
            f"ratios {statistics.median(pairs):.3f}, range {min(pairs):.3f}-{max(pairs):.3f})"
            f"   wall {wall:6.1f} s ({wall / med['plain'][1]:.3f} x plain)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
