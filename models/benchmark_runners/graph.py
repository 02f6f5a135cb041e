"""TF1 between-graph runner of the benchmark: ``parameter_server`` and ``distributed_replicated``.

Each worker builds its own ``tf.compat.v1`` graph and talks to the PS tasks through a session on
its ``tf.distribute.Server``. Variables created under ``replica_device_setter`` land on the PS
tasks; every worker builds the model in the same order, so the graphs agree on names and places.
Worker 0 (the chief) initialises the PS variables; the others wait for it (bounded), as
``tf.compat.v1.train.Supervisor`` did.

With ``--cross_replica_sync`` every step ends at tf_cnn_benchmarks' barrier: one FIFO queue per
worker on a PS; once its update is applied a worker puts a token into every other worker's queue
and takes W-1 from its own, so no worker starts step N+1 before all have finished step N.

Coordination state on PS 0: a barrier counter (workers arrive after warm-up and wait for all, so
the timed windows overlap) and a per-worker vector of measured images/sec (summed for the
``total images/sec`` line, which every worker prints).
"""

from __future__ import annotations

import argparse
import os
import time
from contextlib import nullcontext

import tensorflow as tf

from tflaunch.models.benchmark_runners import sync_vars, transfers
from tflaunch.models.benchmark_runners.common import (
    BenchmarkError,
    Timing,
    images_per_sec,
    log,
    timed_run,
)
from tflaunch.models.cluster import ClusterInfo
from tflaunch.models.data.imagenet import list_shards, make_dataset
from tflaunch.models.registry import ModelSpec, get_model_spec

v1 = tf.compat.v1

WAIT_DEADLINE_S = 600.0  # longest wait for the chief's initialisation or the other workers
POLL_S = 0.05


def _session_config(args: argparse.Namespace, info: ClusterInfo) -> v1.ConfigProto:
    own = info.device
    return v1.ConfigProto(
        device_filters=["/job:ps", own],
        intra_op_parallelism_threads=args.num_intra_threads,
        inter_op_parallelism_threads=args.num_inter_threads,
    )


def _server(args: argparse.Namespace, info: ClusterInfo) -> tf.distribute.Server:
    return tf.distribute.Server(
        tf.train.ClusterSpec(info.cluster),
        job_name=info.job_name,
        task_index=info.task_index,
        config=_session_config(args, info),
        start=True,
    )


def run_ps(args: argparse.Namespace, info: ClusterInfo) -> None:
    """Serve variables until stopped (the launcher stops PS tasks once the workers are done)."""
    server = _server(args, info)
    role = (
        "idle: collective_all_reduce does not use PS tasks"
        if args.variable_update == "collective_all_reduce"
        else "serving variables"
    )
    log(f"ps:{info.task_index} {role}; joining")
    server.join()


def _ps_strategy(args: argparse.Namespace, info: ClusterInfo):
    """The ``ps_strategy`` for replica_device_setter (models/placement.py), or None: round robin."""
    if args.variable_placement is None:
        return None
    from tflaunch.models import placement

    if args.variable_placement == "partitioned" and args.variable_update != "parameter_server":
        raise BenchmarkError(
            "--variable_placement partitioned shards the variables on the PS, which only "
            "--variable_update parameter_server supports (distributed_replicated keeps whole "
            "local copies); choose round_robin, greedy or lpt."
        )
    spec = get_model_spec(args.model)
    try:
        return placement.ps_strategy_for_model(
            args.variable_placement,
            info.num_ps,
            lambda: spec.build(args.num_classes, args.data_format),
        )
    except ValueError as exc:
        raise BenchmarkError(str(exc)) from None


def _inputs(args: argparse.Namespace, info: ClusterInfo):
    """Images and labels on this worker: a fixed synthetic batch (local variables) or tf.data."""
    if args.data_dir is None:
        s = args.image_size
        nchw = args.data_format == "NCHW"
        shape = [args.batch_size, 3, s, s] if nchw else [args.batch_size, s, s, 3]
        local = [v1.GraphKeys.LOCAL_VARIABLES]
        images = v1.Variable(
            tf.random.uniform(shape, -1.0, 1.0), trainable=False, collections=local, name="images"
        )
        labels = v1.Variable(
            tf.random.uniform([args.batch_size], 0, args.num_classes, dtype=tf.int32),
            trainable=False,
            collections=local,
            name="labels",
        )
        return images.read_value(), labels.read_value()
    ds = make_dataset(
        list_shards(args.data_dir),
        args.batch_size,
        args.image_size,
        args.data_format,
        info.num_training_tasks,
        info.rank,
    )
    return v1.data.make_one_shot_iterator(ds).get_next()


def _optimizer(args: argparse.Namespace) -> v1.train.Optimizer:
    if args.optimizer == "momentum":
        return v1.train.MomentumOptimizer(args.learning_rate, args.momentum)
    return v1.train.GradientDescentOptimizer(args.learning_rate)


def _loss(model: tf.Module, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    logits = model(images, training=True)
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    )


def _plan(
    args: argparse.Namespace, variables, region, measured: list[float] | None
) -> transfers.TransferPlan:
    return transfers.make_plan(
        variables, region, args.transfer_order, args.transfer_buckets, measured
    )


def _measure_first_use(args: argparse.Namespace) -> list[float]:
    """tac: when each variable is first used in a profiled step of the model alone."""
    spec = get_model_spec(args.model)

    def build():
        with v1.device("/device:CPU:0"):
            model = spec.build(args.num_classes, args.data_format)
            s = args.image_size
            shape = (
                [args.batch_size, 3, s, s]
                if args.data_format == "NCHW"
                else [args.batch_size, s, s, 3]
            )
            images = tf.random.uniform(shape, -1.0, 1.0)
            labels = tf.random.uniform([args.batch_size], 0, args.num_classes, dtype=tf.int32)
            graph = v1.get_default_graph()
            first = len(graph.get_operations())
            loss = _loss(model, images, labels)
            grads = tf.gradients(loss, model.trainable_variables)
            region = graph.get_operations()[first:]
            train = _optimizer(args).apply_gradients(
                zip(grads, model.trainable_variables, strict=True)
            )
        return model.trainable_variables, region, train

    started = time.perf_counter()
    measured = transfers.measured_first_use(build, (args.num_intra_threads, args.num_inter_threads))
    log(
        f"transfer order tac: profiled a step of {args.model} alone ({time.perf_counter() - started:.1f} s)"
    )
    return measured


class WorkerGraph:
    """The ops one worker runs: init, the training step, and the coordination variables."""

    def __init__(
        self,
        args: argparse.Namespace,
        info: ClusterInfo,
        measured: list[float] | None = None,
    ) -> None:
        worker_device = info.device
        self.prime = None
        cluster = tf.train.ClusterSpec(info.cluster)
        ps_strategy = _ps_strategy(args, info)
        setter = v1.train.replica_device_setter(
            worker_device=worker_device, cluster=cluster, ps_strategy=ps_strategy
        )
        scope = ps_strategy.variable_scope() if ps_strategy is not None else nullcontext()
        spec = get_model_spec(args.model)
        with v1.device("/job:ps/task:0"):
            self.barrier = tf.Variable(0, name="bench_barrier", dtype=tf.int64)
            self.rates = tf.Variable(
                tf.zeros([info.num_training_tasks], tf.float64), name="bench_rates"
            )
            self.arrive = self.barrier.assign_add(1)
            self.rate_in = v1.placeholder(tf.float64, [])
            self.report = v1.scatter_update(self.rates, [info.rank], [self.rate_in])
        with v1.device(setter), scope:
            master = spec.build(args.num_classes, args.data_format)
        with v1.device(worker_device + "/device:CPU:0"):
            images, labels = _inputs(args, info)
        optimizer = _optimizer(args)
        self.local_step = None  # --per_variable_sync: fed with this worker's step count
        self.sync_prime = None
        if args.variable_update == "parameter_server":
            graph = v1.get_default_graph()
            with v1.device(setter):
                first = len(graph.get_operations())
                self.loss = _loss(master, images, labels)
                grads = tf.gradients(self.loss, master.trainable_variables)
            region = graph.get_operations()[first:]
            variables = master.trainable_variables
            self.plan = _plan(args, variables, region, measured)
            self.grad_names = {i: [g.op.name] for i, g in enumerate(grads) if g is not None}
            if args.per_variable_sync:
                self._build_per_variable_sync(args, info, variables, grads, region, optimizer)
                return
            scheduled = transfers.schedule_reads(
                variables,
                transfers.variable_reads(region, variables),
                self.plan,
                worker_device,
                ordered=args.transfer_order != "none",
                staged=args.staged_vars,
            )
            self.read_names = scheduled.read_names
            with v1.device(setter):
                updates = v1.get_collection(v1.GraphKeys.UPDATE_OPS)
                with tf.control_dependencies(updates):
                    apply = optimizer.apply_gradients(zip(grads, variables, strict=True))
            self.train_op = tf.group(apply, *scheduled.step_ops) if scheduled.step_ops else apply
            self.update_op = self.train_op
            if scheduled.prime_ops:
                self.prime = tf.group(*scheduled.prime_ops, name="transfer_stage_first")
            self.local_init = v1.local_variables_initializer()
        else:
            self._build_replicated(
                args, worker_device, spec, master, images, labels, optimizer, measured
            )
        if args.cross_replica_sync and info.num_training_tasks > 1:
            barrier = step_end_barrier(info, [self.update_op])
            self.train_op = tf.group(self.update_op, barrier, name="sync_step")
        self._shared(info)

    def _shared(self, info: ClusterInfo) -> None:
        self.shared_vars = [v for v in v1.global_variables() if v.device.startswith("/job:ps")]
        self.shared_init = v1.variables_initializer(self.shared_vars)
        self.uninitialized = (
            v1.report_uninitialized_variables(self.shared_vars) if info.rank > 0 else None
        )

    def _build_per_variable_sync(self, args, info, variables, grads, region, optimizer) -> None:
        """parameter_server, synchronous, each variable released on its own (sync_vars)."""
        with v1.device(info.device):
            sync = sync_vars.per_variable_sync(
                variables,
                grads,
                transfers.variable_reads(region, variables),
                optimizer,
                info.num_training_tasks,
                info.rank,
                v1.get_collection(v1.GraphKeys.UPDATE_OPS),
            )
        self.train_op = self.update_op = sync.train_op
        self.local_step, self.sync_prime = sync.local_step, sync.prime
        self.read_names = {}
        self.local_init = v1.local_variables_initializer()
        self._shared(info)

    def _build_replicated(
        self,
        args: argparse.Namespace,
        worker_device: str,
        spec: ModelSpec,
        master: tf.Module,
        images: tf.Tensor,
        labels: tf.Tensor,
        optimizer: v1.train.Optimizer,
        measured: list[float] | None,
    ) -> None:
        """Local copy for compute; gradients go to the master copy; values come back (in
        consumption order with --transfer_order)."""
        local_device = "GPU:0" if args.local_parameter_device == "gpu" else "CPU:0"
        graph = v1.get_default_graph()
        with v1.device(f"{worker_device}/device:{local_device}"):
            replica = spec.build(args.num_classes, args.data_format)
            first = len(graph.get_operations())
            self.loss = _loss(replica, images, labels)
            grads = tf.gradients(self.loss, replica.trainable_variables)
        region = graph.get_operations()[first:]
        self.plan = _plan(args, replica.trainable_variables, region, measured)
        updates = v1.get_collection(v1.GraphKeys.UPDATE_OPS)
        with tf.control_dependencies(updates):
            apply = optimizer.apply_gradients(zip(grads, master.trainable_variables, strict=True))
        self.grad_names = {i: [g.op.name] for i, g in enumerate(grads) if g is not None}
        pulls, self.read_names = transfers.ordered_pulls(
            master.trainable_variables,
            replica.trainable_variables,
            self.plan if args.transfer_order != "none" else None,
            [apply],
            f"{worker_device}/device:{local_device}",
        )
        self.train_op = tf.group(*pulls)
        self.update_op = self.train_op
        refresh = [
            local.assign(shared)
            for local, shared in zip(replica.variables, master.variables, strict=True)
        ]
        local_vars = list(replica.variables) + v1.local_variables()
        with tf.control_dependencies([v1.variables_initializer(local_vars)]):
            self.local_init = tf.group(*refresh)


def step_end_barrier(info: ClusterInfo, after: list) -> tf.Operation:
    """tf_cnn_benchmarks' ``add_sync_queues_and_barrier``: one FIFO queue per worker (shared by
    name, on PS 1 if there is one, as its first barrier's counter picks), a token into every
    other worker's queue once ``after`` ran, then W-1 tokens out of this worker's own."""
    workers = info.num_training_tasks
    with v1.device(f"/job:ps/task:{1 % info.num_ps}/device:CPU:0"):
        queues = [
            v1.FIFOQueue(workers, [tf.bool], shapes=[[]], shared_name=f"sync_queues_step_end_{i}")
            for i in range(workers)
        ]
        token = tf.constant(False)
        with tf.control_dependencies(after):
            puts = [q.enqueue(token) for i, q in enumerate(queues) if i != info.rank]
        take = queues[info.rank].dequeue_many(workers - 1)
    return tf.group(*puts, take, name="sync_step_end")


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise BenchmarkError(f"gave up after {WAIT_DEADLINE_S:.0f} s waiting for {what}.")
        time.sleep(POLL_S)


def _describe_transfers(args: argparse.Namespace, info: ClusterInfo, ops: WorkerGraph) -> None:
    """Log the order, and write it beside a traced run's trace for ``tflaunch trace``."""
    plan = ops.plan
    if args.transfer_order != "none":
        first = plan.buckets[0]
        mb = sum(plan.nbytes[i] for i in first) / 1e6
        log(
            f"transfer order {args.transfer_order}: {len(plan.order)} variables in "
            f"{len(plan.buckets)} buckets, the first {len(first)} variables ({mb:.1f} MB); "
            f"Kendall tau against the graph's consumption order "
            f"{transfers.kendall_tau([plan.tic_rank[i] for i in plan.order]):.3f}"
        )
    if args.staged_vars:
        log("staged variables: each step computes with the values fetched during the step before")
    from tflaunch.trace import profiler as trace

    tracer = trace.active() if os.environ.get("TFLAUNCH_TRACE_STEPS") else None
    if tracer is not None and info.rank == 0:
        mode = {
            "variable_update": args.variable_update,
            "transfer_order": args.transfer_order,
            "staged_vars": args.staged_vars,
        }
        transfers.write_order(
            tracer.trace_dir / transfers.ORDER_FILE, plan, ops.read_names, ops.grad_names, mode
        )


def run_worker(args: argparse.Namespace, info: ClusterInfo) -> tuple[Timing, float]:
    """Build this worker's graph, initialise, run the timed loop, exchange the rates."""
    if info.num_ps == 0:
        raise BenchmarkError(
            f"--variable_update {args.variable_update} needs at least one PS task in the "
            "cluster; add PS tasks or use --variable_update collective_all_reduce."
        )
    measured = _measure_first_use(args) if args.transfer_order == "tac" else None
    server = _server(args, info)
    graph = tf.Graph()
    with graph.as_default():
        ops = WorkerGraph(args, info, measured)
    graph.finalize()
    _describe_transfers(args, info, ops)
    with v1.Session(server.target, graph=graph, config=_session_config(args, info)) as sess:
        if info.rank == 0:
            sess.run(ops.shared_init)
            if ops.sync_prime is not None:
                sess.run(ops.sync_prime)  # every worker's first read of every variable
        else:
            _wait(lambda: len(sess.run(ops.uninitialized)) == 0, "the chief to initialise")
        sess.run(ops.local_init)
        if ops.prime is not None:
            sess.run(ops.prime)  # the values the first step computes with
        log(
            f"{args.variable_update}: worker {info.rank} of {info.num_training_tasks}, "
            f"{info.num_ps} PS, {len(ops.shared_vars)} variables on PS, "
            f"{'synchronous' if args.cross_replica_sync else 'asynchronous'} steps"
        )
        fetches = [ops.train_op, ops.loss]
        steps_done = [0]

        def step() -> float:
            if ops.local_step is None:
                return sess.run(fetches)[1]
            loss = sess.run(fetches, {ops.local_step: steps_done[0]})[1]
            steps_done[0] += 1
            return loss

        def barrier() -> None:
            sess.run(ops.arrive)
            _wait(
                lambda: sess.run(ops.barrier) >= info.num_training_tasks, "all workers to warm up"
            )

        timing = timed_run(args, step, barrier)
        sess.run(ops.report, {ops.rate_in: images_per_sec(args.batch_size, timing)})
        _wait(lambda: (sess.run(ops.rates) > 0).all(), "the other workers' figures")
        total = float(sess.run(ops.rates).sum())
    return timing, total
