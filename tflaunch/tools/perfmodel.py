"""A performance model of distributed CNN training: images/sec for W workers x P PS per variable
update, from a single worker's compute time, the bytes each PS holds and netbench's link figures.

The model only: its inputs from measurements are :mod:`tflaunch.tools.perfmodel_inputs`, its
tables :mod:`tflaunch.tools.perfmodel_text`, ``tflaunch model`` :mod:`tflaunch.tools.model_command`.
The assumptions, numbered as the code and docs/performance.md cite them, are written out in full
in docs/performance.md ("The performance model's assumptions"); :data:`ASSUMPTIONS` is their one
line each, which ``tflaunch model`` prints.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from tflaunch.errors import TflaunchError
from tflaunch.models.placement_math import STRATEGIES
from tflaunch.models.registry import VARIABLE_UPDATES as UPDATES

ASSUMPTIONS = """\
1. A worker pulls every variable, computes, pushes every gradient; its P pulls (pushes) at once.
2. parameter_server and distributed_replicated move the same bytes, asynchronously.
3. Full-duplex links shared by processor sharing; with a NIC per host a worker's own link carries
   the whole model each phase (--no-nic: one host, only the PS links bind). PS hosts dedicated.
4. Asynchronous PS: a closed queueing network by mean-value analysis; a phase ends with its last
   PS (queueing stretched by H(P_eff), not when staged). Images/s = batch x throughput at W.
5. collective_all_reduce: a synchronous ring, 2 (W-1)/W of the model each way plus a round trip
   per variable.
6. Latency and bandwidth are one link's, from netbench (median over pairs).
7. Compute per step is the lone worker's, or interpolated from --compute-img-s-at W=R.
8. Ordered transfers (--overlap): the forward pass starts after the first of K buckets; staged
   variables (--staged): the next pull beside compute and push, one phase a step.
9. gRPC's CPU per byte on a host's own cores; a loaded PS moves at most ps_bytes_per_s.
10. Synchronous PS (--sync): each PS moves every worker's bytes a step; staged overlaps pull and
   push only in part (SYNC_STAGED_OVERLAP).
11. The ring's own CPU per byte; --gradient-repacking N overlaps all but the last pack with the
   backward pass, as do --all-reduce-bucket-mb's buckets (a ring's round each);
   --compact-gradient-transfer halves the bytes and costs the casts' CPU.
In full: docs/performance.md, "The performance model's assumptions"."""


class ModelError(TflaunchError):
    """The model's inputs are missing or inconsistent."""


@dataclass(frozen=True)
class Link:
    """One link: latency (s) and bandwidth (bytes/s)."""

    latency_s: float
    bandwidth: float


@dataclass(frozen=True)
class Inputs:
    """What the model needs: per-step compute, the model's variables (bytes, in creation order),
    the link, the per-worker batch, and an optional per-variable cost."""

    compute_s: float
    batch_size: int
    variable_bytes: tuple[tuple[str, tuple[int, ...], int], ...]  # (name, shape, dtype size)
    link: Link
    per_variable_s: float = 0.0
    nic: bool = True  # a host's traffic to all its peers shares one link of link.bandwidth
    shared_cores: bool = False  # all workers compute on the cores one lone worker used
    # (W, compute_s of each of W lone workers computing at once on cores of their own): measured
    # contention for caches and memory bandwidth; between and beyond the points, interpolated.
    compute_at: tuple[tuple[int, float], ...] = ()
    # Assumption 9: gRPC's CPU seconds per byte moved (one unshaped netbench stream), the cores
    # of a host (0: CPU not modelled), a loaded PS's bytes/s in and out together.
    cpu_s_per_byte: float = 0.0
    cores_per_host: int = 0
    ps_bytes_per_s: float = 0.0
    # Assumption 11: the ring's CPU seconds per byte on the wire (0: per-variable round trips).
    ring_cpu_s_per_byte: float = 0.0

    def compute_with(self, workers: int) -> float:
        """A worker's compute per step while ``workers`` workers compute at once."""
        points = sorted({(1, self.compute_s), *self.compute_at})
        if workers <= 1 or len(points) == 1:
            return self.compute_s
        for (w0, c0), (w1, c1) in zip(points, points[1:], strict=False):
            if workers <= w1:
                return c0 + (c1 - c0) * (workers - w0) / (w1 - w0)
        (w0, c0), (w1, c1) = points[-2], points[-1]
        return c1 + (c1 - c0) * (workers - w1) / (w1 - w0)  # extrapolated from the last two

    @property
    def model_bytes(self) -> int:
        return sum(_nbytes(v) for v in self.variable_bytes)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> Inputs:
        try:
            return cls(
                float(data["compute_s"]),
                int(data["batch_size"]),
                tuple((str(n), tuple(s), int(d)) for n, s, d in data["variable_bytes"]),
                Link(float(data["link"]["latency_s"]), float(data["link"]["bandwidth"])),
                float(data.get("per_variable_s", 0.0)),
                bool(data.get("nic", True)),
                bool(data.get("shared_cores", False)),
                tuple((int(w), float(c)) for w, c in data.get("compute_at", ())),
                float(data.get("cpu_s_per_byte", 0.0)),
                int(data.get("cores_per_host", 0)),
                float(data.get("ps_bytes_per_s", 0.0)),
                float(data.get("ring_cpu_s_per_byte", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"model inputs are incomplete or malformed ({exc!r}).") from None


def _nbytes(var: tuple[str, tuple[int, ...], int]) -> int:
    n = 1
    for d in var[1]:
        n *= d
    return n * var[2]


def bytes_per_ps(inputs: Inputs, num_ps: int, strategy: str) -> tuple[int, ...]:
    """Bytes on each PS when ``strategy`` places the model's variables (models.placement_math,
    the same arithmetic the benchmark's placement uses)."""
    from tflaunch.models.placement_math import VariableSpec, place

    specs = [VariableSpec(n, s, d) for n, s, d in inputs.variable_bytes]
    return place(strategy, specs, num_ps).bytes_per_ps


@dataclass(frozen=True)
class Prediction:
    workers: int
    ps: int
    variable_update: str
    strategy: str | None
    images_per_sec: float
    step_s: float
    bound: str  # "workers" (their own step) or "ps" (the busiest PS's link) or "ring"


def predict(
    inputs: Inputs,
    workers: int,
    ps: int,
    update: str,
    strategy: str = "round_robin",
    overlap: bool = False,
    buckets: int = 8,
    sync: bool = False,
    packs: int = 1,
    compact: bool = False,
    staged: bool = False,
    bucket_bytes: int = 0,
) -> Prediction:
    """Images/sec of one setting. ``overlap``: ordered transfers, ``staged``: staged variables
    (assumption 8; asynchronous PS modes); ``sync``: synchronous PS steps (assumption 10, where
    ``overlap`` or ``staged`` means staged); ``packs``, ``compact`` and ``bucket_bytes``: the
    all-reduce's ``--gradient_repacking``, ``--compact_gradient_transfer`` and
    ``--all_reduce_bucket_mb`` (assumption 11)."""
    if workers < 1:
        raise ModelError("at least one worker.")
    link = inputs.link
    if update == "collective_all_reduce":
        return _ring(inputs, workers, packs, compact, bucket_bytes)
    if update not in UPDATES:
        raise ModelError(f"unknown variable update {update!r}; choose one of {', '.join(UPDATES)}.")
    if ps < 1:
        raise ModelError(f"{update} needs at least one PS.")
    loads = bytes_per_ps(inputs, ps, strategy)
    own = inputs.model_bytes / link.bandwidth if inputs.nic else 0.0
    fixed = 2 * link.latency_s + 2 * inputs.per_variable_s * len(inputs.variable_bytes)
    if sync:
        staged_sync = overlap or staged
        return _sync_ps(
            inputs, workers, ps, update, strategy, loads, own, fixed, staged_sync, buckets
        )
    throughput, bound = _mean_value_analysis(
        workers,
        inputs.compute_with(workers),
        inputs.shared_cores,
        fixed,
        own,
        [b / link.bandwidth for b in loads],
        first_bucket_s(link, max(loads), buckets) if overlap and not staged else None,
        staged,
    )
    return Prediction(
        workers, ps, update, strategy, throughput * inputs.batch_size, workers / throughput, bound
    )


def first_bucket_s(link: Link, fullest_bytes: int, buckets: int) -> float:
    """The wait for the first of ``buckets`` buckets from the fullest PS (assumption 8)."""
    return link.latency_s + fullest_bytes / max(1, buckets) / link.bandwidth


# Assumption 10, synchronous staged PS: the share of a step's pull phase that runs beside its push
# phase. A variable's new value can leave the PS only once every worker's gradient for it is in,
# so the two overlap only in part: measured on the first many-core round (16 workers, 2 PS, one
# core a host, 1 Gb/s, ours and tf_cnn_benchmarks' staged rows: 0.65-0.72), and checked on the
# second (three cores a host, both rates: within 10.3 %); docs/performance.md has both.
SYNC_STAGED_OVERLAP = 0.67

# The backward pass's share of a step's compute (assumptions 8 and 11).
BACKWARD_SHARE = 2 / 3


def worker_cycle(
    compute_s: float,
    fixed_s: float,
    phase_s: float,
    first_s: float | None = None,
    staged: bool = False,
) -> float:
    """A worker's step (assumptions 1 and 8): pull, compute, push; with ordered reads
    (``first_s``: the first bucket's wait) the forward pass beside the rest of the pull; with
    staged variables the next step's pull beside this step's compute and push."""
    if staged:
        return fixed_s + compute_s + phase_s
    if first_s is not None:
        forward = compute_s * (1 - BACKWARD_SHARE)
        return fixed_s + max(phase_s, first_s + forward) + BACKWARD_SHARE * compute_s + phase_s
    return fixed_s + compute_s + 2 * phase_s


def worker_cpu_s(inputs: Inputs, workers: int) -> float:
    """A worker's CPU per step: its compute, plus (assumption 9) gRPC's cost of pulling and
    pushing the model on its own cores."""
    compute = inputs.compute_with(workers)
    if inputs.cores_per_host and inputs.cpu_s_per_byte:
        compute += 2 * inputs.model_bytes * inputs.cpu_s_per_byte / inputs.cores_per_host
    return compute


def _sync_ps(
    inputs: Inputs,
    workers: int,
    ps: int,
    update: str,
    strategy: str,
    loads: Sequence[int],
    own_s: float,
    fixed_s: float,
    staged: bool,
    buckets: int,
) -> Prediction:
    """Synchronous PS steps (assumption 10)."""
    link = inputs.link
    fullest = max(loads)
    link_s = workers * fullest / link.bandwidth
    cpu_s = 2 * workers * fullest / inputs.ps_bytes_per_s if inputs.ps_bytes_per_s else 0.0
    phase = max(own_s, link_s, cpu_s)
    cpu = worker_cpu_s(inputs, workers)
    if staged:
        pulls_and_pushes = phase * (2 - SYNC_STAGED_OVERLAP)
        step = max(cpu, pulls_and_pushes, cpu_s) + fixed_s + first_bucket_s(link, fullest, buckets)
    else:
        step = cpu + fixed_s + 2 * phase
    # what sets the communication: the PS (its link or its CPU) or each worker's own NIC
    bound = "ps" if max(link_s, cpu_s) >= own_s else "workers"
    return Prediction(
        workers, ps, update, strategy, workers * inputs.batch_size / step, step, bound
    )


# Assumption 11, float16 on the wire: the CPU of the casts (float32 to float16 and back) and of
# the ring's float16 sums, per byte of the float32 gradients on one core. Fitted on the second
# many-core round (three cores a host, 16 workers, 1 and 10 Gb/s: the median over its four
# float16 rows of the step time the model lacked), checked on the 1-core rounds.
FLOAT16_CPU_S_PER_BYTE = 5.0e-9


def ring_buckets(inputs: Inputs, compact: bool, bucket_bytes: int) -> int:
    """How many all-reduces ``--all_reduce_bucket_mb`` makes: buckets of ``bucket_bytes`` on the
    wire (each closes once it holds that many)."""
    wire = inputs.model_bytes / (2 if compact else 1)
    return max(1, math.ceil(wire / bucket_bytes)) if bucket_bytes > 0 else 1


def suggest_bucket_bytes(inputs: Inputs, workers: int, compact: bool = False) -> int:
    """The bucket size for ``--all_reduce_bucket_mb`` on this link (assumption 11). With B bytes
    a bucket, the link waits for the backward pass to fill the first bucket (B / wire of it)
    and pays a ring's round of latency, 2 (W-1) x the link's, once more per bucket (wire / B of
    them): their sum is least at B = wire x sqrt(round / backward pass), kept between a 64th of
    the wire's bytes and all of them."""
    wire = inputs.model_bytes / (2 if compact else 1)
    backward = BACKWARD_SHARE * inputs.compute_with(workers)
    round_s = 2 * max(1, workers - 1) * inputs.link.latency_s
    if backward <= 0 or round_s <= 0:
        return int(wire)
    return int(min(wire, max(wire / 64, wire * math.sqrt(round_s / backward))))


def _ring(
    inputs: Inputs, workers: int, packs: int = 1, compact: bool = False, bucket_bytes: int = 0
) -> Prediction:
    """Synchronous ring all-reduce (assumptions 5 and 11): with ``bucket_bytes``, that many
    buckets overlap the backward pass as packs do, each after the first a ring's round later."""
    w, link = workers, inputs.link
    n_vars = len(inputs.variable_bytes)
    wire = inputs.model_bytes / (2 if compact else 1)
    compute = inputs.compute_s * w if inputs.shared_cores else inputs.compute_with(w)
    casts = 0.0
    if compact and inputs.cores_per_host:
        casts = inputs.model_bytes * FLOAT16_CPU_S_PER_BYTE / inputs.cores_per_host
    buckets = ring_buckets(inputs, compact, bucket_bytes)
    packs = max(packs, buckets)
    comm = overlapped = 0.0
    if w > 1:
        moved = 2 * (w - 1) / w * wire
        link_s = moved / link.bandwidth + 2 * (w - 1) * link.latency_s * buckets
        if inputs.ring_cpu_s_per_byte:
            comm = link_s + moved * inputs.ring_cpu_s_per_byte
        else:
            comm = link_s + (2 * link.latency_s + inputs.per_variable_s) * n_vars
        if packs > 1:
            overlapped = min(link_s * (packs - 1) / packs, BACKWARD_SHARE * compute)
    step = compute + casts + comm - overlapped
    return Prediction(
        w, 0, "collective_all_reduce", None, w * inputs.batch_size / step, step, "ring"
    )


def _mean_value_analysis(
    workers: int,
    compute_s: float,
    shared_cores: bool,
    fixed_s: float,
    own_link_s: float,
    ps_demand_s: Sequence[float],
    overlap_first_s: float | None = None,
    staged: bool = False,
) -> tuple[float, str]:
    """Steps/s of ``workers`` asynchronous workers (assumption 4) and what binds them: "workers"
    (their own step, their own link included), "ps" (a PS's link) or "cores" (shared compute).

    A worker in a pull (or push) phase moves bytes with every PS at once, so an arriving worker
    shares each PS's link with the workers already in that phase (processor sharing, the
    arrival theorem: as many as with one worker fewer). The phase ends when its last PS is
    done: the queueing part of the fullest PS's time is stretched by H(P_eff), the expected
    maximum of P_eff exponential delays, P_eff = total / largest PS demand (round robin's near
    empty PS counts for little). Never shorter than the worker's own link time."""
    fullest = max(ps_demand_s)
    fork = fork_stretch(ps_demand_s, staged)
    in_phase = queued_cores = throughput = 0.0
    phase = compute = 0.0
    for n in range(1, workers + 1):
        phase = max(own_link_s, fullest * (1 + fork * in_phase))
        compute = compute_s * (1 + queued_cores) if shared_cores else compute_s
        throughput = n / worker_cycle(compute, fixed_s, phase, overlap_first_s, staged)
        in_phase = throughput * phase
        queued_cores = throughput * compute
    # What binds: the shared cores near saturation, else the PS where queueing there stretches
    # the phases, else the workers' own steps (their own link included).
    ps_use = throughput * fullest
    core_use = throughput * compute_s if shared_cores else 0.0
    if core_use >= max(0.75, ps_use):
        return throughput, "cores"
    return throughput, "ps" if phase > 1.05 * max(own_link_s, fullest) else "workers"


def fork_stretch(ps_demand_s: Sequence[float], staged: bool = False) -> float:
    """What the queueing part of a phase at its fullest PS is stretched by (assumption 4):
    H(P_eff), or 1 with staged variables (assumption 8), whose pull and push cross the PS's link
    at once, in its two directions, so the link serves both all the time.

    H(P_eff) was fitted to asynchronous steps that pull, compute and push in turn (8 workers at
    1 Gb/s, 2 and 4 PS: 60-67 % of the full-duplex bound measured). There the workers fall into
    step, so a PS's link is busy one way while the other idles. Staged, 16 workers and 2 PS at
    10 Gb/s reached 97 % of that bound (the many-core lab's second round), where H(2) held the
    model to 67 %: it under-predicted by 29 %, and without the stretch by 3 %."""
    fullest = max(ps_demand_s, default=0.0)
    if staged or not fullest:
        return 1.0
    return harmonic(sum(ps_demand_s) / fullest)


def harmonic(x: float) -> float:
    """H(x) = 1 + 1/2 + ... + 1/x, linear between whole numbers (H(1) = 1, H(2) = 1.5)."""
    whole = max(1, int(x))
    value = sum(1 / k for k in range(1, whole + 1))
    return value + (x - whole) / (whole + 1)


def grid(
    inputs: Inputs,
    workers: Iterable[int],
    ps_counts: Iterable[int],
    updates: Sequence[str] = UPDATES,
    strategies: Sequence[str] = STRATEGIES,
    overlap: bool = False,
    staged: bool = False,
    sync: bool = False,
    packs: int = 1,
    compact: bool = False,
    bucket_bytes: int = 0,
) -> list[Prediction]:
    """Every setting; ``staged`` applies to ``parameter_server`` alone (``--staged_vars``),
    ``sync`` to the PS modes, ``packs``, ``compact`` and ``bucket_bytes`` to the all-reduce (as
    :func:`predict`)."""
    out = []
    ps_counts = list(ps_counts)
    for w in workers:
        for update in updates:
            if update == "collective_all_reduce":
                out.append(
                    predict(
                        inputs, w, 0, update, packs=packs, compact=compact,
                        bucket_bytes=bucket_bytes,
                    )
                )  # fmt: skip
                continue
            for p in ps_counts:
                for s in strategies:
                    stage = staged and update == "parameter_server"
                    out.append(
                        predict(inputs, w, p, update, s, overlap=overlap, sync=sync, staged=stage)
                    )
    return out


def recommend(predictions: Iterable[Prediction]) -> dict[int, Prediction]:
    """Per worker count, the fastest prediction; within 1 % of it, the fewest PS, then the
    simplest strategy (the order of STRATEGIES)."""
    by_w: dict[int, list[Prediction]] = {}
    for p in predictions:
        by_w.setdefault(p.workers, []).append(p)
    best = {}
    for w, preds in by_w.items():
        top = max(p.images_per_sec for p in preds)
        close = [p for p in preds if p.images_per_sec >= 0.99 * top]
        order = {s: i for i, s in enumerate(STRATEGIES)}
        best[w] = min(close, key=lambda p: (p.ps, order.get(p.strategy or "", -1)))
    return best
