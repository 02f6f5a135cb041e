"""What an SSH run records in run.json beside the core's fields: a part of
:class:`tflaunch.runtime.run.RunRecord`, read with ``run.record().part(SshDetails)`` and written
with ``run.update_part(SshDetails, ...)``. Its own module, importing nothing of the project, so that the node
side (``on_host``) writes it without loading the login side's SSH client."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class SshDetails:
    """What an SSH run adds to run.json (:class:`tflaunch.runtime.run.RunRecord`'s details)."""

    ssh_hosts: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)  # HostPaths
    ssh_options: dict[str, Any] | None = None  # SshOptions: how to reach the hosts again
    ssh_python: str = "python3"
    ssh_timings: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    ssh_open_seconds: float | None = None
    detached: bool = False
    ssh_coordinator: str | None = None  # a detached run's coordinator: its host and pid
    ssh_coordinator_pid: int | None = None
    ssh_watcher_pid: int | None = None  # the laptop's watch over its instances (provisioned)
