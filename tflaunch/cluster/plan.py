"""The plan's records: the ClusterSpec and the program (argv with placeholders, environment) held
once, and one small Task per process (job, index, host, cluster address and port, GPUs, workdir,
log), with plan.json's writer and reader.

A task's full view is rendered from those where and when it is needed
(:mod:`tflaunch.cluster.render`), so the plan's size and the time to make it grow linearly with the
cluster; :func:`tflaunch.cluster.placement.make_plan` places a cluster file's tasks on concrete
hosts and makes the plan. Every backend runs the same plan: the laptop builds it for local and SSH
runs, and each node of a Slurm allocation builds the shared cluster and its own tasks from
SLURM_JOB_NODELIST; all get the same answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import Any

from tflaunch.cluster import schema
from tflaunch.cluster.supervision import Supervision
from tflaunch.errors import PlanError


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


def parse_task_name(name: str) -> tuple[str, int]:
    """``"worker:1"`` -> ``("worker", 1)``."""
    job, sep, index = name.partition(":")
    if not sep or not index.isdigit():
        raise PlanError(f"task '{name}' is not of the form JOB:INDEX, e.g. worker:1.")
    return job, int(index)
