"""The bounds every count, duration and line of text of the cluster file keeps, and the fields
that carry them.

Far above any real cluster, low enough that no file can make the launcher build huge lists. The
plan grows linearly with the tasks (benchmarks/plan_scale.py: 33,280 tasks, 4,096 nodes x 8 GPUs,
plan in about a second), so tasks are bounded at twice that scale."""

from __future__ import annotations

import dataclasses
from typing import Any

from tflaunch.cluster.schema import field

MAX_TASKS = 65_536  # tasks of one role, and of all roles together
MAX_HOSTS = 4096  # hosts listed, and slurm.nodes
MAX_GPUS = 256  # GPUs of one host or node, and per worker
MAX_ITEMS = 4096  # items of any list: argv, sbatch options, setup lines, uploads, instance ids
MAX_SECONDS = 30 * 24 * 3600.0  # any timeout or interval: 30 days
MAX_RESTARTS = 10_000  # any restart limit
MAX_PORT = 65_535


def seconds(default: float | None, doc: str, minimum: float = 0) -> Any:
    """A duration field: seconds, at least ``minimum`` and at most :data:`MAX_SECONDS`."""
    return field(default, minimum=minimum, maximum=MAX_SECONDS, doc=doc)


def task_count(default: int | None, doc: str, minimum: int = 0) -> Any:
    """A number of tasks (of a role, or on one host): at least ``minimum``, at most
    :data:`MAX_TASKS`."""
    return field(default, minimum=minimum, maximum=MAX_TASKS, doc=doc)


def gpu_count(default: int | None, doc: str) -> Any:
    """A number of GPUs (of a host, or per task): 0 to :data:`MAX_GPUS`."""
    return field(default, minimum=0, maximum=MAX_GPUS, doc=doc)


def one_line(default: Any = dataclasses.MISSING, *, doc: str) -> Any:
    """A text setting that must fit on one line (it goes into names, commands and manifests)."""
    return field(default, doc=doc, line=True)
