"""The surface backends and cloud providers build on: the only tflaunch module they import.

A backend (in ``launchers/<name>/`` or a package of its own) and a cloud provider use what this
module lists and nothing else of tflaunch, so that the rest may change without breaking them;
``tests/test_plugin.py`` fails when a listed name disappears or an in-tree backend imports
around this module. ``docs/plugins.md`` says how to write one, start to end.

The names are imported on first use (PEP 562), not when this module is: each backend's folder is
imported on every command to find the registered backends, and the runtime behind
:class:`Backend` costs ~130 ms more than the cluster file's reader. The ``TYPE_CHECKING`` block
says the same to type checkers and to the import contracts (pyproject.toml).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module that defines it. Grouped as docs/plugins.md explains them.
_SOURCES: dict[str, str] = {
    # Registering a backend, and its section of the cluster file
    "BackendSpec": "tflaunch.cluster.backends",
    "BackendFeature": "tflaunch.cluster.backends",  # what up's options need, declared
    "Fail": "tflaunch.cluster.backends",
    "field": "tflaunch.cluster.schema",
    "MAX_GPUS": "tflaunch.cluster.bounds",
    "MAX_HOSTS": "tflaunch.cluster.bounds",
    "MAX_ITEMS": "tflaunch.cluster.bounds",
    "MAX_PORT": "tflaunch.cluster.bounds",
    "MAX_SECONDS": "tflaunch.cluster.bounds",
    "env_name_problem": "tflaunch.cluster.config",  # why a name is no environment variable's
    # The cluster file and the plan
    "ClusterConfig": "tflaunch.cluster.config",
    "parse_config": "tflaunch.cluster.config",
    "load_config": "tflaunch.cluster.config",
    "Host": "tflaunch.cluster.plan",
    "Plan": "tflaunch.cluster.plan",
    "make_plan": "tflaunch.cluster.placement",
    "hosts_from_config": "tflaunch.cluster.placement",
    "unset_gpus": "tflaunch.cluster.placement",
    "render_task": "tflaunch.cluster.render",  # a task's argv and environment on its host
    "gpu_ids": "tflaunch.cluster.placement",  # a host's GPU count -> its ids ("0", "1", ...)
    "expand_hostlist": "tflaunch.cluster.hostlist:expand",  # "nid0[01-03]" -> names
    "compress_hostlist": "tflaunch.cluster.hostlist:compress",  # names -> "nid0[01-03]"
    # Errors (each carries its exit code; bad input is 2, with a one-paragraph message)
    "TflaunchError": "tflaunch.errors",
    "ConfigError": "tflaunch.errors",
    "PlanError": "tflaunch.errors",
    "LaunchError": "tflaunch.errors",
    "MissingExtra": "tflaunch.errors",  # an optional dependency not installed: names the extra
    # The backend interface
    "Backend": "tflaunch.launchers.base",
    "LaunchOptions": "tflaunch.launchers.base",
    "spawn_agent": "tflaunch.launchers.base",
    "preflight_here": "tflaunch.runtime.agent",  # an agent's pre-flight, run here (validate)
    # Batch schedulers: the login side and the in-job side
    "BatchBackend": "tflaunch.launchers.batch.backend",
    "BatchDetails": "tflaunch.launchers.batch.state",
    "JobState": "tflaunch.launchers.batch.state",
    "placeholder_hosts": "tflaunch.launchers.batch.backend",
    "JobNode": "tflaunch.launchers.batch.job",
    "read_job": "tflaunch.launchers.batch.job",
    "coordinate_job": "tflaunch.launchers.batch.job:coordinate",
    "job_main": "tflaunch.launchers.batch.job:main",
    # Runs, their records and processes
    "Run": "tflaunch.runtime.run",
    "RunRecord": "tflaunch.runtime.run",
    "Outcome": "tflaunch.runtime.run",
    "INTERRUPT_CODES": "tflaunch.runtime.run",
    "write_run_file": "tflaunch.runtime.runfiles",
    "open_run_file": "tflaunch.runtime.runfiles",
    "is_component": "tflaunch.runtime.runfiles",  # a name safe to join to a run directory
    "RunFileError": "tflaunch.runtime.runfiles",  # a run file there but not readable as one
    "PLAN_FILE": "tflaunch.runtime.runfiles",
    "EVENTS_FILE": "tflaunch.runtime.runfiles",
    "CONSOLE_FILE": "tflaunch.runtime.runfiles",
    "SAMPLES_PREFIX": "tflaunch.runtime.runfiles",
    "PROGRESS_FILE": "tflaunch.runtime.progress",
    "remote_record_path": "tflaunch.runtime.run",  # run.json of a run directory on a host
    "Requeue": "tflaunch.runtime.signals",
    "Revive": "tflaunch.runtime.revival",
    "ProcessLink": "tflaunch.runtime.link",
    "agent_argv": "tflaunch.runtime.link",
    "agent_args": "tflaunch.runtime.link",
    "agent_output": "tflaunch.runtime.link",
    "StreamLink": "tflaunch.runtime.link",  # an agent over a pair of text streams (SSH channel)
    "spawn": "tflaunch.runtime.procs",  # a process group of its own, optionally tied to us
    "terminate_group": "tflaunch.runtime.procs",  # SIGTERM, bounded wait, SIGKILL
    "free_ports": "tflaunch.runtime.procs",  # ports of this machine nobody listens on
    "in_threads": "tflaunch.threads",  # one call per item in daemon threads, under a deadline
    # Tracing: the request up --trace makes, and where a backend's capture runs (Backend.trace_site)
    "TraceRequest": "tflaunch.trace.request",
    "TraceSite": "tflaunch.trace.site",
    # Cloud providers: registering one (its spec, section, declared features, admin options)
    "ProviderSpec": "tflaunch.launchers.clouds.base",
    "ProvisionSection": "tflaunch.launchers.clouds.base",
    "Feature": "tflaunch.launchers.clouds.base",
    "AdminOption": "tflaunch.launchers.clouds.base",
    "Unsupported": "tflaunch.launchers.clouds.base",  # a request for an undeclared feature
    # Cloud providers: the interface and what its instances carry
    "Provider": "tflaunch.launchers.clouds.base",
    "Instance": "tflaunch.launchers.clouds.records",
    "PlannedInstance": "tflaunch.launchers.clouds.records",
    "LockHolder": "tflaunch.launchers.clouds.records",
    "Say": "tflaunch.launchers.clouds.base",
    "ALIVE_STATES": "tflaunch.launchers.clouds.records",
    "GONE_STATES": "tflaunch.launchers.clouds.records",
    "POLL_SECONDS": "tflaunch.launchers.clouds.base",
    "TAG_RUN": "tflaunch.launchers.clouds.records",
    "TAG_CLUSTER": "tflaunch.launchers.clouds.records",
    "TAG_HOST": "tflaunch.launchers.clouds.records",
    "TAG_ROLE": "tflaunch.launchers.clouds.records",
    "TAG_KEEP": "tflaunch.launchers.clouds.records",
    "TAG_AUTOSTOP": "tflaunch.launchers.clouds.records",
    "network_name": "tflaunch.launchers.clouds.records",
    "pending_hosts": "tflaunch.launchers.clouds.records",
    "Price": "tflaunch.launchers.clouds.costs",
}

__all__ = sorted(_SOURCES)


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(
            f"module 'tflaunch.plugin' has no attribute {name!r}: plugins use only the names "
            "it lists (docs/plugins.md)"
        )
    module, _, attribute = source.partition(":")
    value = getattr(importlib.import_module(module), attribute or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from tflaunch.cluster.backends import BackendFeature, BackendSpec, Fail
    from tflaunch.cluster.bounds import MAX_GPUS, MAX_HOSTS, MAX_ITEMS, MAX_PORT, MAX_SECONDS
    from tflaunch.cluster.config import ClusterConfig, env_name_problem, load_config, parse_config
    from tflaunch.cluster.hostlist import compress as compress_hostlist
    from tflaunch.cluster.hostlist import expand as expand_hostlist
    from tflaunch.cluster.placement import gpu_ids, hosts_from_config, make_plan, unset_gpus
    from tflaunch.cluster.plan import Host, Plan
    from tflaunch.cluster.render import render_task
    from tflaunch.cluster.schema import field
    from tflaunch.errors import ConfigError, LaunchError, MissingExtra, PlanError, TflaunchError
    from tflaunch.launchers.base import Backend, LaunchOptions, spawn_agent
    from tflaunch.launchers.batch.backend import BatchBackend, placeholder_hosts
    from tflaunch.launchers.batch.job import JobNode, read_job
    from tflaunch.launchers.batch.job import coordinate as coordinate_job
    from tflaunch.launchers.batch.job import main as job_main
    from tflaunch.launchers.batch.state import BatchDetails, JobState
    from tflaunch.launchers.clouds.base import (
        POLL_SECONDS,
        AdminOption,
        Feature,
        Provider,
        ProviderSpec,
        ProvisionSection,
        Say,
        Unsupported,
    )
    from tflaunch.launchers.clouds.costs import Price
    from tflaunch.launchers.clouds.records import (
        ALIVE_STATES,
        GONE_STATES,
        TAG_AUTOSTOP,
        TAG_CLUSTER,
        TAG_HOST,
        TAG_KEEP,
        TAG_ROLE,
        TAG_RUN,
        Instance,
        LockHolder,
        PlannedInstance,
        network_name,
        pending_hosts,
    )
    from tflaunch.runtime.agent import preflight_here
    from tflaunch.runtime.link import ProcessLink, StreamLink, agent_args, agent_argv, agent_output
    from tflaunch.runtime.procs import free_ports, spawn, terminate_group
    from tflaunch.runtime.progress import PROGRESS_FILE
    from tflaunch.runtime.revival import Revive
    from tflaunch.runtime.run import INTERRUPT_CODES, Outcome, Run, RunRecord, remote_record_path
    from tflaunch.runtime.runfiles import (
        CONSOLE_FILE,
        EVENTS_FILE,
        PLAN_FILE,
        SAMPLES_PREFIX,
        RunFileError,
        is_component,
        open_run_file,
        write_run_file,
    )
    from tflaunch.runtime.signals import Requeue
    from tflaunch.threads import in_threads
    from tflaunch.trace.request import TraceRequest
    from tflaunch.trace.site import TraceSite
