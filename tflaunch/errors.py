"""Domain errors. Each carries the process exit code the CLI maps it to.

Bad input of any kind (cluster file, host files, unreachable hosts, busy ports) is exit code 2 with
a one-paragraph message that says what is wrong and what to do; the CLI prints no traceback for
these unless ``--debug`` is given.
"""

from __future__ import annotations


class TflaunchError(Exception):
    """Base of all errors that tflaunch reports to the user as a message, not a traceback."""

    exit_code = 2


class ConfigError(TflaunchError):
    """The cluster file (or another input file) is unreadable or invalid."""


class MissingExtra(ConfigError):
    """An optional dependency (an extra of the tflaunch package) is not installed here: what the
    file asks for cannot be done on this machine, though the file itself may be right."""

    def __init__(self, message: str, package: str, extra: str):
        super().__init__(message)
        self.package, self.extra = package, extra


class PlanError(TflaunchError):
    """The cluster cannot be placed on the given hosts (too few slots, GPUs, colliding ports)."""


class LaunchError(TflaunchError):
    """The cluster could not be started: pre-flight check failed, program missing, port busy."""


class RunNotFoundError(TflaunchError):
    """No run directory exists for the run id given to status/logs/down."""
