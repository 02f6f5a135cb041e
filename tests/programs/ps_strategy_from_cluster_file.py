"""Test program: TF2 ParameterServerStrategy trained through a tflaunch cluster file.

Usage: ``ps_strategy_from_cluster_file.py CLUSTER_FILE``. The file names one chief, two workers
and two PS on this machine. This process starts the worker and PS servers in-process (as TF's
own multi-process-free tests do), then, as the chief, builds the strategy from
``ClusterFileResolver`` (the task from ``TFLAUNCH_TASK=chief:0``), trains a linear model for
STEPS steps through a ClusterCoordinator, and prints one line ``ps-strategy: {json}`` with the
variables' devices and the first and last loss.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from tflaunch.models.cluster_file_resolver import ClusterFileResolver  # noqa: E402

STEPS = 20


def start_servers(resolver: ClusterFileResolver) -> list[tf.distribute.Server]:
    spec = resolver.cluster_spec()
    # In one process the servers share the inter-op pool; too few threads deadlock (TF's own
    # in-process cluster example raises it above the number of workers on small machines).
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=spec.num_tasks("worker") + 2)
    return [
        tf.distribute.Server(spec, job, i, protocol="grpc", config=config, start=True)
        for job in ("worker", "ps")
        for i in range(spec.num_tasks(job))
    ]


def main(path: str) -> None:
    resolver = ClusterFileResolver(path)
    servers = start_servers(resolver)
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        w = tf.Variable(tf.zeros([4, 1]), name="w")
        b = tf.Variable(tf.zeros([1]), name="b")
    x = tf.random.stateless_normal([64, 4], seed=[1, 2])
    y = x @ tf.constant([[1.0], [-2.0], [0.5], [3.0]]) + 0.25

    @tf.function
    def step() -> tf.Tensor:
        def replica_step() -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((x @ w + b - y) ** 2)
            gw, gb = tape.gradient(loss, [w, b])
            w.assign_sub(0.1 * gw)
            b.assign_sub(0.1 * gb)
            return loss

        return strategy.run(replica_step)

    losses = [coordinator.schedule(step) for _ in range(STEPS)]
    coordinator.join()
    report = {
        "devices": sorted({w.device, b.device}),
        "first_loss": float(losses[0].fetch()),
        "last_loss": float(losses[-1].fetch()),
        "task": [resolver.task_type, resolver.task_id],
    }
    print("ps-strategy: " + json.dumps(report), flush=True)
    del servers


if __name__ == "__main__":
    main(sys.argv[1])
