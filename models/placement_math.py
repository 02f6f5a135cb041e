"""Variable placement across parameter servers: the arithmetic, without TensorFlow.

A variable is a :class:`VariableSpec` (name, shape, bytes per element); a strategy maps a list of
them, in creation order, to PS task indices and returns a :class:`VariablePlacement` (named so
to keep it apart from the cluster file's host ``Placement``). The strategies:

- ``round_robin``: variable *i* to PS ``i % n``: what ``tf.compat.v1.train.replica_device_setter``
  does by default. On a CNN, kernels and batch-norm offsets alternate, so at 2 PS every kernel
  lands on PS 0.
- ``greedy``: each variable, in creation order, to the PS with the fewest bytes so far (first such
  PS on ties): TensorFlow 1's ``GreedyLoadBalancingStrategy`` with ``byte_size_load_fn``.
- ``lpt``: the same, but largest variable first (longest-processing-time scheduling), which needs
  the full list of variables before the first is placed.
- ``partitioned``: variables larger than a shard limit are split into shards along their longest
  axis, exactly as TensorFlow's ``variable_axis_size_partitioner`` and partitioned variables slice
  them (names ``<name>/part_<i>``); all pieces are placed largest first, then single pieces are
  moved or swapped between the fullest and the emptiest PS while that lowers the fullest. The
  shard limit is the largest of ``total / (n * s)`` for ``s = 1, sqrt 2, 2, ... 128`` that brings
  max/mean within ``BALANCE_TARGET``: as few shards as the balance needs, at any PS count,
  including counts where the largest whole variable is bigger than the per-PS mean.

Everything here is deterministic: every worker of a between-graph cluster computes the same plan.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

# The partitioned strategy shards finer (more shards per PS) until max/mean is at most this.
BALANCE_TARGET = 1.02
# Shards per PS tried, coarsest first: 2 ** (k / 2) for k = 0 .. 14, i.e. 1 to 128.
SHARDS_PER_PS_STEPS = tuple(2 ** (k / 2) for k in range(15))


@dataclass(frozen=True)
class VariableSpec:
    """One variable (or one shard of a partitioned variable): name, shape and element size.

    Only trainable variables are ever sharded: non-trainable ones (batch-norm moving statistics)
    are updated with ``assign`` ops, which a partitioned variable does not offer.
    """

    name: str
    shape: tuple[int, ...]
    dtype_size: int
    trainable: bool = True

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype_size


@dataclass(frozen=True)
class VariablePlacement:
    """Which PS holds each variable (or shard), in creation order, under one strategy."""

    strategy: str
    num_ps: int
    assignment: tuple[tuple[VariableSpec, int], ...]

    @property
    def bytes_per_ps(self) -> tuple[int, ...]:
        loads = [0] * self.num_ps
        for spec, ps in self.assignment:
            loads[ps] += spec.nbytes
        return tuple(loads)

    @property
    def total_bytes(self) -> int:
        return sum(spec.nbytes for spec, _ in self.assignment)

    @property
    def largest_bytes(self) -> int:
        return max(self.bytes_per_ps)

    @property
    def max_over_mean(self) -> float:
        """Bytes on the fullest PS over the mean bytes per PS (1.0 is perfect balance)."""
        total = self.total_bytes
        return self.largest_bytes * self.num_ps / total if total else 1.0

    def device_index(self) -> dict[str, int]:
        """Variable (or shard) name to PS index: the lookup table a planned ps_strategy uses."""
        return {spec.name: ps for spec, ps in self.assignment}


def round_robin(variables: Sequence[VariableSpec], num_ps: int) -> VariablePlacement:
    """Variable i to PS i mod n, as replica_device_setter's default strategy."""
    _check_num_ps(num_ps)
    assignment = tuple((spec, i % num_ps) for i, spec in enumerate(variables))
    return VariablePlacement("round_robin", num_ps, assignment)


def greedy(variables: Sequence[VariableSpec], num_ps: int) -> VariablePlacement:
    """Each variable, in creation order, to the least-loaded PS by bytes."""
    _check_num_ps(num_ps)
    return VariablePlacement("greedy", num_ps, _least_loaded(variables, num_ps))


def lpt(variables: Sequence[VariableSpec], num_ps: int) -> VariablePlacement:
    """Largest variable first, each to the least-loaded PS; reported in creation order."""
    _check_num_ps(num_ps)
    return VariablePlacement("lpt", num_ps, _largest_first(variables, num_ps))


def partitioned(
    variables: Sequence[VariableSpec], num_ps: int, max_shard_bytes: int | None = None
) -> VariablePlacement:
    """Shard every variable above ``max_shard_bytes``, place the pieces largest first, rebalance.

    Without ``max_shard_bytes``, :func:`choose_max_shard_bytes` picks the coarsest limit that
    meets ``BALANCE_TARGET``.
    """
    _check_num_ps(num_ps)
    if max_shard_bytes is None:
        max_shard_bytes = choose_max_shard_bytes(variables, num_ps)
    return _place_shards(variables, num_ps, max_shard_bytes)


def choose_max_shard_bytes(variables: Sequence[VariableSpec], num_ps: int) -> int:
    """The largest shard limit whose partitioned placement is within ``BALANCE_TARGET``.

    Tries ``total / (num_ps * s)`` for s in ``SHARDS_PER_PS_STEPS``; if none meets the target,
    returns the limit with the best balance. A pure function of the variable list, so every
    worker of a between-graph cluster shards the same way.
    """
    total = sum(spec.nbytes for spec in variables)
    best = (math.inf, max(1, total))
    for shards_per_ps in SHARDS_PER_PS_STEPS:
        limit = max(1, math.ceil(total / (num_ps * shards_per_ps)))
        ratio = _place_shards(variables, num_ps, limit).max_over_mean
        if ratio <= BALANCE_TARGET:
            return limit
        if ratio < best[0]:
            best = (ratio, limit)
    return best[1]


def _place_shards(
    variables: Sequence[VariableSpec], num_ps: int, max_shard_bytes: int
) -> VariablePlacement:
    pieces = [shard for spec in variables for shard in shard_variable(spec, max_shard_bytes)]
    owners = _rebalance(pieces, [ps for _, ps in _largest_first(pieces, num_ps)], num_ps)
    return VariablePlacement("partitioned", num_ps, tuple(zip(pieces, owners, strict=True)))


PLACERS: dict[str, Callable[[Sequence[VariableSpec], int], VariablePlacement]] = {
    "round_robin": round_robin,
    "greedy": greedy,
    "lpt": lpt,
    "partitioned": partitioned,
}
# The strategy names, listed here only: every program's --variable_placement and the placement
# report take them from this tuple.
STRATEGIES = tuple(PLACERS)


def place(strategy: str, variables: Sequence[VariableSpec], num_ps: int) -> VariablePlacement:
    """Run the named strategy; ValueError names the valid ones on a typo."""
    try:
        placer = PLACERS[strategy]
    except KeyError:
        raise ValueError(
            f"unknown placement strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}"
        ) from None
    return placer(variables, num_ps)


def split_axis(shape: Sequence[int]) -> int:
    """The axis to shard along: the longest one (first on ties), so it allows the most shards.

    A 1x1x2048x448 kernel cannot be split along its first axis; its longest axis (2048) can.
    """
    return max(range(len(shape)), key=lambda axis: (shape[axis], -axis))


def num_shards(shape: Sequence[int], dtype_size: int, max_shard_bytes: int, axis: int) -> int:
    """Shard count along ``axis``, as TensorFlow's ``variable_axis_size_partitioner`` computes it.

    Each shard holds whole slices along ``axis``, as many as fit in ``max_shard_bytes`` (at least
    one), so a shard exceeds the limit only when a single slice does.
    """
    bytes_per_slice = math.prod(shape) / shape[axis] * dtype_size
    slices_per_shard = max(1, math.floor(max_shard_bytes / bytes_per_slice))
    return math.ceil(shape[axis] / slices_per_shard)


def shard_variable(spec: VariableSpec, max_shard_bytes: int) -> list[VariableSpec]:
    """The pieces TensorFlow creates for ``spec`` under the partitioned strategy.

    Variables of at most ``max_shard_bytes``, scalars and non-trainable variables stay whole under
    their own name. Larger ones become ``<name>/part_<i>``, sliced as TensorFlow slices partitioned variables: the first
    ``dim % k`` shards are one row longer.
    """
    if not spec.trainable or not spec.shape or spec.nbytes <= max_shard_bytes:
        return [spec]
    axis = split_axis(spec.shape)
    count = num_shards(spec.shape, spec.dtype_size, max_shard_bytes, axis)
    dim = spec.shape[axis]
    shards = []
    for i in range(count):
        rows = dim // count + (1 if i < dim % count else 0)
        shape = spec.shape[:axis] + (rows,) + spec.shape[axis + 1 :]
        shards.append(VariableSpec(f"{spec.name}/part_{i}", shape, spec.dtype_size))
    return shards


def _least_loaded(
    pieces: Iterable[VariableSpec], num_ps: int
) -> tuple[tuple[VariableSpec, int], ...]:
    # Heap of (bytes, ps index): the minimum is the least-loaded PS, lowest index on ties, as
    # numpy.argmin in TensorFlow's GreedyLoadBalancingStrategy.
    heap = [(0, ps) for ps in range(num_ps)]
    assignment = []
    for spec in pieces:
        load, ps = heapq.heappop(heap)
        assignment.append((spec, ps))
        heapq.heappush(heap, (load + spec.nbytes, ps))
    return tuple(assignment)


def _largest_first(
    pieces: Sequence[VariableSpec], num_ps: int
) -> tuple[tuple[VariableSpec, int], ...]:
    order = sorted(range(len(pieces)), key=lambda i: -pieces[i].nbytes)  # stable on ties
    placed = _least_loaded((pieces[i] for i in order), num_ps)
    ps_of = {i: ps for i, (_, ps) in zip(order, placed, strict=True)}
    return tuple((pieces[i], ps_of[i]) for i in range(len(pieces)))


def _rebalance(pieces: Sequence[VariableSpec], owners: list[int], num_ps: int) -> list[int]:
    """Move one piece, or swap two, between the fullest and the emptiest PS while that helps.

    Each step moves ``d`` bytes with ``0 < d < gap`` (choosing ``d`` closest to ``gap / 2``),
    which strictly lowers the sum of squared loads, so the loop ends.
    """
    owners = list(owners)
    held: list[list[int]] = [[] for _ in range(num_ps)]
    for i, ps in enumerate(owners):
        held[ps].append(i)
    loads = [sum(pieces[i].nbytes for i in piece_ids) for piece_ids in held]
    for _ in range(50 * len(pieces)):
        fullest = max(range(num_ps), key=lambda ps: (loads[ps], -ps))
        emptiest = min(range(num_ps), key=lambda ps: (loads[ps], ps))
        step = _best_exchange(
            pieces, held[fullest], held[emptiest], loads[fullest] - loads[emptiest]
        )
        if step is None:
            break
        moved, out, back = step
        held[fullest].remove(out)
        held[emptiest].append(out)
        owners[out] = emptiest
        if back is not None:
            held[emptiest].remove(back)
            held[fullest].append(back)
            owners[back] = fullest
        loads[fullest] -= moved
        loads[emptiest] += moved
    return owners


def _best_exchange(
    pieces: Sequence[VariableSpec], full: list[int], empty: list[int], gap: int
) -> tuple[int, int, int | None] | None:
    """(bytes moved, piece leaving the full PS, piece coming back or None) closest to gap/2."""
    best: tuple[int, int, int | None] | None = None
    for out in full:
        for back in (None, *empty):
            moved = pieces[out].nbytes - (pieces[back].nbytes if back is not None else 0)
            if 0 < moved < gap and (best is None or abs(gap - 2 * moved) < abs(gap - 2 * best[0])):
                best = (moved, out, back)
    return best


def _check_num_ps(num_ps: int) -> None:
    if num_ps < 1:
        raise ValueError(f"the number of parameter servers must be at least 1, not {num_ps}")


def summary(placement: VariablePlacement) -> dict[str, object]:
    """A placement's figures as plain data (for JSON output and tables)."""
    loads = placement.bytes_per_ps
    return {
        "strategy": placement.strategy,
        "num_ps": placement.num_ps,
        "max_over_mean": placement.max_over_mean,
        "largest_bytes": max(loads),
        "mean_bytes": placement.total_bytes / placement.num_ps,
        "bytes_per_ps": list(loads),
        "pieces": len(placement.assignment),
    }
