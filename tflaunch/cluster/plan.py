"""The plan: a pure, deterministic function of a cluster config and a concrete host list.

It holds the ClusterSpec and the program (argv with placeholders, environment) once, and one
small Task per process: job, index, host, cluster address and port, GPUs, workdir, log. A task's
full view — argv with placeholders filled, environment with TF_CONFIG, CUDA_VISIBLE_DEVICES
(always exported) and the cluster file's path — is rendered from those by ``render_task`` where
and when it is needed (by the agent that starts the task), so the plan's size and the time to
make it grow linearly with the cluster. Every backend runs the same plan: the laptop builds it for
local and SSH runs, and each node of a Slurm allocation builds the shared cluster and its own
tasks from SLURM_JOB_NODELIST; all get the same answer.

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
import posixpath
import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import Any

from tflaunch.cluster import backends, schema
from tflaunch.cluster.config import LEGACY_KERAS_ENV, ClusterConfig, Supervision
from tflaunch.errors import PlanError

LOCAL_ADDRESS = "127.0.0.1"
MAX_PORT = 65535
CLUSTER_FILE = "cluster_spec.json"
# Linux refuses (E2BIG) any one argument or environment string longer than 32 pages, NUL included.
MAX_ARG_STRLEN = 32 * 4096
# Bytes counted for the cluster file's path in an argv item: run directories live deeper than
# ``runs/<run-id>/`` on some hosts (SSH: <remote_runs_dir>/<run-id>/<host>/).
CLUSTER_FILE_PATH_RESERVE = 512


@dataclass(frozen=True)
class Host:
    """A concrete machine: how tasks reach it, how the launcher reaches it, its GPU ids, and
    where their count came from (shown by ``tflaunch plan``, not kept in plan.json; empty: not
    given, for the backend to find). ``gpus_found``: the count was found on the machine
    (``nvidia-smi``), not written in the cluster file, so too few of them for the host's tasks
    leave those tasks on CPU instead of failing the plan (:func:`make_plan`)."""

    name: str
    cluster_address: str
    connect_address: str
    gpu_ids: tuple[str, ...] = ()
    gpu_source: str = field(default="", compare=False)
    gpus_found: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Task:
    """One process of the cluster: only its own fields. Its argv, environment and TF_CONFIG are
    rendered from the plan's shared cluster and program when needed (``render_task``)."""

    job: str
    index: int
    host: str
    cluster_address: str
    port: int | None
    gpus: tuple[str, ...]
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
class Program:
    """What every task runs, held once: argv with its placeholders, the environment the cluster
    file adds, and whether tasks get a TF_CONFIG (off for clusters past the kernel's limit)."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    tf_config: bool = True
    checkpoint_dir: str = ""  # {checkpoint_dir}, $TFLAUNCH_CHECKPOINT_DIR: one for every task


@dataclass(frozen=True)
class TaskView:
    """One task as its process sees it: argv with placeholders filled, environment, workdir."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    workdir: str


@dataclass(frozen=True)
class Plan:
    """The ClusterSpec (once), what every task runs (once), one small Task per process, and how
    they are supervised. Size and time grow linearly with the number of tasks."""

    name: str
    hosts: tuple[Host, ...]
    tasks: tuple[Task, ...]
    cluster: Mapping[str, tuple[str, ...]]
    program: Program
    supervision: Supervision = field(default_factory=Supervision)

    @cached_property
    def _by_name(self) -> dict[str, Task]:
        return {t.name: t for t in self.tasks}

    @cached_property
    def _by_host(self) -> dict[str, tuple[Task, ...]]:
        by_host: dict[str, list[Task]] = {}
        for task in self.tasks:
            by_host.setdefault(task.host, []).append(task)
        return {host: tuple(tasks) for host, tasks in by_host.items()}

    @cached_property
    def cluster_json(self) -> str:
        """The ClusterSpec as JSON (sorted keys), as TF_CONFIG and the cluster file hold it."""
        return json.dumps({job: list(addrs) for job, addrs in self.cluster.items()}, sort_keys=True)

    def task(self, name: str) -> Task:
        try:
            return self._by_name[name]
        except KeyError:
            shown = ", ".join(t.name for t in self.tasks[:20])
            more = f" and {len(self.tasks) - 20} more" if len(self.tasks) > 20 else ""
            raise PlanError(f"no task '{name}' in the plan; tasks are {shown}{more}") from None

    def tasks_on(self, host: str) -> tuple[Task, ...]:
        return self._by_host.get(host, ())

    def hosts_with_tasks(self) -> tuple[Host, ...]:
        return tuple(h for h in self.hosts if h.name in self._by_host)

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise PlanError(f"no host '{name}' in the plan")

    def with_hosts(self, *replacements: Host) -> Plan:
        """This plan with ``replacements`` in place of its hosts of the same names (a replaced
        instance: the same name and cluster address, a new address to connect to)."""
        new = {h.name: h for h in replacements}
        return replace(self, hosts=tuple(new.get(h.name, h) for h in self.hosts))

    def with_ports(self, ports: Mapping[str, int]) -> Plan:
        """This plan with the tasks named in ``ports`` on those ports (the cluster with them)."""
        tasks = tuple(replace(t, port=ports[t.name]) if t.name in ports else t for t in self.tasks)
        cluster = {job: list(addresses) for job, addresses in self.cluster.items()}
        for task in tasks:
            if task.name in ports and task.address is not None:
                cluster[task.job][task.index] = task.address
        return replace(self, tasks=tasks, cluster={job: tuple(a) for job, a in cluster.items()})

    def ps_addresses(self) -> tuple[str, ...]:
        return tuple(self.cluster.get("ps", ()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "supervision": asdict(self.supervision),
            "program": {
                "argv": list(self.program.argv),
                "env": dict(self.program.env),
                "tf_config": self.program.tf_config,
                "checkpoint_dir": self.program.checkpoint_dir,
            },
            "cluster": {job: list(addrs) for job, addrs in self.cluster.items()},
            "hosts": [
                {
                    "name": h.name,
                    "cluster_address": h.cluster_address,
                    "connect_address": h.connect_address,
                    "gpu_ids": list(h.gpu_ids),
                }
                for h in self.hosts
            ],  # written out: dataclasses.asdict deep-copies, thousands of hosts add up
            "tasks": [_task_dict(t) for t in self.tasks],
        }

    def to_json(self) -> str:
        """plan.json: readable at the top, one line per cluster job, host and task, so that
        writing and reading it stays fast at tens of thousands of tasks."""
        data = self.to_dict()
        parts = []
        for key, value in data.items():
            if key in ("cluster", "hosts", "tasks") and value:
                items = value.items() if key == "cluster" else enumerate(value)
                lines = ",\n".join(
                    f"    {json.dumps(k)}: {json.dumps(v)}" if key == "cluster"
                    else f"    {json.dumps(v)}"
                    for k, v in items
                )  # fmt: skip
                brackets = "{}" if key == "cluster" else "[]"
                text = f"{brackets[0]}\n{lines}\n  {brackets[1]}"
            else:
                text = json.dumps(value, indent=2).replace("\n", "\n  ")
            parts.append(f"  {json.dumps(key)}: {text}")
        return "{\n" + ",\n".join(parts) + "\n}\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        hosts = tuple(Host(**{**h, "gpu_ids": tuple(h["gpu_ids"])}) for h in data["hosts"])
        tasks = tuple(
            Task(**{**t, "gpus": tuple(t["gpus"]), "cpus": tuple(t.get("cpus", ()))})
            for t in data["tasks"]
        )
        cluster = {job: tuple(addrs) for job, addrs in data["cluster"].items()}
        program = data["program"]
        return cls(
            data["name"],
            hosts,
            tasks,
            cluster,
            Program(
                tuple(program["argv"]),
                dict(program["env"]),
                program["tf_config"],
                program["checkpoint_dir"],
            ),
            schema.read(Supervision, data["supervision"]),
        )


def _task_dict(task: Task) -> dict[str, Any]:
    entry = {
        "job": task.job,
        "index": task.index,
        "host": task.host,
        "cluster_address": task.cluster_address,
        "port": task.port,
        "gpus": list(task.gpus),
        "workdir": task.workdir,
        "log_name": task.log_name,
    }
    if task.cpus:  # unpinned tasks leave it out
        entry["cpus"] = list(task.cpus)
    return entry


def tf_config(plan: Plan, task: Task) -> dict[str, Any]:
    """The TF_CONFIG of one task, in the form TFConfigClusterResolver reads."""
    return {
        "cluster": {job: list(addrs) for job, addrs in plan.cluster.items()},
        "task": {"type": task.job, "index": task.index},
    }


def gpu_ids(count: int) -> tuple[str, ...]:
    """The ids of a host's ``count`` GPUs, as CUDA numbers them."""
    return tuple(str(i) for i in range(count))


def tf_config_text(plan: Plan, job: str, index: int) -> str:
    """TF_CONFIG as the environment holds it: ``json.dumps(tf_config, sort_keys=True)``, built
    around the plan's one serialised cluster instead of serialising it again."""
    return f'{{"cluster": {plan.cluster_json}, "task": {{"index": {index}, "type": {json.dumps(job)}}}}}'


def cluster_file_text(plan: Plan) -> str:
    """The cluster file every task may read (``{cluster_file}``, ``$TFLAUNCH_CLUSTER_FILE``)."""
    return f'{{"cluster": {plan.cluster_json}}}\n'


def cluster_file_path(run_dir: str | os.PathLike | None) -> str:
    """Where the cluster file of a run directory is; ``<run directory>/...`` when there is no run
    yet (``tflaunch render``), as the checkpoint directory shows."""
    if run_dir is None:
        return f"<run directory>/{CLUSTER_FILE}"
    return os.path.join(os.path.abspath(run_dir), CLUSTER_FILE)


def render_task(
    plan: Plan,
    task: Task,
    run_dir: str | os.PathLike | None = None,
    keep: Iterable[str] = (),
) -> TaskView:
    """One task's argv and environment, from the shared cluster and the task's own fields.

    The environment holds ``TF_CONFIG`` (unless ``program.tf_config`` is off),
    ``CUDA_VISIBLE_DEVICES`` (always exported; empty for PS), ``TFLAUNCH_TASK`` and
    ``TFLAUNCH_CLUSTER_FILE``; ``run_dir`` is the directory whose cluster file the task reads.
    Placeholders named in ``keep`` stay as written (for display)."""
    values = _placeholder_values(plan, task, cluster_file_path(run_dir))
    for name in keep:
        values[name] = "{" + name + "}"
    argv = tuple(arg.format_map(values) for arg in plan.program.argv)
    env = dict(plan.program.env)
    if plan.program.tf_config:
        env["TF_CONFIG"] = tf_config_text(plan, task.job, task.index)
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(task.gpus),
            "TFLAUNCH_TASK": task.name,
            "TFLAUNCH_CLUSTER_FILE": values["cluster_file"],
            "TFLAUNCH_CHECKPOINT_DIR": plan.program.checkpoint_dir,
            "PYTHONUNBUFFERED": "1",
        }
    )
    return TaskView(argv, env, task.workdir)


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


def long_placeholders(plan: Plan, width: int = 120) -> dict[str, int]:
    """The cluster-list placeholders that ``program.argv`` uses whose values are longer than
    ``width`` characters, with their address counts: what a per-task table should not repeat."""
    used = {
        name
        for arg in plan.program.argv
        for _, name, _, _ in string.Formatter().parse(arg)
        if name in ("ps_hosts", "worker_hosts", "chief_hosts")
    }
    values = _cluster_values(plan.cluster)
    return {
        name: len(plan.cluster.get(name.removesuffix("_hosts"), ()))
        for name in sorted(used)
        if len(values[name]) > width
    }


def _placeholder_values(plan: Plan, task: Task, cluster_file: str) -> dict[str, str]:
    return {
        "job_name": task.job,
        "task_index": str(task.index),
        "host": task.cluster_address,
        "port": "" if task.port is None else str(task.port),
        "cluster_file": cluster_file,
        "checkpoint_dir": plan.program.checkpoint_dir,
        **_cluster_values(plan.cluster),
    }


def _cluster_values(cluster: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """The placeholders every task fills the same way."""
    return {
        "ps_hosts": ",".join(cluster.get("ps", ())),
        "worker_hosts": ",".join(cluster.get("worker", ())),
        "chief_hosts": ",".join(cluster.get("chief", ())),
        "num_ps": str(len(cluster.get("ps", ()))),
        "num_workers": str(len(cluster.get("worker", ()))),
    }


TASK_PLACEHOLDERS = ("job_name", "task_index", "host", "port", "cluster_file", "checkpoint_dir")
CLUSTER_PLACEHOLDERS = (
    "ps_hosts", "worker_hosts", "chief_hosts", "num_ps", "num_workers",
)  # fmt: skip


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
    _check_program(config, plan, [(job, index, host) for job, index, host, _ in placed])
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


def _check_program(config: ClusterConfig, plan: Plan, placed: list[tuple[str, int, Host]]) -> None:
    """Refuse, before anything starts, placeholders that do not exist and argument or
    environment strings no process could be given (Linux's MAX_ARG_STRLEN)."""
    templates = [_parse_template(arg, config, i) for i, arg in enumerate(plan.program.argv)]
    # The longest task-specific values any task has: the strings it gets are at most this long.
    widest = {
        "job_name": max(len(job) for job, _, _ in placed),
        "task_index": max(len(str(index)) for _, index, _ in placed),
        "host": max(len(host.cluster_address.encode()) for _, _, host in placed),
        "port": 5,
        "cluster_file": CLUSTER_FILE_PATH_RESERVE,
    }
    widths = {k: len(v.encode()) for k, v in _cluster_values(plan.cluster).items()} | widest
    for arg, pieces in zip(plan.program.argv, templates, strict=True):
        size = sum(len(text.encode()) + widths.get(name, 0) for text, name in pieces) + 1
        if size > MAX_ARG_STRLEN:
            used = [name for _, name in pieces if name in CLUSTER_PLACEHOLDERS]
            raise PlanError(
                f"{config.source}: program.argv item {arg!r} would be {size:,} bytes for "
                f"{len(plan.tasks):,} tasks, over Linux's limit of {MAX_ARG_STRLEN:,} bytes for one "
                "argument (MAX_ARG_STRLEN): no process can be started with it. Let the program "
                "read the cluster from a file instead: pass '{cluster_file}' (a JSON file "
                '{"cluster": {...}} in the run directory, also named by $TFLAUNCH_CLUSTER_FILE) '
                f"in place of {', '.join('{' + n + '}' for n in used)}."
            )
    for key, value in plan.program.env.items():
        size = len(key.encode()) + len(value.encode()) + 2
        if size > MAX_ARG_STRLEN:
            raise PlanError(
                f"{config.source}: program.env.{key} is {size:,} bytes, over Linux's limit of "
                f"{MAX_ARG_STRLEN:,} bytes for one environment string (MAX_ARG_STRLEN). Put the "
                "value in a file and pass its path."
            )
    if plan.program.tf_config and plan.cluster:
        # "TF_CONFIG=" + the text + NUL, for the task with the longest job name and index
        size = len('TF_CONFIG={"cluster": , "task": {"index": , "type": ""}}') + 1
        size += len(plan.cluster_json) + widest["task_index"] + widest["job_name"]
        if size > MAX_ARG_STRLEN:
            raise PlanError(
                f"{config.source}: every task's TF_CONFIG would be {size:,} bytes for "
                f"{len(plan.tasks):,} tasks, over Linux's limit of {MAX_ARG_STRLEN:,} bytes for "
                "one environment string (MAX_ARG_STRLEN): no task could be started with it. "
                "Set program.tf_config: false and let the program read the cluster from the "
                "file named by $TFLAUNCH_CLUSTER_FILE (or passed as '{cluster_file}' in "
                'program.argv): JSON {"cluster": {...}} in the run directory, which '
                "tflaunch.models.cluster_file_resolver.ClusterFileResolver hands to TF2 "
                "strategies (cluster_resolver=); tflaunch's programs take it as --cluster_file."
            )


def _parse_template(arg: str, config: ClusterConfig, position: int) -> list[tuple[str, str | None]]:
    """An argv item as (literal text, placeholder name or None) pieces; errors name the item
    and its line."""
    where = config.where("program", "argv", position)
    try:
        parsed = list(string.Formatter().parse(arg))
    except ValueError as err:
        raise PlanError(
            f"{where}: program.argv item {arg!r} has unbalanced braces "
            f"({err}); write {{{{ and }}}} for literal braces."
        ) from None
    for _, name, spec, conversion in parsed:
        if name is not None and (spec or conversion):
            raise PlanError(
                f"{where}: program.argv item {arg!r}: placeholders are replaced as "
                f"they are, without format specs or conversions; write {{{name}}} "
                f"(or {{{{ and }}}} for literal braces)."
            )
    pieces = [(text, name) for text, name, _, _ in parsed]
    known = TASK_PLACEHOLDERS + CLUSTER_PLACEHOLDERS
    unknown = [name for _, name in pieces if name is not None and name not in known]
    if unknown:
        raise PlanError(
            f"{where}: program.argv item {arg!r} uses the unknown placeholder "
            f"{{{unknown[0]}}}; known ones are {', '.join('{' + k + '}' for k in known)}."
        )
    # a literal "{{" parses to "{": the rendered text is what the bytes count
    return pieces


def parse_task_name(name: str) -> tuple[str, int]:
    """``"worker:1"`` -> ``("worker", 1)``."""
    job, sep, index = name.partition(":")
    if not sep or not index.isdigit():
        raise PlanError(f"task '{name}' is not of the form JOB:INDEX, e.g. worker:1.")
    return job, int(index)
