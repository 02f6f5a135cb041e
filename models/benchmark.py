"""tf_cnn_benchmarks-style CNN training throughput, carried forward to TensorFlow 2.

    python -m tflaunch.models.benchmark --model inception3 --batch_size 8 --num_batches 100 \
        [--variable_update parameter_server|distributed_replicated|collective_all_reduce] \
        [--staged_vars] [--transfer_order none|tic|tac] [--transfer_buckets 8] \
        [--cross_replica_sync [--per_variable_sync]] [--gradient_repacking N] \
        [--compact_gradient_transfer] [--all_reduce_bucket_mb MB] \
        [--data_dir DIR] [--job_name worker --task_index 0 --ps_hosts ... --worker_hosts ...]

Flag names follow tf_cnn_benchmarks. The cluster comes from ``--job_name/--task_index/--ps_hosts/
--worker_hosts`` when given, else from a cluster file (``--cluster_file`` or
``$TFLAUNCH_CLUSTER_FILE``), else from ``TF_CONFIG`` (:mod:`tflaunch.models.cluster`), else the
run is a single process. ``--model`` takes tf_cnn_benchmarks' names (:mod:`.registry`).

Variable updates (one device per worker: ``--batch_size`` is per worker):

* ``parameter_server``: TF1 between-graph replication in ``tf.compat.v1`` graph mode. Variables
  (and optimizer slots) live on the PS tasks, placed by ``replica_device_setter`` (round robin,
  or ``--variable_placement``); each worker reads them every step, computes gradients and applies
  them on the PS, asynchronously to the other workers; with ``--cross_replica_sync``, in lock
  step: every worker waits at the end of each step until all have applied theirs
  (tf_cnn_benchmarks' default and its barrier, FIFO queues on the PS).
* ``distributed_replicated``: as in tf_cnn_benchmarks, each worker keeps a local copy of the
  variables (on ``--local_parameter_device``) for its forward and backward pass; the gradients
  are applied to the master copy on the PS, and the updated values are copied back into the local
  copy in the same step. ``--cross_replica_sync`` as for parameter_server.
* ``--per_variable_sync`` (parameter_server with ``--cross_replica_sync``): no step-end
  barrier; the chief applies each variable's mean gradient (all workers', once) as soon as it is
  in and releases that variable alone to the workers' next reads (:mod:`.benchmark_runners.sync_vars`).
* ``--staged_vars`` (parameter_server) and ``--transfer_order tic|tac`` (both TF1 modes) change
  when the variables cross the link, not what is computed: see :mod:`.benchmark_runners.transfers`.
* ``collective_all_reduce``: TF2 ``MultiWorkerMirroredStrategy``: every worker holds a mirrored
  copy and gradients are summed by collective (ring) all-reduce every step, synchronously. PS
  tasks are not used; if the cluster has some (one cluster file for every variable update), they
  start a server and idle until the launcher stops them. Always synchronous.
  ``--gradient_repacking N`` packs the gradients into about N all-reduces (MWMS's
  ``bytes_per_pack``), so the first packs cross while the backward pass still runs;
  ``--compact_gradient_transfer`` sends them as float16 (summed in float16, averaged and applied
  in float32). ``--all_reduce_bucket_mb X`` cuts them instead into buckets of X MB on the wire in
  the order the backward pass produces them (the graph's), one all-reduce each, launched as soon
  as the bucket's gradients exist while the rest of the backward pass runs.
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
``--result_variables`` adds the model's trainable variables (what ``tflaunch tune`` sizes by).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow's C++ runtime loads

from tflaunch.models.benchmark_runners.common import (  # noqa: E402
    OPTIMIZERS,
    TRANSFER_ORDERS,
    BenchmarkError,
    Timing,
    images_per_sec,
    log,
    perf_stats,
)
from tflaunch.models.cluster import (  # noqa: E402
    ClusterError,
    ClusterInfo,
    add_cluster_flags,
    cluster_from_args,
)
from tflaunch.models.placement_math import STRATEGIES  # noqa: E402
from tflaunch.models.registry import (  # noqa: E402
    VARIABLE_UPDATES,
    UnknownModelError,
    get_model_spec,
    model_names,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tflaunch.models.benchmark",
        description="CNN training throughput (tf_cnn_benchmarks flags) on a TF cluster.",
    )
    p.add_argument(
        "--model",
        default="inception3",
        help=f"one of {', '.join(model_names(benchmark=True, aliases=True))}",
    )
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
        choices=STRATEGIES,
        help="how variables are spread over the PS tasks (parameter_server and "
        "distributed_replicated); default: replica_device_setter's round robin",
    )
    p.add_argument(
        "--staged_vars",
        action="store_true",
        help="parameter_server: fetch the variables for step N+1 while step N computes and "
        "updates (as tf_cnn_benchmarks); a step's values are at most one step older",
    )
    p.add_argument(
        "--transfer_order",
        default="none",
        choices=TRANSFER_ORDERS,
        help="order of the variables' transfers to a worker (parameter_server, "
        "distributed_replicated): none (as they come), tic (the forward pass's consumption "
        "order, from the graph), tac (from a profiled step's op times)",
    )
    p.add_argument(
        "--transfer_buckets",
        type=int,
        default=8,
        help="with --transfer_order: buckets of about equal bytes sent one after another",
    )
    p.add_argument(
        "--cross_replica_sync",
        type=_boolean,
        nargs="?",
        const=True,
        default=False,
        help="parameter_server, distributed_replicated: synchronous steps (every worker waits "
        "for all at the end of each step, as tf_cnn_benchmarks' default); default asynchronous. "
        "collective_all_reduce is always synchronous",
    )
    p.add_argument(
        "--per_variable_sync",
        type=_boolean,
        nargs="?",
        const=True,
        default=False,
        help="parameter_server with --cross_replica_sync: no step-end barrier; each variable "
        "is applied (the mean of every worker's gradient, once) and released to the workers "
        "as soon as its gradients are in",
    )
    p.add_argument(
        "--gradient_repacking",
        type=int,
        default=0,
        help="collective_all_reduce: all-reduce the gradients in about N packs of equal bytes "
        "(0: TensorFlow's default, one pack after the whole backward pass)",
    )
    p.add_argument(
        "--compact_gradient_transfer",
        type=_boolean,
        nargs="?",
        const=True,
        default=False,
        help="collective_all_reduce: gradients cross the wire as float16 and are applied in "
        "float32 (half the bytes)",
    )
    p.add_argument(
        "--all_reduce_bucket_mb",
        type=float,
        default=0.0,
        help="collective_all_reduce: all-reduce the gradients in buckets of this many MB on the "
        "wire, in the order the backward pass produces them, each launched as soon as its "
        "gradients exist (0: off; `tflaunch model` suggests a size for the link)",
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
    p.add_argument(
        "--mixed_precision",
        default="none",
        choices=("none", "bf16"),
        help="bf16: TensorFlow's oneDNN auto mixed precision (convolutions and matrix products "
        "in bfloat16 where the CPU has it; not numerically equivalent to float32, so opt-in)",
    )
    p.add_argument("--result_json", default=None, help="write settings, step times, figures here")
    p.add_argument(
        "--result_variables",
        action="store_true",
        help="with --result_json: the model's trainable variables too (name, shape, dtype size; "
        "built once more in a graph, nothing computed), what tflaunch tune sizes the model by",
    )
    add_cluster_flags(p)
    return p


def _boolean(text: str) -> bool:
    """absl's spellings of a boolean flag's value (``--cross_replica_sync=false``)."""
    value = text.strip().lower()
    if value in ("1", "true", "t", "yes", "y"):
        return True
    if value in ("0", "false", "f", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r} (true or false)")


def resolve_cluster(args: argparse.Namespace, environ: Mapping[str, str]) -> ClusterInfo | None:
    """This task's cluster (tflaunch.models.cluster), or None: a single process."""
    try:
        return cluster_from_args(args, environ)
    except ClusterError as exc:
        raise BenchmarkError(str(exc)) from None


def validate(args: argparse.Namespace) -> None:
    """Flag checks that need no TensorFlow; raises BenchmarkError saying what to change."""
    try:
        spec = get_model_spec(args.model, benchmark=True)
    except UnknownModelError as exc:
        raise BenchmarkError(str(exc)) from None
    args.model = spec.name  # an alias runs (and is reported) as the model's main name
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
    check_transfer_flags(args)
    from tflaunch.models.nets.layers import DataFormatError, check_data_format

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
        from tflaunch.models.data.imagenet import list_shards

        try:
            list_shards(args.data_dir)
        except FileNotFoundError as exc:
            raise BenchmarkError(str(exc)) from None


def check_transfer_flags(args: argparse.Namespace) -> None:
    """--staged_vars and --transfer_order only where the graph runner can apply them."""
    if args.staged_vars and args.variable_update != "parameter_server":
        raise BenchmarkError(
            f"--staged_vars stages the reads of the PS's variables, which only --variable_update "
            f"parameter_server makes every step; {args.variable_update} keeps local copies. "
            "Drop --staged_vars or use parameter_server."
        )
    if args.transfer_order != "none" and args.variable_update == "collective_all_reduce":
        raise BenchmarkError(
            "--transfer_order orders the transfers of variables from the PS, which "
            "collective_all_reduce does not use; use parameter_server or distributed_replicated."
        )
    if args.per_variable_sync and not (
        args.variable_update == "parameter_server" and args.cross_replica_sync
    ):
        raise BenchmarkError(
            "--per_variable_sync replaces the synchronous step-end barrier of parameter_server; "
            "give --variable_update parameter_server --cross_replica_sync."
        )
    if args.per_variable_sync and (args.staged_vars or args.transfer_order != "none"):
        raise BenchmarkError(
            "--per_variable_sync gates each variable's read itself; drop --staged_vars and "
            "--transfer_order."
        )
    if args.transfer_buckets < 1:
        raise BenchmarkError(f"--transfer_buckets must be at least 1, not {args.transfer_buckets}.")
    all_reduce = args.variable_update == "collective_all_reduce"
    if args.gradient_repacking < 0:
        raise BenchmarkError(
            f"--gradient_repacking must not be negative, not {args.gradient_repacking}."
        )
    if args.all_reduce_bucket_mb < 0:
        raise BenchmarkError(
            f"--all_reduce_bucket_mb must not be negative, not {args.all_reduce_bucket_mb}."
        )
    shaped = args.gradient_repacking or args.compact_gradient_transfer or args.all_reduce_bucket_mb
    if shaped and not all_reduce:
        raise BenchmarkError(
            "--gradient_repacking, --compact_gradient_transfer and --all_reduce_bucket_mb shape "
            f"the all-reduce of the gradients, which {args.variable_update} does not do (its "
            "gradients go to the PS); use --variable_update collective_all_reduce."
        )
    if args.gradient_repacking > 1 and args.all_reduce_bucket_mb:
        raise BenchmarkError(
            "--gradient_repacking and --all_reduce_bucket_mb both cut the gradients into "
            "all-reduces; give one of them."
        )


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
            "num_workers": info.num_training_tasks if info else 1,
            "task": f"{info.job_name}:{info.task_index}" if info else "local",
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


def run(args: argparse.Namespace, info: ClusterInfo | None) -> int:
    """Dispatch to the PS join, the graph-mode runner or the tf.function runner."""
    if os.environ.get("TFLAUNCH_TRACE_STEPS"):  # tflaunch up --trace: every task takes part
        from tflaunch.trace import profiler as trace

        trace.setup(info)
    if info is not None and info.job_name == "ps":
        from tflaunch.models.benchmark_runners.graph import run_ps

        run_ps(args, info)
        return 0
    if info is not None and not info.is_training_task:
        log(f"task {info.job_name}:{info.task_index} has no part in the benchmark; exiting.")
        return 0
    if args.mixed_precision == "bf16":  # before any graph is optimised
        import tensorflow as tf

        tf.config.optimizer.set_experimental_options({"auto_mixed_precision_onednn_bfloat16": True})
    if info is None and (args.staged_vars or args.transfer_order != "none"):
        log("one process, no PS: --staged_vars and --transfer_order have nothing to move.")
    if info is not None and args.variable_update != "collective_all_reduce":
        from tflaunch.models.benchmark_runners.graph import run_worker
    else:
        from tflaunch.models.benchmark_runners.eager import run_worker
    timing, total_rate = run_worker(args, info)
    worker_rate = images_per_sec(args.batch_size, timing)
    log("-" * 64)
    log(f"worker images/sec: {worker_rate:.2f}")
    log(f"total images/sec: {total_rate:.2f}")
    log("-" * 64)
    if args.result_json:
        document = result_document(args, info, timing, worker_rate, total_rate)
        if args.result_variables:
            from tflaunch.models.placement import trainable_rows

            spec = get_model_spec(args.model, benchmark=True)
            document["variables"] = trainable_rows(
                lambda: spec.build(args.num_classes, args.data_format)
            )
        with open(args.result_json, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=1)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        validate(args)
        info = resolve_cluster(args, os.environ)
        if info is not None:
            log(f"{info.name}: cluster from {info.source}")
        return run(args, info)
    except BenchmarkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
