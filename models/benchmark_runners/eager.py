"""TF2 runner of the benchmark: a ``tf.function`` step, alone or under MultiWorkerMirroredStrategy.

Single process (no cluster): variables on ``--local_parameter_device``, plain SGD or momentum
updates inside the step. ``collective_all_reduce``: the model, optimizer slots and step run under
``MultiWorkerMirroredStrategy`` on the chief and worker tasks (PS tasks, if the cluster has any,
are left out of its cluster); gradients of all workers are summed by one batched collective
all-reduce per step (or ``--gradient_repacking`` packs of it, in float16 with
``--compact_gradient_transfer``: :func:`reduce_gradients`) and every worker applies the same
averaged update (synchronous training).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import tensorflow as tf

from tflaunch.models.benchmark_runners.common import (
    Timing,
    bytes_per_pack_for,
    cut_buckets,
    images_per_sec,
    log,
    pack_sizes,
    timed_run,
)
from tflaunch.models.cluster import TRAINING_JOBS, ClusterInfo
from tflaunch.models.cluster_file_resolver import resolver_for
from tflaunch.models.data.imagenet import list_shards, make_dataset
from tflaunch.models.registry import get_model_spec


class Optimizer:
    """SGD or momentum with slots made at construction, so they are mirrored like the weights."""

    def __init__(
        self, kind: str, learning_rate: float, momentum: float, variables: Sequence[tf.Variable]
    ) -> None:
        self.learning_rate = learning_rate
        self.momentum = momentum if kind == "momentum" else None
        self.slots = [
            tf.Variable(tf.zeros_like(v), trainable=False, name="momentum")
            for v in variables
            if self.momentum is not None
        ]

    def update(self, var: tf.Variable, grad: tf.Tensor, slot: tf.Variable | None = None):
        """One variable's update (also the per-device function of ``extended.update``)."""
        if slot is None:
            return var.assign_sub(self.learning_rate * grad)
        accum = slot.assign(self.momentum * slot + grad)
        return var.assign_sub(self.learning_rate * accum)

    def apply(self, grads: Sequence[tf.Tensor], variables: Sequence[tf.Variable]) -> None:
        slots = self.slots or [None] * len(variables)
        for var, grad, slot in zip(variables, grads, slots, strict=True):
            self.update(var, grad, slot)


def loss_fn(model: tf.Module, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    logits = model(images, training=True)
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    )


def synthetic_batch(args: argparse.Namespace) -> tuple[tf.Variable, tf.Variable]:
    """One fixed random batch kept in (non-trainable) variables, as tf_cnn_benchmarks does."""
    s = args.image_size
    shape = [args.batch_size, 3, s, s] if args.data_format == "NCHW" else [args.batch_size, s, s, 3]
    images = tf.Variable(tf.random.uniform(shape, -1.0, 1.0), trainable=False, name="images")
    labels = tf.Variable(
        tf.random.uniform([args.batch_size], 0, args.num_classes, dtype=tf.int32),
        trainable=False,
        name="labels",
    )
    return images, labels


def single_step(args: argparse.Namespace) -> Callable[[], tf.Tensor]:
    """The training step of a single process: read a batch, gradients, update."""
    device = "/device:GPU:0" if args.local_parameter_device == "gpu" else "/device:CPU:0"
    spec = get_model_spec(args.model)
    with tf.device(device):
        model = spec.build(args.num_classes, args.data_format)
        variables = model.trainable_variables
        optimizer = Optimizer(args.optimizer, args.learning_rate, args.momentum, variables)
    next_batch = _batches(args, num_shards=1, shard_index=0)

    @tf.function
    def step() -> tf.Tensor:
        images, labels = next_batch()
        with tf.GradientTape() as tape:
            loss = loss_fn(model, images, labels)
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    return step


def _batches(args: argparse.Namespace, num_shards: int, shard_index: int):
    """A callable giving the next (images, labels): synthetic variables or a tf.data iterator."""
    if args.data_dir is None:
        images, labels = synthetic_batch(args)
        return lambda: (images.read_value(), labels.read_value())
    ds = make_dataset(
        list_shards(args.data_dir),
        args.batch_size,
        args.image_size,
        args.data_format,
        num_shards,
        shard_index,
    )
    iterator = iter(ds)
    return lambda: next(iterator)


class GradientReduction:
    """How the gradients cross the wire under MultiWorkerMirroredStrategy: ``packs`` (about that
    many all-reduces of concatenated gradients; 0 or 1: TensorFlow's default, one), or
    ``bucket_bytes`` (buckets of that many bytes on the wire in the order the backward pass
    produces the gradients, one all-reduce each), and ``compact`` (float16 on the wire, float32
    applied).

    :meth:`wire` runs in each replica (the cast to float16; with buckets it also reads the
    backward pass's order off the traced graph); :meth:`reduce` in cross-replica context (the
    all-reduces, then the mean in the variables' dtype)."""

    def __init__(
        self,
        variables: Sequence[tf.Variable],
        packs: int = 0,
        compact: bool = False,
        bucket_bytes: int = 0,
    ):
        self.compact = compact
        wire_size = 2 if compact else None
        self.nbytes = [
            v.shape.num_elements() * (wire_size or v.dtype.size) for v in variables
        ]  # fmt: skip
        self.bytes_per_pack = bytes_per_pack_for(self.nbytes, packs)
        self.pack_sizes = pack_sizes(self.nbytes, self.bytes_per_pack)
        self.wire_bytes = sum(self.nbytes)
        self.bucket_bytes = int(bucket_bytes)
        # Set when the step is traced (wire): variable indices per bucket, in launch order.
        self.buckets: list[list[int]] | None = None

    def describe(self) -> str:
        dtype = "float16" if self.compact else "float32"
        if self.bucket_bytes and self.buckets is not None:
            sizes = [sum(self.nbytes[i] for i in b) / 1e6 for b in self.buckets]
            return (
                f"gradient all-reduce: {len(self.buckets)} bucket(s) in the backward pass's "
                f"order, {'/'.join(f'{mb:.1f}' for mb in sizes)} MB, "
                f"{self.wire_bytes / 1e6:.1f} MB as {dtype}, each launched once its gradients exist"
            )
        return (
            f"gradient all-reduce: {len(self.pack_sizes)} pack(s) of "
            f"{'/'.join(str(n) for n in self.pack_sizes)} tensors, {self.wire_bytes / 1e6:.1f} MB "
            f"as {dtype}, bytes_per_pack {self.bytes_per_pack}"
        )

    def wire(self, grads: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        if self.bucket_bytes:
            self.buckets = cut_buckets(backward_order(grads), self.nbytes, self.bucket_bytes)
        if not self.compact:
            return list(grads)
        return [tf.cast(g, tf.float16) for g in grads]

    def reduce(
        self,
        strategy: tf.distribute.Strategy,
        grads: Sequence[object],
        variables: Sequence[tf.Variable],
    ) -> list[tf.Tensor]:
        """Per-replica gradients -> every variable's reduced gradient: the mean, or with
        ``compact`` the float16 sum (:meth:`finish` makes it the mean in the variable's dtype).

        Buckets: one ``batch_reduce_to`` (one pack, one collective) per bucket, called in the
        backward pass's order. A bucket's collective takes only its own gradients as inputs, and
        MWMS chains its collectives in call order (one ordering token), so the first bucket's
        all-reduce starts once the last layers' gradients exist and the later buckets follow as
        theirs do, while the backward pass goes on."""
        op = tf.distribute.ReduceOp.SUM if self.compact else tf.distribute.ReduceOp.MEAN
        pairs = list(zip(grads, variables, strict=True))
        if not self.bucket_bytes:
            options = tf.distribute.experimental.CommunicationOptions(
                bytes_per_pack=self.bytes_per_pack
            )
            return strategy.extended.batch_reduce_to(op, pairs, options=options)
        if self.buckets is None:
            raise RuntimeError("GradientReduction.reduce before wire: the buckets are not cut")
        one_pack = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=0)
        reduced: list = [None] * len(pairs)
        for bucket in self.buckets:
            out = strategy.extended.batch_reduce_to(
                op, [pairs[i] for i in bucket], options=one_pack
            )
            for i, value in zip(bucket, out, strict=True):
                reduced[i] = value
        return reduced

    def finish(self, grad: tf.Tensor, dtype: tf.DType, replicas: int) -> tf.Tensor:
        """On each device, before the update: the float16 sum back to the variable's dtype and
        divided by the replicas (the mean, in float32); an uncompacted mean as it came."""
        if not self.compact:
            return grad
        return tf.cast(grad, dtype) / float(replicas)


def backward_order(grads: Sequence[tf.Tensor]) -> list[int]:
    """Indices of ``grads`` in the order the backward pass produces them: the position of each
    gradient's op in its graph. The gradient tape creates the backward ops in an order their
    data edges allow (a gradient's op exists only after every op it needs), so creation order
    is the graph's production order; ties keep the variables' order reversed."""
    graph = grads[0].graph
    position = {op.name: k for k, op in enumerate(graph.get_operations())}
    n = len(grads)
    return sorted(range(n), key=lambda i: (position[grads[i].op.name], n - i))


def reduce_gradients(
    strategy: tf.distribute.Strategy,
    reduction: GradientReduction,
    grads_fn: Callable,
    inputs: tuple,
    variables: Sequence[tf.Variable],
):
    """One synchronous step's communication: run ``grads_fn(*inputs) -> (loss, grads)`` in each
    replica, put the gradients on the wire's dtype, all-reduce them as ``reduction`` says.
    Returns (per-replica loss, reduced gradients for :meth:`GradientReduction.finish`). Call
    inside a ``tf.function``."""

    def replica_fn(*args):
        loss, grads = grads_fn(*args)
        return loss, reduction.wire(grads)

    loss, grads = strategy.run(replica_fn, args=inputs)
    return loss, reduction.reduce(strategy, grads, variables)


def synchronous_update(
    strategy: tf.distribute.Strategy,
    reduction: GradientReduction,
    optimizer: Optimizer,
    grads_fn: Callable,
    inputs: tuple,
    variables: Sequence[tf.Variable],
) -> tf.Tensor:
    """One synchronous step's work, inside a ``tf.function``: the gradients all-reduced as
    ``reduction`` says (:func:`reduce_gradients`), each variable updated where it lives with
    its own (and its optimizer slot); the replicas' mean loss."""
    loss, reduced = reduce_gradients(strategy, reduction, grads_fn, inputs, variables)
    replicas = strategy.num_replicas_in_sync

    def apply(var: tf.Variable, grad: tf.Tensor, slot: tf.Variable | None = None):
        return optimizer.update(var, reduction.finish(grad, var.dtype, replicas), slot)

    slots = optimizer.slots or [None] * len(variables)
    for var, grad, slot in zip(variables, reduced, slots, strict=True):
        extra = (slot,) if slot is not None else ()
        strategy.extended.update(var, apply, args=(grad, *extra), group=False)
    return strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None)


def collective_step(
    args: argparse.Namespace, strategy: tf.distribute.Strategy, rank: int, num_workers: int
) -> Callable[[], tf.Tensor]:
    """The synchronous all-reduce step under MultiWorkerMirroredStrategy."""
    spec = get_model_spec(args.model)
    with strategy.scope():
        model = spec.build(args.num_classes, args.data_format)
        variables = model.trainable_variables
        optimizer = Optimizer(args.optimizer, args.learning_rate, args.momentum, variables)
    next_batch = _batches(args, num_workers, rank)
    reduction = GradientReduction(
        variables,
        args.gradient_repacking,
        args.compact_gradient_transfer,
        int(args.all_reduce_bucket_mb * 1e6),
    )

    def grads_fn(images: tf.Tensor, labels: tf.Tensor):
        with tf.GradientTape() as tape:
            loss = loss_fn(model, images, labels)
        return loss, tape.gradient(loss, variables)

    @tf.function
    def step() -> tf.Tensor:
        images, labels = next_batch()
        return synchronous_update(
            strategy, reduction, optimizer, grads_fn, (images, labels), variables
        )

    step.get_concrete_function()  # traced now (the first step reuses it): the buckets are cut
    if rank == 0:
        log(reduction.describe())
    return step


def _make_strategy(info: ClusterInfo) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy over the chief and workers (PS tasks, if any, left out)."""
    resolver = resolver_for(info, rpc_layer="grpc", jobs=TRAINING_JOBS)
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)


def _set_threads(args: argparse.Namespace) -> None:
    if args.num_intra_threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.num_intra_threads)
    if args.num_inter_threads:
        tf.config.threading.set_inter_op_parallelism_threads(args.num_inter_threads)


def run_worker(args: argparse.Namespace, info: ClusterInfo | None) -> tuple[Timing, float]:
    """Run the timed loop; return this worker's timing and the total images/sec of all workers."""
    _set_threads(args)
    if info is None:
        step = single_step(args)
        timing = timed_run(args, step, barrier=lambda: None)
        return timing, images_per_sec(args.batch_size, timing)
    strategy = _make_strategy(info)
    log(f"collective_all_reduce: worker {info.rank} of {info.num_training_tasks}, PS tasks unused")
    step = collective_step(args, strategy, info.rank, info.num_training_tasks)

    @tf.function
    def sum_over_workers(value: tf.Tensor) -> tf.Tensor:
        per_replica = strategy.run(tf.identity, args=(value,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def barrier() -> None:  # an all-reduce that every worker has to join
        sum_over_workers(tf.constant(1.0, tf.float64))

    timing = timed_run(args, step, barrier)
    rate = images_per_sec(args.batch_size, timing)
    total = sum_over_workers(tf.constant(rate, tf.float64))
    return timing, float(total)
