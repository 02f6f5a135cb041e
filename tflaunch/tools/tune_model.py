"""The performance model per host layout: where each worker and each PS of a setting's plan sits.

:mod:`tflaunch.tools.perfmodel` takes every worker as alike. With a NIC per host and PS
co-located on worker hosts they are not: a worker reads the PS on its own host over loopback and
only the rest through its NIC, and that PS's NIC also carries its share of every other worker's
traffic. Under asynchronous PS training each worker goes at its own pace, so the cluster's
images/sec is the sum of unequal workers' rates (measured on 1 Gb/s links, 2 workers, 1 PS on
worker 0's host: 7.1 img/s, where the model of identical workers gave 2.3).

This module solves the same queueing network as perfmodel's assumption 4 with one class per
worker, by Schweitzer's approximate mean-value analysis (a fixed point instead of the exact
recursion over the population):

- each host has a NIC of ``beta`` each way (full duplex); a pull of PS p's ``B_p`` by a worker on
  another host takes PS p's host's NIC out and the worker host's NIC in, a push the reverse, so
  one direction's figures stand for both; bytes between a worker and a PS of its own host cross
  that host's loopback, at netbench's figure within a host (free when it was not measured);
- a worker's phase moves its remote bytes at once; on each NIC it shares the link with the other
  workers' phases there (processor sharing: ``R = D (1 + Q_others)``, Q the time-average number
  of the others' transfers on that NIC); the phase ends with its slowest transfer, the queueing
  part of its fullest remote PS stretched by H(P_eff) as in assumption 4;
- compute is perfmodel's (shared cores a queue, contention measured at W), and the cycle is
  perfmodel's ``worker_cycle`` (assumption 8: with ordered transfers the forward pass beside
  the pull after the first bucket, with staged variables the next pull beside compute and push).

With every worker alike (PS on hosts of their own, or one host and no NIC) it gives what the
exact recursion gives to within a few per cent; the tests check it against perfmodel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tflaunch.tools import perfmodel as pm
from tflaunch.tools import tune_settings as ts

ITERATIONS = 200


@dataclass(frozen=True)
class Layout:
    """The host of each worker (chief first) and of each PS, from a setting's plan."""

    worker_hosts: tuple[str, ...]
    ps_hosts: tuple[str, ...]


@dataclass(frozen=True)
class LayoutPrediction:
    images_per_sec: float
    step_s: float  # the mean worker step
    bound: str
    worker_steps_s: tuple[float, ...]


def predict_setting(
    inputs: pm.Inputs,
    layout: Layout,
    setting: ts.Setting,
    loopback: pm.Link | None = None,
    sync: bool = False,
) -> LayoutPrediction:
    """:func:`predict` for one of tune's settings: its update, placement (all-reduce has none:
    round robin) and transfer (``tic`` ordered, ``staged`` staged variables; the all-reduce's
    packs and float16). ``sync``: the PS settings run synchronous steps, which perfmodel's
    assumption 10 predicts for PS on hosts of their own (tune notes where they are not)."""
    return predict(
        inputs,
        layout,
        setting.update,
        setting.strategy,
        overlap=setting.transfer == "tic",
        loopback=loopback,
        staged=setting.transfer == "staged",
        sync=sync,
        packs=setting.packs,
        compact=setting.compact,
    )


def predict(
    inputs: pm.Inputs,
    layout: Layout,
    update: str,
    strategy: str = "round_robin",
    overlap: bool = False,
    buckets: int = 8,
    loopback: pm.Link | None = None,
    staged: bool = False,
    sync: bool = False,
    packs: int = 1,
    compact: bool = False,
) -> LayoutPrediction:
    """images/sec of a setting on ``layout`` (all-reduce, synchronous PS steps and one host
    without a NIC: as perfmodel predicts them). ``overlap``: ordered transfers; ``staged``:
    staged variables; ``sync``: synchronous PS steps, without a term for ordered reads under
    the barrier (predicted as without them); ``packs``, ``compact``: the all-reduce's."""
    workers = len(layout.worker_hosts)
    if update == ts.ALL_REDUCE or sync or not inputs.nic or not layout.ps_hosts:
        p = pm.predict(
            inputs, workers, len(layout.ps_hosts), update, strategy, overlap and not sync,
            buckets, sync=sync, packs=packs, compact=compact, staged=staged,
        )  # fmt: skip
        return LayoutPrediction(p.images_per_sec, p.step_s, p.bound, (p.step_s,) * workers)
    loads = pm.bytes_per_ps(inputs, len(layout.ps_hosts), strategy)
    beta = inputs.link.bandwidth
    # Per worker: seconds on each NIC it uses in one phase (its own, and each remote PS host's).
    demands: list[dict[str, float]] = []
    remote_ps: list[list[float]] = []
    for host in layout.worker_hosts:
        remote = [b / beta for b, h in zip(loads, layout.ps_hosts, strict=True) if h != host and b]
        by_host: dict[str, float] = {}
        for b, h in zip(loads, layout.ps_hosts, strict=True):
            if h != host and b:
                by_host[h] = by_host.get(h, 0.0) + b / beta
        own = sum(remote)
        demand = {f"nic:{host}": own} if own else {}
        local = sum(b for b, h in zip(loads, layout.ps_hosts, strict=True) if h == host)
        if local and loopback is not None:
            demand[f"loop:{host}"] = local / loopback.bandwidth
        for h, seconds in by_host.items():
            key = f"nic:{h}"
            demand[key] = max(demand.get(key, 0.0), seconds)
        demands.append(demand)
        remote_ps.append(remote)
    compute_s = inputs.compute_with(workers)
    fixed = 2 * inputs.link.latency_s + 2 * inputs.per_variable_s * len(inputs.variable_bytes)
    first = pm.first_bucket_s(inputs.link, max(loads), buckets) if overlap else None
    if staged:
        first = None
    own_links = [f"nic:{h}" for h in layout.worker_hosts]
    return _solve(workers, compute_s, inputs.shared_cores, fixed, demands, own_links, remote_ps,
                  first, inputs.batch_size, staged)  # fmt: skip


def _solve(
    workers: int,
    compute_s: float,
    shared_cores: bool,
    fixed: float,
    demands: Sequence[dict[str, float]],
    own_links: Sequence[str],
    remote_ps: Sequence[Sequence[float]],
    first: float | None,
    batch: int,
    staged: bool = False,
) -> LayoutPrediction:
    rates = [1.0 / (compute_s + fixed)] * workers
    computes = [compute_s] * workers
    phases = [0.0] * workers
    for _ in range(ITERATIONS):
        new_rates = []
        for w in range(workers):
            # The others in a phase on each of this worker's NICs, for their whole phase (as
            # perfmodel's in_phase counts them), by the arrival theorem without this worker.
            queued = {
                link: sum(
                    rates[v] * phases[v] for v in range(workers) if v != w and link in demands[v]
                )
                for link in demands[w]
            }
            phases[w] = _phase(demands[w], queued, own_links[w], remote_ps[w], staged)
            if shared_cores:
                busy = sum(rates[v] * computes[v] for v in range(workers) if v != w)
                computes[w] = compute_s * (1 + busy)
            cycle = pm.worker_cycle(computes[w], fixed, phases[w], first, staged)
            new_rates.append(1.0 / cycle)
        rates = [0.5 * a + 0.5 * b for a, b in zip(rates, new_rates, strict=True)]
    steps = tuple(1.0 / r for r in rates)
    total = sum(rates)
    return LayoutPrediction(total * batch, workers / total, _bound(demands, phases, shared_cores,
                            rates, compute_s), steps)  # fmt: skip


def _phase(
    demand: dict[str, float],
    queued: dict[str, float],
    own: str,
    remote: Sequence[float],
    staged: bool = False,
) -> float:
    """The phase ends with its slowest transfer: through the worker's own NIC (shared with the
    others' transfers to a PS on its host), or from its fullest remote PS, whose queueing part is
    stretched by H(P_eff), unless staged (perfmodel's assumption 4, :func:`pm.fork_stretch`)."""
    if not demand:
        return 0.0
    fork = pm.fork_stretch(remote, staged)
    mine = [k for k in demand if k == own or k.startswith("loop:")]
    own_s = max((demand[k] * (1 + queued[k]) for k in mine), default=0.0)
    ps_s = max(
        (d * (1 + fork * queued[k]) for k, d in demand.items() if k not in mine), default=0.0
    )
    return max(own_s, ps_s)


def _bound(demands, phases, shared_cores: bool, rates, compute_s: float) -> str:
    if shared_cores and sum(r * compute_s for r in rates) >= 0.75:
        return "cores"
    base = [max(d.values(), default=0.0) for d in demands]
    stretched = any(p > 1.05 * b for p, b in zip(phases, base, strict=True) if b)
    return "ps" if stretched else "workers"
