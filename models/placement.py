"""Variable placement across parameter servers, on TensorFlow graphs (TF1-style between-graph).

The arithmetic lives in :mod:`tflaunch.models.placement_math` (no TensorFlow); this module connects it to
``tf.compat.v1.train.replica_device_setter``:

- ``ps_strategy`` callables (:class:`RoundRobinStrategy`, :class:`GreedyStrategy`,
  :class:`PlannedStrategy`) that size a variable from its op's ``shape`` and ``dtype`` attributes.
  TensorFlow 1's ``byte_size_load_fn`` read the op's first output instead, which for a resource
  variable is a scalar handle of dtype ``resource`` (size 0), so greedy placement put every
  resource variable on PS 0.
- :func:`partition_variables`, a variable-creator scope that splits large trainable variables into
  TensorFlow partitioned variables (``<name>/part_<i>``) along the axis
  :func:`tflaunch.models.placement_math.split_axis` chooses, sliced as ``tf.compat.v1.get_variable`` with a
  partitioner would slice them. Works for ``tf.Variable`` (the tf.Module models) and
  ``tf.compat.v1.get_variable`` (models/nets/deep_mnist.py) in graph mode; tf.Module's
  ``trainable_variables`` lists the shards, and checkpoints store the whole variable.
- :func:`ps_strategy_for_model` (a strategy by name) and :func:`variable_placement` (the device
  setter and the strategy's variable scope in one), what a program enters around model
  construction.

``lpt`` and ``partitioned`` need every variable before the first is placed, so they first build
the model once in a throwaway graph (no values are computed) and plan from that list; every worker
computes the same plan, so all agree on where each variable lives.
"""

from __future__ import annotations

import abc
import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import node_def_pb2

# Not exported under tf.*: the class tf.compat.v1.get_variable returns for partitioned variables.
from tensorflow.python.ops.variables import PartitionedVariable

from tflaunch.models import placement_math as pm
from tflaunch.models.placement_math import VariablePlacement, VariableSpec

_VARIABLE_OPS = ("Variable", "VariableV2", "VarHandleOp", "AutoReloadVariable")


def _node_def(op: Any) -> node_def_pb2.NodeDef:
    return op if isinstance(op, node_def_pb2.NodeDef) else op.node_def


def op_spec(op: Any) -> VariableSpec:
    """Name, shape and element size of the variable an op (or NodeDef) creates.

    Read from the op's ``shape`` and ``dtype`` attributes, which VarHandleOp and VariableV2 both
    carry; other PS ops (hash tables, accumulators) and unknown shapes count as 0 bytes.
    """
    node_def = _node_def(op)
    attr = node_def.attr
    if node_def.op in _VARIABLE_OPS and "shape" in attr and "dtype" in attr:
        shape = tf.TensorShape(attr["shape"].shape)
        if shape.is_fully_defined():
            dtype_size = tf.as_dtype(attr["dtype"].type).size
            return VariableSpec(node_def.name, tuple(shape.as_list()), dtype_size)
    return VariableSpec(node_def.name, (0,), 0)


def op_nbytes(op: Any) -> int:
    """Bytes of the variable an op creates (0 for non-variables); see :func:`op_spec`."""
    return op_spec(op).nbytes


class PsStrategy(abc.ABC):
    """A ``ps_strategy`` for replica_device_setter: called with each PS op, returns a task index.

    ``variable_scope()`` is what to enter, beside the device setter, while the variables are
    created: nothing, except for the partitioned strategy, which shards large variables there.
    """

    @abc.abstractmethod
    def __call__(self, op: Any) -> int:
        """The PS task index for ``op``."""

    def variable_scope(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class RoundRobinStrategy(PsStrategy):
    """PS ops to tasks 0, 1, ..., n-1, 0, ...: replica_device_setter's default, made explicit."""

    def __init__(self, num_tasks: int) -> None:
        self._num_tasks = num_tasks
        self._next = 0

    def __call__(self, op: Any) -> int:
        task = self._next
        self._next = (self._next + 1) % self._num_tasks
        return task


def _colocation_target(op: Any) -> str | None:
    """Name of the op that ``op`` is being created colocated with, if any.

    Optimizer slots are created under ``colocate_with(variable)``: replica_device_setter still
    asks the ps_strategy about them, but TensorFlow then overrides the device with the
    variable's, so a strategy should book their bytes on the variable's task.
    """
    stack = getattr(getattr(op, "graph", None), "_colocation_stack", None)
    for obj in stack.peek_objs() if stack is not None else ():
        target = getattr(obj, "op", obj)
        if isinstance(target, tf.Operation):
            return target.name
    return None


class _BookkeepingStrategy(PsStrategy):
    """Tracks bytes per task and which task each op went to; colocated ops follow their target."""

    def __init__(self, num_tasks: int) -> None:
        self.loads = [0] * num_tasks
        self.task_of: dict[str, int] = {}

    def __call__(self, op: Any) -> int:
        target = _colocation_target(op)
        task = self.task_of.get(target) if target is not None else None
        if task is None:
            task = self._choose(op)
        self.task_of[_node_def(op).name] = task
        self.loads[task] += op_nbytes(op)
        return task

    @abc.abstractmethod
    def _choose(self, op: Any) -> int:
        """The task for an op that does not follow a colocation target."""

    def _least_loaded(self) -> int:
        return min(range(len(self.loads)), key=lambda i: (self.loads[i], i))


class GreedyStrategy(_BookkeepingStrategy):
    """Each variable to the task with the fewest bytes so far (lowest index on ties), online.

    TensorFlow 1's ``GreedyLoadBalancingStrategy`` with a load function that sizes resource
    variables correctly (:func:`op_nbytes`); unlike it, optimizer slots are booked on their
    variable's task, where TensorFlow puts them.
    """

    def _choose(self, op: Any) -> int:
        return self._least_loaded()


class PlannedStrategy(_BookkeepingStrategy):
    """Variables to the tasks a precomputed :class:`VariablePlacement` names, by op name.

    An op the plan does not know and that is not colocated with a known one (a variable the
    planning build did not create, such as a global step) goes to the least-loaded task, counting
    the whole plan from the start; ``unplanned`` lists them.
    """

    def __init__(self, plan: VariablePlacement, max_shard_bytes: int | None = None) -> None:
        super().__init__(plan.num_ps)
        self.plan = plan
        self.max_shard_bytes = max_shard_bytes
        self._planned = plan.device_index()
        self._pending = list(plan.bytes_per_ps)  # planned bytes not created yet
        self.unplanned: list[str] = []

    def _choose(self, op: Any) -> int:
        name = _node_def(op).name
        if name in self._planned:
            task = self._planned[name]
            self._pending[task] -= op_nbytes(op)
            return task
        self.unplanned.append(name)
        return min(range(len(self.loads)), key=lambda i: (self.loads[i] + self._pending[i], i))

    def variable_scope(self) -> contextlib.AbstractContextManager[None]:
        if self.max_shard_bytes is None:
            return contextlib.nullcontext()
        return partition_variables(self.max_shard_bytes)


def ps_strategy_for_model(
    strategy: str, num_ps: int, build_fn: Callable[[], object] | None = None
) -> PsStrategy:
    """The ps_strategy for ``strategy`` on ``num_ps`` PS tasks.

    ``lpt`` and ``partitioned`` plan from the full variable list, learned by running
    ``build_fn`` (which creates the model's variables, as the real build will) once in a
    throwaway graph. Enter the result's ``variable_scope()`` where the variables are created.
    """
    if strategy not in pm.STRATEGIES:
        raise ValueError(
            f"unknown placement {strategy!r}; choose one of {', '.join(pm.STRATEGIES)}"
        )
    if num_ps < 1:
        raise ValueError(f"placement needs at least one PS task, not {num_ps}")
    if strategy == "round_robin":
        return RoundRobinStrategy(num_ps)
    if strategy == "greedy":
        return GreedyStrategy(num_ps)
    if build_fn is None:
        raise ValueError(f"placement {strategy!r} needs build_fn to learn the variables first")
    variables = graph_variables(build_fn)
    if strategy == "lpt":
        return PlannedStrategy(pm.lpt(variables, num_ps))
    max_shard_bytes = pm.choose_max_shard_bytes(variables, num_ps)
    return PlannedStrategy(pm.partitioned(variables, num_ps, max_shard_bytes), max_shard_bytes)


def graph_variables(build_fn: Callable[[], object]) -> list[VariableSpec]:
    """The variables a replica_device_setter would place, in the order it would see them.

    Runs ``build_fn`` once in a throwaway graph (ops only, nothing computed) under a device
    setter whose ps_strategy records each op it is asked about: exactly the ops the real
    strategy will see (optimizer slots, created colocated with their variable, are not among
    them). ``trainable`` comes from the graph's TRAINABLE_VARIABLES collection.
    """
    recorded: list[VariableSpec] = []

    def record(op: Any) -> int:
        recorded.append(op_spec(op))
        return 0

    graph = tf.Graph()
    with graph.as_default():
        with tf.compat.v1.device(
            tf.compat.v1.train.replica_device_setter(ps_tasks=1, ps_strategy=record)
        ):
            build_fn()
        trainable = {
            v.op.name for v in graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
        }
    return [VariableSpec(s.name, s.shape, s.dtype_size, s.name in trainable) for s in recorded]


def trainable_rows(build_fn: Callable[[], object]) -> list[list]:
    """The trainable ones of :func:`graph_variables` as JSON rows ``[name, shape, dtype size]``:
    what ``tflaunch tune`` sizes the model by (the benchmark's ``--result_variables``, the
    probe's ``--print-variables``)."""
    return [[v.name, list(v.shape), v.dtype_size] for v in graph_variables(build_fn) if v.trainable]


def created_variables(build_fn: Callable[[], object]) -> list[VariableSpec]:
    """Trainable variables in the order ``build_fn`` creates them (eager or graph, Keras too).

    Keras's ``model.trainable_variables`` is in layer-graph order, not creation order; the
    creation order is what a device setter sees, so it is recorded with a variable creator.
    """
    created: list[tf.Variable] = []

    def record(next_creator: Callable[..., tf.Variable], **kwargs: Any) -> tf.Variable:
        variable = next_creator(**kwargs)
        created.append(variable)
        return variable

    with tf.variable_creator_scope(record):
        build_fn()
    return [
        VariableSpec(v.name.split(":")[0], tuple(v.shape.as_list()), v.dtype.size)
        for v in created
        if v.trainable
    ]


class ShardedVariable(PartitionedVariable):
    """A PartitionedVariable that tf.Module's variable tracking can see through.

    tf.Module finds variables by flattening its attributes with ``tf.nest``; this class tells
    ``tf.nest`` that its components are its parts, so ``model.trainable_variables`` lists the
    shards (and an optimizer trains them). In ops it is a tensor: the parts concatenated.
    """

    def __tf_flatten__(self) -> tuple[tuple[Any, ...], tuple[tf.Variable, ...]]:
        return (self.name, self.get_shape(), self.dtype, self._partitions), tuple(self)

    @classmethod
    def __tf_unflatten__(
        cls, metadata: tuple[Any, ...], components: Sequence[tf.Variable]
    ) -> ShardedVariable:
        name, shape, dtype, partitions = metadata
        return cls(name, shape, dtype, list(components), partitions)


_PARTITIONING = threading.local()


@contextlib.contextmanager
def partition_variables(max_shard_bytes: int) -> Iterator[None]:
    """Within this scope, trainable variables above ``max_shard_bytes`` become sharded.

    The shards, named ``<name>/part_<i>``, are created one by one, so the device setter places
    each on its own PS. Graph mode only (TensorFlow's partitioned variables do not run eagerly).
    """
    if tf.executing_eagerly():
        raise ValueError("partitioned variables need graph mode (tf.compat.v1 graph building)")

    def creator(next_creator: Callable[..., tf.Variable], **kwargs: Any) -> Any:
        if getattr(_PARTITIONING, "active", False) or not _is_trainable(kwargs):
            return next_creator(**kwargs)
        value = kwargs["initial_value"]
        value = tf.convert_to_tensor(value() if callable(value) else value, kwargs.get("dtype"))
        if not value.shape.is_fully_defined():
            return next_creator(**kwargs)
        graph = tf.compat.v1.get_default_graph()
        name = kwargs.get("name") or "Variable"
        # The name the variable would get (tf.Variable opens a name scope of its name).
        full = graph.unique_name(name, mark_as_used=False)
        whole = VariableSpec(full, tuple(value.shape.as_list()), value.dtype.size)
        shards = pm.shard_variable(whole, max_shard_bytes)
        if shards == [whole]:
            return next_creator(**kwargs)
        graph.unique_name(name)  # reserve it, as the unsharded variable would have
        _PARTITIONING.active = True
        try:
            return _make_sharded(next_creator, kwargs, value, whole, shards)
        finally:
            _PARTITIONING.active = False

    with tf.variable_creator_scope(creator):
        yield


def _is_trainable(kwargs: Mapping[str, Any]) -> bool:
    """tf.Variable's rule: trainable unless said otherwise or synchronized ON_READ."""
    trainable = kwargs.get("trainable")
    if trainable is None:
        return kwargs.get("synchronization") != tf.VariableSynchronization.ON_READ
    return bool(trainable)


def _make_sharded(
    next_creator: Callable[..., tf.Variable],
    kwargs: dict[str, Any],
    value: tf.Tensor,
    whole: VariableSpec,
    shards: Sequence[VariableSpec],
) -> ShardedVariable:
    axis = pm.split_axis(whole.shape)
    pieces = tf.split(value, [s.shape[axis] for s in shards], axis=axis)
    parts = []
    offset = [0] * len(whole.shape)
    for shard, piece in zip(shards, pieces, strict=True):
        # An absolute name scope ("a/b/") so the part's op is exactly "<full name>/part_<i>".
        with tf.compat.v1.name_scope(whole.name + "/"):
            part = next_creator(
                **{
                    **kwargs,
                    "initial_value": piece,
                    "shape": piece.shape,
                    "name": shard.name.rsplit("/", 1)[-1],
                }
            )
        part._set_save_slice_info(  # noqa: SLF001 - how TensorFlow marks a variable as a slice
            tf.Variable.SaveSliceInfo(
                whole.name, list(whole.shape), list(offset), list(shard.shape)
            )
        )
        offset[axis] += shard.shape[axis]
        parts.append(part)
    partitions = [1] * len(whole.shape)
    partitions[axis] = len(parts)
    return ShardedVariable(whole.name, list(whole.shape), value.dtype, parts, partitions)


@contextlib.contextmanager
def variable_placement(
    strategy: str,
    num_ps: int,
    build_fn: Callable[[], object] | None = None,
    **setter_kwargs: Any,
) -> Iterator[PsStrategy]:
    """Device scope placing variables on ``num_ps`` PS tasks by ``strategy``; yields the strategy.

    For a TF1-style (graph mode) program: enter it around model construction, with the
    replica_device_setter arguments the program would pass (``cluster``, ``worker_device``, ...).
    ``build_fn`` (for ``lpt`` and ``partitioned``) must create the same variables as the code
    inside the scope.
    """
    ps_strategy = ps_strategy_for_model(strategy, num_ps, build_fn)
    setter = tf.compat.v1.train.replica_device_setter(
        ps_tasks=num_ps, ps_strategy=ps_strategy, **setter_kwargs
    )
    with tf.compat.v1.device(setter), ps_strategy.variable_scope():
        yield ps_strategy
