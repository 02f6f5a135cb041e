"""``tflaunch export CLUSTER --format tfjob``: the cluster file as a Kubeflow TFJob (kubeflow.org/v1).

Each role becomes a replica spec (PS, Chief, Worker, Evaluator) of one pod template whose
container, named ``tensorflow`` as the TFJob operator expects, runs ``program.argv``. The
operator gives every pod a TF_CONFIG whose cluster names each task
``<job>-<type>-<index>.<namespace>.svc:<port>`` (the evaluator is not in the cluster) on the
container port named ``tfjob-port``; here that port is the role's base port from ``ports:``.
The placeholders are filled the same way: ``{ps_hosts}``, ``{worker_hosts}``, ``{chief_hosts}``,
``{num_ps}``, ``{num_workers}`` and ``{job_name}`` are the same for every pod of a role, while
``{task_index}`` and ``{host}`` become ``$(TFLAUNCH_TASK_INDEX)``, which Kubernetes expands from
the pod's ``training.kubeflow.org/replica-index`` label (a literal ``$`` is written ``$$``).

``supervision.restart`` gives each replica spec its restartPolicy (never: Never, on-failure:
OnFailure, exit-code: ExitCode) and ``runPolicy.backoffLimit``; GPUs per task from the plan
become GPU limits. What a TFJob cannot say is an error naming the key, never a silent drop; what
tflaunch's launcher watches itself (stalls, heartbeats) and TFJob does not is named in warnings.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from typing import Any

from tflaunch import launch
from tflaunch.cluster.config import LEGACY_KERAS_ENV, ClusterConfig, namespace_problem
from tflaunch.cluster.plan import Plan
from tflaunch.cluster.supervision import RoleRestart
from tflaunch.errors import ConfigError

REPLICA_TYPES = {"ps": "PS", "chief": "Chief", "worker": "Worker", "evaluator": "Evaluator"}
RESTART_POLICIES = {"never": "Never", "on-failure": "OnFailure", "exit-code": "ExitCode"}
CONTAINER = "tensorflow"  # the container the operator gives TF_CONFIG and reads tfjob-port from
PORT_NAME = "tfjob-port"
INDEX_LABEL = "training.kubeflow.org/replica-index"
INDEX_VAR = "TFLAUNCH_TASK_INDEX"
_INDEX = "\x00index\x00"  # stands for $(TFLAUNCH_TASK_INDEX) until '$' is escaped


def export_tfjob(
    config: ClusterConfig,
    image: str | None = None,
    namespace: str | None = None,
    checkpoint_dir: str | None = None,
    warn: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """The TFJob manifest of ``config``; options override the ``kubernetes:`` section."""
    section = config.kubernetes
    image = image or section.image
    where = config.source
    if namespace is not None and namespace_problem(namespace):
        raise ConfigError(f"--namespace: {namespace_problem(namespace)}.")
    namespace = namespace or section.namespace
    if not image:
        raise ConfigError(
            f"{where}: a TFJob needs a container image; set kubernetes.image in the cluster "
            "file or pass --image."
        )
    _refuse_unexpressible(config)
    plan = launch.plan_cluster(config)
    name = _dns_name(config.name)
    ports = {"ps": config.ports.ps, "worker": config.ports.worker, "chief": config.ports.chief}
    counts = {job: getattr(config.roles, job) for job in REPLICA_TYPES}
    cluster = {
        job: [f"{name}-{job}-{i}.{namespace}.svc:{ports[job]}" for i in range(counts[job])]
        for job in ("ps", "chief", "worker")
        if counts[job]
    }
    checkpoints = _checkpoint_dir(config, checkpoint_dir)
    specs = {}
    for job, kind in REPLICA_TYPES.items():
        if not counts[job]:
            continue
        specs[kind] = _replica_spec(
            config, plan, job, counts[job], image, name, namespace, ports, cluster, checkpoints
        )
    restart = config.supervision.restart
    run_policy: dict[str, Any] = {"cleanPodPolicy": "Running"}  # the PS stop with the run
    if restart.enabled:
        run_policy["backoffLimit"] = restart.max_restarts
    if config.supervision.max_runtime:
        run_policy["activeDeadlineSeconds"] = int(config.supervision.max_runtime)
    spec: dict[str, Any] = {"runPolicy": run_policy}
    success = config.supervision.success
    if success == "workers" or (success == "auto" and not counts.get("chief")):
        spec["successPolicy"] = "AllWorkers"  # (TFJob's default: the chief, else worker 0)
    spec["tfReplicaSpecs"] = specs
    for warning in _launcher_only(config):
        warn(warning)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def _replica_spec(
    config: ClusterConfig,
    plan: Plan,
    job: str,
    count: int,
    image: str,
    name: str,
    namespace: str,
    ports: dict[str, int],
    cluster: dict[str, list[str]],
    checkpoints: str | None,
) -> dict[str, Any]:
    values = {
        "job_name": job,
        "task_index": _INDEX,
        "host": f"{name}-{job}-{_INDEX}.{namespace}.svc",
        "port": str(ports[job]) if job != "evaluator" else "",
        "checkpoint_dir": checkpoints or "",
        "cluster_file": "",
        "ps_hosts": ",".join(cluster.get("ps", [])),
        "worker_hosts": ",".join(cluster.get("worker", [])),
        "chief_hosts": ",".join(cluster.get("chief", [])),
        "num_ps": str(len(cluster.get("ps", []))),
        "num_workers": str(len(cluster.get("worker", []))),
    }
    argv = [_k8s_text(arg.format_map(values)) for arg in config.program.argv]
    env: list[dict[str, Any]] = [
        {
            "name": INDEX_VAR,
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{INDEX_LABEL}']"}},
        },
        {"name": "TFLAUNCH_TASK", "value": f"{job}:$({INDEX_VAR})"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if checkpoints:
        env.append({"name": "TFLAUNCH_CHECKPOINT_DIR", "value": _k8s_text(checkpoints)})
    program_env = dict(config.program.env)
    if config.program.keras == "legacy":
        program_env[LEGACY_KERAS_ENV] = "1"
    env += [{"name": k, "value": _k8s_text(v)} for k, v in program_env.items()]
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "command": argv,
        "env": env,
    }
    if job != "evaluator":
        container["ports"] = [{"name": PORT_NAME, "containerPort": ports[job]}]
    if config.kubernetes.workdir:
        container["workingDir"] = config.kubernetes.workdir
    limits = _limits(config, plan, job)
    if limits:
        container["resources"] = {"limits": limits}
    return {
        "replicas": count,
        "restartPolicy": RESTART_POLICIES[config.supervision.restart.of(job).policy],
        "template": {
            "spec": {
                "containers": [container],
                "terminationGracePeriodSeconds": max(1, round(config.supervision.grace_period)),
            }
        },
    }


def _limits(config: ClusterConfig, plan: Plan, job: str) -> dict[str, Any]:
    """GPU (and pinned CPU) limits of one role: one pod template, so one count for all its
    tasks."""
    counts = sorted({len(t.gpus) for t in plan.tasks if t.job == job})
    if len(counts) > 1:
        raise ConfigError(
            f"{config.source}: the plan gives {job} tasks {' or '.join(map(str, counts))} GPUs "
            "(hosts with different GPU counts), but every pod of a TFJob replica type has one "
            "template; set placement.gpus_per_worker so that each gets the same."
        )
    limits: dict[str, Any] = {}
    if counts and counts[0]:
        limits[config.kubernetes.gpu_resource] = counts[0]
    if config.placement.cpus_per_task:
        limits["cpu"] = config.placement.cpus_per_task
    return limits


def _refuse_unexpressible(config: ClusterConfig) -> None:
    """Errors for what a TFJob would run differently from tflaunch."""
    program = config.program
    where = config.source

    def fail(key: str, message: str) -> None:
        raise ConfigError(f"{where}: {key}: {message}; a TFJob cannot express it.")

    if not program.tf_config:
        fail(
            "program.tf_config",
            "false, but the TFJob operator always gives every pod its TF_CONFIG and no "
            "cluster file",
        )
    if _uses(config, "cluster_file"):
        fail("program.argv", "'{cluster_file}' names a file in tflaunch's run directory")
    if program.env_from:
        fail(
            "program.env_from",
            "its values must never be written to a file; give the pods a Kubernetes Secret "
            "instead (env valueFrom.secretKeyRef) and remove env_from for the export",
        )
    if program.workdir != "." and not config.kubernetes.workdir:
        fail(
            "program.workdir",
            f"{program.workdir!r} is a directory on the hosts tflaunch runs the tasks on, not "
            "in the container; set kubernetes.workdir to the container's working directory",
        )
    restart = config.supervision.restart
    for job in REPLICA_TYPES:
        role = restart.of(job)
        if role.scope == "cluster":
            fail(
                f"supervision.restart.{job}.scope",
                "cluster: TFJob restarts a failed pod alone, never every pod from the checkpoints",
            )
        if role.max_restarts != RoleRestart().max_restarts and role.policy != "never":
            fail(
                f"supervision.restart.{job}.max_restarts",
                "TFJob bounds restarts for the whole job only (runPolicy.backoffLimit, from "
                "supervision.restart.max_restarts), not per replica type",
            )


def _launcher_only(config: ClusterConfig) -> list[str]:
    """Settings tflaunch's launcher enforces and a TFJob leaves to the operator's defaults."""
    sup = config.supervision
    notes = []
    if sup.stall_timeout:
        notes.append(
            "supervision.stall_timeout is watched by tflaunch's launcher; the TFJob operator "
            "does not detect stalls (add a livenessProbe to the pod template if you need one)"
        )
    if ("program", "workdir") in config.positions and not config.kubernetes.workdir:
        notes.append(
            f"program.workdir {config.program.workdir!r} (the cluster file's folder) is not in "
            "the container: the pods start in the image's working directory (set "
            "kubernetes.workdir to choose it)"
        )
    restart = sup.restart
    for job in ("ps", "chief"):
        if restart.of(job).policy != "never" and restart.of(job).scope is None:
            notes.append(
                f"supervision.restart.{job} restarts the whole cluster under tflaunch; the "
                f"TFJob restarts the {job} pod alone ({RESTART_POLICIES[restart.of(job).policy]})"
            )
    if restart.enabled and restart.max_cluster_restarts != type(restart)().max_cluster_restarts:
        notes.append("supervision.restart.max_cluster_restarts has no TFJob equivalent")
    return notes


def _checkpoint_dir(config: ClusterConfig, given: str | None) -> str | None:
    """``{checkpoint_dir}`` in the containers, if the program uses it."""
    path = given or config.kubernetes.checkpoint_dir
    if path:
        return path
    own = config.program.checkpoint_dir
    if own and own.startswith("/"):
        return own
    if _uses(config, "checkpoint_dir"):
        raise ConfigError(
            f"{config.source}: program.argv uses '{{checkpoint_dir}}', which in a TFJob must "
            "be a path on a volume every pod mounts; set kubernetes.checkpoint_dir (or an "
            "absolute program.checkpoint_dir), or pass --checkpoint-dir."
        )
    return None


def _uses(config: ClusterConfig, placeholder: str) -> bool:
    return any(
        name == placeholder
        for arg in config.program.argv
        for _, name, _, _ in string.Formatter().parse(arg)
    )


def _k8s_text(text: str) -> str:
    """Text for a command or env value: Kubernetes expands ``$(VAR)`` there, ``$$`` is ``$``."""
    return text.replace("$", "$$").replace(_INDEX, f"$({INDEX_VAR})")


def _dns_name(name: str) -> str:
    """The cluster name as a Kubernetes object name: a lower-case DNS label short enough that
    ``<name>-evaluator-<index>``, each pod's service name, is one too (63 characters)."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:40].strip("-")
    return label or "tflaunch"
