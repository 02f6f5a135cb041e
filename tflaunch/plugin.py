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
    "Fail": "tflaunch.cluster.backends",
    "field": "tflaunch.cluster.schema",
    "MAX_GPUS": "tflaunch.cluster.config",
    "MAX_HOSTS": "tflaunch.cluster.config",
    "MAX_ITEMS": "tflaunch.cluster.config",
    # The cluster file and the plan
    "ClusterConfig": "tflaunch.cluster.config",
    "parse_config": "tflaunch.cluster.config",
    "Host": "tflaunch.cluster.plan",
    "Plan": "tflaunch.cluster.plan",
    "make_plan": "tflaunch.cluster.plan",
    "hosts_from_config": "tflaunch.cluster.plan",
    "unset_gpus": "tflaunch.cluster.plan",
    "expand_hostlist": "tflaunch.cluster.hostlist:expand",  # "nid0[01-03]" -> names
    "compress_hostlist": "tflaunch.cluster.hostlist:compress",  # names -> "nid0[01-03]"
    # Errors (each carries its exit code; bad input is 2, with a one-paragraph message)
    "TflaunchError": "tflaunch.errors",
    "ConfigError": "tflaunch.errors",
    "PlanError": "tflaunch.errors",
    "LaunchError": "tflaunch.errors",
    # The backend interface
    "Backend": "tflaunch.launchers.base",
    "LaunchOptions": "tflaunch.launchers.base",
    "spawn_agent": "tflaunch.launchers.base",
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
    "Requeue": "tflaunch.runtime.signals",
    "Revive": "tflaunch.runtime.revival",
    "ProcessLink": "tflaunch.runtime.link",
    "agent_argv": "tflaunch.runtime.link",
    "spawn": "tflaunch.runtime.procs",  # a process group of its own, optionally tied to us
    "terminate_group": "tflaunch.runtime.procs",  # SIGTERM, bounded wait, SIGKILL
    # Cloud providers: the interface as it is on main (launchers/clouds/base.py).
    # >>> The lead extends this group after merging h-cloud (ProviderSpec, declared features,
    # the provider's section); until then these are the names a provider needs today. <<<
    "Provider": "tflaunch.launchers.clouds.base",
    "Instance": "tflaunch.launchers.clouds.base",
    "PlannedInstance": "tflaunch.launchers.clouds.base",
    "LockHolder": "tflaunch.launchers.clouds.base",
    "Say": "tflaunch.launchers.clouds.base",
    "ALIVE_STATES": "tflaunch.launchers.clouds.base",
    "GONE_STATES": "tflaunch.launchers.clouds.base",
    "TAG_RUN": "tflaunch.launchers.clouds.base",
    "TAG_CLUSTER": "tflaunch.launchers.clouds.base",
    "network_name": "tflaunch.launchers.clouds.base",
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
    from tflaunch.cluster.backends import BackendSpec, Fail
    from tflaunch.cluster.config import (
        MAX_GPUS,
        MAX_HOSTS,
        MAX_ITEMS,
        ClusterConfig,
        parse_config,
    )
    from tflaunch.cluster.hostlist import compress as compress_hostlist
    from tflaunch.cluster.hostlist import expand as expand_hostlist
    from tflaunch.cluster.plan import Host, Plan, hosts_from_config, make_plan, unset_gpus
    from tflaunch.cluster.schema import field
    from tflaunch.errors import ConfigError, LaunchError, PlanError, TflaunchError
    from tflaunch.launchers.base import Backend, LaunchOptions, spawn_agent
    from tflaunch.launchers.batch.backend import BatchBackend, placeholder_hosts
    from tflaunch.launchers.batch.job import JobNode, read_job
    from tflaunch.launchers.batch.job import coordinate as coordinate_job
    from tflaunch.launchers.batch.job import main as job_main
    from tflaunch.launchers.batch.state import BatchDetails, JobState
    from tflaunch.launchers.clouds.base import (
        ALIVE_STATES,
        GONE_STATES,
        TAG_CLUSTER,
        TAG_RUN,
        Instance,
        LockHolder,
        PlannedInstance,
        Provider,
        Say,
        network_name,
    )
    from tflaunch.launchers.clouds.costs import Price
    from tflaunch.runtime.link import ProcessLink, agent_argv
    from tflaunch.runtime.procs import spawn, terminate_group
    from tflaunch.runtime.revival import Revive
    from tflaunch.runtime.run import INTERRUPT_CODES, Outcome, Run, RunRecord
    from tflaunch.runtime.runfiles import write_run_file
    from tflaunch.runtime.signals import Requeue
