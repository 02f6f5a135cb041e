"""tf_cnn_benchmarks-style CNN training throughput, carried forward to TensorFlow 2.

    python -m tflaunch.models.benchmark --model inception3 --batch_size 8 --num_batches 100 \
        [--variable_update parameter_server|distributed_replicated|collective_all_reduce] \
        [--data_dir DIR] [--job_name worker --task_index 0 --ps_hosts ... --worker_hosts ...]

Flag names follow tf_cnn_benchmarks. The cluster comes from ``--job_name/--task_index/--ps_hosts/
--worker_hosts`` when given, else from ``TF_CONFIG``, else the run is a single process.

Variable updates (one device per worker: ``--batch_size`` is per worker):

* ``parameter_server``: TF1 between-graph replication in ``tf.compat.v1`` graph mode. Variables
  (and optimizer slots) live on the PS tasks, placed by ``replica_device_setter`` (round robin,
  or ``--variable_placement``); each worker reads them every step, computes gradients and applies
  them on the PS, asynchronously to the other workers.
* ``distributed_replicated``: as in tf_cnn_benchmarks, each worker keeps a local copy of the
  variables (on ``--local_parameter_device``) for its forward and backward pass; the gradients
  are applied to the master copy on the PS, and the updated values are copied back into the local
  copy in the same step.
* ``collective_all_reduce``: TF2 ``MultiWorkerMirroredStrategy``: every worker holds a mirrored
  copy and gradients are summed by collective (ring) all-reduce every step, synchronously. PS
  tasks are not used; if the cluster has some (one cluster file for every variable update), they
  start a server and idle until the launcher stops them.
* No cluster: one process trains with a ``tf.function`` step, variables on
  ``--local_parameter_device``.

PS tasks start a ``tf.distribute.Server`` and join (block) until they are stopped.

Output: every ``--display_every`` timed steps a line ``<step>\\timages/sec: X +/- Y (jitter = Z)``
for this worker (mean over the timed steps so far, standard error, and 1.4826 x MAD of the per-step
rates, as tf_cnn_benchmarks computes them), then::

    worker images/sec: A       this worker: batch_size x timed steps / wall time of its timed loop
    total images/sec: T        the sum of A over all workers

Every worker prints the same total: the workers exchange their A through the cluster (a variable
on PS 0, or an all-reduce) before printing it. All workers wait at a barrier after warm-up so that
their timed windows overlap. ``--result_json PATH`` writes settings, per-step times and the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow's C++ runtime loads

import numpy as np  # noqa: E402

VARIABLE_UPDATES = ("parameter_server", "distributed_replicated", "collective_all_reduce")
OPTIMIZERS = ("sgd", "momentum")
PLACEMENTS = ("round_robin", "greedy", "lpt", "partitioned")  # models/placement.py


class BenchmarkError(Exception):
    """Bad flags or cluster description; the message says what to change."""


@dataclass(frozen=True)
class ClusterInfo:
    """This process's place in the cluster. ``cluster`` maps job names to host:port lists."""

    cluster: dict[str, list[str]]
    job: str
    index: int

    @property
    def workers(self) -> list[tuple[str, int]]:
        """Training tasks in rank order: the chief (if any) first, then the workers."""
        chief = [("chief", i) for i in range(len(self.cluster.get("chief", [])))]
        return chief + [("worker", i) for i in range(len(self.cluster.get("worker", [])))]

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def num_ps(self) -> int:
        return len(self.cluster.get("ps", []))

    @property
    def is_worker(self) -> bool:
        return (self.job, self.index) in self.workers

    @property
    def rank(self) -> int:
        return self.workers.index((self.job, self.index))


def resolve_cluster(
    job_name: str | None,
    task_index: int,
    ps_hosts: str | None,
    worker_hosts: str | None,
    tf_config: str | None,
) -> ClusterInfo | None:
    """The cluster from the TF1-style flags, else from TF_CONFIG, else None (single process)."""
    if job_name:
        cluster = {
            "ps": _split_hosts(ps_hosts),
            "worker": _split_hosts(worker_hosts),
        }
        cluster = {job: hosts for job, hosts in cluster.items() if hosts}
        info = ClusterInfo(cluster, job_name, task_index)
    elif tf_config:
        try:
            parsed = json.loads(tf_config)
            cluster = {str(k): list(v) for k, v in parsed["cluster"].items()}
            task = parsed["task"]
            info = ClusterInfo(cluster, str(task["type"]), int(task["index"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BenchmarkError(
                f"TF_CONFIG is not a valid cluster description ({exc!r}): expected JSON like "
                '{"cluster": {"ps": [...], "worker": [...]}, "task": {"type": "worker", '
                '"index": 0}}.'
            ) from None
    else:
        return None
    if info.job == "evaluator":  # TF_CONFIG lists no evaluator job; it has no part here
        return info
    if info.job not in info.cluster or not 0 <= info.index < len(info.cluster[info.job]):
        raise BenchmarkError(
            f"task {info.job}:{info.index} is not in the cluster {info.cluster}; check "
            "--job_name/--task_index against --ps_hosts/--worker_hosts (or TF_CONFIG)."
        )
    if not info.workers:
        raise BenchmarkError("the cluster has no worker (or chief) task to train on.")
    return info


def _split_hosts(hosts: str | None) -> list[str]:
    return [h.strip() for h in (hosts or "").split(",") if h.strip()]


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
    for i in range(1, num_batches + 1):
        t0 = time.perf_counter()
        result = step()
        times.append(time.perf_counter() - t0)
        if should_display(i, display_every):
            log(perf_line(i, batch_size, times))
    timing.elapsed = time.perf_counter() - loop_start
    timing.end_time = time.time()
    timing.final_loss = _as_float(result)
    return timing


def images_per_sec(batch_size: int, timing: Timing) -> float:
    """This worker's throughput: images in its timed steps over the wall time of its timed loop."""
    return batch_size * len(timing.step_times) / timing.elapsed


def _as_float(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tflaunch.models.benchmark",
        description="CNN training throughput (tf_cnn_benchmarks flags) on a TF cluster.",
    )
    p.add_argument("--model", default="inception3", help="inception3 or resnet50")
    p.add_argument("--batch_size", type=int, default=32, help="images per step per worker")
    p.add_argument("--num_batches", type=int, default=100, help="timed steps")
    p.add_argument("--num_warmup_batches", type=int, default=10, help="untimed steps first")
    p.add_argument("--data_format", default="NHWC", choices=("NHWC", "NCHW"))
    p.add_argument("--variable_update", default="parameter_server", choices=VARIABLE_UPDATES)
    p.add_argument("--local_parameter_device", default="cpu", choices=("cpu", "gpu"))
    p.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS)
    p.add_argument("--learning_rate", type=float, default=0.005)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument(
        "--variable_placement",
        default=None,
        choices=PLACEMENTS,
        help="how variables are spread over the PS tasks (parameter_server and "
        "distributed_replicated); default: replica_device_setter's round robin",
    )
    p.add_argument("--data_dir", default=None, help="ImageNet-layout TFRecords; default synthetic")
    p.add_argument(
        "--image_size", type=int, default=None, help="default: the model's (299 for inception3)"
    )
    p.add_argument(
        "--num_classes", type=int, default=None, help="default: 1001 as tf_cnn_benchmarks"
    )
    p.add_argument("--display_every", type=int, default=10)
    p.add_argument("--num_intra_threads", type=int, default=0, help="0: TensorFlow chooses")
    p.add_argument("--num_inter_threads", type=int, default=0, help="0: TensorFlow chooses")
    p.add_argument("--result_json", default=None, help="write settings, step times, figures here")
    p.add_argument("--job_name", default=None, help="ps or worker (TF1-style cluster flags)")
    p.add_argument("--task_index", type=int, default=0)
    p.add_argument("--ps_hosts", default=None, help="comma-separated host:port list")
    p.add_argument("--worker_hosts", default=None, help="comma-separated host:port list")
    return p


def validate(args: argparse.Namespace) -> None:
    """Flag checks that need no TensorFlow; raises BenchmarkError saying what to change."""
    from tflaunch.models.nets import MODELS

    if args.model not in MODELS:
        raise BenchmarkError(f"unknown --model {args.model!r}; choose one of: {', '.join(MODELS)}")
    spec = MODELS[args.model]
    if args.image_size is None:
        args.image_size = spec.default_image_size
    if args.num_classes is None:
        args.num_classes = spec.default_num_classes
    if args.image_size < spec.min_image_size:
        raise BenchmarkError(
            f"--image_size {args.image_size} is too small for {args.model}: the smallest input it "
            f"accepts is {spec.min_image_size}x{spec.min_image_size}."
        )
    for name in ("batch_size", "num_batches", "num_classes"):
        if getattr(args, name) < 1:
            raise BenchmarkError(f"--{name} must be at least 1, not {getattr(args, name)}.")
    if args.num_warmup_batches < 0:
        raise BenchmarkError("--num_warmup_batches must not be negative.")
    from tflaunch.models.layers import DataFormatError, check_data_format

    try:
        check_data_format(args.data_format)
    except DataFormatError as exc:
        raise BenchmarkError(str(exc)) from None
    if args.local_parameter_device == "gpu":
        import tensorflow as tf

        if not tf.config.list_physical_devices("GPU"):
            raise BenchmarkError(
                "--local_parameter_device gpu, but no GPU is visible to this process; "
                "use --local_parameter_device cpu."
            )
    if args.data_dir is not None:
        from tflaunch.models.tfrecords import list_shards

        try:
            list_shards(args.data_dir)
        except FileNotFoundError as exc:
            raise BenchmarkError(str(exc)) from None


def result_document(
    args: argparse.Namespace,
    info: ClusterInfo | None,
    timing: Timing,
    worker_rate: float,
    total_rate: float,
) -> dict:
    """The JSON result: settings, cluster shape, per-step times and the figures."""
    mean, uncertainty, jitter = perf_stats(args.batch_size, timing.step_times)
    return {
        "settings": vars(args),
        "cluster": {
            "num_ps": info.num_ps if info else 0,
            "num_workers": info.num_workers if info else 1,
            "task": f"{info.job}:{info.index}" if info else "local",
        },
        "timing": asdict(timing),
        "images_per_sec": {
            "worker": worker_rate,
            "total": total_rate,
            "step_mean": mean,
            "step_uncertainty": uncertainty,
            "step_jitter": jitter,
        },
    }


def log(line: str) -> None:
    print(line, flush=True)


def run(args: argparse.Namespace, info: ClusterInfo | None) -> int:
    """Dispatch to the PS join, the graph-mode runner or the tf.function runner."""
    if info is not None and info.job == "ps":
        from tflaunch.models.bench_graph import run_ps

        run_ps(args, info)
        return 0
    if info is not None and not info.is_worker:
        log(f"task {info.job}:{info.index} has no part in the benchmark; exiting.")
        return 0
    if info is not None and args.variable_update != "collective_all_reduce":
        from tflaunch.models.bench_graph import run_worker
    else:
        from tflaunch.models.bench_eager import run_worker
    timing, total_rate = run_worker(args, info)
    worker_rate = images_per_sec(args.batch_size, timing)
    log("-" * 64)
    log(f"worker images/sec: {worker_rate:.2f}")
    log(f"total images/sec: {total_rate:.2f}")
    log("-" * 64)
    if args.result_json:
        document = result_document(args, info, timing, worker_rate, total_rate)
        with open(args.result_json, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=1)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        validate(args)
        info = resolve_cluster(
            args.job_name,
            args.task_index,
            args.ps_hosts,
            args.worker_hosts,
            os.environ.get("TF_CONFIG"),
        )
        return run(args, info)
    except BenchmarkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy: the runners import tflaunch.models.benchmark,
    # and its exception and dataclass types must be the ones main() catches.
    from tflaunch.models.benchmark import main as _main

    sys.exit(_main())
