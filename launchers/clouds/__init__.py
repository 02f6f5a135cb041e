"""Cloud providers: where provisioned machines come from, one folder per provider.

A provider fills in :class:`tflaunch.launchers.clouds.base.Provider`. The cluster file names
it (``ssh.provision.cloud``, default ``ec2``); a run records it in run.json under its name, so
that ``down`` and ``gc`` find the account again. Providers of other packages join through the
``tflaunch.clouds`` entry-point group (``name = "package.module:ProviderClass"``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from tflaunch.errors import ConfigError

if TYPE_CHECKING:
    from tflaunch.cluster.config import ClusterConfig
    from tflaunch.launchers.clouds.base import Provider, Say

_PROVIDERS = {"ec2": "tflaunch.launchers.clouds.ec2.provider:Ec2Provider"}


def providers() -> dict[str, str]:
    """Every known provider: name -> ``module:class`` (this package's, then entry points)."""
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


def provider_of_run(meta: Mapping[str, Any], say: Say) -> Provider | None:
    """The provider a run made its instances with (from its run.json), or None."""
    for name in providers():
        if meta.get(name):
            return provider_class(name).from_access(meta[name], say)
    return None
