"""From a cluster file to a running cluster: the one path every command takes to the backends.

The CLI, ``tflaunch bench`` and other callers go through here; only this module picks a backend
(:mod:`tflaunch.launchers`). :func:`plan_cluster` is the one config → plan function, used by
``validate``, ``plan``, ``render``, ``up --dry-run`` and ``up``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tflaunch.cluster import backends
from tflaunch.cluster.config import ClusterConfig
from tflaunch.cluster.placement import gpu_notices, make_plan
from tflaunch.cluster.plan import Plan
from tflaunch.errors import ConfigError, LaunchError, PlanError, TflaunchError
from tflaunch.runtime.identity import Launcher
from tflaunch.runtime.run import ENDED, Outcome, Run, new_run_id
from tflaunch.trace.request import DEFAULT_PORT_OFFSET, TraceRequest, trace_dir

# A run's states before its coordinator runs it, when the launcher is the one to end it; the run
# is live while that launcher runs (making its machines, submitting), whatever its backend says.
UNSTARTED = ("created", "starting")

if TYPE_CHECKING:
    from tflaunch.launchers.base import Backend, LaunchOptions


def backend_for(name: str) -> Backend:
    """The backend called ``name`` (imported on demand, so each stays optional)."""
    from tflaunch.launchers import get_backend

    return get_backend(name)


def backend_of(run: Run) -> Backend:
    """The backend that started ``run`` (runs record it in run.json)."""
    return backend_for(run.record().backend or "local")


def run_state(run: Run) -> str:
    """The run's recorded state; ``lost`` when it has not ended but its coordinator (a local
    process, a Slurm job, a detached coordinator on a host) is gone: a killed ``up``, say; and
    ``unknown`` when only another machine can tell (its launcher runs there)."""
    return run_liveness(run)[0]


def run_liveness(run: Run) -> tuple[str, str | None]:
    """(:func:`run_state`, why it is ``unknown``, or None)."""
    record = run.record()
    state = record.state or "unknown"
    if state in ENDED:
        return state, None
    launcher = record.launcher
    if state in UNSTARTED and launcher is not None and launcher.alive():
        return state, None
    alive = backend_of(run).cluster_alive(run)
    if alive:
        return state, None
    if alive is None:
        return "unknown", _elsewhere(run.id, launcher)
    return ("lost", None) if not run.ended else (run.record().state or "unknown", None)


def _elsewhere(run_id: str, launcher: Launcher | None) -> str:
    if launcher is None:
        return (
            "its run.json names no launcher (written by an older tflaunch, or edited), so "
            "whether it still runs cannot be told"
        )
    return (
        f"its launcher is {launcher.describe()}; only that machine can tell whether it still "
        f"runs ('tflaunch status {run_id}' there)"
    )


def plan_cluster(config: ClusterConfig, run: Run | None = None) -> Plan:
    """Place the cluster on its backend's hosts (``run``'s directory, as the tasks see it, holds
    the default checkpoints)."""
    return make_plan(config, backend_for(config.backend).hosts(config), tasks_run_dir(config, run))


def tasks_run_dir(config: ClusterConfig, run: Run | None) -> str | None:
    """The run's directory as its tasks see it: on the hosts where they have their own
    (ssh: ``<remote_runs_dir>/<run id>``, ``~`` for the remote home), else the run directory
    here (this machine, Slurm's shared file system); None without a run, outside ssh."""
    run_id = run.id if run is not None else "<run id>"
    on_hosts = backend_for(config.backend).host_run_dir(config, run_id)
    if on_hosts is not None:
        return on_hosts
    return None if run is None else str(run.dir)


def ports_line(config: ClusterConfig, plan: Plan) -> str | None:
    """``tflaunch plan``'s line when ``up`` settles ports the plan shows by their defaults (the
    local backend's free ports for the jobs the file gives no base)."""
    chosen = backend_for(config.backend).choose_ports(config, plan)
    moved = sorted({t.job for t, c in zip(plan.tasks, chosen.tasks, strict=True) if t != c})
    if not moved:
        return None
    return (
        f"ports: the {', '.join(moved)} tasks get free ports of this machine at each 'up' (the "
        "file's ports: names no base for them); shown above are the defaults"
    )


def checkpoints_line(config: ClusterConfig, plan: Plan) -> str | None:
    """``tflaunch plan``'s line saying where the tasks' checkpoint directory is when it is on
    the hosts' own disks (ssh); None where it is on this machine's (or a shared) file system."""
    if backend_for(config.backend).host_run_dir(config, "<run id>") is None:
        return None
    path = plan.program.checkpoint_dir
    if "://" in path:
        return f"checkpoints: {path} (program.checkpoint_dir)"
    where = "program.checkpoint_dir" if config.program.checkpoint_dir else "the default"
    return (
        f"checkpoints: {path} on each task's host ({where}; ~ and relative paths are the "
        "remote home's)"
    )


def prepare(
    config: ClusterConfig,
    runs_dir: str | None = None,
    run_id: str | None = None,
    cluster_file: str | None = None,
    backend: Backend | None = None,
) -> tuple[Plan, Run]:
    """Plan the cluster and create its run directory; ``backend``: the one that will launch it
    (what it learns while finding the hosts, e.g. a cloud provider, it keeps for the launch)."""
    check_env_from(config)
    backend = backend or backend_for(config.backend)
    hosts = backend.hosts(config)
    run = Run.create(runs_dir or config.runs_dir, config.name, run_id, int(config.run_dir_mode, 8))
    try:
        plan = backend.choose_ports(config, make_plan(config, hosts, tasks_run_dir(config, run)))
    except PlanError:
        run.discard()  # a plan that cannot be made leaves no run behind
        raise
    if not backend.hosts_pending(config):  # else the backend writes it once the hosts exist
        run.write_plan(plan)
    run.update_meta(
        backend=config.backend,
        cluster_file=str(Path(cluster_file).resolve()) if cluster_file else None,
    )
    return plan, run


def check_env_from(config: ClusterConfig, environ: Mapping[str, str] = os.environ) -> None:
    """Every ``program.env_from`` variable is set here, where the tasks will inherit it from
    (the agent, or the job sbatch submits), and the backend can pass them on."""
    missing = [name for name in config.program.env_from if name not in environ]
    if missing:
        raise LaunchError(
            f"{config.source}: program.env_from names {', '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not set in this environment; export "
            f"{'it' if len(missing) == 1 else 'them'} before 'tflaunch up'."
        )
    backend_for(config.backend).check_environment(config, environ)


def problems_here(config: ClusterConfig, plan: Plan) -> list[str]:
    """What the backend sees from here that would stop the cluster's start, one sentence each,
    on the ports a start would use (:meth:`Backend.choose_ports`: local free ports)."""
    backend = backend_for(config.backend)
    return backend.check_here(config, backend.choose_ports(config, plan))


def check_here(config: ClusterConfig, plan: Plan) -> None:
    """``validate``'s checks of this machine beyond the file: ``program.env_from`` is set, and
    what the backend can see from here (local: the program on PATH, free ports, hosts that
    resolve; ssh: hosts that resolve). LaunchError (exit 2) listing every problem."""
    check_env_from(config)
    problems = problems_here(config, plan)
    if problems:
        raise LaunchError(
            f"{config.source}: the file is valid, but the cluster cannot start from here: "
            + "; ".join(p.rstrip(".") for p in problems)
            + ". ('tflaunch validate --offline' checks the file alone.)"
        )


def traced(
    config: ClusterConfig,
    runs_dir: str,
    run_id: str,
    steps: str | None,
    at: str | None = None,
    length: str | None = None,
    port_offset: int = DEFAULT_PORT_OFFSET,
) -> tuple[ClusterConfig, TraceRequest]:
    """``up --trace``'s one typed request for run ``run_id`` (its trace directory in the run
    directory here, or on the hosts where they keep their own: ssh), and ``config`` with it in
    every task's environment. The request goes on in ``LaunchOptions.trace``; the backend hands
    it to the coordinator. TraceError (exit 2) for options that do not fit."""
    on_hosts = backend_for(config.backend).host_run_dir(config, run_id)
    request = TraceRequest.from_options(
        trace_dir(runs_dir, run_id, on_hosts), steps, at, length, port_offset
    )
    return request.applied(config), request


def run_cluster(config: ClusterConfig, runs_dir: str | None = None) -> tuple[Run, Outcome]:
    """Run the cluster to its end in the foreground (output streams to stdout)."""
    backend = backend_for(config.backend)
    plan, run = prepare(config, runs_dir, backend=backend)
    return run, backend.launch(config, plan, run)


def dry_run(config: ClusterConfig, runs_dir: str | None, run_id: str | None) -> str:
    """What ``up --dry-run`` prints: the plan, or what the backend would submit."""
    runs_dir = runs_dir or config.runs_dir
    run_id = run_id or new_run_id(config.name)
    run = Run(run_id, Path(runs_dir).resolve() / run_id)
    return backend_for(config.backend).dry_run(config, plan_cluster(config, run), run)


def up(
    config: ClusterConfig,
    cluster_file: str,
    runs_dir: str | None = None,
    run_id: str | None = None,
    detach: bool = False,
    attached_daemon: bool = False,
    options: LaunchOptions | None = None,
) -> Outcome | str:
    """``tflaunch up``: the run's outcome, or with ``detach`` what to print (the run id).
    ``options`` go to the backend: those asking for an ability its spec does not declare
    (``BackendSpec.features``) are refused here, once, then those it cannot honour here."""
    backend = backend_for(config.backend)
    if options is not None:
        spec = backends.spec_of(config.backend)
        for feature, asked in options.features():
            spec.require(feature, asked)
    if options is not None and options.keep and not backend.hosts_pending(config):
        raise ConfigError(
            f"{config.source}: --keep keeps the machines tflaunch makes for a run "
            "(ssh.provision), and this cluster file makes none."
        )
    runs_dir = runs_dir or config.runs_dir
    if options is not None:
        backend.check_options(options)
    if attached_daemon:  # the background half of --detach: the plan the foreground showed
        run = Run.open(runs_dir, run_id or "")
        plan = run.read_plan()
    else:
        plan, run = prepare(config, runs_dir, run_id, cluster_file, backend)
        note = config.ps_default_note()
        if note:  # the first line of a run that starts
            print(f"[tflaunch] note: {note}", file=sys.stderr, flush=True)
        for notice in gpu_notices(plan):
            print(f"[tflaunch] {notice}", file=sys.stderr, flush=True)
    try:
        if detach:
            return backend.detach(config, plan, run, options)
        return backend.launch(config, plan, run, options)
    except (TflaunchError, OSError) as err:
        # Detached, a run past 'created' has a coordinator of its own, which finishes it.
        finish_unstarted(run, err, ("created",) if detach else UNSTARTED)
        raise


def finish_unstarted(run: Run, err: Exception, states: tuple[str, ...] = UNSTARTED) -> None:
    """A run that failed before its coordinator took it over (a failed submit, an agent that
    could not start) ends as ``failed`` with the reason, never left ``created`` or ``starting``
    for 'status' to call lost. A run that got further is its coordinator's to finish."""
    if run.record().state in states:
        code = err.exit_code if isinstance(err, TflaunchError) else 1
        run.finish(Outcome(code, f"failed before any task started: {err}"))


def attach(run: Run) -> None:
    """Open the terminal session of a run started with ``up --terminals tmux``."""
    backend_of(run).attach(run)
