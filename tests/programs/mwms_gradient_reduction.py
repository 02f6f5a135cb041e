"""Train the same small network twice under MultiWorkerMirroredStrategy, in the same worker
processes: with the default gradient all-reduce, then with the benchmark's
``--gradient_repacking 4 --compact_gradient_transfer`` (packs of float16 gradients, applied in
float32), then with ``--all_reduce_bucket_mb 0.02 --compact_gradient_transfer`` (float16
buckets in the backward pass's order, each all-reduced as soon as its gradients exist), through
the benchmark's own code (``models.benchmark_runners.eager``).

    TF_CONFIG=... python tests/programs/mwms_gradient_reduction.py STEPS OUT.json

Data: scikit-learn's 8x8 digits (the MNIST example's default data), 80 % to train (each worker
its own shard, the same batches in both runs), 20 % to test. Both runs start from the same
seeded weights. Worker 0 writes OUT.json: per setting the test accuracy, the final loss, and
what the traced step holds: how many collective all-reduces and in which dtype (the graph check).
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

from tflaunch.models.benchmark_runners.eager import (  # noqa: E402
    GradientReduction,
    Optimizer,
    synchronous_update,
)

SIZES = (64, 96, 96, 96, 96, 10)  # 10 variables: --gradient_repacking 4 makes 4 packs
BATCH = 32  # per worker
BUCKET_BYTES = 20_000  # 3 buckets of the 70,292 float16 bytes


class Net(tf.Module):
    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.layers = []
        for i, (n_in, n_out) in enumerate(zip(SIZES, SIZES[1:], strict=False)):
            w = rng.normal(0, np.sqrt(2 / n_in), (n_in, n_out)).astype("float32")
            self.layers.append(
                (tf.Variable(w, name=f"w{i}"), tf.Variable(tf.zeros([n_out]), name=f"b{i}"))
            )

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        for i, (w, b) in enumerate(self.layers):
            x = tf.matmul(x, w) + b
            if i < len(self.layers) - 1:
                x = tf.nn.relu(x)
        return x


def collectives(graph) -> dict[str, int]:
    """dtype -> number of collective all-reduce ops in a traced step's graph."""
    found: dict[str, int] = {}
    for op in graph.get_operations():
        if op.type.startswith("CollectiveReduce"):
            dtype = op.get_attr("T").name
            found[dtype] = found.get(dtype, 0) + 1
    return found


def train(
    strategy, rank: int, workers: int, steps: int, packs: int, compact: bool, data, buckets: int = 0
) -> dict:
    x_train, y_train, x_test, y_test = data
    with strategy.scope():
        net = Net(seed=1)
        variables = [v for layer in net.layers for v in layer]
        optimizer = Optimizer("sgd", 0.1, 0.0, variables)
    reduction = GradientReduction(variables, packs, compact, buckets)
    mine = np.arange(len(x_train))[rank::workers]
    order = np.random.default_rng(7).permutation(len(mine))

    def grads_fn(x, y):
        with tf.GradientTape() as tape:
            logits = net(x)
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
            )
        return loss, tape.gradient(loss, variables)

    @tf.function
    def step(x, y):
        return synchronous_update(strategy, reduction, optimizer, grads_fn, (x, y), variables)

    loss = None
    for i in range(steps):
        start = (i * BATCH) % (len(order) - BATCH)
        idx = mine[order[start : start + BATCH]]
        loss = float(step(tf.constant(x_train[idx]), tf.constant(y_train[idx])))
    traced = step.get_concrete_function(
        tf.TensorSpec([BATCH, 64], tf.float32), tf.TensorSpec([BATCH], tf.int32)
    ).graph
    accuracy = float(np.mean(np.argmax(net(tf.constant(x_test)).numpy(), axis=1) == y_test))
    return {
        "packs": packs,
        "compact": compact,
        "expected_packs": len(reduction.buckets or reduction.pack_sizes),
        "collectives": collectives(traced),
        "test_accuracy": accuracy,
        "final_loss": loss,
    }


def main() -> int:
    steps, out = int(sys.argv[1]), sys.argv[2]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    rank, workers = resolver.task_id, strategy.num_replicas_in_sync
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int32")
    perm = np.random.default_rng(0).permutation(len(x))
    cut = int(0.8 * len(x))
    data = (x[perm[:cut]], y[perm[:cut]], x[perm[cut:]], y[perm[cut:]])
    results = [
        train(strategy, rank, workers, steps, 0, False, data),
        train(strategy, rank, workers, steps, 4, True, data),
        train(strategy, rank, workers, steps, 0, True, data, BUCKET_BYTES),
    ]
    print(json.dumps(results), flush=True)
    if rank == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
