"""What the benchmark harness costs: tflaunch.models.benchmark against a bare tf.function training loop.

Two measurements in one process, same model, batch, image size and synthetic batch (kept in
variables):

1. Whole program, alternating rounds (A B A B ...). A: ``tflaunch.models.benchmark.main`` exactly as
   ``python -m tflaunch.models.benchmark`` runs it (single process: warm-up, barrier, per-step timing,
   progress lines, JSON result); its ``worker images/sec``. B: a bare ``tf.function`` step
   (forward, loss, gradients, SGD update) looped as fast as it goes after the same warm-up;
   images / wall time. Per-round ratios A/B and medians.
2. Interleaved blocks, for a ratio that the load of a shared machine disturbs less: the
   benchmark's own step (``tflaunch.models.benchmark_runners.eager.single_step``) inside its own timed loop
   (``tflaunch.models.benchmark_runners.common.timed_loop``) against the bare step in a bare loop, in alternating
   blocks of a few steps; medians of the per-pair ratios of wall time and of process CPU time
   (CPU time is far less disturbed by other processes on a shared machine).
3. The timed loop's own bookkeeping per step (clock reads, list append, display check), on a
   no-op step, against a bare Python loop: an upper bound of what the harness adds per step.

A ratio of 1.00 means the harness costs nothing; the issue asks for at least 0.97. The defaults
are also the reference figure asked for: InceptionV3, batch 8, NHWC, 299x299, one worker.

    python benchmarks/harness_overhead.py [--rounds 3] [--num_batches 15] [--pairs 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from tflaunch.models.benchmark import build_parser, validate  # noqa: E402
from tflaunch.models.benchmark import main as benchmark_main  # noqa: E402
from tflaunch.models.benchmark_runners.common import timed_loop  # noqa: E402
from tflaunch.models.benchmark_runners.eager import loss_fn, single_step  # noqa: E402
from tflaunch.models.registry import get_model_spec  # noqa: E402


def bare_step(model_name: str, batch: int, size: int):
    """A plain tf.function SGD step on a fixed synthetic batch: the baseline."""
    spec = get_model_spec(model_name)
    model = spec.build(spec.default_num_classes, "NHWC")
    variables = model.trainable_variables
    images = tf.Variable(tf.random.uniform([batch, size, size, 3], -1.0, 1.0), trainable=False)
    labels = tf.Variable(
        tf.random.uniform([batch], 0, spec.default_num_classes, tf.int32), trainable=False
    )

    @tf.function
    def step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(model, images, labels)
        for var, grad in zip(variables, tape.gradient(loss, variables), strict=True):
            var.assign_sub(0.005 * grad)
        return loss

    return step


def bare_loop(step, batch: int, steps: int) -> float:
    """Images/sec of ``step`` looped ``steps`` times with nothing else in the loop."""
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return batch * steps / (time.perf_counter() - start)


def bare_program(model_name: str, batch: int, size: int, warmup: int, steps: int) -> float:
    step = bare_step(model_name, batch, size)
    for _ in range(warmup):
        step()
    return bare_loop(step, batch, steps)


def harness(model_name: str, batch: int, size: int, warmup: int, steps: int) -> float:
    """The benchmark program's own ``worker images/sec`` for the same settings."""
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        argv = [
            "--model", model_name, "--batch_size", str(batch), "--image_size", str(size),
            "--num_batches", str(steps), "--num_warmup_batches", str(warmup),
            "--display_every", "10", "--data_format", "NHWC", "--result_json", result,
        ]  # fmt: skip
        if benchmark_main(argv) != 0:
            raise SystemExit("tflaunch.models.benchmark failed")
        with open(result, encoding="utf-8") as f:
            return float(json.load(f)["images_per_sec"]["worker"])


def interleaved(a: argparse.Namespace) -> tuple[list[float], list[float]]:
    """Per-pair ratios, wall time and process CPU time: the benchmark's step in its timed loop
    against the bare step in a bare loop (ratio > 1: the harness is faster / uses less CPU)."""
    args = build_parser().parse_args(
        ["--model", a.model, "--batch_size", str(a.batch_size), "--image_size", str(a.image_size)]
    )
    validate(args)
    ours, bare = single_step(args), bare_step(a.model, a.batch_size, a.image_size)
    for _ in range(a.num_warmup_batches):
        ours()
        bare()

    def harness_block() -> tuple[float, float]:
        cpu = time.process_time()
        timing = timed_loop(ours, 0, a.block, a.batch_size, 0, lambda: None, lambda _line: None)
        return timing.elapsed, time.process_time() - cpu

    def bare_block() -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        bare_loop(bare, a.batch_size, a.block)
        return time.perf_counter() - wall, time.process_time() - cpu

    wall_ratios, cpu_ratios = [], []
    for i in range(a.pairs):  # alternate which goes first, so a drifting load cancels out
        if i % 2 == 0:
            h, b = harness_block(), bare_block()
        else:
            b, h = bare_block(), harness_block()
        wall_ratios.append(b[0] / h[0])
        cpu_ratios.append(b[1] / h[1])
    return wall_ratios, cpu_ratios


def loop_cost_us(steps: int = 200_000) -> float:
    """Extra time per step of the benchmark's timed loop over a bare loop, on a no-op step."""

    def noop() -> None:
        return None

    start = time.perf_counter()
    for _ in range(steps):
        noop()
    bare = time.perf_counter() - start
    timing = timed_loop(noop, 0, steps, 1, 10**9, lambda: None, lambda _line: None)
    return (timing.elapsed - bare) / steps * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="inception3")
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--image_size", type=int, default=299)
    p.add_argument("--num_batches", type=int, default=15)
    p.add_argument("--num_warmup_batches", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pairs", type=int, default=8, help="interleaved block pairs")
    p.add_argument("--block", type=int, default=3, help="steps per interleaved block")
    a = p.parse_args()
    settings = (a.model, a.batch_size, a.image_size, a.num_warmup_batches, a.num_batches)
    ours: list[float] = []
    bare: list[float] = []
    for r in range(1, a.rounds + 1):
        ours.append(harness(*settings))
        bare.append(bare_program(*settings))
        print(
            f"round {r}: harness {ours[-1]:.2f} images/sec, bare loop {bare[-1]:.2f} images/sec, "
            f"ratio {ours[-1] / bare[-1]:.3f}",
            flush=True,
        )
    wall, cpu = interleaved(a)
    print("interleaved wall-time ratios: " + " ".join(f"{r:.3f}" for r in wall))
    print("interleaved CPU-time ratios:  " + " ".join(f"{r:.3f}" for r in cpu))
    loop_us = loop_cost_us()
    h, b = statistics.median(ours), statistics.median(bare)
    round_ratio = statistics.median(x / y for x, y in zip(ours, bare, strict=True))
    step_s = a.batch_size / b
    print("=" * 64)
    print(
        f"{a.model} batch {a.batch_size} NHWC {a.image_size}x{a.image_size}, one worker "
        f"(single process, synthetic data)"
    )
    print(f"whole program, {a.rounds} rounds of {a.num_batches} timed steps (medians):")
    print(f"  harness (tflaunch.models.benchmark) images/sec: {h:.2f}")
    print(f"  bare tf.function loop images/sec:      {b:.2f}")
    print(f"  median per-round ratio harness/bare:   {round_ratio:.3f}")
    print(f"interleaved, {a.pairs} pairs of {a.block}-step blocks (harness/bare throughput):")
    print(f"  median wall-time ratio: {statistics.median(wall):.3f}")
    print(f"  median CPU-time ratio:  {statistics.median(cpu):.3f}")
    print(
        f"timed-loop bookkeeping: {loop_us:.2f} us per step = "
        f"{100 * loop_us * 1e-6 / step_s:.5f}% of a {step_s:.2f} s step"
    )


if __name__ == "__main__":
    main()
