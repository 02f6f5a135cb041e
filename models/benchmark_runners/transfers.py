"""When each parameter travels: staged variables and ordered reads in the TF1 PS modes.

In between-graph PS training a worker's reads of the PS's variables are independent receives:
nothing orders them, so the first layer's weights, which the forward pass needs first, often
arrive last, and nothing overlaps. Two remedies, both built into the graph before it is
finalised, both leaving the variables and their updates as they are:

* **Ordered reads** (``--transfer_order tic|tac``, TicTac's idea). Every transferred variable gets
  one explicit read on its PS; the forward (and backward) ops that consumed the model's own reads
  consume it instead. The reads go in ``--transfer_buckets`` buckets of about equal bytes, in
  consumption order, and bucket k+1's reads carry a control dependency on a no-op *on the worker*
  that waits for every tensor of bucket k to have arrived there. A PS answers a worker's receive
  only once the read has run, so bucket k+1 starts crossing the link when bucket k is in: the
  first layers' weights come first and the forward pass starts on them while the rest is in
  flight. Buckets, not a chain of single variables, so that one round trip per bucket (not per
  variable) is what the order costs. ``tic`` ranks variables by the graph alone: the depth (in
  ops) of the first op that consumes each one. ``tac`` ranks them by measured time: the start of
  that op in a profiled step of the same model on this worker alone (ties and unmeasured
  variables keep their tic rank).
* **Staged variables** (``--staged_vars``, parameter_server only, as tf_cnn_benchmarks). Each
  trainable variable gets a FIFO staging area on the worker. A step's forward pass takes the value
  staged by the step before, and the same step puts a fresh read of the PS's value for the next
  step: the fetch of step N+1 crosses the link while step N computes and updates. The values a
  step uses are at most one step older than without staging (the read of step N may miss this
  worker's own update of step N); the updates themselves go to the PS variables as before.

Gradients need nothing: TensorFlow sends each gradient to its PS as soon as the backward pass has
computed it, which is backward order already (the last layer's first; see the README).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from tflaunch.trace.transfers import ORDER_FILE, kendall_tau

v1 = tf.compat.v1
__all__ = ["ORDER_FILE", "kendall_tau"]  # used by the runner (graph.py) from here


@dataclass(frozen=True)
class TransferPlan:
    """Which variables cross the link, their consumption ranks and the enforced order."""

    names: tuple[str, ...]
    nbytes: tuple[int, ...]
    tic_rank: tuple[int, ...]  # the graph's consumption order: rank of each variable
    order: tuple[int, ...]  # variable indices in the order they are sent
    buckets: tuple[tuple[int, ...], ...]  # ``order`` cut into buckets


def variable_reads(region: Sequence[tf.Operation], variables: Sequence) -> dict[int, list]:
    """The ``ReadVariableOp`` s among ``region`` that read each variable (by index)."""
    index = {v.handle.op.name: i for i, v in enumerate(variables)}
    reads: dict[int, list] = {}
    for op in region:
        if op.type == "ReadVariableOp" and op.inputs[0].op.name in index:
            reads.setdefault(index[op.inputs[0].op.name], []).append(op)
    return reads


def consumption_depths(region: Sequence[tf.Operation], variables: Sequence) -> list[float]:
    """Per variable, the depth in ops of the first op of ``region`` that consumes a read of it,
    with transfers taken as free. ``region`` is in creation order, which is a topological order
    of its data edges (an op's inputs exist before it)."""
    reads = variable_reads(region, variables)
    read_ops = {op.name for ops in reads.values() for op in ops}
    depth: dict[str, int] = {}
    for op in region:
        if op.name in read_ops:
            depth[op.name] = 0
            continue
        preds = [t.op.name for t in op.inputs] + [c.name for c in op.control_inputs]
        depth[op.name] = 1 + max((depth.get(p, 0) for p in preds), default=0)
    out = []
    for i in range(len(variables)):
        consumers = [c for op in reads.get(i, []) for c in op.outputs[0].consumers()]
        out.append(min((depth.get(c.name, math.inf) for c in consumers), default=math.inf))
    return out


def ranks(keys: Sequence[tuple]) -> tuple[int, ...]:
    """Rank of each position when sorted by its key (0 first)."""
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    rank = [0] * len(keys)
    for r, i in enumerate(order):
        rank[i] = r
    return tuple(rank)


def cut_buckets(order: Sequence[int], nbytes: Sequence[int], count: int) -> tuple[tuple[int, ...]]:
    """``order`` cut into at most ``count`` contiguous buckets of about equal bytes."""
    total = sum(nbytes[i] for i in order) or 1
    buckets: list[list[int]] = [[] for _ in range(max(1, count))]
    before = 0
    for i in order:
        k = min(len(buckets) - 1, int(before * len(buckets) / total))
        buckets[k].append(i)
        before += nbytes[i]
    return tuple(tuple(b) for b in buckets if b)


def make_plan(
    variables: Sequence,
    region: Sequence[tf.Operation],
    transfer_order: str,
    num_buckets: int,
    measured: Sequence[float] | None = None,
) -> TransferPlan:
    """The plan for ``variables`` as ``region`` (the ops that consume them) uses them.

    ``measured`` (tac): per variable, when its first consumer started in a profiled step."""
    depths = consumption_depths(region, variables)
    tic = ranks([(d, i) for i, d in enumerate(depths)])
    if transfer_order == "tac" and measured is not None:
        order_rank = ranks([(m, tic[i]) for i, m in enumerate(measured)])
    else:
        order_rank = tic
    order = tuple(sorted(range(len(variables)), key=lambda i: order_rank[i]))
    nbytes = tuple(_nbytes(v) for v in variables)
    return TransferPlan(
        tuple(v.name for v in variables),
        nbytes,
        tic,
        order,
        cut_buckets(order, nbytes, num_buckets),
    )


def _nbytes(var) -> int:
    return int(var.shape.num_elements() or 0) * var.dtype.size


def _stage_name(var) -> str:
    return "tflaunch_stage/" + var.handle.op.name


def explicit_read(var, index: int, after: Sequence) -> tf.Tensor:
    """One read of ``var`` on its own device, run only after the ops in ``after``."""
    with v1.device(var.device), tf.control_dependencies(list(after)):
        return tf.raw_ops.ReadVariableOp(
            resource=var.handle, dtype=var.dtype, name=f"transfer_read_{index}"
        )


def reroute(old_reads: Sequence[tf.Operation], value: tf.Tensor) -> None:
    """Make every consumer of ``old_reads`` consume ``value`` instead. Graph surgery through
    ``Operation._update_input`` (the only way to change an input of an op that exists): done
    before the graph is finalised and before any session runs it."""
    for read in old_reads:
        old = read.outputs[0]
        for consumer in list(old.consumers()):
            for j, t in enumerate(consumer.inputs):
                if t is old:
                    consumer._update_input(j, value)  # noqa: SLF001 - see the docstring


@dataclass
class Scheduled:
    """What the worker's graph gains: ops to run with every step (staged puts) and once before
    the first (the first puts), and the reads whose receives carry the parameters."""

    step_ops: list
    prime_ops: list
    read_names: dict[int, list[str]]


def schedule_reads(
    variables: Sequence,
    reads: dict[int, list],
    plan: TransferPlan,
    worker_device: str,
    ordered: bool,
    staged: bool,
) -> Scheduled:
    """Replace the model's reads of ``variables`` by ordered and/or staged ones (parameter_server).

    Unordered and unstaged: nothing changes (today's graph)."""
    if not ordered and not staged:
        return Scheduled([], [], {i: [op.name for op in ops] for i, ops in reads.items()})
    buckets = plan.buckets if ordered else (plan.order,)
    step_ops, prime_ops, names = [], [], {}
    arrived: list = []
    for b, bucket in enumerate(buckets):
        marks = []
        for i in bucket:
            var = variables[i]
            read = explicit_read(var, i, arrived)
            names[i] = [read.op.name]
            with v1.device(worker_device):
                if staged:
                    put = tf.raw_ops.Stage(values=[read], shared_name=_stage_name(var))
                    value = tf.raw_ops.Unstage(dtypes=[var.dtype], shared_name=_stage_name(var))[0]
                    value.set_shape(var.shape)
                    step_ops.append(put)
                    marks.append(put)
                    with v1.device(var.device):
                        first = tf.raw_ops.ReadVariableOp(resource=var.handle, dtype=var.dtype)
                    prime_ops.append(tf.raw_ops.Stage(values=[first], shared_name=_stage_name(var)))
                else:
                    value = tf.identity(read, name=f"transfer_arrived_{i}")
                    marks.append(value.op)
            reroute(reads.get(i, []), value)
        if ordered and b + 1 < len(buckets):
            with v1.device(worker_device):
                arrived = [tf.group(*marks, name=f"transfer_bucket_{b}_arrived")]
    return Scheduled(step_ops, prime_ops, names)


def ordered_pulls(
    masters: Sequence,
    replicas: Sequence,
    plan: TransferPlan | None,
    after: Sequence,
    local_device: str,
) -> tuple[list, dict[int, list[str]]]:
    """distributed_replicated's copy back of the updated values into the local replica, in
    buckets in consumption order (``plan``), or all at once (``plan`` None: today's graph)."""
    if plan is None:
        graph = v1.get_default_graph()
        first = len(graph.get_operations())
        with tf.control_dependencies(list(after)):
            assigns = [r.assign(m) for r, m in zip(replicas, masters, strict=True)]
        reads = variable_reads(graph.get_operations()[first:], masters)
        return assigns, {i: [op.name for op in ops] for i, ops in reads.items()}
    assigns: list = []
    names: dict[int, list[str]] = {}
    gate: list = list(after)
    for b, bucket in enumerate(plan.buckets):
        marks = []
        for i in bucket:
            read = explicit_read(masters[i], i, gate)
            names[i] = [read.op.name]
            with v1.device(local_device):
                marks.append(replicas[i].assign(read, read_value=False))
        assigns += marks
        if b + 1 < len(plan.buckets):
            with v1.device(local_device):
                gate = list(after) + [tf.group(*marks, name=f"transfer_bucket_{b}_arrived")]
    return assigns, names


def measured_first_use(
    build: Callable[[], tuple[Sequence, Sequence[tf.Operation], tf.Operation]],
    threads: tuple[int, int],
    steps: int = 2,
) -> list[float]:
    """tac's input: per variable, microseconds from the start of a profiled training step of the
    model alone (its own graph, variables local) to the start of the first op that consumes it.

    ``build()`` runs in a fresh graph and returns (variables, the ops that consume them, the
    training op). Grappler's
    rewrites are off for this step so that the ops keep their graph names."""
    graph = tf.Graph()
    with graph.as_default():
        variables, region, train = build()
        reads = variable_reads(region, variables)
        init = v1.global_variables_initializer()
    config = v1.ConfigProto(
        intra_op_parallelism_threads=threads[0], inter_op_parallelism_threads=threads[1]
    )
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    metadata = v1.RunMetadata()
    with v1.Session(graph=graph, config=config) as sess:
        sess.run(init)
        for _ in range(steps):
            sess.run(train)
        options = v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE)
        sess.run(train, options=options, run_metadata=metadata)
    starts: dict[str, int] = {}
    for dev in metadata.step_stats.dev_stats:
        for node in dev.node_stats:
            name = node.node_name.split(":")[0]
            starts[name] = min(starts.get(name, node.all_start_micros), node.all_start_micros)
    origin = min(starts.values()) if starts else 0
    out = []
    for i in range(len(variables)):
        consumers = [c.name for op in reads.get(i, []) for c in op.outputs[0].consumers()]
        times = [starts[c] - origin for c in consumers if c in starts]
        out.append(float(min(times)) if times else math.inf)
    return out


def write_order(
    path: Path,
    plan: TransferPlan,
    read_names: dict[int, list[str]],
    grad_names: dict[int, list[str]],
    mode: dict,
) -> None:
    """The consumption order, the reads that carry each variable to the worker and the
    gradients that go back, for ``tflaunch trace`` (tflaunch.trace.transfers) to compare
    with the order the receives finished in."""
    doc = {
        **mode,
        "variables": [
            {
                "name": plan.names[i],
                "bytes": plan.nbytes[i],
                "consumption_rank": plan.tic_rank[i],
                "send_rank": plan.order.index(i),
                "reads": read_names.get(i, []),
                "gradients": grad_names.get(i, []),
            }
            for i in range(len(plan.names))
        ],
        "buckets": [list(b) for b in plan.buckets],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
