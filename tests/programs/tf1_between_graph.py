"""A TF1 between-graph replicated trainer on parameter servers, written against plain
TensorFlow (``tf.compat.v1``) the way such scripts were: ``--job_name/--task_index/--ps_hosts/
--worker_hosts`` flags, ``tf.train.Server``, ``replica_device_setter``, the chief initialising the variables on
the PS, and a ``Session.run`` loop that logs ``global_step``. It knows nothing of tflaunch.
Every worker counts itself in on the PS and waits for the others before its first step (as
SyncReplicasOptimizer's scripts did), so that no worker trains alone: a worker slow to start
(a loaded machine) otherwise finds the steps all taken, and a trace window misses it."""

import argparse
import sys
import time

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--job_name", required=True)
    p.add_argument("--task_index", type=int, required=True)
    p.add_argument("--ps_hosts", required=True)
    p.add_argument("--worker_hosts", required=True)
    p.add_argument("--train_steps", type=int, default=600)
    args = p.parse_args()
    v1.disable_eager_execution()
    cluster = v1.train.ClusterSpec(
        {"ps": args.ps_hosts.split(","), "worker": args.worker_hosts.split(",")}
    )
    server = v1.train.Server(cluster, job_name=args.job_name, task_index=args.task_index)
    if args.job_name == "ps":
        server.join()  # serves until the launcher stops it
        return 0
    device = v1.train.replica_device_setter(
        worker_device=f"/job:worker/task:{args.task_index}", cluster=cluster
    )
    with v1.device(device):
        x = v1.placeholder(tf.float32, [None, 64])
        y = v1.placeholder(tf.int64, [None])
        w1 = v1.get_variable("w1", [64, 256], initializer=v1.glorot_uniform_initializer())
        b1 = v1.get_variable("b1", [256], initializer=v1.zeros_initializer())
        w2 = v1.get_variable("w2", [256, 10], initializer=v1.glorot_uniform_initializer())
        hidden = tf.nn.relu(tf.matmul(x, w1) + b1)
        logits = tf.matmul(hidden, w2)
        loss = v1.losses.sparse_softmax_cross_entropy(y, logits)
        global_step = v1.train.get_or_create_global_step()
        train_op = v1.train.AdamOptimizer(1e-3).minimize(loss, global_step=global_step)
        joined = v1.get_variable(
            "workers_joined", [], tf.int64, initializer=v1.zeros_initializer(), trainable=False
        )
        join = v1.assign_add(joined, 1)
        init = v1.global_variables_initializer()
        uninitialized = v1.report_uninitialized_variables()
    rng = np.random.default_rng(args.task_index)
    config = v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{args.task_index}"])
    local = 0
    with v1.Session(server.target, config=config) as sess:
        if args.task_index == 0:
            sess.run(init)
        while len(sess.run(uninitialized)):  # the chief initialises the variables on the PS
            time.sleep(0.2)
        sess.run(join)
        while sess.run(joined) < len(cluster.job_tasks("worker")):
            time.sleep(0.1)
        step = sess.run(global_step)
        while step < args.train_steps:
            xs = rng.normal(size=(64, 64)).astype("float32")
            ys = (xs[:, 0] > 0).astype("int64")
            _, value, step = sess.run([train_op, loss, global_step], {x: xs, y: ys})
            local += 1
            if local % 10 == 0:
                print(f"loss = {value:.4f}, global_step = {step}", flush=True)
    print(f"worker {args.task_index} done after {local} local steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
