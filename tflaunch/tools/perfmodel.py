"""A performance model of distributed CNN training: images/sec for W workers x P PS per variable
update, from a single worker's compute time, the bytes each PS holds and netbench's link figures.

Assumptions (printed by ``tflaunch model``):

1. A worker's step does not overlap compute and communication: it pulls every variable, computes,
   and pushes a gradient of every variable (TF1 between-graph replication as models.benchmark
   runs it). Its pulls from the P PS go in parallel, and so do its pushes.
2. ``parameter_server`` and ``distributed_replicated`` move the same bytes (the latter also copies
   the values into the local replica, a memory copy taken as free), asynchronously.
3. Links are full duplex: a PS sends the pulls and receives the pushes at once, each at ``beta``.
   Transfers that share a link share its ``beta`` (processor sharing), so workers queue at a busy
   PS. With ``nic`` (the default: one host's traffic to all its peers shares one NIC of
   ``beta``, as on shaped test hosts or cloud instances), a worker also pulls and pushes the
   whole model ``B`` through its own link: a phase takes at least ``B / beta``, whatever P is.
   Without (``--no-nic``: tasks of one host talk over loopback), only the PS's links bind.
   PS hosts are dedicated; PS tasks sharing a worker's host are modelled as if they did not.
4. The asynchronous PS cluster is a closed queueing network solved by mean-value analysis: W
   workers cycle through compute (with ``--shared-cores``, a queue: the hosts share the cores a
   lone worker used), a pull phase and a push phase. In a phase a worker moves bytes with every
   PS at once, sharing each PS's link with the workers already in that phase (as many as with
   one worker fewer); the phase ends with its last PS, so the queueing part of the fullest PS's
   time is stretched by H(P_eff), the mean maximum of P_eff exponential delays (P_eff = total /
   largest PS demand): ``phase = max(B / beta, B_max / beta (1 + H(P_eff) N_phase))``; with
   staged variables (8) not stretched, as their pull and push keep both directions of a PS's
   link busy (:func:`fork_stretch`). Images/s = batch x throughput at n = W.
5. ``collective_all_reduce`` is synchronous ring all-reduce:
   ``step = t_compute + 2 (W-1)/W B / beta + 2 (W-1) alpha + 2 alpha n_vars``: the ring moves
   2 (W-1)/W of the model through every worker's link each way, and each variable's all-reduce
   costs one round trip more (fitted: 8 workers at 1 Gb/s took 0.45 s over the bytes' time, 190
   variables x 2 x 1.4 ms; a ring latency per variable per step, 2 (W-1) n_vars alpha, would be
   3.6 s). W workers make W steps per step.
6. ``alpha`` (latency) and ``beta`` (bandwidth) are one link's, from netbench (median over pairs):
   alpha the smallest message's time, beta the slope between its two largest sizes.
7. Without ``--shared-cores``, a worker's compute per step is the lone worker's, or, with
   ``--compute-img-s-at W=R`` (W lone workers at once, each on cores of its own), the measured
   figure interpolated at W: contention for caches and memory bandwidth on one many-core host.
8. With ordered transfers (``--transfer_order tic|tac``: ``--overlap``) the variables come in K
   buckets in the order the forward pass uses them, so the forward pass (a third of the
   compute; the backward pass is two thirds, as in 11) starts once the first bucket is in and
   runs beside the rest of the pull; the backward pass and the push follow: the cycle is
   ``fixed + max(phase, first + t_compute / 3) + 2/3 t_compute + phase``, ``first = alpha +
   max_p B_p / (K beta)``, instead of ``fixed + phase + t_compute + phase`` (phases as in 4,
   queueing included). With staged variables (``--staged_vars``: ``--staged``) a step computes
   on the values the step before fetched, and its own fetch for the next step starts with it:
   the pull crosses the link (PS to worker) while the step computes and pushes its gradients
   the other way, so the cycle is ``fixed + t_compute + phase``: one phase, not two.
9. gRPC's CPU cost per byte (``cpu_s_per_byte``: one unshaped netbench stream is CPU-bound, so
   its time per byte is that cost) is paid on a host's own cores (``cores_per_host``, 0: not
   modelled): a worker's CPU per step is ``t_compute + 2 B c / cores`` (pull and push), which
   computation cannot hide. A loaded PS moves at most ``ps_bytes_per_s`` (in and out together:
   netbench's PS test with several workers, which goes past one stream) however fast its link.
10. Synchronous PS (``--cross_replica_sync``: every worker waits for all at the end of each
   step): per step each PS p moves W B_p out and W B_p in. A phase takes
   ``max(B / beta, W B_max / beta, W B_max / (ps_bytes_per_s / 2))``; the step is
   ``cpu + fixed + 2 phase``; with staged variables the next pull runs beside this step's
   compute and push, but only in part (a variable's new value leaves the PS once every worker's
   gradient for it is in): ``max(cpu, (2 - o) phase, 2 W B_max / ps_bytes_per_s) + fixed``, with
   ``o`` = ``SYNC_STAGED_OVERLAP`` (0.67, measured on the many-core lab).
11. The ring's own CPU (``ring_cpu_s_per_byte``): MultiWorkerMirroredStrategy's CPU collectives
   (receive, add, copy, concatenate and split per pack) cost far more per byte than one gRPC
   stream; fitted to the default ring at two rates on the many-core lab, it replaces the
   per-variable round trip of 5 when set: ``comm = 2 (W-1)/W b (1/beta + c_ring)`` with ``b`` the
   bytes on the wire (half with ``--compact_gradient_transfer``). With ``packs`` > 1 the link part
   of all but the last pack overlaps the backward pass (two thirds of the compute).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from tflaunch.errors import TflaunchError
from tflaunch.models.placement_math import STRATEGIES
from tflaunch.models.registry import VARIABLE_UPDATES as UPDATES
from tflaunch.models.registry import model_names

ASSUMPTIONS = __doc__.split("Assumptions (printed by ``tflaunch model``):", 1)[1].strip()


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
) -> Prediction:
    """Images/sec of one setting. ``overlap``: ordered transfers, ``staged``: staged variables
    (assumption 8; asynchronous PS modes); ``sync``: synchronous PS steps (assumption 10, where
    ``overlap`` or ``staged`` means staged); ``packs`` and ``compact``: the all-reduce's
    ``--gradient_repacking`` and ``--compact_gradient_transfer`` (assumption 11)."""
    if workers < 1:
        raise ModelError("at least one worker.")
    link = inputs.link
    if update == "collective_all_reduce":
        return _ring(inputs, workers, packs, compact)
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


def _ring(inputs: Inputs, workers: int, packs: int = 1, compact: bool = False) -> Prediction:
    """Synchronous ring all-reduce (assumptions 5 and 11)."""
    w, link = workers, inputs.link
    n_vars = len(inputs.variable_bytes)
    wire = inputs.model_bytes / (2 if compact else 1)
    compute = inputs.compute_s * w if inputs.shared_cores else inputs.compute_with(w)
    comm = overlapped = 0.0
    if w > 1:
        moved = 2 * (w - 1) / w * wire
        link_s = moved / link.bandwidth + 2 * (w - 1) * link.latency_s
        if inputs.ring_cpu_s_per_byte:
            comm = link_s + moved * inputs.ring_cpu_s_per_byte
        else:
            comm = link_s + (2 * link.latency_s + inputs.per_variable_s) * n_vars
        if packs > 1:
            overlapped = min(link_s * (packs - 1) / packs, BACKWARD_SHARE * compute)
    step = compute + comm - overlapped
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
) -> list[Prediction]:
    """Every setting; ``staged`` applies to ``parameter_server`` alone (``--staged_vars``),
    ``sync`` to the PS modes, ``packs`` and ``compact`` to the all-reduce (as :func:`predict`)."""
    out = []
    ps_counts = list(ps_counts)
    for w in workers:
        for update in updates:
            if update == "collective_all_reduce":
                out.append(predict(inputs, w, 0, update, packs=packs, compact=compact))
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


# -- inputs from measurements ------------------------------------------------------------------


def link_from_netbench(result: Mapping) -> Link:
    """Latency: median over pairs of the smallest message's time. Bandwidth: median over pairs
    of the slope between the two largest sizes (bytes per extra second)."""
    rows = result.get("point_to_point") or []
    sizes = sorted(result.get("sizes") or [])
    if not rows or len(sizes) < 2:
        raise ModelError("netbench result needs point-to-point rows at two sizes at least.")
    by_pair: dict[tuple[str, str], dict[int, float]] = {}
    for r in rows:
        by_pair.setdefault((r["src"], r["dst"]), {})[r["bytes"]] = r["median_s"]
    small, big2, big = sizes[0], sizes[-2], sizes[-1]
    latencies = [t[small] for t in by_pair.values() if small in t]
    slopes = []
    for t in by_pair.values():
        if big in t and big2 in t:
            dt = t[big] - t[big2]
            slopes.append((big - big2) / dt if dt > 0 else big / t[big])
    if not latencies or not slopes:
        raise ModelError("netbench result lacks the smallest or the two largest sizes.")
    return Link(statistics.median(latencies), statistics.median(slopes))


def compute_from_single(images_per_sec: float, batch_size: int) -> float:
    """A lone worker's (no cluster) step time."""
    if images_per_sec <= 0:
        raise ModelError("the single-worker images/sec must be positive.")
    return batch_size / images_per_sec


def compute_from_trace(trace_dir: Path) -> tuple[float, str, int]:
    """A lone worker's step time without its communication, from the trace of a traced
    one-worker run (``tflaunch up --trace``, any program): the step's wall time less the time
    it spent only sending, receiving or waiting on a receive (compute and the program's own
    idle time stay in). Returns (seconds, the worker, traced steps)."""
    path = trace_dir / "trace_summary.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(
            f"no trace summary at {path}: run one worker with 'tflaunch up CLUSTER --trace "
            "STEPS' first (or 'tflaunch trace RUN' if trace.json is there)."
        ) from None
    except ValueError as exc:
        raise ModelError(f"{path} is not JSON ({exc}).") from None
    workers = [
        t for t, s in summary.items() if t.startswith(("chief:", "worker:")) and s.get("own_steps")
    ]
    if len(workers) != 1:
        raise ModelError(
            f"{path}: {len(workers)} workers with traced steps ({', '.join(workers) or 'none'}); "
            "--from-run needs a traced run of one worker (roles: {worker: 1}) whose trace "
            "marks its steps."
        )
    p = summary[workers[0]]["per_step_ms"]
    seconds = (p["total"] - p["communication"] - p["recv_wait"]) / 1000.0
    if seconds <= 0:
        raise ModelError(f"{path}: {workers[0]}'s traced steps hold no compute.")
    return seconds, workers[0], int(summary[workers[0]]["steps"])


def parse_link(text: str) -> Link:
    """``LATENCY_US,BANDWIDTH_MB_S`` (e.g. 50,1000) as a Link."""
    try:
        latency, bandwidth = (float(x) for x in text.split(","))
    except ValueError:
        raise ModelError(
            f"--link {text!r}: give latency in µs and bandwidth in MB/s, e.g. --link 50,1000."
        ) from None
    if latency < 0 or bandwidth <= 0:
        raise ModelError(f"--link {text!r}: latency at least 0, bandwidth above 0.")
    return Link(latency * 1e-6, bandwidth * 1e6)


def load_netbench(path: Path) -> dict:
    candidate = path / "netbench.json" if path.is_dir() else path
    try:
        return json.loads(candidate.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"no netbench result at {candidate}; run 'tflaunch netbench'.") from None
    except ValueError as exc:
        raise ModelError(f"{candidate} is not JSON ({exc}).") from None


# -- text --------------------------------------------------------------------------------------


def prediction_lines(predictions: Sequence[Prediction]) -> list[str]:
    from tflaunch.text import aligned

    rows = [("WORKERS", "PS", "VARIABLE UPDATE", "PLACEMENT", "IMG/s", "STEP ms", "BOUND")]
    for p in predictions:
        rows.append(
            (
                str(p.workers),
                str(p.ps) if p.variable_update != "collective_all_reduce" else "-",
                p.variable_update,
                p.strategy or "-",
                f"{p.images_per_sec:.1f}",
                f"{p.step_s * 1e3:.0f}",
                p.bound,
            )
        )
    return aligned(rows)


def error_pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def measured_lines(inputs: Inputs, rows: Iterable, strategy: str) -> tuple[list[str], float | None]:
    """``tflaunch bench --predict``: each measured row (bench.Row) beside its prediction, and
    the median absolute error in percent."""
    from tflaunch.text import aligned

    table = [("WORKERS", "PS", "VARIABLE UPDATE", "REAL", "MEASURED", "PREDICTED", "ERROR %")]
    errors = []
    for row in rows:
        point = row.point
        if row.mean is None:
            continue
        pred = predict(inputs, point.workers, point.ps, point.variable_update, strategy)
        err = error_pct(pred.images_per_sec, row.mean)
        errors.append(abs(err))
        table.append(
            (
                str(point.workers),
                str(point.ps),
                point.variable_update,
                str(point.real_data),
                f"{row.mean:.1f}",
                f"{pred.images_per_sec:.1f}",
                f"{err:+.1f}",
            )
        )
    median = statistics.median(errors) if errors else None
    lines = aligned(table)
    if median is not None:
        lines.append(f"median absolute error: {median:.1f} % over {len(errors)} rows")
    return lines, median


def load_inputs(path: Path) -> Inputs:
    try:
        return Inputs.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise ModelError(
            f"no model inputs at {path}; write them with 'tflaunch model --save'."
        ) from None
    except ValueError as exc:
        raise ModelError(f"{path} is not JSON ({exc}).") from None


def _model_variables(model: str, num_classes: int) -> tuple[tuple[str, tuple[int, ...], int], ...]:
    """The model's trainable variables, from one TensorFlow graph build (as tflaunch placement)."""
    from tflaunch.models.registry import UnknownModelError, get_model_spec
    from tflaunch.tools.placement_command import model_variables

    try:
        spec = get_model_spec(model)
    except UnknownModelError as exc:
        raise ModelError(str(exc)) from None
    variables = model_variables(spec, num_classes, command="model")
    return tuple((v.name, tuple(v.shape), v.dtype_size) for v in variables)


def _workers_rate(text: str) -> tuple[int, float]:
    try:
        workers, rate = text.split("=")
        return int(workers), float(rate)
    except ValueError:
        raise ModelError(
            f"--compute-img-s-at {text!r}: write W=IMG_S, e.g. 8=28.4 (each of 8 lone workers "
            "computing at once made 28.4 images/sec)."
        ) from None


def _int_list(text: str) -> list[int]:
    from tflaunch.tools.placement_command import parse_ps_counts

    return parse_ps_counts(text)


@click.command("model")
@click.option("--netbench", "netbench_path", default=None, help="netbench.json or its run dir.")
@click.option("--compute-img-s", type=float, default=None, help="A lone worker's images/sec.")
@click.option(
    "--from-run",
    "from_run",
    default=None,
    metavar="RUN",
    help="Instead of --compute-img-s: a traced one-worker run (up --trace) of any program; its "
    "step time less communication is the compute per step of --batch-size images.",
)
@click.option(
    "--runs-dir",
    "--run-dir",
    "runs_dir",
    default="runs",
    show_default=True,
    help="Where --from-run's run is.",
)
@click.option(
    "--link",
    "link_text",
    default=None,
    metavar="US,MB_S",
    help="Instead of --netbench: one link's latency (µs) and bandwidth (MB/s).",
)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option(
    "--model",
    "model_name",
    type=click.Choice(model_names(aliases=True)),
    default="inception3",
    show_default=True,
    help="A network of tflaunch.models.registry (as 'tflaunch placement --model').",
)
@click.option("--num-classes", type=int, default=1001, show_default=True)
@click.option("--per-variable-us", type=float, default=0.0, show_default=True)
@click.option(
    "--nic/--no-nic",
    default=True,
    show_default=True,
    help="Each host's traffic shares one link of netbench's bandwidth (--no-nic: one host, loopback).",
)
@click.option(
    "--shared-cores",
    is_flag=True,
    help="Every task runs on the cores the lone worker used (namespace hosts of one machine).",
)
@click.option(
    "--compute-img-s-at",
    "compute_at_text",
    multiple=True,
    metavar="W=IMG_S",
    help="Each of W lone workers' images/sec while all W compute at once (repeatable).",
)
@click.option("--inputs", "inputs_path", default=None, help="Model inputs saved with --save.")
@click.option("--save", "save_path", default=None, help="Write the model inputs here (JSON).")
@click.option("--workers", default="1,2,4,8", show_default=True)
@click.option("--ps", "ps_text", default="1-4", show_default=True)
@click.option("--all", "show_all", is_flag=True, help="Print every prediction, not the best.")
@click.option(
    "--overlap",
    is_flag=True,
    help="PS modes run with --transfer_order tic|tac: communication beside computation "
    "(assumption 8).",
)
@click.option(
    "--staged",
    is_flag=True,
    help="parameter_server runs with --staged_vars: the next step's pull beside this step's "
    "compute and push (assumption 8).",
)
@click.option(
    "--sync",
    is_flag=True,
    help="PS modes run synchronous steps, as --cross_replica_sync does (assumption 10); "
    "all-reduce always does.",
)
@click.option(
    "--gradient-repacking",
    "packs",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    metavar="N",
    help="All-reduce in N packs, the first beside the backward pass (the benchmark's "
    "--gradient_repacking; assumption 11; 0: one pack).",
)
@click.option(
    "--compact-gradient-transfer",
    "compact",
    is_flag=True,
    help="All-reduce's gradients cross as float16, half the bytes (assumption 11).",
)
def model_command(
    netbench_path: str | None,
    compute_img_s: float | None,
    from_run: str | None,
    runs_dir: str,
    link_text: str | None,
    batch_size: int,
    model_name: str,
    num_classes: int,
    per_variable_us: float,
    nic: bool,
    shared_cores: bool,
    compute_at_text: tuple[str, ...],
    inputs_path: str | None,
    save_path: str | None,
    workers: str,
    ps_text: str,
    show_all: bool,
    overlap: bool,
    staged: bool,
    sync: bool,
    packs: int,
    compact: bool,
) -> None:
    """Predict images/sec for W workers x P PS per variable update; recommend P and placement."""
    packs = max(1, packs)  # 0 and 1 both mean one pack
    if sync and overlap:
        raise ModelError(
            "--sync with --overlap: ordered reads under the synchronous barrier are not in the "
            "model; give --staged (staged variables) or leave --overlap out."
        )
    compute_at = tuple(
        (w, compute_from_single(rate, batch_size))
        for w, rate in (_workers_rate(t) for t in compute_at_text)
    )  # checked before anything slow (TensorFlow builds the model's variables)
    if inputs_path:
        inputs = load_inputs(Path(inputs_path))
    else:
        if (not netbench_path and not link_text) or (compute_img_s is None and not from_run):
            raise ModelError(
                "give --netbench (a netbench run) or --link, and --compute-img-s (a lone "
                "worker's images/sec at --batch-size) or --from-run (a traced one-worker run); "
                "or --inputs FILE."
            )
        from tflaunch.tools.placement_command import require_tensorflow

        require_tensorflow("model", "builds the model's variables (without --inputs)")
        if from_run:
            from tflaunch.runtime.run import Run

            compute_s, worker, steps = compute_from_trace(
                Run.open(runs_dir, from_run).dir / "trace"
            )
            click.echo(
                f"from run {from_run}: {worker}'s {steps} traced steps, {compute_s * 1e3:.1f} ms "
                f"each without communication ({batch_size / compute_s:.1f} img/s at batch "
                f"{batch_size})"
            )
        else:
            assert compute_img_s is not None
            compute_s = compute_from_single(compute_img_s, batch_size)
        link = (
            parse_link(link_text)
            if link_text
            else link_from_netbench(load_netbench(Path(netbench_path or "")))
        )
        inputs = Inputs(
            compute_s,
            batch_size,
            _model_variables(model_name, num_classes),
            link,
            per_variable_us * 1e-6,
            nic,
            shared_cores,
            compute_at,
        )
    if save_path:
        Path(save_path).write_text(json.dumps(inputs.to_dict(), indent=1), encoding="utf-8")
    click.echo("Assumptions:\n" + ASSUMPTIONS + "\n")
    click.echo(
        f"inputs: compute {inputs.compute_s * 1e3:.1f} ms per step of {inputs.batch_size} images, "
        f"{len(inputs.variable_bytes)} variables {inputs.model_bytes / 1e6:.1f} MB, latency "
        f"{inputs.link.latency_s * 1e6:.0f} µs, bandwidth {inputs.link.bandwidth / 1e6:.0f} MB/s"
        f"{', a NIC per host' if inputs.nic else ''}"
        f"{', cores shared by all tasks' if inputs.shared_cores else ''}"
        + "".join(f", compute {c * 1e3:.0f} ms at {w} workers" for w, c in inputs.compute_at)
    )
    click.echo(
        "PS steps: "
        + ("synchronous (assumption 10)" if sync else "asynchronous")
        + f"; all-reduce: {packs} pack(s), "
        + ("float16 on the wire" if compact else "float32")
    )
    predictions = grid(
        inputs, _int_list(workers), _int_list(ps_text), overlap=overlap, staged=staged,
        sync=sync, packs=packs, compact=compact,
    )  # fmt: skip
    if show_all:
        for line in prediction_lines(predictions):
            click.echo(line)
        click.echo("")
    best = recommend(predictions)
    click.echo("Recommended per worker count:")
    for line in prediction_lines([best[w] for w in sorted(best)]):
        click.echo(line)
