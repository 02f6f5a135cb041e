"""A TensorFlow ClusterResolver for tflaunch's cluster file, for clusters too large for TF_CONFIG.

Linux refuses a single environment string over 128 KiB, so past a few thousand tasks a cluster
cannot travel in ``TF_CONFIG``. tflaunch then writes it to a JSON file,
``{"cluster": {"ps": ["host:port", ...], "worker": [...], "chief": [...]}}``, and gives every
task ``TFLAUNCH_CLUSTER_FILE=<path>`` and ``TFLAUNCH_TASK=worker:1``. TF2 strategies take it
through ``cluster_resolver=``::

    from tflaunch.models.cluster_file_resolver import ClusterFileResolver

    resolver = ClusterFileResolver()  # the file and the task from the environment
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)

It answers as ``TFConfigClusterResolver`` answers for a TF_CONFIG with the same cluster and task:
the same ``cluster_spec()``, ``master()``, ``task_type``, ``task_id`` and ``rpc_layer``. The file
is read once, when the resolver is made (it does not change during a run).

:func:`resolver_for` gives the resolver for a cluster that :mod:`tflaunch.models.cluster`
resolved from any source (flags, cluster file, TF_CONFIG), so a program hands its strategy the same
kind of resolver whichever way its cluster came. The only module of the cluster resolution that
imports TensorFlow; reading and checking the file is :mod:`tflaunch.models.cluster`'s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import tensorflow as tf

from tflaunch.models.cluster import (
    CLUSTER_FILE_ENV,
    TASK_ENV,
    ClusterError,
    ClusterInfo,
    parse_task,
    read_cluster_file,
)


class StaticClusterResolver(tf.distribute.cluster_resolver.ClusterResolver):
    """A fixed cluster (job -> host:port list) and this task in it, answering ``cluster_spec()``,
    ``master()``, ``task_type``, ``task_id`` and ``rpc_layer`` as ``TFConfigClusterResolver`` does
    for a TF_CONFIG with the same cluster and task.

    Unlike ``SimpleClusterResolver``, ``num_accelerators()`` counts this machine's devices (the
    base class's), as TFConfigClusterResolver's does: MultiWorkerMirroredStrategy puts one replica
    on each GPU it reports.
    """

    def __init__(
        self,
        cluster: Mapping[str, Sequence[str]],
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
        where: str = "the cluster",
    ) -> None:
        self._cluster = {job: list(hosts) for job, hosts in cluster.items()}
        self._task_type = task_type
        self._task_id = task_id
        self._rpc_layer = rpc_layer
        if task_type is None or task_type == "evaluator":
            return  # TF_CONFIG's cluster lists no evaluator either
        hosts = self._cluster.get(task_type, [])
        if task_id is None or not 0 <= task_id < len(hosts):
            raise ClusterError(
                f"task {task_type}:{task_id} is not in {where}: job {task_type!r} has "
                f"{len(hosts)} address(es)."
            )

    def cluster_spec(self) -> tf.train.ClusterSpec:
        return tf.train.ClusterSpec(self._cluster)

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """This task's address (or the one named), with ``rpc_layer://`` when one is set; '' for a
        cluster of one task, as TFConfigClusterResolver."""
        spec = self.cluster_spec()
        if not spec.jobs or (len(spec.jobs) == 1 and spec.num_tasks(spec.jobs[0]) == 1):
            return ""
        task_type = self._task_type if task_type is None else task_type
        task_id = self._task_id if task_id is None else task_id
        rpc_layer = self._rpc_layer if rpc_layer is None else rpc_layer
        address = spec.task_address(task_type, task_id)
        return f"{rpc_layer}://{address}" if rpc_layer else address

    @property
    def rpc_layer(self) -> str | None:
        return self._rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer


class ClusterFileResolver(StaticClusterResolver):
    """The cluster of a tflaunch cluster file, and this task in it.

    ``path`` defaults to ``$TFLAUNCH_CLUSTER_FILE``; ``task_type``/``task_id`` to
    ``$TFLAUNCH_TASK`` (None when neither is given, as for a TF_CONFIG without a task).
    ``jobs`` keeps only those jobs (in the file's order), e.g. ``("chief", "worker")`` for
    MultiWorkerMirroredStrategy in a cluster that also has PS tasks.
    """

    def __init__(
        self,
        path: str | None = None,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
        jobs: Sequence[str] | None = None,
    ) -> None:
        path = path or os.environ.get(CLUSTER_FILE_ENV, "").strip()
        if not path:
            raise ClusterError(
                f"no cluster file: pass its path to ClusterFileResolver or set {CLUSTER_FILE_ENV}."
            )
        cluster = read_cluster_file(path)
        if jobs is not None:
            cluster = {job: hosts for job, hosts in cluster.items() if job in jobs}
        if task_type is None and os.environ.get(TASK_ENV, "").strip():
            task_type, env_id = parse_task(os.environ[TASK_ENV])
            task_id = env_id if task_id is None else task_id
        self.path = path
        super().__init__(cluster, task_type, task_id, rpc_layer, f"the cluster file {path}")


def resolver_for(
    info: ClusterInfo, rpc_layer: str | None = None, jobs: Sequence[str] | None = None
) -> StaticClusterResolver:
    """The TF resolver for a cluster :mod:`tflaunch.models.cluster` resolved: the cluster file's
    when it came from one, else one holding the same cluster (``jobs`` keeps only those)."""
    if info.cluster_file is not None:
        return ClusterFileResolver(
            info.cluster_file, info.job_name, info.task_index, rpc_layer, jobs
        )
    cluster = info.jobs(*jobs) if jobs is not None else info.cluster
    return StaticClusterResolver(cluster, info.job_name, info.task_index, rpc_layer, info.source)
