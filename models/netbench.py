"""TensorFlow's own gRPC runtime measured on a cluster's hosts and ports (after OSU's
TF-gRPC-Bench); ``tflaunch netbench CLUSTER`` runs it as every task of the cluster.

Point to point: for every ordered pair of hosts (and, on a host with two tasks, between them) a
tensor of each size lives in a variable on the source task and an op on the destination task
consumes it; the first worker's session times each transfer (the median of repeated runs, each
also paying the session's run-graph RPCs: the latency a training step pays per transfer).

PS throughput: every worker places the model's real variables on the PS as the placement
strategy places them and, for a number of steps, pulls them all (reads on the worker) and pushes
as many bytes back (an ``assign_add`` of a local tensor of each variable's shape): one
training step's traffic without the compute. Workers run at once, after a barrier.

The first worker prints one line ``netbench-result: {json}``; the launcher side
(``tflaunch/tools/netbench_command.py``) reads it from the log, prints the tables and draws the PNG.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tflaunch.models.cluster import ClusterInfo, resolve_cluster  # noqa: E402
from tflaunch.models.registry import model_names  # noqa: E402

v1 = tf.compat.v1
RESULT_PREFIX = "netbench-result: "
WAIT_DEADLINE_S = 900.0


def endpoints(info: ClusterInfo) -> dict[str, list[str]]:
    """Host -> its tasks' device names, PS first, then the chief, then workers (plan order)."""
    out: dict[str, list[str]] = {}
    for job in ("ps", "chief", "worker"):
        for index, address in enumerate(info.cluster.get(job, [])):
            host = address.rpartition(":")[0]
            out.setdefault(host, []).append(f"/job:{job}/task:{index}")
    return out


def pairs(info: ClusterInfo) -> list[tuple[str, str, str, str]]:
    """(source host, destination host, source device, destination device) for every ordered
    pair of hosts; a host with two tasks also gets a pair within itself."""
    hosts = endpoints(info)
    out = []
    for a, a_tasks in hosts.items():
        for b, b_tasks in hosts.items():
            if a != b:
                out.append((a, b, a_tasks[0], b_tasks[0]))
            elif len(a_tasks) > 1:
                out.append((a, a, a_tasks[0], a_tasks[1]))
    return out


def _session_config() -> v1.ConfigProto:
    config = v1.ConfigProto()
    # No graph rewriting: a rewrite could fold the consumer or move it next to its source.
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


def _time(run, min_repeats: int, max_seconds: float, max_repeats: int) -> list[float]:
    run()  # warm-up: the first run of a graph sets up its partitions
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_repeats and (
        len(times) < min_repeats or time.perf_counter() - start < max_seconds
    ):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return times


def point_to_point(args: argparse.Namespace, info: ClusterInfo, target: str) -> list[dict]:
    graph = tf.Graph()
    tests = []
    with graph.as_default():
        sources: dict[tuple[str, int], tf.Variable] = {}
        for a, b, src, dst in pairs(info):
            for size in args.sizes:
                key = (src, size)
                if key not in sources:
                    with v1.device(src):
                        sources[key] = v1.Variable(
                            tf.zeros([max(1, size // 4)], tf.float32),
                            name=f"src_{len(sources)}",
                            collections=[v1.GraphKeys.LOCAL_VARIABLES],
                        )
                with v1.device(dst):
                    consumed = tf.identity(sources[key].read_value())[0]
                tests.append((a, b, src, dst, size, consumed))
        init = v1.local_variables_initializer()
    results = []
    with v1.Session(target, graph=graph, config=_session_config()) as sess:
        sess.run(init)
        for a, b, src, dst, size, op in tests:
            times = _time(lambda op=op: sess.run(op), args.min_repeats, args.max_seconds, 50)
            results.append(
                {
                    "src_host": a,
                    "dst_host": b,
                    "src": src,
                    "dst": dst,
                    "bytes": size,
                    "median_s": float(np.median(times)),
                    "min_s": float(np.min(times)),
                    "repeats": len(times),
                }
            )
    return results


def _ps_variables(args: argparse.Namespace, num_ps: int):
    from tflaunch.models.placement import graph_variables
    from tflaunch.models.placement_math import place
    from tflaunch.models.registry import get_model_spec

    spec = get_model_spec(args.ps_model)
    built = graph_variables(lambda: spec.build(spec.default_num_classes, "NHWC"))
    return place(args.ps_placement, [v for v in built if v.trainable], num_ps)


def ps_throughput(args: argparse.Namespace, info: ClusterInfo, target: str) -> dict | None:
    """Every worker pulls and pushes the model's variables for ``ps_steps`` steps."""
    placement = _ps_variables(args, info.num_ps)
    own = info.device
    graph = tf.Graph()
    with graph.as_default():
        with v1.device("/job:ps/task:0"):
            barrier = tf.Variable(0, name="netbench_barrier", dtype=tf.int64)
            rates = tf.Variable(
                tf.zeros([info.num_training_tasks], tf.float64), name="netbench_rates"
            )
            arrive = barrier.assign_add(1)
            rate_in = v1.placeholder(tf.float64, [])
            report = v1.scatter_update(rates, [info.rank], [rate_in])
        shared, pushes, pulls = [barrier, rates], [], []
        for i, (spec, ps) in enumerate(placement.assignment):
            with v1.device(f"/job:ps/task:{ps}"):
                var = tf.Variable(tf.zeros(spec.shape, tf.float32), name=f"var_{i}")
            shared.append(var)
            with v1.device(own):
                grad = v1.Variable(
                    tf.zeros(spec.shape, tf.float32),
                    name=f"grad_{i}",
                    collections=[v1.GraphKeys.LOCAL_VARIABLES],
                )
                pulls.append(tf.reduce_sum(tf.identity(var.read_value())[:1]))
            with v1.device(f"/job:ps/task:{ps}"):
                pushes.append((var, grad))
        with tf.control_dependencies(pulls):
            step = tf.group(*[v.assign_add(g.read_value()) for v, g in pushes])
        shared_init = v1.variables_initializer(shared)
        uninitialized = v1.report_uninitialized_variables(shared)
        local_init = v1.local_variables_initializer()
    with v1.Session(target, graph=graph, config=_session_config()) as sess:
        if info.rank == 0:
            sess.run(shared_init)
        # The first worker measures point to point first: poll it seldom, to stay out of that.
        _wait(lambda: len(sess.run(uninitialized)) == 0, "the first worker to initialise", 1.0)
        sess.run(local_init)
        for _ in range(args.ps_warmup):
            sess.run(step)
        sess.run(arrive)
        _wait(lambda: sess.run(barrier) >= info.num_training_tasks, "every worker")
        t0 = time.perf_counter()
        for _ in range(args.ps_steps):
            sess.run(step)
        elapsed = time.perf_counter() - t0
        sess.run(report, {rate_in: args.ps_steps / elapsed})
        _wait(lambda: (sess.run(rates) > 0).all(), "the other workers' figures")
        steps_per_s = [float(r) for r in sess.run(rates)]
    return {
        "model": args.ps_model,
        "placement": args.ps_placement,
        "num_ps": info.num_ps,
        "num_workers": info.num_training_tasks,
        "bytes_per_ps": list(placement.bytes_per_ps),
        "total_bytes": placement.total_bytes,
        "num_variables": len(placement.assignment),
        "steps_per_s": steps_per_s,
    }


def _wait(condition, what: str, poll_s: float = 0.05) -> None:
    deadline = time.monotonic() + WAIT_DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {WAIT_DEADLINE_S:.0f} s waiting for {what}")
        time.sleep(poll_s)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tflaunch.models.netbench")
    p.add_argument("--sizes", required=True, help="message sizes in bytes, comma-separated")
    p.add_argument("--min_repeats", type=int, default=5)
    p.add_argument("--max_seconds", type=float, default=0.5, help="per pair and size")
    p.add_argument(
        "--ps_model",
        default="inception_v3",
        choices=(*model_names(sized_in_graph=True, aliases=True), "none"),
        help="a network of tflaunch.models.registry, or 'none' to skip the PS test",
    )
    p.add_argument("--ps_placement", default="round_robin")
    p.add_argument("--ps_steps", type=int, default=10)
    p.add_argument("--ps_warmup", type=int, default=2)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    info = resolve_cluster(environ=os.environ)
    if info is None:
        print("error: netbench runs as the tasks of a cluster (TF_CONFIG)", file=sys.stderr)
        return 2
    server = tf.distribute.Server(
        tf.train.ClusterSpec(info.cluster),
        job_name=info.job_name,
        task_index=info.task_index,
        start=True,
    )
    if not info.is_training_task:
        server.join()  # PS: serve until the launcher stops the cluster
        return 0
    result: dict = {"hosts": list(endpoints(info)), "sizes": args.sizes}
    if info.rank == 0:
        result["point_to_point"] = point_to_point(args, info, server.target)
    if args.ps_model != "none" and info.num_ps:
        result["ps"] = ps_throughput(args, info, server.target)
    if info.rank == 0:
        print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
