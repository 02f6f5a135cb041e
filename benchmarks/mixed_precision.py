"""tflaunch.models.benchmark with ``--mixed_precision bf16`` against the bare ``tf.function`` loop of
benchmarks/harness_overhead.py at float32, in alternating rounds of separate processes (the
precision is a per-process graph option, so the two cannot share one process).

    python benchmarks/mixed_precision.py [--rounds 2] [--num_batches 30] [--batch_size 8]

Each round: A = ``python -m tflaunch.models.benchmark --model inception3 --batch_size 8
--num_batches 30 --mixed_precision bf16`` (its ``worker images/sec``); B = the bare loop, same
warm-up and steps (images / wall time). Printed: every round, the median per-round ratio A/B,
and the CPU seconds each process used per timed step (less disturbed by a shared machine's load).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BARE = """
import json, os, sys, time
sys.path.insert(0, {root!r}); sys.path.insert(0, {bench!r})
from harness_overhead import bare_step
step = bare_step("inception3", {batch}, 299)
for _ in range({warmup}): step()
t0, c0 = time.perf_counter(), time.process_time()
for _ in range({steps}): step()
w, c = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({{"img_s": {batch} * {steps} / w, "cpu_per_step": c / {steps}}}))
"""


def ours(a: argparse.Namespace) -> float:
    argv = [sys.executable, "-m", "tflaunch.models.benchmark", "--model", "inception3",
            "--batch_size", str(a.batch_size), "--num_batches", str(a.num_batches),
            "--num_warmup_batches", str(a.warmup), "--data_format", "NHWC",
            "--mixed_precision", "bf16"]  # fmt: skip
    out = subprocess.run(argv, cwd=ROOT, text=True, capture_output=True, check=True).stdout
    return float(re.search(r"^worker images/sec: ([\d.]+)$", out, re.M).group(1))


def bare(a: argparse.Namespace) -> tuple[float, float]:
    code = BARE.format(
        root=str(ROOT),
        bench=str(ROOT / "benchmarks"),
        batch=a.batch_size,
        warmup=a.warmup,
        steps=a.num_batches,
    )
    out = subprocess.run([sys.executable, "-c", code], text=True, capture_output=True, check=True)
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    return doc["img_s"], doc["cpu_per_step"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--num_batches", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch_size", type=int, default=8)
    a = p.parse_args()
    ratios = []
    for r in range(1, a.rounds + 1):
        a_rate = ours(a)
        b_rate, b_cpu = bare(a)
        ratios.append(a_rate / b_rate)
        print(
            f"round {r}: ours bf16 {a_rate:.2f} img/s, bare float32 {b_rate:.2f} img/s "
            f"(bare CPU {b_cpu:.2f} s/step), ratio {a_rate / b_rate:.3f}",
            flush=True,
        )
    print(f"median ratio ours(bf16)/bare(float32): {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
