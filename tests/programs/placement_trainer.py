"""Test program: between-graph training with a placement strategy, reporting where variables live.

    python tests/programs/placement_trainer.py STRATEGY BASE_PORT

One process, one cluster of gRPC servers (two PS and a worker on BASE_PORT..BASE_PORT+2, as
tests/programs/per_variable_sync.py has it): what is placed where, and where the updates run, is
TensorFlow's distributed runtime on the cluster's devices, the same whether the PS are this
process's servers or other processes' (one TensorFlow import, not three). The worker builds a small
classifier (tflaunch.models.nets.layers.Dense, 64 -> HIDDEN -> 10, on scikit-learn's 8x8 digits) under
``tflaunch.models.placement.variable_placement(STRATEGY, num_ps, ...)``, trains it for STEPS steps with
Adam, and prints one line ``placement-report: {json}`` with:

- ``variables``: what the planning build learned (name, shape, dtype size, trainable);
- ``graph_devices``: each variable op's device in the graph the worker ran;
- ``update_devices``: where each variable's optimizer update op actually executed (from a traced
  step's step_stats), i.e. on which PS task the variable lives;
- ``first_loss``, ``last_loss`` and ``accuracy`` on the training set after training.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

from tflaunch.models import placement  # noqa: E402
from tflaunch.models.nets.layers import Dense  # noqa: E402

v1 = tf.compat.v1
HIDDEN = int(os.environ.get("HIDDEN", "512"))
STEPS = int(os.environ.get("STEPS", "150"))


class Net(tf.Module):
    def __init__(self) -> None:
        super().__init__(name="net")
        with self.name_scope:
            self.hidden = Dense(64, HIDDEN, name="hidden")
            self.out = Dense(HIDDEN, 10, name="out")

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        return self.out(tf.nn.relu(self.hidden(x)))


def traced_devices(sess: v1.Session, train_op: tf.Operation, feed: dict) -> dict[str, str]:
    """Variable op name -> device that ran its optimizer update in one traced step."""
    options = v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE)
    metadata = v1.RunMetadata()
    sess.run(train_op, feed_dict=feed, options=options, run_metadata=metadata)
    ran_on = {
        node.node_name: dev.device
        for dev in metadata.step_stats.dev_stats
        for node in dev.node_stats
    }
    graph = train_op.graph
    return {
        op.inputs[0].op.name: ran_on[op.name]
        for op in graph.get_operations()
        if op.type.startswith("ResourceApply") and op.name in ran_on
    }


def train(cluster: tf.train.ClusterSpec, task_id: int, strategy: str) -> None:
    server = tf.distribute.Server(cluster, job_name="worker", task_index=task_id)
    num_ps = cluster.num_tasks("ps")
    digits = load_digits()
    images = (digits.data / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(1)
        with placement.variable_placement(
            strategy,
            num_ps,
            Net,
            cluster=cluster,
            worker_device=f"/job:worker/task:{task_id}",
        ) as ps_strategy:
            net = Net()
        with v1.device(f"/job:worker/task:{task_id}"):
            x = v1.placeholder(tf.float32, [None, 64])
            y = v1.placeholder(tf.int64, [None])
            logits = net(x)
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
            )
            accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
            optimizer = v1.train.AdamOptimizer(0.01)
            train_op = optimizer.minimize(loss, var_list=net.trainable_variables)
        init = v1.global_variables_initializer()
    config = v1.ConfigProto(
        device_filters=["/job:ps", f"/job:worker/task:{task_id}"],
        operation_timeout_in_ms=60_000,
        intra_op_parallelism_threads=1,
        inter_op_parallelism_threads=2,
    )
    feed = {x: images, y: labels}
    with v1.Session(server.target, graph=graph, config=config) as sess:
        sess.run(init)
        first_loss = float(sess.run(loss, feed))
        update_devices = traced_devices(sess, train_op, feed)
        for _ in range(STEPS):
            sess.run(train_op, feed)
        last_loss, acc = (float(v) for v in sess.run([loss, accuracy], feed))
    report = {
        "strategy": strategy,
        "num_ps": num_ps,
        "variables": [
            [v.name, list(v.shape), v.dtype_size, v.trainable]
            for v in placement.graph_variables(Net)
        ],
        "graph_devices": {
            op.name: op.device for op in graph.get_operations() if op.type == "VarHandleOp"
        },
        "update_devices": update_devices,
        "trainable": [v.name.split(":")[0] for v in net.trainable_variables],
        "unplanned": getattr(ps_strategy, "unplanned", []),
        "first_loss": first_loss,
        "last_loss": last_loss,
        "accuracy": acc,
    }
    print("placement-report: " + json.dumps(report), flush=True)


def main() -> None:
    strategy, base = sys.argv[1], int(sys.argv[2])
    hosts = [f"localhost:{base + i}" for i in range(3)]
    cluster = tf.train.ClusterSpec({"ps": hosts[:2], "worker": hosts[2:]})
    ps_servers = [tf.distribute.Server(cluster, job_name="ps", task_index=i) for i in range(2)]
    train(cluster, 0, strategy)
    del ps_servers  # served until the worker is done


if __name__ == "__main__":
    main()
