"""What resource sampling costs an agent: CPU time of the sampler thread at 1 Hz with 8 tasks.

Starts 8 stand-in tasks shaped like TensorFlow tasks (a Python process with 32 threads and one
child process each), then runs the agent's real ``Sampler`` thread over them for --duration
seconds, emitting through the agent's real ``LineEmitter`` (JSON lines into a pipe drained by a
reader thread, as the launcher drains an agent). Prints, measured in this one run:

  - the sampler thread's own CPU time over the period, as % of one core (the claim: <= 1 %);
  - the same for an idle baseline thread waking at 1 Hz (the floor of any periodic thread);
  - CPU time per sample (median of --repeats back-to-back samples) and its parts: the process
    scan, the 8 task trees, the node (CPU, memory, interfaces), JSON encoding;
  - the coordinator's cost to store one sample line (parse + write), paid on the launcher;
  - how many processes and interfaces this machine has: the scan grows with them.

Usage: python benchmarks/sampling_cost.py [--duration 30] [--tasks 8] [--interval 1] [--repeats 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tflaunch.runtime import protocol  # noqa: E402
from tflaunch.runtime.agent import LineEmitter  # noqa: E402
from tflaunch.runtime.monitor import SampleLog, Sampler, TreeSampler, process_tree  # noqa: E402

TASK = """
import subprocess, threading, time
child = subprocess.Popen(["sleep", "1000"])
for _ in range(31):
    threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()
print("up", flush=True)
time.sleep(1000)
"""


def start_tasks(count: int) -> list[subprocess.Popen]:
    tasks = [
        subprocess.Popen(
            [sys.executable, "-c", TASK], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        for _ in range(count)
    ]
    for task in tasks:
        task.stdout.readline()
    return tasks


def stop_tasks(tasks: list[subprocess.Popen]) -> None:
    for task in tasks:
        os.killpg(task.pid, 9)
        task.wait(timeout=10)


def run_sampler(pids: dict[str, int], interval: float, duration: float) -> tuple[float, int]:
    """The agent's sampler for ``duration`` s; returns (its thread CPU seconds, samples emitted)."""
    read_end, write_end = os.pipe()
    reader = os.fdopen(read_end, "r")
    lines = []
    drain = threading.Thread(target=lambda: lines.extend(iter(reader.readline, "")), daemon=True)
    drain.start()
    writer = os.fdopen(write_end, "w")
    emitter = LineEmitter(writer, "bench")
    sampler = Sampler(interval, lambda: pids, lambda event: emitter(event.wire()))
    sampler.start()
    time.sleep(duration)
    cpu = sampler.cpu_seconds  # the loop's own CPU time, taken after each sample
    sampler.stop(final=False)
    writer.close()
    drain.join(timeout=5)
    return cpu, len(lines)


def run_idle_baseline(interval: float, duration: float) -> float:
    """CPU seconds of a thread that only wakes at the same rate."""
    stop, result = threading.Event(), []

    def loop() -> None:
        start = time.thread_time()
        while not stop.wait(interval):
            pass
        result.append(time.thread_time() - start)

    thread = threading.Thread(target=loop)
    thread.start()
    time.sleep(duration)
    stop.set()
    thread.join()
    return result[0]


def cpu_ms(action, repeats: int) -> float:
    """Median thread CPU milliseconds of one call."""
    costs = []
    for _ in range(repeats):
        start = time.thread_time()
        action()
        costs.append((time.thread_time() - start) * 1000)
    return statistics.median(costs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()

    tasks = start_tasks(args.tasks)
    try:
        pids = {f"worker:{i}": t.pid for i, t in enumerate(tasks)}
        trees, _ = process_tree(list(pids.values()))
        processes = sum(len(t) for t in trees.values())
        threads = sum(psutil.Process(p).num_threads() for t in trees.values() for p in t)

        with tempfile.TemporaryDirectory() as scratch:
            baseline = run_idle_baseline(args.interval, args.duration)
            sampler_cpu, emitted = run_sampler(pids, args.interval, args.duration)

            warm = TreeSampler()
            warm.sample(pids)
            per_sample = cpu_ms(lambda: warm.sample(pids), args.repeats)
            scan = cpu_ms(lambda: process_tree(list(pids.values())), args.repeats)
            node = cpu_ms(warm._sample_node, args.repeats)
            event = protocol.Sample(warm.sample(pids)).wire()
            encode = cpu_ms(lambda: json.dumps(event), args.repeats)
            line = json.dumps({"time": 1.0, "host": "bench", **event})
            log = SampleLog(scratch)
            store = cpu_ms(lambda: log.write("bench", json.loads(line)), args.repeats)
            log.close()
    finally:
        stop_tasks(tasks)

    share = 100 * sampler_cpu / args.duration
    floor = 100 * baseline / args.duration
    print(
        f"machine: {len(psutil.pids())} processes, {len(psutil.net_io_counters(pernic=True))} "
        f"network interfaces, {psutil.cpu_count()} CPUs"
    )
    print(
        f"sampled: {args.tasks} tasks = {processes} processes, {threads} threads; "
        f"interval {args.interval:g} s for {args.duration:g} s ({emitted} samples emitted, "
        f"{len(line)} bytes each)"
    )
    print(
        f"sampler thread CPU: {sampler_cpu * 1000:.1f} ms over {args.duration:g} s = "
        f"{share:.3f} % of one core"
    )
    print(f"idle 1 Hz thread (baseline): {baseline * 1000:.2f} ms = {floor:.4f} % of one core")
    print(
        f"per sample (median of {args.repeats}): {per_sample:.2f} ms CPU — process scan "
        f"{scan:.2f} ms, node {node:.2f} ms, JSON {encode:.2f} ms; every {args.interval:g} s "
        f"that is {per_sample / (10 * args.interval):.3f} % of one core"
    )
    print(f"coordinator, per sample stored (parse + write): {store:.3f} ms CPU")
    verdict = "within" if share <= 1.0 else "ABOVE"
    print(
        f"result: sampling at {1 / args.interval:g} Hz with {args.tasks} tasks costs "
        f"{share:.3f} % of one core, {verdict} the 1 % budget"
    )


if __name__ == "__main__":
    main()
