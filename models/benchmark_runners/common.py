"""The pieces of the CNN benchmark that its program and both runners share.

The program (:mod:`tflaunch.models.benchmark`) parses flags and dispatches; the runners
(:mod:`.graph` for TF1 between-graph replication, :mod:`.eager` for ``tf.function`` and
MultiWorkerMirroredStrategy) build and run the step. Both runners need the timed loop, the
statistics and the error type: they live here, below all three, so nothing imports upward.
No TensorFlow here.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

OPTIMIZERS = ("sgd", "momentum")
TRANSFER_ORDERS = ("none", "tic", "tac")


def pack_sizes(nbytes: Sequence[int], bytes_per_pack: int) -> list[int]:
    """How MultiWorkerMirroredStrategy packs dense gradients of these sizes (bytes, in the order
    given) for one batched all-reduce: it reverses the list (the last layer's gradients come
    first) and starts a new pack once the current one holds more than ``bytes_per_pack``; 0 puts
    everything in one pack. Returns the number of tensors in each pack, in launch order
    (TensorFlow's ``cross_device_utils.group_by_size``, which tests check this against)."""
    if bytes_per_pack <= 0:
        return [len(nbytes)] if nbytes else []
    packs: list[int] = []
    filled = 0
    for size in reversed(nbytes):
        if not packs or filled > bytes_per_pack:
            packs.append(0)
            filled = 0
        packs[-1] += 1
        filled += size
    return packs


def bytes_per_pack_for(nbytes: Sequence[int], packs: int) -> int:
    """``--gradient_repacking N``: the ``bytes_per_pack`` that splits these gradients into about
    N packs (at most N: a pack closes only once it holds more than the total / N); 0 for N < 2,
    TensorFlow's default, one pack."""
    if packs < 2:
        return 0
    return max(1, -(-sum(nbytes) // packs))


def cut_buckets(order: Sequence[int], nbytes: Sequence[int], bucket_bytes: int) -> list[list[int]]:
    """``--all_reduce_bucket_mb``: the gradients (indices, in ``order``: the order the backward
    pass produces them) cut into buckets that each close once they hold ``bucket_bytes`` on the
    wire (as PyTorch DDP's ``bucket_cap_mb``), so a bucket's all-reduce can start as soon as its
    last gradient exists; 0 or less: one bucket."""
    buckets: list[list[int]] = []
    filled = 0
    for i in order:
        if not buckets or (bucket_bytes > 0 and filled >= bucket_bytes):
            buckets.append([])
            filled = 0
        buckets[-1].append(i)
        filled += nbytes[i]
    return buckets


class BenchmarkError(Exception):
    """Bad flags or cluster description; the message says what to change."""


@dataclass
class Timing:
    """What one worker measured."""

    warmup_times: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    elapsed: float = 0.0
    start_time: float = 0.0
    end_time: float = 0.0
    final_loss: float | None = None


def perf_stats(batch_size: int, step_times: Sequence[float]) -> tuple[float, float, float]:
    """(mean images/sec, standard error, jitter) over per-step times, as tf_cnn_benchmarks."""
    times = np.asarray(step_times, dtype=np.float64)
    speeds = batch_size / times
    mean = batch_size / float(np.mean(times))
    uncertainty = float(np.std(speeds) / np.sqrt(len(speeds)))
    jitter = 1.4826 * float(np.median(np.abs(speeds - np.median(speeds))))
    return mean, uncertainty, jitter


def perf_line(step: int, batch_size: int, step_times: Sequence[float]) -> str:
    """``<step>\\timages/sec: X +/- Y (jitter = Z)``."""
    mean, uncertainty, jitter = perf_stats(batch_size, step_times)
    return f"{step}\timages/sec: {mean:.1f} +/- {uncertainty:.1f} (jitter = {jitter:.1f})"


def should_display(step: int, display_every: int) -> bool:
    """Display the first timed step and every ``display_every``-th (1-based, as tf_cnn)."""
    return step == 1 or (display_every > 0 and step % display_every == 0)


def timed_loop(
    step: Callable[[], object],
    num_warmup: int,
    num_batches: int,
    batch_size: int,
    display_every: int,
    barrier: Callable[[], None],
    log: Callable[[str], None],
) -> Timing:
    """Warm up, wait for every worker, then time ``num_batches`` steps one by one.

    The only per-step work beyond the step itself is two clock reads and a list append; the
    statistics are computed on display steps only.
    """
    timing = Timing()
    for _ in range(num_warmup):
        t0 = time.perf_counter()
        step()
        timing.warmup_times.append(time.perf_counter() - t0)
    barrier()
    log("Step\tImg/sec")
    times = timing.step_times
    timing.start_time = time.time()
    loop_start = time.perf_counter()
    result = None
    tracer = _tracer()
    for i in range(1, num_batches + 1):
        if tracer is None:
            t0 = time.perf_counter()
            result = step()
        else:
            tracer.at_step(i, times)
            t0 = time.perf_counter()
            result = tracer.run_step(step, i)
        times.append(time.perf_counter() - t0)
        if should_display(i, display_every):
            log(perf_line(i, batch_size, times))
    timing.elapsed = time.perf_counter() - loop_start
    timing.end_time = time.time()
    if tracer is not None:
        tracer.finish()
    timing.final_loss = _as_float(result)
    return timing


def timed_run(
    args: argparse.Namespace, step: Callable[[], object], barrier: Callable[[], None]
) -> Timing:
    """:func:`timed_loop` as the benchmark's flags say (``--num_warmup_batches``,
    ``--num_batches``, ``--batch_size``, ``--display_every``), its lines on stdout."""
    return timed_loop(
        step,
        args.num_warmup_batches,
        args.num_batches,
        args.batch_size,
        args.display_every,
        barrier,
        log,
    )


def _tracer():
    """The profiler window of a traced run (``tflaunch up --trace``), or None. The tracer
    imports TensorFlow: only a traced run loads it from here."""
    if not os.environ.get("TFLAUNCH_TRACE_STEPS"):
        return None
    from tflaunch.trace import profiler as trace

    return trace.active()


def images_per_sec(batch_size: int, timing: Timing) -> float:
    """This worker's throughput: images in its timed steps over the wall time of its timed loop."""
    return batch_size * len(timing.step_times) / timing.elapsed


def _as_float(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def log(line: str) -> None:
    print(line, flush=True)
