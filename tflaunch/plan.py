"""The plan: a pure, deterministic function of a cluster config and a concrete host list.

It yields one Task per process — job, index, host, cluster address and port, GPUs, environment
(with TF_CONFIG and CUDA_VISIBLE_DEVICES, always exported), argv with placeholders filled — and the
ClusterSpec. Every backend runs the same plan: the laptop builds it for local and SSH runs, each
agent inside a Slurm allocation rebuilds it from SLURM_JOB_NODELIST, and all get the same answer.

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

import json
import math
import os
import string
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tflaunch import schema
from tflaunch.config import ClusterConfig, Supervision
from tflaunch.errors import PlanError

LOCAL_ADDRESS = "127.0.0.1"
MAX_PORT = 65535
# Every task's TF_CONFIG (and any {worker_hosts}-like argument) lists the whole cluster, so a
# plan grows with tasks squared; past this many bytes of arguments and environment in all it is
# refused before it is built (2,048 workers: about 80 MB; with {worker_hosts} in argv, twice).
MAX_PLAN_BYTES = 128 << 20


@dataclass(frozen=True)
class Host:
    """A concrete machine: how tasks reach it, how the launcher reaches it, its GPU ids."""

    name: str
    cluster_address: str
    connect_address: str
    gpu_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Task:
    """One process of the cluster."""

    job: str
    index: int
    host: str
    cluster_address: str
    port: int | None
    gpus: tuple[str, ...]
    argv: tuple[str, ...]
    env: Mapping[str, str]
    workdir: str
    log_name: str
    cpus: tuple[int, ...] = ()  # core slots on its host (placement.cpus_per_task); () unpinned

    @property
    def name(self) -> str:
        return f"{self.job}:{self.index}"

    @property
    def address(self) -> str | None:
        return None if self.port is None else f"{self.cluster_address}:{self.port}"


@dataclass(frozen=True)
class Plan:
    """Every task of the cluster, the ClusterSpec they share, and how they are supervised."""

    name: str
    hosts: tuple[Host, ...]
    tasks: tuple[Task, ...]
    cluster: Mapping[str, tuple[str, ...]]
    supervision: Supervision = field(default_factory=Supervision)

    def task(self, name: str) -> Task:
        for task in self.tasks:
            if task.name == name:
                return task
        raise PlanError(
            f"no task '{name}' in the plan; tasks are {', '.join(t.name for t in self.tasks)}"
        )

    def tasks_on(self, host: str) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if t.host == host)

    def hosts_with_tasks(self) -> tuple[Host, ...]:
        used = {t.host for t in self.tasks}
        return tuple(h for h in self.hosts if h.name in used)

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise PlanError(f"no host '{name}' in the plan")

    def ps_addresses(self) -> tuple[str, ...]:
        return tuple(self.cluster.get("ps", ()))

    def to_dict(self) -> dict[str, Any]:
        data = json.loads(json.dumps(asdict(self)))
        for task in data["tasks"]:
            if not task["cpus"]:
                del task["cpus"]  # unpinned: plan.json as it was before CPU binding
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        hosts = tuple(Host(**{**h, "gpu_ids": tuple(h["gpu_ids"])}) for h in data["hosts"])
        tasks = tuple(
            Task(
                **{
                    **t,
                    "gpus": tuple(t["gpus"]),
                    "argv": tuple(t["argv"]),
                    "env": dict(t["env"]),
                    "cpus": tuple(t.get("cpus", ())),
                }
            )
            for t in data["tasks"]
        )
        cluster = {job: tuple(addrs) for job, addrs in data["cluster"].items()}
        supervision = schema.read(Supervision, data["supervision"])
        return cls(data["name"], hosts, tasks, cluster, supervision)


def tf_config(plan: Plan, task: Task) -> dict[str, Any]:
    """The TF_CONFIG of one task, in the form TFConfigClusterResolver reads."""
    return {
        "cluster": {job: list(addrs) for job, addrs in plan.cluster.items()},
        "task": {"type": task.job, "index": task.index},
    }


def gpu_ids(count: int) -> tuple[str, ...]:
    """The ids of a host's ``count`` GPUs, as CUDA numbers them."""
    return tuple(str(i) for i in range(count))


def hosts_from_config(config: ClusterConfig) -> list[Host]:
    """The hosts written in the cluster file (local default: this machine)."""
    if not config.hosts:
        return [Host("localhost", LOCAL_ADDRESS, LOCAL_ADDRESS)]
    return [
        Host(
            name=h.name,
            cluster_address=h.address or h.name,
            connect_address=h.connect or h.address or h.name,
            gpu_ids=gpu_ids(h.gpus),
        )
        for h in config.hosts
    ]


def checkpoint_dir(config: ClusterConfig, run_dir: str | os.PathLike | None) -> str:
    """``program.checkpoint_dir`` against the workdir, else ``checkpoints/`` in the run
    directory (shown as ``<run directory>/checkpoints`` when planning without a run)."""
    if config.program.checkpoint_dir:
        return os.path.join(config.workdir, os.path.expanduser(config.program.checkpoint_dir))
    return os.path.join(str(run_dir) if run_dir else "<run directory>", "checkpoints")


def make_plan(
    config: ClusterConfig, hosts: Iterable[Host], run_dir: str | os.PathLike | None = None
) -> Plan:
    """Place every task of ``config`` on ``hosts``. Raises PlanError when it cannot.
    ``run_dir`` only places the default checkpoint directory."""
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

    cluster: dict[str, tuple[str, ...]] = {}
    for job, index, host, _ in placed:
        if job != "evaluator":
            cluster.setdefault(job, ())
            cluster[job] += (f"{host.cluster_address}:{ports[(job, index)]}",)
    checkpoints = checkpoint_dir(config, run_dir)
    _check_size(config, cluster, len(placed))
    tasks = _pin_cpus(
        config,
        tuple(
            _make_task(
                config, cluster, job, index, host, ports.get((job, index)), gpus, checkpoints
            )
            for job, index, host, gpus in placed
        ),
    )
    return Plan(config.name, hosts, tasks, cluster, config.supervision)


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


def _assign_gpus(config: ClusterConfig, host: Host, n_tasks: int) -> list[tuple[str, ...]]:
    if not host.gpu_ids or n_tasks == 0:
        return [()] * n_tasks
    per_task = config.placement.gpus_per_worker
    if per_task is None:
        per_task = len(host.gpu_ids) if n_tasks == 1 else 1
    if per_task * n_tasks > len(host.gpu_ids):
        raise PlanError(
            f"host '{host.name}' has {len(host.gpu_ids)} GPU(s) but its {n_tasks} worker task(s) "
            f"at {per_task} each need {per_task * n_tasks}. Lower placement.gpus_per_worker or "
            "placement.workers_per_host, or add hosts."
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
                f"no free port for {job}:{index} on {host.name}: counting up from "
                f"ports.{job} passed {MAX_PORT}. Lower ports.{job}."
            )
        used.add(port)
        ports[(job, index)] = port
    return ports


def _check_size(config: ClusterConfig, cluster: Mapping[str, tuple[str, ...]], n: int) -> None:
    """Refuse a plan whose tasks would hold more than MAX_PLAN_BYTES, from an upper bound of
    one task's arguments and environment (placeholders at their longest), before building it."""
    lists = {job: sum(len(a) + 4 for a in addresses) for job, addresses in cluster.items()}
    longest = {"ps_hosts": "ps", "worker_hosts": "worker", "chief_hosts": "chief"}
    per_task = sum(lists.values()) + 128  # TF_CONFIG
    per_task += sum(len(k) + len(v) for k, v in config.program.env.items())
    for arg in config.program.argv:
        per_task += len(arg)
        if "{" in arg:
            for name in longest:
                per_task += arg.count("{" + name + "}") * lists.get(longest[name], 0)
            per_task += arg.count("{") * 64  # {host}, {port}, {task_index}, ...
    if per_task * n > MAX_PLAN_BYTES:
        raise PlanError(
            f"{config.source}: the plan would hold about {per_task * n >> 20} MiB of task "
            f"arguments and environment ({n} tasks, each listing the whole cluster in TF_CONFIG"
            f"{' and its arguments' if '{' in ''.join(config.program.argv) else ''}); at most "
            f"{MAX_PLAN_BYTES >> 20} MiB. Lower roles.worker or roles.ps."
        )


def _make_task(
    config: ClusterConfig,
    cluster: Mapping[str, tuple[str, ...]],
    job: str,
    index: int,
    host: Host,
    port: int | None,
    gpus: tuple[str, ...],
    checkpoints: str,
) -> Task:
    values = {
        "job_name": job,
        "task_index": str(index),
        "host": host.cluster_address,
        "port": "" if port is None else str(port),
        "ps_hosts": ",".join(cluster.get("ps", ())),
        "worker_hosts": ",".join(cluster.get("worker", ())),
        "chief_hosts": ",".join(cluster.get("chief", ())),
        "num_ps": str(config.roles.ps),
        "num_workers": str(config.roles.worker),
        "checkpoint_dir": checkpoints,
    }
    argv = tuple(_fill(arg, values, config) for arg in config.program.argv)
    tf_conf = {
        "cluster": {j: list(a) for j, a in cluster.items()},
        "task": {"type": job, "index": index},
    }
    env = dict(config.program.env)
    env.update(
        {
            "TF_CONFIG": json.dumps(tf_conf, sort_keys=True),
            "CUDA_VISIBLE_DEVICES": ",".join(gpus),
            "TFLAUNCH_TASK": f"{job}:{index}",
            "TFLAUNCH_CHECKPOINT_DIR": checkpoints,
            "PYTHONUNBUFFERED": "1",
        }
    )
    return Task(
        job=job,
        index=index,
        host=host.name,
        cluster_address=host.cluster_address,
        port=port,
        gpus=gpus,
        argv=argv,
        env=env,
        workdir=config.workdir,
        log_name=f"{job}-{index}.log",
    )


def _fill(arg: str, values: Mapping[str, str], config: ClusterConfig) -> str:
    try:
        fields = [(n, s, c) for _, n, s, c in string.Formatter().parse(arg) if n is not None]
    except ValueError as err:
        raise PlanError(
            f"{config.source}: program.argv item {arg!r} has unbalanced braces "
            f"({err}); write {{{{ and }}}} for literal braces."
        ) from None
    names = [name for name, _, _ in fields]
    for name, spec, conversion in fields:
        if spec or conversion:
            raise PlanError(
                f"{config.source}: program.argv item {arg!r}: placeholders are replaced as "
                f"they are, without format specs or conversions; write {{{name}}} "
                f"(or {{{{ and }}}} for literal braces)."
            )
    unknown = [n for n in names if n not in values]
    if unknown:
        raise PlanError(
            f"{config.source}: program.argv item {arg!r} uses the unknown placeholder "
            f"{{{unknown[0]}}}; known ones are "
            f"{', '.join('{' + k + '}' for k in values)}."
        )
    return arg.format_map(values)


def parse_task_name(name: str) -> tuple[str, int]:
    """``"worker:1"`` -> ``("worker", 1)``."""
    job, sep, index = name.partition(":")
    if not sep or not index.isdigit():
        raise PlanError(f"task '{name}' is not of the form JOB:INDEX, e.g. worker:1.")
    return job, int(index)
