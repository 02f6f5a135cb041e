"""Placement: :func:`make_plan`, a pure, deterministic function of a cluster config and a concrete
host list, puts every task on a host, a port, GPUs and cores, and returns the
:class:`~tflaunch.cluster.plan.Plan`.

Placement rules:
- Slot tasks (chief, then workers, then evaluator) fill the worker hosts in order, at most
  ``workers_per_host`` per host (default: spread evenly over the hosts).
- Co-located PS (the default): PS i goes on worker host i, wrapping round when there are more PS
  than worker hosts (``ps_per_host`` caps how many one host may take). Dedicated PS: one host
  each, after the worker hosts.
- Ports count up from each job's base port per cluster address, skipping ports already taken on
  that address, so tasks never collide however many share a host.
- GPUs: PS get none. Slot tasks get distinct GPUs of their host: ``gpus_per_worker`` each
  (default 1, or all of them when the host runs one slot task); a host without GPUs runs on CPU.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
from collections.abc import Iterable
from dataclasses import replace

from tflaunch.cluster import backends
from tflaunch.cluster.config import LEGACY_KERAS_ENV, ClusterConfig
from tflaunch.cluster.plan import Host, Plan, Program, Task
from tflaunch.cluster.render import check_program
from tflaunch.errors import PlanError

LOCAL_ADDRESS = "127.0.0.1"
MAX_PORT = 65535


def gpu_ids(count: int) -> tuple[str, ...]:
    """The ids of a host's ``count`` GPUs, as CUDA numbers them."""
    return tuple(str(i) for i in range(count))


def hosts_from_config(config: ClusterConfig) -> list[Host]:
    """The hosts written in the cluster file (local default: this machine). A host without
    ``gpus`` gets none here; backends that can find them do (:func:`unset_gpus`)."""
    if not config.hosts:
        return [Host("localhost", LOCAL_ADDRESS, LOCAL_ADDRESS)]
    return [
        Host(
            name=h.name,
            cluster_address=h.address or h.name,
            connect_address=h.connect or h.address or h.name,
            gpu_ids=gpu_ids(h.gpus or 0),
            gpu_source=f"hosts[{i}].gpus" if h.gpus is not None else "",
        )
        for i, h in enumerate(config.hosts)
    ]


def unset_gpus(config: ClusterConfig, host: Host) -> bool:
    """Whether the cluster file leaves ``host``'s GPU count open (no ``gpus:``), so that the
    backend may find it."""
    for entry in config.hosts:
        if entry.name == host.name:
            return entry.gpus is None
    return not host.gpu_source


def checkpoint_dir(config: ClusterConfig, run_dir: str | os.PathLike | None) -> str:
    """``program.checkpoint_dir`` against the workdir (a URL such as ``gs://bucket/run`` as it
    is), else ``checkpoints/`` in the run directory as the tasks see it, ``run_dir`` (shown as
    ``<run directory>/checkpoints`` when planning without a run).

    Where the program runs on hosts of their own (ssh), ``run_dir`` is the run's directory on
    the hosts and both stay paths of the hosts: ``~`` and relative paths are made absolute
    there, by each host's agent (:func:`on_this_host`), not here."""
    chosen = config.program.checkpoint_dir
    if chosen:
        if "://" in chosen:  # the storage's own name, not a path here
            return chosen
        if backends.spec_of(config.backend).workdir_on_hosts:
            return chosen if chosen.startswith("~") else posixpath.join(config.workdir, chosen)
        return os.path.join(config.workdir, os.path.expanduser(chosen))
    return os.path.join(str(run_dir) if run_dir else "<run directory>", "checkpoints")


def on_this_host(plan: Plan) -> Plan:
    """The plan with its checkpoint directory as an absolute path of the host this runs on (an
    agent's): an SSH host's plan keeps ``~`` and relative paths as the cluster file wrote them,
    relative meaning the remote home, where sshd starts the agent. A URL stays as it is; on
    this machine and Slurm's nodes the path is absolute already."""
    path = plan.program.checkpoint_dir
    if not path or "://" in path or os.path.isabs(path):
        return plan
    resolved = os.path.abspath(os.path.expanduser(path))
    return replace(plan, program=replace(plan.program, checkpoint_dir=resolved))


def make_plan(
    config: ClusterConfig,
    hosts: Iterable[Host],
    run_dir: str | os.PathLike | None = None,
    only_host: str | None = None,
) -> Plan:
    """Place every task of ``config`` on ``hosts``. Raises PlanError when it cannot, or when a
    task's TF_CONFIG or argv would not fit what Linux passes to a process. ``run_dir`` only
    places the default checkpoint directory.

    With ``only_host``, the plan holds the whole cluster but only that host's tasks: what a
    Slurm node needs to run its share, without building every other node's tasks."""
    hosts = tuple(hosts)
    if not hosts:
        raise PlanError("no hosts to place the cluster on; list some under 'hosts:'.")
    roles = config.roles
    slot_jobs = (
        [("chief", 0)] * roles.chief
        + [("worker", i) for i in range(roles.worker)]
        + [("evaluator", 0)] * roles.evaluator
    )
    worker_hosts, ps_hosts = _split_hosts(config, hosts, len(slot_jobs))
    slots = _fill_slots(config, worker_hosts, slot_jobs)
    on_cpu = {
        host.name: _found_gpus_unused(host, len(jobs))
        for host, jobs in slots
        if _too_few_found(config, host, len(jobs))
    }
    if on_cpu:
        hosts = tuple(on_cpu.get(h.name, h) for h in hosts)
        slots = [(on_cpu.get(host.name, host), jobs) for host, jobs in slots]
    ps_on = _place_ps(config, worker_hosts, ps_hosts, len(slots))

    placed: list[tuple[str, int, Host, tuple[str, ...]]] = []
    for i, host in enumerate(ps_on):
        placed.append(("ps", i, host, ()))
    for host, jobs in slots:
        for (job, index), gpus in zip(jobs, _assign_gpus(config, host, len(jobs)), strict=True):
            placed.append((job, index, host, gpus))
    order = {job: n for n, job in enumerate(("ps", "chief", "worker", "evaluator"))}
    placed.sort(key=lambda p: (order[p[0]], p[1]))
    ports = _assign_ports(config, placed)

    cluster: dict[str, list[str]] = {}
    for job, index, host, _ in placed:
        if job != "evaluator":
            cluster.setdefault(job, []).append(f"{host.cluster_address}:{ports[(job, index)]}")
    workdir = config.workdir
    tasks = _pin_cpus(
        config,
        tuple(
            Task(
                job=job,
                index=index,
                host=host.name,
                cluster_address=host.cluster_address,
                port=ports.get((job, index)),
                gpus=gpus,
                workdir=workdir,
                log_name=f"{job}-{index}.log",
            )
            for job, index, host, gpus in placed
            if only_host is None or host.name == only_host
        ),
    )
    env = dict(config.program.env)
    if config.program.keras == "legacy":
        env[LEGACY_KERAS_ENV] = "1"
    program = Program(
        config.program.argv,
        env,
        config.program.tf_config,
        checkpoint_dir(config, run_dir),
    )
    plan = Plan(
        config.name,
        hosts,
        tasks,
        {job: tuple(addrs) for job, addrs in cluster.items()},
        program,
        config.supervision,
    )
    check_program(config, plan, [(job, index, host) for job, index, host, _ in placed])
    return plan


def _pin_cpus(config: ClusterConfig, tasks: tuple[Task, ...]) -> tuple[Task, ...]:
    """With ``placement.cpus_per_task = k``, the i-th task on a host (plan order) gets core slots
    ``i*k .. i*k+k-1``; the agent maps slots onto the cores the host lets it use."""
    k = config.placement.cpus_per_task
    if not k:
        return tasks
    seen: dict[str, int] = {}
    pinned = []
    for task in tasks:
        i = seen.get(task.host, 0)
        seen[task.host] = i + 1
        pinned.append(replace(task, cpus=tuple(range(i * k, (i + 1) * k))))
    return tuple(pinned)


def cpu_list(cpus: Iterable[int]) -> str:
    """``0-5,12`` for a set of cores (as taskset and Slurm write them); ``-`` for none."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs) or "-"


def _split_hosts(
    config: ClusterConfig, hosts: tuple[Host, ...], n_slots: int
) -> tuple[tuple[Host, ...], tuple[Host, ...]]:
    """Worker hosts and dedicated PS hosts (none when PS are co-located)."""
    if config.placement.ps != "dedicated" or config.roles.ps == 0:
        return hosts, ()
    n_ps = config.roles.ps
    per_host = config.placement.workers_per_host
    worker_hosts_needed = math.ceil(n_slots / per_host) if per_host else 1
    if worker_hosts_needed + n_ps > len(hosts):
        raise PlanError(
            f"too few hosts: dedicated PS need one host each, so {n_ps} PS + "
            f"{worker_hosts_needed} worker host(s) need {n_ps + worker_hosts_needed} hosts, "
            f"but {len(hosts)} are given. Add hosts, lower roles.ps, or use placement.ps: colocated."
        )
    available = len(hosts) - n_ps
    return hosts[:available], hosts[available:]


def _fill_slots(
    config: ClusterConfig, worker_hosts: tuple[Host, ...], slot_jobs: list[tuple[str, int]]
) -> list[tuple[Host, list[tuple[str, int]]]]:
    per_host = config.placement.workers_per_host or math.ceil(len(slot_jobs) / len(worker_hosts))
    capacity = per_host * len(worker_hosts)
    if len(slot_jobs) > capacity:
        raise PlanError(
            f"too few host slots: {len(slot_jobs)} worker tasks (chief, workers and evaluator "
            f"count) need {math.ceil(len(slot_jobs) / per_host)} host(s) at "
            f"{per_host} per host, but {len(worker_hosts)} worker host(s) are given "
            f"({capacity} slots). Add hosts, raise placement.workers_per_host, or lower roles.worker."
        )
    filled = []
    for i, host in enumerate(worker_hosts):
        jobs = slot_jobs[i * per_host : (i + 1) * per_host]
        if jobs:
            filled.append((host, jobs))
    return filled


def _place_ps(
    config: ClusterConfig,
    worker_hosts: tuple[Host, ...],
    ps_hosts: tuple[Host, ...],
    n_used_worker_hosts: int,
) -> list[Host]:
    n_ps = config.roles.ps
    if ps_hosts:
        return list(ps_hosts)
    targets = worker_hosts[: max(n_used_worker_hosts, 1)]
    cap = config.placement.ps_per_host
    if cap is not None and n_ps > cap * len(targets):
        raise PlanError(
            f"too many co-located PS: {n_ps} PS at most {cap} per host need "
            f"{math.ceil(n_ps / cap)} worker host(s), but the workers use {len(targets)}. "
            "Raise placement.ps_per_host, add workers on more hosts, or use placement.ps: dedicated."
        )
    return [targets[i % len(targets)] for i in range(n_ps)]


def _too_few_found(config: ClusterConfig, host: Host, n_tasks: int) -> bool:
    """Whether ``host``'s GPUs were found on it (not given), are fewer than its ``n_tasks``
    slot tasks, and nothing in the file asks for a number per task: then the tasks run on CPU
    (a laptop with one GPU runs a two-worker example) where a count the user wrote fails."""
    return (
        host.gpus_found
        and config.placement.gpus_per_worker is None
        and 0 < len(host.gpu_ids) < n_tasks
    )


def _found_gpus_unused(host: Host, n_tasks: int) -> Host:
    """``host`` with its found GPUs left out, its source saying why and how to use them."""
    why = (
        f"{host.gpu_source}: {len(host.gpu_ids)} GPU(s) for {n_tasks} worker tasks, one each "
        "would not go round, so they run on CPU; to use the GPUs, lower "
        "placement.workers_per_host or the workers, or set placement.gpus_per_worker"
    )
    return replace(host, gpu_ids=(), gpu_source=why)


def gpu_notices(plan: Plan) -> list[str]:
    """One line per host whose found GPUs the plan leaves unused, for ``tflaunch up``."""
    return [
        f"{host.name}: {host.gpu_source}"
        for host in plan.hosts_with_tasks()
        if host.gpus_found and not host.gpu_ids
    ]


def gpu_sources(plan: Plan, most: int = 3) -> list[str]:
    """One line per GPU count and its source, for ``tflaunch plan``: ``GPUs: 2 on localhost
    (nvidia-smi -L (2 found))``; hosts of one kind are grouped (``hosts[0].gpus`` and
    ``hosts[1].gpus`` as ``hosts[].gpus``), a few of them named."""
    groups: dict[tuple[int, str], list[tuple[str, str]]] = {}
    for host in plan.hosts_with_tasks():
        if host.gpu_source:
            kind = re.sub(r"\[\d+\]", "[]", host.gpu_source)
            groups.setdefault((len(host.gpu_ids), kind), []).append((host.name, host.gpu_source))
    lines = []
    for (count, kind), members in groups.items():
        names = [name for name, _ in members]
        shown = ", ".join(names[:most]) + (
            f" and {len(names) - most} more" if len(names) > most else ""
        )
        lines.append(f"GPUs: {count} on {shown} ({members[0][1] if len(names) == 1 else kind})")
    return lines


def _assign_gpus(config: ClusterConfig, host: Host, n_tasks: int) -> list[tuple[str, ...]]:
    if not host.gpu_ids or n_tasks == 0:
        return [()] * n_tasks
    per_task = config.placement.gpus_per_worker
    if per_task is None:
        per_task = len(host.gpu_ids) if n_tasks == 1 else 1
    if per_task * n_tasks > len(host.gpu_ids):
        source = f" ({host.gpu_source})" if host.gpu_source else ""
        raise PlanError(
            f"host '{host.name}' has {len(host.gpu_ids)} GPU(s){source} but its {n_tasks} worker "
            f"task(s) at {per_task} each need {per_task * n_tasks}. Lower "
            "placement.gpus_per_worker (0: run on CPU) or placement.workers_per_host, or add hosts."
        )
    return [tuple(host.gpu_ids[i * per_task : (i + 1) * per_task]) for i in range(n_tasks)]


def _assign_ports(config: ClusterConfig, placed: list) -> dict[tuple[str, int], int]:
    """Count up from each job's base port per address, skipping ports taken on that address.

    Ports taken on an address only ever grow, so the lowest free port at or above a job's base
    never goes down: each (address, job) resumes its search where it last stopped, which makes
    the whole assignment linear in the tasks (a search from the base each time is quadratic)."""
    taken: dict[str, set[int]] = {}
    resume: dict[tuple[str, str], int] = {}
    ports: dict[tuple[str, int], int] = {}
    for job, index, host, _ in placed:
        if job == "evaluator":
            continue
        used = taken.setdefault(host.cluster_address, set())
        port = resume.get((host.cluster_address, job), getattr(config.ports, job))
        while port in used:
            port += 1
        resume[(host.cluster_address, job)] = port
        if port > MAX_PORT:
            raise PlanError(
                f"{config.where('ports', job)}: no free port for {job}:{index} on "
                f"{host.name}: counting up from ports.{job} passed {MAX_PORT}. Lower ports.{job}."
            )
        used.add(port)
        ports[(job, index)] = port
    return ports
