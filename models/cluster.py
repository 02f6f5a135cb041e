"""Where a program finds its cluster and which task it is: one module for every program here.

A cluster maps job names (``ps``, ``worker``, ``chief``) to ``host:port`` lists, as TF_CONFIG's
``"cluster"`` does. The sources, first match wins:

1. TF1-style flags: ``--job_name/--task_index`` with ``--ps_hosts/--worker_hosts/--chief_hosts``
   (comma-separated ``host:port`` lists), as TF1-era launch scripts pass them;
2. a cluster file: ``--cluster_file PATH``, else the environment variable
   ``TFLAUNCH_CLUSTER_FILE``, naming a JSON file ``{"cluster": {"ps": [...], "worker": [...]}}``.
   tflaunch writes one when the cluster is too large for TF_CONFIG (Linux refuses a single
   environment string over 128 KiB). The task is ``--job_name/--task_index`` when given, else
   the environment variable ``TFLAUNCH_TASK`` (``worker:1``), which tflaunch sets for every task;
3. ``TF_CONFIG``;
4. none of them: :func:`resolve_cluster` returns None, and the program decides (the benchmark runs
   as a single process, MNIST refuses).

Every source goes through the same checks (known job names, the task's index within its job, at
least one training task, at most one chief), and every error is a :class:`ClusterError` whose
message names the source and what to change. No TensorFlow here: TF2 strategies take the cluster
file through :class:`tflaunch.models.cluster_file_resolver.ClusterFileResolver`.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

CLUSTER_FILE_ENV = "TFLAUNCH_CLUSTER_FILE"
TASK_ENV = "TFLAUNCH_TASK"
JOBS = ("ps", "worker", "chief", "evaluator")
TRAINING_JOBS = ("chief", "worker")  # rank order: the chief first
HOST_FLAGS = {"ps": "ps_hosts", "worker": "worker_hosts", "chief": "chief_hosts"}


class ClusterError(ValueError):
    """The cluster description is missing or wrong; the message says where and what to change."""


@dataclass(frozen=True)
class ClusterInfo:
    """The cluster (job -> host:port list) and which task this process is."""

    cluster: dict[str, list[str]]
    job_name: str
    task_index: int
    source: str = field(default="the cluster", compare=False)  # where it came from, for messages
    cluster_file: str | None = field(default=None, compare=False)  # when it came from one

    @property
    def name(self) -> str:
        return f"{self.job_name}:{self.task_index}"

    @property
    def device(self) -> str:
        return f"/job:{self.job_name}/task:{self.task_index}"

    @property
    def training_tasks(self) -> list[tuple[str, int]]:
        """The chief (if any), then the workers: the tasks that train, in rank order."""
        return [(job, i) for job in TRAINING_JOBS for i in range(len(self.cluster.get(job, [])))]

    @property
    def num_training_tasks(self) -> int:
        return sum(len(self.cluster.get(job, [])) for job in TRAINING_JOBS)

    @property
    def num_ps(self) -> int:
        return len(self.cluster.get("ps", []))

    @property
    def is_training_task(self) -> bool:
        tasks = len(self.cluster.get(self.job_name, []))
        return self.job_name in TRAINING_JOBS and 0 <= self.task_index < tasks

    @property
    def rank(self) -> int:
        """This training task's position in :attr:`training_tasks` (0: the chief or worker 0),
        computed without listing them: clusters may hold tens of thousands of tasks."""
        if not self.is_training_task:
            raise ValueError(f"{self.name} is not a training task, so it has no rank")
        chiefs = len(self.cluster.get("chief", [])) if self.job_name == "worker" else 0
        return chiefs + self.task_index

    @property
    def is_chief(self) -> bool:
        """The ``chief`` task, else worker 0 when the cluster has no chief."""
        return self.is_training_task and self.rank == 0

    def jobs(self, *names: str) -> dict[str, list[str]]:
        """The cluster restricted to ``names`` (in that order), leaving out absent jobs."""
        return {job: list(self.cluster[job]) for job in names if job in self.cluster}


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """The cluster flags every program takes: TF1-style ones and ``--cluster_file``."""
    group = parser.add_argument_group(
        "cluster (else --cluster_file or $TFLAUNCH_CLUSTER_FILE, else TF_CONFIG)"
    )
    group.add_argument("--job_name", choices=JOBS, help="this task's job")
    group.add_argument("--task_index", type=int, default=0, help="this task's index in its job")
    group.add_argument("--ps_hosts", default="", help="comma-separated host:port list")
    group.add_argument("--worker_hosts", default="", help="comma-separated host:port list")
    group.add_argument("--chief_hosts", default="", help="comma-separated host:port (at most 1)")
    group.add_argument(
        "--cluster_file",
        default=None,
        help='JSON {"cluster": {"ps": [...], "worker": [...]}}; the task from --job_name/'
        f"--task_index or ${TASK_ENV} (default: ${CLUSTER_FILE_ENV})",
    )


def cluster_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> ClusterInfo | None:
    """:func:`resolve_cluster` with the flags :func:`add_cluster_flags` added."""
    return resolve_cluster(
        job_name=args.job_name,
        task_index=args.task_index,
        hosts={job: getattr(args, flag) or "" for job, flag in HOST_FLAGS.items()},
        cluster_file=args.cluster_file,
        environ=os.environ if environ is None else environ,
    )


def resolve_cluster(
    *,
    job_name: str | None = None,
    task_index: int = 0,
    hosts: Mapping[str, str] | None = None,
    cluster_file: str | None = None,
    environ: Mapping[str, str],
) -> ClusterInfo | None:
    """The cluster from the flags, else a cluster file, else TF_CONFIG; None when none is given.

    ``hosts`` maps job names to the comma-separated lists of ``--ps_hosts`` and its siblings.
    """
    lists = {job: _host_list(text) for job, text in (hosts or {}).items()}
    lists = {job: hosts for job, hosts in lists.items() if hosts}
    cluster_file = cluster_file or environ.get(CLUSTER_FILE_ENV, "").strip() or None
    if lists and job_name is None:
        raise ClusterError(
            "--ps_hosts/--worker_hosts/--chief_hosts were given without --job_name; pass "
            "--job_name and --task_index too."
        )
    if lists or (job_name is not None and cluster_file is None):
        info = ClusterInfo(lists, job_name, task_index, "the command line")  # type: ignore[arg-type]
    elif cluster_file is not None:
        info = _from_cluster_file(cluster_file, job_name, task_index, environ)
    elif environ.get("TF_CONFIG", "").strip():
        info = _from_tf_config(environ["TF_CONFIG"])
    else:
        return None
    return checked(info)


def checked(info: ClusterInfo) -> ClusterInfo:
    """The checks every source goes through; raises ClusterError naming the source."""
    where = info.source
    if info.job_name not in JOBS:
        raise ClusterError(f"{where}: unknown job {info.job_name!r}; expected one of {JOBS}.")
    if not info.cluster:
        raise ClusterError(
            f"{where}: the cluster is empty; give --ps_hosts and --worker_hosts (host:port lists) "
            "or a cluster file with --cluster_file."
        )
    if not info.num_training_tasks:
        raise ClusterError(f"{where}: the cluster has no worker or chief task.")
    if len(info.cluster.get("chief", [])) > 1:
        raise ClusterError(f"{where}: at most one chief, got {len(info.cluster['chief'])}.")
    tasks = len(info.cluster.get(info.job_name, []))
    if info.job_name != "evaluator" and not 0 <= info.task_index < tasks:
        valid = f"the index must be 0..{tasks - 1}" if tasks else "it has no task at all"
        raise ClusterError(
            f"{where}: task {info.name} is not in the cluster: job {info.job_name!r} has {tasks} "
            f"address(es), so {valid}."
        )
    return info


def read_cluster_file(path: str) -> dict[str, list[str]]:
    """The ``"cluster"`` of a cluster file, as job -> host:port list."""
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except OSError as exc:
        raise ClusterError(f"cannot read the cluster file {path}: {exc.strerror or exc}.") from None
    except ValueError as exc:
        raise ClusterError(f"the cluster file {path} is not JSON: {exc}.") from None
    cluster = document.get("cluster") if isinstance(document, dict) else None
    return _cluster_of(cluster, f"the cluster file {path}")


def parse_task(text: str, where: str = TASK_ENV) -> tuple[str, int]:
    """``"worker:1"`` -> ``("worker", 1)``."""
    job, sep, index = text.strip().partition(":")
    if not sep or not job or not index.isdigit():
        raise ClusterError(f"{where}={text!r} is not a task; expected job:index, like worker:1.")
    return job, int(index)


def _from_cluster_file(
    path: str, job_name: str | None, task_index: int, environ: Mapping[str, str]
) -> ClusterInfo:
    cluster = read_cluster_file(path)
    source = f"the cluster file {path}"
    if job_name is None:
        task = environ.get(TASK_ENV, "").strip()
        if not task:
            raise ClusterError(
                f"{source} gives the cluster but not this task: pass --job_name and "
                f"--task_index, or set {TASK_ENV}=job:index (tflaunch sets it for every task)."
            )
        job_name, task_index = parse_task(task)
    return ClusterInfo(cluster, job_name, task_index, source, cluster_file=path)


def _from_tf_config(text: str) -> ClusterInfo:
    example = (
        'expected JSON like {"cluster": {"ps": [...], "worker": [...]}, "task": {"type": '
        '"worker", "index": 0}}'
    )
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise ClusterError(
            f"TF_CONFIG is not a valid cluster description ({exc}); {example}."
        ) from None
    if not isinstance(parsed, dict):
        raise ClusterError(f"TF_CONFIG is not a valid cluster description; {example}.")
    cluster = _cluster_of(parsed.get("cluster"), "TF_CONFIG")
    task = parsed.get("task")
    if not isinstance(task, dict) or "type" not in task:
        raise ClusterError('TF_CONFIG has no "task": {"type": ..., "index": ...}; ' + example)
    try:
        index = int(task.get("index", 0))
    except (TypeError, ValueError):
        raise ClusterError(
            f"TF_CONFIG's task index {task.get('index')!r} is not a number."
        ) from None
    return ClusterInfo(cluster, str(task["type"]), index, "TF_CONFIG")


def _cluster_of(cluster: object, where: str) -> dict[str, list[str]]:
    """Check the ``"cluster"`` object's shape: job names to lists of host:port strings."""
    valid = isinstance(cluster, dict) and all(
        isinstance(hosts, list) and all(isinstance(h, str) for h in hosts)
        for hosts in cluster.values()
    )
    if not valid:
        raise ClusterError(
            f"{where} is not a valid cluster description: expected "
            '{"cluster": {"ps": ["host:port", ...], "worker": [...]}} (lists of host:port).'
        )
    return {str(job): list(hosts) for job, hosts in cluster.items() if hosts}  # type: ignore[union-attr]


def _host_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]
