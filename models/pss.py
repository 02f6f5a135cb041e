"""Digit classification with TF2's ParameterServerStrategy: a custom training loop driven by a
``ClusterCoordinator`` on the chief, checkpointed with ``CheckpointManager``, resumable.

Every task runs this same program and reads its role from ``TF_CONFIG`` (which tflaunch sets), or
from a cluster file or TF1 flags (:mod:`tflaunch.models.cluster`, as every program here):

* ``ps`` and ``worker`` tasks start a ``tf.distribute.Server`` and serve until they are stopped;
  they never exit by themselves (the chief's exit ends the run: ``supervision.success``'s
  default, ``auto``, stops them once idle; ``chief`` at once).
* the ``chief`` creates the model's variables on the PS, schedules training steps on the workers
  through the ``ClusterCoordinator`` until the global step reaches ``--train_steps``, saves a
  checkpoint every ``--checkpoint_steps`` global steps, at the end and on SIGUSR1/SIGUSR2 (Slurm's
  ``--signal`` ahead of the time limit), evaluates the final model
  on the test set (``test accuracy: X``) and exits 0.

Failures, as TensorFlow's ParameterServerStrategy handles them:

* a worker that dies: the coordinator re-runs its steps on the other workers and starts using it
  again once it is back at its address (a launcher restarts it in place, same TF_CONFIG);
* a PS or the chief that dies: the variables are lost. The chief exits 1 when a step fails
  because a PS is gone. Restart the whole cluster: the chief restores the latest checkpoint from
  ``--checkpoint_dir`` and carries on from its global step (``resumed from ... at global step N``).

The checkpoint directory is ``--checkpoint_dir``, else ``$TFLAUNCH_CHECKPOINT_DIR`` (tflaunch sets
it), else no checkpoints. The chief reports progress as ``global step N: loss L`` lines, which
tflaunch's stall watchdog reads as step progress.

Exit codes: 0 success; 1 TensorFlow runtime failure; 2 bad flags or cluster.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from tflaunch.models.warning_signals import ignore_warnings, warnings_caught

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow's C++ runtime loads
# Slurm's --signal reaches every process of the job step at once, maybe while TensorFlow
# still loads: ignored until the program says otherwise, it cannot kill a task.
ignore_warnings()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tflaunch.models.cluster import ClusterError, add_cluster_flags, cluster_from_args  # noqa: E402
from tflaunch.models.cluster_file_resolver import resolver_for  # noqa: E402
from tflaunch.models.data import digits  # noqa: E402
from tflaunch.models.program import UsageError, error_exit, positive_int  # noqa: E402

HIDDEN = 128
SERVER_JOBS = ("ps", "worker")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pss", description="Digit classification with TF2 ParameterServerStrategy."
    )
    parser.add_argument("--train_steps", type=positive_int, default=400, help="global steps")
    parser.add_argument("--batch_size", type=positive_int, default=64, help="per step")
    parser.add_argument("--learning_rate", type=float, default=0.1, help="SGD with momentum")
    parser.add_argument(
        "--steps_per_round",
        type=positive_int,
        default=10,
        help="steps scheduled before the chief waits for them (join)",
    )
    parser.add_argument(
        "--checkpoint_dir",
        default=None,
        help="where the chief saves and restores (default $TFLAUNCH_CHECKPOINT_DIR)",
    )
    parser.add_argument(
        "--checkpoint_steps",
        type=positive_int,
        default=50,
        help="save every this many global steps",
    )
    parser.add_argument(
        "--step_delay",
        type=float,
        default=0.0,
        help="seconds each step sleeps on its worker (slows training for tests)",
    )
    parser.add_argument("--data_dir", help="MNIST IDX files or mnist.npz; default: sklearn digits")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=positive_int, default=1, help="per process")
    add_cluster_flags(parser)
    return parser


def resolve(args: argparse.Namespace) -> tf.distribute.cluster_resolver.ClusterResolver:
    """This task's cluster as a resolver for the strategy; ParameterServerStrategy needs a chief,
    PS and workers."""
    try:
        info = cluster_from_args(args, os.environ)
    except ClusterError as exc:
        raise UsageError(str(exc)) from None
    if info is None:
        raise UsageError(
            "no cluster: TF_CONFIG is not set and neither --cluster_file nor the cluster flags "
            "were given; run this program under tflaunch (or set TF_CONFIG)"
        )
    print(f"{info.name}: cluster from {info.source}", flush=True)
    if info.job_name not in ("chief", *SERVER_JOBS):
        raise UsageError(f"task type {info.job_name!r}: expected chief, worker or ps")
    if not info.cluster.get("chief") or not info.num_ps or not info.cluster.get("worker"):
        raise UsageError(
            "ParameterServerStrategy needs a chief, at least one PS and one worker "
            f"({info.source}'s cluster has {sorted(info.cluster)}); set roles.chief: 1"
        )
    return resolver_for(info)


def serve(resolver: tf.distribute.cluster_resolver.ClusterResolver, threads: int) -> int:
    ignore_warnings()  # the chief's cue to checkpoint, not ours
    # A remote step blocks inter-op threads on reads from the PS: one thread would deadlock.
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads + 3
    )
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol="grpc",
        config=config,
        start=True,
    )
    print(f"{resolver.task_type}:{resolver.task_id}: serving at {server.target}", flush=True)
    server.join()  # until the launcher stops it
    return 0


class Model(tf.Module):
    """784-128-10 perceptron with ReLU; its variables live on the PS."""

    def __init__(self, seed: int):
        super().__init__()
        rng = np.random.RandomState(seed)
        size_in = digits.IMAGE_SIZE * digits.IMAGE_SIZE
        he = np.sqrt(2.0 / size_in)
        self.w1 = tf.Variable(rng.normal(0, he, (size_in, HIDDEN)).astype(np.float32), name="w1")
        self.b1 = tf.Variable(np.zeros(HIDDEN, np.float32), name="b1")
        self.w2 = tf.Variable(
            rng.normal(0, np.sqrt(2.0 / HIDDEN), (HIDDEN, digits.NUM_CLASSES)).astype(np.float32),
            name="w2",
        )
        self.b2 = tf.Variable(np.zeros(digits.NUM_CLASSES, np.float32), name="b2")

    @property
    def weights(self) -> list[tf.Variable]:
        return [self.w1, self.b1, self.w2, self.b2]

    def __call__(self, images: tf.Tensor) -> tf.Tensor:
        x = tf.reshape(images, [-1, digits.IMAGE_SIZE * digits.IMAGE_SIZE])
        x = tf.nn.relu(tf.matmul(x, self.w1) + self.b1)
        return tf.matmul(x, self.w2) + self.b2


class Trainer:
    """The chief's side: variables, the per-worker dataset, the scheduled step, checkpoints."""

    def __init__(self, args: argparse.Namespace, strategy, data: digits.DigitData):
        self.args, self.strategy = args, strategy
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            self.model = Model(args.seed)
            self.velocity = [
                tf.Variable(tf.zeros_like(w), name=f"velocity_{i}")
                for i, w in enumerate(self.model.weights)
            ]
            self.global_step = tf.Variable(0, dtype=tf.int64, name="global_step")
        self.checkpoint = tf.train.Checkpoint(
            model=self.model, velocity=self.velocity, global_step=self.global_step
        )
        train_images, train_labels = data.train_images, data.train_labels

        def dataset_fn(_context=None) -> tf.data.Dataset:
            dataset = tf.data.Dataset.from_tensor_slices((train_images, train_labels))
            return dataset.shuffle(len(train_labels)).repeat().batch(args.batch_size).prefetch(2)

        self.iterator = iter(self.coordinator.create_per_worker_dataset(dataset_fn))

        @tf.function
        def train_step(iterator):
            def replica_step(images, labels):
                if args.step_delay > 0:
                    tf.py_function(lambda: time.sleep(args.step_delay), [], [])
                with tf.GradientTape() as tape:
                    logits = self.model(images)
                    loss = tf.reduce_mean(
                        tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
                    )
                grads = tape.gradient(loss, self.model.weights)
                for weight, velocity, grad in zip(
                    self.model.weights, self.velocity, grads, strict=True
                ):
                    velocity.assign(0.9 * velocity + grad)
                    weight.assign_sub(args.learning_rate * velocity)
                self.global_step.assign_add(1)
                return loss

            images, labels = next(iterator)
            return self.strategy.run(replica_step, args=(images, labels))

        self.train_step = train_step

    def train(self, manager: tf.train.CheckpointManager | None) -> None:
        # SIGUSR1/2 (Slurm's --signal ahead of the time limit): checkpoint now. Ignored again
        # once training ends: one that comes while the chief exits must not kill it (exit 138).
        with warnings_caught() as warned:
            self._train(manager, warned)

    def _train(self, manager: tf.train.CheckpointManager | None, warned: list[int]) -> None:
        args = self.args
        step = int(self.global_step.numpy())
        saved = step
        while step < args.train_steps:
            todo = min(args.steps_per_round, args.train_steps - step)
            losses = [
                self.coordinator.schedule(self.train_step, args=(self.iterator,))
                for _ in range(todo)
            ]
            self.coordinator.join()
            step = int(self.global_step.numpy())
            loss = float(np.mean([value.fetch() for value in losses]))
            print(f"global step {step}: loss {loss:.4f}", flush=True)
            if warned and manager:
                # one checkpoint however many copies arrived (Slurm's, the agent's, the launcher's)
                print(f"chief: got signal {warned[0]}: checkpointing now", flush=True)
                warned.clear()
                saved = -args.checkpoint_steps
            if manager and (step - saved >= args.checkpoint_steps or step >= args.train_steps):
                path = manager.save(checkpoint_number=step)
                saved = step
                print(f"saved checkpoint {path} at global step {step}", flush=True)

    def accuracy(self, images: np.ndarray, labels: np.ndarray) -> float:
        """The final model on the chief (reads the variables from the PS once)."""
        weights = [w.numpy() for w in self.model.weights]
        x = images.reshape(len(images), -1)
        hidden = np.maximum(x @ weights[0] + weights[1], 0.0)
        predicted = np.argmax(hidden @ weights[2] + weights[3], axis=1)
        return float(np.mean(predicted == labels))


def run_chief(resolver, args: argparse.Namespace) -> int:
    started = time.monotonic()
    data = digits.load_data(args.data_dir)
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    trainer = Trainer(args, strategy, data)
    checkpoint_dir = args.checkpoint_dir or os.environ.get("TFLAUNCH_CHECKPOINT_DIR")
    manager = None
    restarts = os.environ.get("TFLAUNCH_CLUSTER_RESTARTS", "0")
    if checkpoint_dir:
        manager = tf.train.CheckpointManager(trainer.checkpoint, checkpoint_dir, max_to_keep=3)
        if manager.latest_checkpoint:
            trainer.checkpoint.restore(manager.latest_checkpoint)
            print(
                f"resumed from {manager.latest_checkpoint} at global step "
                f"{int(trainer.global_step.numpy())} (cluster restarts: {restarts})",
                flush=True,
            )
        else:
            print(f"no checkpoint in {checkpoint_dir}: starting at global step 0", flush=True)
    workers = resolver.cluster_spec().num_tasks("worker")
    ps = resolver.cluster_spec().num_tasks("ps")
    print(
        f"chief: {data.describe()}; training to global step {args.train_steps} on "
        f"{workers} worker(s) with {ps} PS",
        flush=True,
    )
    trainer.train(manager)
    print(f"train accuracy: {trainer.accuracy(data.train_images, data.train_labels):.4f}")
    print(f"test accuracy: {trainer.accuracy(data.test_images, data.test_labels):.4f}")
    print(f"chief: done in {time.monotonic() - started:.1f} s", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    name = "pss"
    try:
        resolver = resolve(args)
        name = f"{resolver.task_type}:{resolver.task_id}"
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads + 3)
        if resolver.task_type in SERVER_JOBS:
            return serve(resolver, args.threads)
        return run_chief(resolver, args)
    except (UsageError, digits.DataError) as exc:
        return error_exit(name, exc, 2)
    except tf.errors.OpError as exc:
        return error_exit(name, f"TensorFlow {type(exc).__name__}: {exc.message}", 1)


if __name__ == "__main__":
    sys.exit(main())
