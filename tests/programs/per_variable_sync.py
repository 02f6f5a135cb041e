"""Synchronous parameter_server steps past the barrier (``--per_variable_sync``), in one process:
a PS and two workers as in-process servers, each worker its own graph and session in a thread,
a linear model with its own batch per worker, through the benchmark's own
``models.benchmark_runners.sync_vars``.

    python tests/programs/per_variable_sync.py BASE_PORT STEPS OUT.json

Writes the PS's weights after STEPS steps, and the same STEPS steps of SGD on the mean of both
workers' gradients computed here in NumPy (what synchronous training means), and what each
worker's graph gates its reads on.
"""

import json
import os
import sys
import threading

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tflaunch.models.benchmark_runners.sync_vars import per_variable_sync  # noqa: E402
from tflaunch.models.benchmark_runners.transfers import variable_reads  # noqa: E402

v1 = tf.compat.v1
LR = 0.1
RNG = np.random.default_rng(3)
W0 = RNG.normal(size=(4, 3)).astype("float32")
B0 = RNG.normal(size=(3,)).astype("float32")
X = RNG.normal(size=(2, 8, 4)).astype("float32")  # one batch per worker
Y = RNG.normal(size=(2, 8, 3)).astype("float32")


def reference(steps: int) -> list:
    w, b = W0.astype("float64"), B0.astype("float64")
    for _ in range(steps):
        gw, gb = [], []
        for x, y in zip(X, Y, strict=True):
            err = x @ w + b - y
            gw.append(2 * x.T @ err / err.size)
            gb.append(2 * err.sum(axis=0) / err.size)
        w = w - LR * np.mean(gw, axis=0)
        b = b - LR * np.mean(gb, axis=0)
    return [w.tolist(), b.tolist()]


def worker(cluster, server, rank: int, steps: int, ready: threading.Event, out: dict) -> None:
    graph = tf.Graph()
    with graph.as_default():
        device = f"/job:worker/task:{rank}"
        setter = v1.train.replica_device_setter(worker_device=device, cluster=cluster)
        with v1.device(setter):
            w = tf.Variable(W0, name="w")
            b = tf.Variable(B0, name="b")
            first = len(graph.get_operations())
            loss = tf.reduce_mean(tf.square(tf.matmul(tf.constant(X[rank]), w) + b - Y[rank]))
            grads = tf.gradients(loss, [w, b])
        region = graph.get_operations()[first:]
        sync = per_variable_sync(
            [w, b], grads, variable_reads(region, [w, b]),
            v1.train.GradientDescentOptimizer(LR), 2, rank,
        )  # fmt: skip
        final = [w.read_value(), b.read_value()]
        init = v1.variables_initializer([w, b])
        queues = sorted(
            op.get_attr("shared_name").decode()
            for op in graph.get_operations()
            if op.type == "FIFOQueueV2"
        )
    with v1.Session(server.target, graph=graph) as sess:
        if rank == 0:
            sess.run(init)
            sess.run(sync.prime)
            ready.set()
        elif not ready.wait(120):
            raise RuntimeError("the chief did not initialise")
        for step in range(steps):
            sess.run(sync.train_op, {sync.local_step: step})
        if rank == 0:
            out["weights"] = [v.tolist() for v in sess.run(final)]
    out[f"queues_{rank}"] = queues


def main() -> int:
    base, steps, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    hosts = {
        "ps": [f"localhost:{base}"],
        "worker": [f"localhost:{base + 1}", f"localhost:{base + 2}"],
    }
    cluster = tf.train.ClusterSpec(hosts)
    servers = [tf.distribute.Server(cluster, "ps", 0)]
    servers += [tf.distribute.Server(cluster, "worker", i) for i in range(2)]
    ready, out = threading.Event(), {}
    threads = [
        threading.Thread(target=worker, args=(cluster, servers[1 + r], r, steps, ready, out))
        for r in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    out["reference"] = reference(steps)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f)
    os._exit(0)  # the in-process servers never stop by themselves


if __name__ == "__main__":
    sys.exit(main())
