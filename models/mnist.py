"""Distributed MNIST, the case study: TensorFlow's "deep MNIST" net trained with between-graph
replication on parameter servers, written TF1-style with ``tf.compat.v1``.

Every task runs this same program; its role comes from the command line, as TF1-era launch scripts
pass it::

    python -m tflaunch.models.mnist --job_name worker --task_index 1 \\
        --ps_hosts localhost:2230 --worker_hosts localhost:2220,localhost:2221

or, when those flags are absent, from a cluster file (``--cluster_file``, else
``$TFLAUNCH_CLUSTER_FILE``; tflaunch writes one for clusters too large for TF_CONFIG), else from
``TF_CONFIG``: :mod:`tflaunch.models.cluster`, as every program here.

* ``ps`` tasks start a ``tf.distribute.Server`` and ``join()``: they never exit by themselves.
* ``chief``/``worker`` tasks build the graph under ``replica_device_setter`` (variables on the PS,
  compute on the task itself) and train with ``MonitoredTrainingSession`` until the shared global
  step reaches ``--train_steps``. The chief (the ``chief`` task, else worker 0) initialises the
  variables and reports ``test accuracy: X``; every training task reports ``train accuracy: X``
  (the final shared model on up to 2000 training images) and ``steps/sec: Y`` (its own steps,
  first step excluded as warm-up).
* an ``evaluator`` task (not part of the training cluster) uses PS 0 as its session master and
  evaluates the test set every ``--eval_interval_secs`` and once more when the global step reaches
  ``--train_steps``; then it exits 0. It prints ``test-set accuracy`` (not the chief's line).

What keeps a run from hanging (TF 2.x can otherwise leave a late non-chief worker waiting forever):

* every session's ``device_filters`` name only the PS and the task itself, so no task waits for
  another worker to be up (or still alive);
* each training task increments a ``workers_done`` counter on the PS when it has finished, and the
  chief keeps running (bounded by ``--worker_wait_secs``) until every training task has done so: a
  launcher that stops the PS when the chief exits never strands a slow worker, and a worker that
  starts after training ended finds the PS, reads the final step and stops without an update;
* non-chief workers poll for the chief's initialisation five times a second instead of
  MonitoredTrainingSession's 30 s sleep;
* a watchdog thread bounds what TensorFlow leaves unbounded (session creation against a PS that is
  down, MonitoredSession re-creating its session after losing a PS) and exits 1 with a message.

Exit codes: 0 success; 1 TensorFlow runtime failure or a timeout; 2 bad flags, cluster or data.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow's C++ runtime loads
# Slurm's --signal reaches every process of the job step at once, maybe while TensorFlow
# still loads: ignored until the program says otherwise, it cannot kill a task.
for _warning in (signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(_warning, signal.SIG_IGN)
STARTED = time.monotonic()  # before importing TensorFlow: reported times include that import

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tflaunch.models import placement  # noqa: E402
from tflaunch.models.cluster import (  # noqa: E402
    TRAINING_JOBS,
    ClusterError,
    ClusterInfo,
    add_cluster_flags,
    cluster_from_args,
)
from tflaunch.models.data import digits  # noqa: E402
from tflaunch.models.nets.deep_mnist import build_on_placeholder, deep_mnist  # noqa: E402
from tflaunch.models.placement_math import STRATEGIES  # noqa: E402
from tflaunch.models.program import (  # noqa: E402
    UsageError,
    error_exit,
    positive_float,
    positive_int,
)

v1 = tf.compat.v1

TRAIN_EVAL_EXAMPLES = 2000
EVAL_CHUNK = 500


class TaskTimeout(Exception):
    """Another task did not do its part in time (exit 1); the message names the flag to raise."""


class Watchdog:
    """Ends the process with exit code 1 when a phase outlasts its deadline.

    TensorFlow's session creation waits for every task its device filters name, with no timeout
    (``operation_timeout_in_ms`` does not cover it), and MonitoredSession answers a lost PS by
    re-creating its session, which then waits the same way: a PS that is down or gone would hang
    a worker forever. Blocking calls run inside ``watchdog.phase(...)``; a daemon thread enforces
    the deadline.
    """

    def __init__(self, task: str) -> None:
        self._task = task
        self._lock = threading.Lock()
        self._current: tuple[str, float, str, float] | None = None  # what, secs, flag, deadline
        threading.Thread(target=self._watch, name="watchdog", daemon=True).start()

    @contextlib.contextmanager
    def phase(self, what: str, seconds: float, flag: str) -> Iterator[None]:
        with self._lock:
            outer, self._current = self._current, (what, seconds, flag, time.monotonic() + seconds)
        try:
            yield
        finally:
            with self._lock:
                self._current = outer

    def _watch(self) -> None:
        while True:
            time.sleep(0.25)
            with self._lock:
                current = self._current
            if current is not None and time.monotonic() > current[3]:
                what, seconds, flag, _ = current
                print(
                    f"{self._task}: error: {what} did not finish within {seconds:g} s ({flag}); "
                    "are the PS up and reachable, and the chief running?",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(1)


# ----------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mnist",
        description="Distributed deep-MNIST training (between-graph replication, PS + workers).",
    )
    add_cluster_flags(parser)
    train = parser.add_argument_group("training")
    train.add_argument("--train_steps", type=positive_int, default=200, help="global steps")
    train.add_argument("--batch_size", type=positive_int, default=50)
    train.add_argument("--learning_rate", type=positive_float, default=1e-3, help="Adam's")
    train.add_argument("--dropout", type=float, default=0.0, help="dense-layer drop rate [0, 1)")
    train.add_argument("--data_format", choices=("NHWC", "NCHW"), default="NHWC")
    train.add_argument("--data_dir", help="MNIST IDX files or mnist.npz; default: sklearn digits")
    train.add_argument("--seed", type=int, default=1)
    train.add_argument("--log_every", type=positive_int, default=20, help="local steps")
    train.add_argument("--variable_placement", choices=STRATEGIES, default="round_robin")
    train.add_argument(
        "--checkpoint_dir",
        default=os.environ.get("TFLAUNCH_CHECKPOINT_DIR") or None,
        help="the chief saves here and a restarted cluster resumes from it "
        "(default $TFLAUNCH_CHECKPOINT_DIR; unset: no checkpoints)",
    )
    train.add_argument(
        "--checkpoint_steps", type=positive_int, default=100, help="global steps between saves"
    )
    runtime = parser.add_argument_group("runtime")
    runtime.add_argument("--intra_op_threads", type=positive_int, default=1, help="per process")
    runtime.add_argument("--inter_op_threads", type=positive_int, default=2, help="per process")
    runtime.add_argument(
        "--op_timeout_secs",
        type=positive_float,
        default=60.0,
        help="bound on one training step or evaluation; then exit 1",
    )
    runtime.add_argument(
        "--startup_timeout_secs",
        type=positive_float,
        default=300.0,
        help="bound on reaching the PS and the chief's initialisation; then exit 1",
    )
    runtime.add_argument(
        "--worker_wait_secs",
        type=positive_float,
        default=300.0,
        help="how long the chief waits for the other training tasks to finish; then exit 1",
    )
    runtime.add_argument(
        "--eval_interval_secs",
        type=positive_float,
        default=10.0,
        help="evaluator: seconds between test-set evaluations",
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if not 0.0 <= args.dropout < 1.0:
        raise UsageError(f"--dropout is a drop rate in [0, 1), got {args.dropout}")
    return args


# ----------------------------------------------------------------------------- cluster


def resolve_cluster(args: argparse.Namespace, environ: Mapping[str, str]) -> ClusterInfo:
    """The cluster from flags, a cluster file or TF_CONFIG (tflaunch.models.cluster); MNIST
    trains on parameter servers, so it needs at least one PS."""
    try:
        info = cluster_from_args(args, environ)
    except ClusterError as exc:
        raise UsageError(str(exc)) from None
    if info is None:
        raise UsageError(
            "no cluster: pass --job_name, --task_index, --ps_hosts and --worker_hosts "
            "(comma-separated host:port lists), or --cluster_file, or set TF_CONFIG"
        )
    if not info.num_ps:
        raise UsageError(f"{info.source}: the cluster has no ps task; give at least one PS address")
    return info


def check_data_format(data_format: str, gpus: Sequence[object]) -> None:
    if data_format == "NCHW" and not gpus:
        raise UsageError(
            "--data_format NCHW needs a GPU: TensorFlow's CPU convolutions support only NHWC, "
            "and no GPU is visible here; use --data_format NHWC"
        )


# ----------------------------------------------------------------------------- model and graph


@dataclass(frozen=True)
class Handles:
    """The tensors and ops of one task's graph."""

    graph: tf.Graph
    images: tf.Tensor
    labels: tf.Tensor
    drop_rate: tf.Tensor
    loss: tf.Tensor
    accuracy: tf.Tensor
    num_correct: tf.Tensor
    global_step: tf.Variable
    workers_done: tf.Variable
    mark_done: tf.Operation
    uninitialized: tf.Tensor
    train_op: tf.Operation | None


def build_graph(
    info: ClusterInfo, args: argparse.Namespace, compute_device: str, data_format: str, train: bool
) -> Handles:
    """One replica's graph: variables spread over the PS by ``replica_device_setter``, compute on
    ``compute_device``. The creation order is the same for every task (so round-robin placement
    agrees); the optimizer's slots come last, so an evaluator graph without them still matches."""
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(args.seed)
        ps_strategy = placement.ps_strategy_for_model(
            args.variable_placement,
            len(info.cluster["ps"]),
            lambda: build_on_placeholder(digits.NUM_CLASSES, data_format),
        )
        setter = v1.train.replica_device_setter(
            cluster=tf.train.ClusterSpec(info.cluster),
            worker_device=compute_device,
            ps_strategy=ps_strategy,
        )
        # tf.device rejects device functions in TF2; the compat.v1 form applies them.
        # variable_scope() shards large variables for --variable_placement partitioned.
        with v1.device(setter), ps_strategy.variable_scope():
            global_step = v1.train.get_or_create_global_step()
            workers_done = v1.get_variable(
                "workers_done", [], tf.int64, initializer=v1.zeros_initializer(), trainable=False
            )
            images = v1.placeholder(tf.float32, [None, 28, 28, 1], name="images")
            labels = v1.placeholder(tf.int64, [None], name="labels")
            drop_rate = v1.placeholder_with_default(0.0, [], name="drop_rate")
            logits = deep_mnist(images, data_format, drop_rate)
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
            )
            correct = tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32)
            train_op = None
            if train:
                optimizer = v1.train.AdamOptimizer(args.learning_rate)
                train_op = optimizer.minimize(loss, global_step=global_step)
            uninitialized = v1.report_uninitialized_variables()
            uninitialized.mark_used()  # only some roles run it; silence tf_should_use
            handles = Handles(
                graph=graph,
                images=images,
                labels=labels,
                drop_rate=drop_rate,
                loss=loss,
                accuracy=tf.reduce_mean(correct),
                num_correct=tf.reduce_sum(correct),
                global_step=global_step,
                workers_done=workers_done,
                mark_done=v1.assign_add(workers_done, 1).op,
                uninitialized=uninitialized,
                train_op=train_op,
            )
    return handles


def session_config(args: argparse.Namespace, device_filters: Sequence[str]) -> v1.ConfigProto:
    """Small thread pools (several TF processes share a few cores), a per-operation timeout so no
    run blocks forever, and device filters so a session only waits for the PS and this task."""
    return v1.ConfigProto(
        device_filters=list(device_filters),
        intra_op_parallelism_threads=args.intra_op_threads,
        inter_op_parallelism_threads=args.inter_op_threads,
        operation_timeout_in_ms=int(args.op_timeout_secs * 1000),
    )


def start_server(info: ClusterInfo, args: argparse.Namespace) -> tf.distribute.Server:
    threads = v1.ConfigProto(
        intra_op_parallelism_threads=args.intra_op_threads,
        inter_op_parallelism_threads=args.inter_op_threads,
    )
    spec = tf.train.ClusterSpec(info.jobs("ps", *TRAINING_JOBS))
    return tf.distribute.Server(
        spec, job_name=info.job_name, task_index=info.task_index, config=threads
    )


# ----------------------------------------------------------------------------- tasks


def say(info: ClusterInfo, message: str) -> None:
    print(f"{info.name}: {message}", flush=True)


def evaluate(sess: v1.Session, h: Handles, images: np.ndarray, labels: np.ndarray) -> float:
    """Accuracy of the current shared model, in chunks to bound memory."""
    correct = 0.0
    for start in range(0, len(labels), EVAL_CHUNK):
        feed = {
            h.images: images[start : start + EVAL_CHUNK],
            h.labels: labels[start : start + EVAL_CHUNK],
        }
        correct += float(sess.run(h.num_correct, feed_dict=feed))
    return correct / max(len(labels), 1)


def batches(
    images: np.ndarray, labels: np.ndarray, batch_size: int, rng: np.random.RandomState
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Endless shuffled mini-batches, a fresh permutation every epoch."""
    batch_size = min(batch_size, len(labels))
    while True:
        order = rng.permutation(len(labels))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            chosen = order[start : start + batch_size]
            yield images[chosen], labels[chosen]


def run_ps(info: ClusterInfo, args: argparse.Namespace) -> int:
    server = start_server(info, args)
    say(info, f"serving at {info.cluster['ps'][info.task_index]} ({server.target})")
    server.join()  # a PS never exits by itself; the launcher stops it
    return 0


def train_loop(
    info: ClusterInfo,
    args: argparse.Namespace,
    data: digits.DigitData,
    h: Handles,
    sess: v1.train.MonitoredSession,
    watchdog: Watchdog,
) -> float:
    """Train until the global step reaches --train_steps; return this task's steps/sec
    (the first step, which carries the graph set-up, excluded)."""
    rng = np.random.RandomState(args.seed * 1000 + info.rank)
    stream = batches(data.train_images, data.train_labels, args.batch_size, rng)
    steps, first_done, last_done = 0, 0.0, 0.0
    window = [0.0, 0.0, 0, time.monotonic()]  # loss sum, accuracy sum, steps, start
    while not sess.should_stop():
        x, y = next(stream)
        feed = {h.images: x, h.labels: y, h.drop_rate: args.dropout}
        with watchdog.phase("a training step", args.op_timeout_secs, "--op_timeout_secs"):
            _, loss, accuracy, global_step = sess.run(
                [h.train_op, h.loss, h.accuracy, h.global_step], feed_dict=feed
            )
        steps += 1
        last_done = time.monotonic()
        if steps == 1:
            first_done = last_done
        window = [window[0] + loss, window[1] + accuracy, window[2] + 1, window[3]]
        if steps % args.log_every == 0:
            say(
                info,
                f"step {steps} (global {global_step}): loss {window[0] / window[2]:.4f}, "
                f"train accuracy (batch mean) {window[1] / window[2]:.4f}, "
                f"{window[2] / (last_done - window[3]):.2f} steps/sec",
            )
            window = [0.0, 0.0, 0, last_done]
    if steps < 2:
        return 0.0
    return (steps - 1) / max(last_done - first_done, 1e-9)


def checkpoint_scaffold(h: Handles) -> v1.train.Scaffold:
    """Checkpoint the model and the global step, not ``workers_done``: a cluster restarted from a
    checkpoint counts its finished tasks afresh. The first session to come up sets it to 0."""
    with h.graph.as_default():
        saved = [v for v in v1.global_variables() if v is not h.workers_done]
        init_done = tf.cond(
            v1.is_variable_initialized(h.workers_done),
            tf.no_op,
            lambda: v1.variables_initializer([h.workers_done]),
        )
        return v1.train.Scaffold(
            saver=v1.train.Saver(saved, max_to_keep=3),
            ready_for_local_init_op=v1.report_uninitialized_variables(saved),
            local_init_op=tf.group(v1.local_variables_initializer(), init_done),
        )


def open_training_session(
    info: ClusterInfo, args: argparse.Namespace, h: Handles, target: str, config: v1.ConfigProto
) -> v1.train.MonitoredSession:
    """MonitoredTrainingSession stopping at --train_steps. With --checkpoint_dir the chief
    restores the latest checkpoint there (a restarted cluster resumes at its global step) and
    saves every --checkpoint_steps; no summaries."""
    checkpointing = {}
    if args.checkpoint_dir:
        checkpointing = {
            "checkpoint_dir": args.checkpoint_dir,
            "save_checkpoint_steps": args.checkpoint_steps,
            "scaffold": checkpoint_scaffold(h),
        }
    sess = v1.train.MonitoredTrainingSession(
        master=target,
        is_chief=info.is_chief,
        hooks=[v1.train.StopAtStepHook(last_step=args.train_steps)],
        config=config,
        **checkpointing,
        save_checkpoint_secs=None,
        save_summaries_steps=None,
        save_summaries_secs=None,
        log_step_count_steps=0,
        max_wait_secs=int(args.startup_timeout_secs),
        stop_grace_period_secs=5,
    )
    # A read lets StopAtStepHook stop a task that arrives after training ended before it applies
    # one more update.
    say(info, f"session ready at global step {sess.run(h.global_step)}")
    return sess


def run_training(
    info: ClusterInfo, args: argparse.Namespace, data: digits.DigitData, watchdog: Watchdog
) -> int:
    server = start_server(info, args)
    h = build_graph(info, args, info.device, args.data_format, train=True)
    config = session_config(args, ["/job:ps", info.device])
    say(
        info,
        f"{data.describe()}; training to global step {args.train_steps} with "
        f"{info.num_training_tasks} training task(s) and {len(info.cluster['ps'])} PS"
        + (" (chief)" if info.is_chief else ""),
    )
    connecting = f"connecting to the PS at {','.join(info.cluster['ps'])}"
    waiting = f"{connecting} and waiting for the chief to initialise the model"
    startup, op_timeout = "--startup_timeout_secs", "--op_timeout_secs"
    if not info.is_chief:
        # MonitoredTrainingSession re-checks a not-yet-initialised model only every 30 s; poll
        # here first so a worker starting before the chief's initialisation loses no time.
        with (
            watchdog.phase(waiting, args.startup_timeout_secs, startup),
            v1.Session(server.target, graph=h.graph, config=config) as sess,
        ):
            wait_until_initialized(info, args, sess, h)
    with h.graph.as_default():
        with watchdog.phase(waiting, args.startup_timeout_secs, startup):
            training = open_training_session(info, args, h, server.target, config)
        training_started = time.monotonic()
        with training:
            rate = train_loop(info, args, data, h, training, watchdog)
        say(
            info,
            f"training ended {time.monotonic() - STARTED:.1f} s after start "
            f"(set-up {training_started - STARTED:.1f} s, training "
            f"{time.monotonic() - training_started:.1f} s)",
        )
    with v1.Session(server.target, graph=h.graph, config=config) as sess:
        with watchdog.phase(connecting, args.startup_timeout_secs, startup):
            sess.run(h.mark_done)
        sample = slice(0, TRAIN_EVAL_EXAMPLES)
        with watchdog.phase("evaluating on the training set", args.op_timeout_secs, op_timeout):
            train_accuracy = evaluate(sess, h, data.train_images[sample], data.train_labels[sample])
        print(f"train accuracy: {train_accuracy:.4f}", flush=True)
        print(f"steps/sec: {rate:.2f}", flush=True)
        if not info.is_chief:
            return 0
        with watchdog.phase("evaluating on the test set", args.op_timeout_secs, op_timeout):
            test_accuracy = evaluate(sess, h, data.test_images, data.test_labels)
        print(f"test accuracy: {test_accuracy:.4f}", flush=True)
        return wait_for_workers(info, args, sess, h, watchdog)


def wait_for_workers(
    info: ClusterInfo, args: argparse.Namespace, sess: v1.Session, h: Handles, watchdog: Watchdog
) -> int:
    """Keep the chief alive until every training task has finished (bounded), so a launcher that
    stops the PS when the chief exits never strands a slower worker."""
    deadline = time.monotonic() + args.worker_wait_secs
    announced = False
    while True:
        with watchdog.phase("reading workers_done", args.op_timeout_secs, "--op_timeout_secs"):
            done = int(sess.run(h.workers_done))
        if done >= info.num_training_tasks:
            say(info, f"all {info.num_training_tasks} training task(s) finished")
            return 0
        if time.monotonic() >= deadline:
            raise TaskTimeout(
                f"only {done} of {info.num_training_tasks} training tasks finished within "
                f"--worker_wait_secs={args.worker_wait_secs:g}; the others are stuck or died, "
                "see their logs"
            )
        if not announced:
            say(info, f"waiting for {info.num_training_tasks - done} training task(s) to finish")
            announced = True
        time.sleep(0.5)


def wait_until_initialized(
    info: ClusterInfo, args: argparse.Namespace, sess: v1.Session, h: Handles
) -> None:
    """Poll (bounded by --startup_timeout_secs) until the chief has initialised the model."""
    deadline = time.monotonic() + args.startup_timeout_secs
    while len(sess.run(h.uninitialized)):
        if time.monotonic() >= deadline:
            raise TaskTimeout(
                "the chief did not initialise the model within "
                f"--startup_timeout_secs={args.startup_timeout_secs:g}; is it running?"
            )
        time.sleep(0.2)


def run_evaluator(
    info: ClusterInfo, args: argparse.Namespace, data: digits.DigitData, watchdog: Watchdog
) -> int:
    """Evaluate the shared model on the test set every --eval_interval_secs, and once more as soon
    as the global step reaches --train_steps (polled twice a second), then exit 0.

    The evaluator is not part of the training cluster, so it uses PS 0 as its session master and
    runs the (small) evaluation there, always NHWC since a PS computes on its CPU."""
    h = build_graph(info, args, "/job:ps/task:0", "NHWC", train=False)
    config = session_config(args, ["/job:ps"])
    with v1.Session(f"grpc://{info.cluster['ps'][0]}", graph=h.graph, config=config) as sess:
        waiting = f"connecting to PS 0 at {info.cluster['ps'][0]} and waiting for the model"
        with watchdog.phase(waiting, args.startup_timeout_secs, "--startup_timeout_secs"):
            wait_until_initialized(info, args, sess, h)
        next_evaluation = 0.0
        while True:
            with watchdog.phase(
                "reading the global step", args.op_timeout_secs, "--op_timeout_secs"
            ):
                global_step = int(sess.run(h.global_step))
            finished = global_step >= args.train_steps
            if finished or time.monotonic() >= next_evaluation:
                with watchdog.phase("evaluating", args.op_timeout_secs, "--op_timeout_secs"):
                    accuracy = evaluate(sess, h, data.test_images, data.test_labels)
                say(info, f"global step {global_step}: test-set accuracy {accuracy:.4f}")
                next_evaluation = time.monotonic() + args.eval_interval_secs
            if finished:
                return 0
            time.sleep(0.5)


def main(argv: Sequence[str] | None = None) -> int:
    name = "mnist"
    for sig in (signal.SIGUSR1, signal.SIGUSR2):  # Slurm's --signal, passed on by tflaunch:
        signal.signal(sig, signal.SIG_IGN)  # the chief checkpoints every --checkpoint_steps
    try:
        args = parse_args(argv)
        info = resolve_cluster(args, os.environ)
        name = info.name
        say(info, f"cluster from {info.source}")
        if info.job_name == "ps":
            return run_ps(info, args)
        if info.job_name in TRAINING_JOBS:
            check_data_format(args.data_format, tf.config.list_physical_devices("GPU"))
        data = digits.load_data(args.data_dir)
        watchdog = Watchdog(name)
        if info.job_name == "evaluator":
            return run_evaluator(info, args, data, watchdog)
        return run_training(info, args, data, watchdog)
    except (UsageError, digits.DataError) as exc:
        return error_exit(name, exc, 2)
    except TaskTimeout as exc:
        return error_exit(name, exc, 1)
    except tf.errors.OpError as exc:
        return error_exit(name, f"TensorFlow {type(exc).__name__}: {exc.message}", 1)


if __name__ == "__main__":
    sys.exit(main())
