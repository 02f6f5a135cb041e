"""A task's view, rendered from the plan's shared cluster and program and the task's own fields
where and when it is needed (by the agent that starts it): argv with placeholders filled,
environment with TF_CONFIG, CUDA_VISIBLE_DEVICES (always exported) and the cluster file's path.

:func:`check_program` refuses, when the plan is made, placeholders that do not exist and argument
or environment strings no process could be given (Linux's MAX_ARG_STRLEN): past that size the
cluster travels as a file (``{cluster_file}``, ``$TFLAUNCH_CLUSTER_FILE``).
"""

from __future__ import annotations

import json
import os
import string
from collections.abc import Iterable, Mapping
from typing import Any

from tflaunch.cluster.config import ClusterConfig
from tflaunch.cluster.plan import Host, Plan, Task, TaskView
from tflaunch.errors import PlanError

CLUSTER_FILE = "cluster_spec.json"
# Linux refuses (E2BIG) any one argument or environment string longer than 32 pages, NUL included.
MAX_ARG_STRLEN = 32 * 4096
# Bytes counted for the cluster file's path in an argv item: run directories live deeper than
# ``runs/<run-id>/`` on some hosts (SSH: <remote_runs_dir>/<run-id>/<host>/).
CLUSTER_FILE_PATH_RESERVE = 512


def tf_config(plan: Plan, task: Task) -> dict[str, Any]:
    """The TF_CONFIG of one task, in the form TFConfigClusterResolver reads."""
    return {
        "cluster": {job: list(addrs) for job, addrs in plan.cluster.items()},
        "task": {"type": task.job, "index": task.index},
    }


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


def check_program(config: ClusterConfig, plan: Plan, placed: list[tuple[str, int, Host]]) -> None:
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
