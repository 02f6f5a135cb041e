"""One training step of a tiny network on two replicas, through the benchmark's own gradient
reduction (``models.benchmark_runners.eager``), with and without ``--all_reduce_bucket_mb``:
the updated weights of each setting and, for the traced steps, what every collective all-reduce
waits for.

    python tests/programs/bucketed_all_reduce.py OUT.json

The two replicas are two logical CPUs of this process under MirroredStrategy with
``CollectiveAllReduce`` cross-device ops: the class, ordering token and ``batch_reduce_to`` path
that MultiWorkerMirroredStrategy uses between workers, without a second process. Each replica
gets its own batch; both settings start from the same seeded weights.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.helpers import upstream  # noqa: E402
from tflaunch.models.benchmark_runners.eager import (  # noqa: E402
    GradientReduction,
    Optimizer,
    synchronous_update,
)

SIZES = (64, 96, 96, 96, 96, 10)  # 5 layers, 10 variables
BATCH = 16
BUCKET_BYTES = 20_000  # 4 buckets as float32, 3 as float16 (a 96x96 kernel: 36,864 B in float32)


def strategy_of_two() -> tf.distribute.Strategy:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from tensorflow.python.distribute import cross_device_ops

    devices = ["/device:CPU:0", "/device:CPU:1"]
    ops = cross_device_ops.CollectiveAllReduce(
        devices, group_size=2, options=tf.distribute.experimental.CommunicationOptions()
    )
    return tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)


def one_step(strategy, compact: bool, bucket_bytes: int, data) -> dict:
    rng = np.random.default_rng(1)
    with strategy.scope():
        variables = []
        for i, (n_in, n_out) in enumerate(zip(SIZES, SIZES[1:], strict=False)):
            w = rng.normal(0, np.sqrt(2 / n_in), (n_in, n_out)).astype("float32")
            variables += [
                tf.Variable(w, name=f"w{i}"),
                tf.Variable(tf.zeros([n_out]), name=f"b{i}"),
            ]
        optimizer = Optimizer("sgd", 0.5, 0.0, variables)
    reduction = GradientReduction(variables, 0, compact, bucket_bytes)
    grad_ops: dict[int, str] = {}  # replica 0's gradient op per variable (replica 0 runs first)

    def grads_fn(x, y):
        with tf.GradientTape() as tape:
            h = x
            for i in range(0, len(variables), 2):
                h = tf.matmul(h, variables[i]) + variables[i + 1]
                if i + 2 < len(variables):
                    h = tf.nn.relu(h)
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=h)
            )
        grads = tape.gradient(loss, variables)
        if not grad_ops:
            grad_ops.update({i: g.op.name for i, g in enumerate(grads)})
        return loss, grads

    x, y = data
    inputs = strategy.experimental_distribute_values_from_function(
        lambda ctx: (
            tf.constant(x[ctx.replica_id_in_sync_group]),
            tf.constant(y[ctx.replica_id_in_sync_group]),
        )
    )

    @tf.function
    def step(x, y):
        return synchronous_update(strategy, reduction, optimizer, grads_fn, (x, y), variables)

    step(*inputs)
    graph = step.get_concrete_function(*inputs).graph
    collectives = [
        op
        for op in graph.get_operations()
        if op.type == "CollectiveReduceV2" and op.device.endswith("CPU:0")
    ]
    return {
        "compact": compact,
        "bucket_bytes": bucket_bytes,
        "buckets": reduction.buckets,
        "describe": reduction.describe(),
        "weights": [v.values[0].numpy().tolist() for v in variables],
        "grad_ops": [grad_ops[i] for i in range(len(variables))],
        # per collective of replica 0, in the order they were made (the launch order), the
        # variables whose gradient op it waits for
        "waits_for": [
            sorted(i for i, name in grad_ops.items() if name in upstream(op)) for op in collectives
        ],
    }


def main() -> int:
    strategy = strategy_of_two()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, BATCH, SIZES[0])).astype("float32")
    y = rng.integers(0, SIZES[-1], size=(2, BATCH)).astype("int32")
    results = [
        one_step(strategy, compact, bucket_bytes, (x, y))
        for compact in (False, True)
        for bucket_bytes in (0, BUCKET_BYTES)
    ]
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
