"""Cloud providers: where provisioned machines come from, one folder per provider.

A provider fills in :class:`tflaunch.launchers.clouds.base.Provider`. The cluster file names
it (``ssh.provision.cloud``, default ``ec2``); a run records it in run.json under its name, so
that ``down`` and ``gc`` find the account again. Providers of other packages join through the
``tflaunch.clouds`` entry-point group (``name = "package.module:ProviderClass"``).
"""

from __future__ import annotations

import functools
import importlib
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from tflaunch.errors import ConfigError

if TYPE_CHECKING:
    from tflaunch.cluster.config import ClusterConfig
    from tflaunch.launchers.clouds.base import Provider, Say
    from tflaunch.runtime.run import RunRecord

_PROVIDERS = {"ec2": "tflaunch.launchers.clouds.ec2.provider:Ec2Provider"}
DEFAULT_CLOUD = "ec2"  # the account named by flags alone (--region, --profile) is one of its


def providers() -> dict[str, str]:
    """Every known provider: name -> ``module:class`` (this package's, then entry points),
    scanned once a process."""
    return dict(_scanned())


@functools.cache
def _scanned() -> tuple[tuple[str, str], ...]:
    return tuple(scan_providers().items())


def scan_providers() -> dict[str, str]:
    """The scan itself (~11 ms: it reads every installed package's metadata; ``status --cloud``
    asks :func:`providers` once per run directory)."""
    found = dict(_PROVIDERS)
    for point in entry_points(group="tflaunch.clouds"):
        found.setdefault(point.name, point.value)
    return found


def provider_class(name: str, where: str = "ssh.provision.cloud") -> type[Provider]:
    """The provider class called ``name``, imported on demand (each stays optional)."""
    known = providers()
    if name not in known:
        raise ConfigError(f"{where}: unknown cloud '{name}'; choose one of {', '.join(known)}.")
    module_name, class_name = known[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def provider_for(config: ClusterConfig, say: Say) -> Provider:
    """The provider the cluster file's ``ssh.provision`` names, with its settings."""
    section = config.ssh.provision
    if section is None:
        raise ConfigError(f"{config.source}: the cluster file has no ssh.provision section.")
    return provider_class(section.cloud)(section, say)


def run_access(record: RunRecord) -> tuple[str, dict[str, Any]] | None:
    """(cloud, access) of the account a run made its instances in (from its run.json), or
    None."""
    from tflaunch.launchers.clouds.base import access_part

    for name in providers():
        access = getattr(record.part(access_part(name)), name)
        if access:
            return name, access
    return None


def provider_of_run(record: RunRecord, say: Say) -> Provider | None:
    """The provider a run made its instances with (from its run.json), or None."""
    found = run_access(record)
    return None if found is None else provider_class(found[0]).from_access(found[1], say)
