"""Backends: how agents are started on the hosts of a plan. One module per backend."""

from __future__ import annotations

import importlib

from tflaunch.errors import ConfigError

_BACKENDS = {
    "local": "tflaunch.launchers.local:LocalBackend",
    "slurm": "tflaunch.launchers.slurm.backend:SlurmBackend",
    "ssh": "tflaunch.launchers.ssh.backend:SshBackend",
}


def get_backend(name: str):
    """An instance of the named backend (imported on demand, so each stays optional)."""
    try:
        module_name, class_name = _BACKENDS[name].split(":")
    except KeyError:
        raise ConfigError(
            f"unknown backend '{name}'; choose one of {', '.join(_BACKENDS)}."
        ) from None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name == module_name:
            raise ConfigError(
                f"the '{name}' backend is not available in this installation."
            ) from None
        raise
    return getattr(module, class_name)()
