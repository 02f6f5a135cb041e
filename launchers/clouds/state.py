"""A provisioned run's state: what the orchestration (:mod:`tflaunch.launchers.clouds.provisioning`)
made or took, and all the spot fleet (:mod:`tflaunch.launchers.clouds.fleet`) needs to replace
an instance of it, in one object both share; and :class:`Reach`, what they need of the backend
that uses the instances."""

from __future__ import annotations

import dataclasses
import functools
import socket
import time
from collections.abc import Mapping, Sequence

from tflaunch.cluster.config import ClusterConfig
from tflaunch.cluster.plan import Host
from tflaunch.errors import LaunchError
from tflaunch.launchers.clouds.base import POLL_SECONDS, Provider, ProvisionSection, Say
from tflaunch.launchers.clouds.costs import Price
from tflaunch.launchers.clouds.records import (
    TAG_AUTOSTOP,
    TAG_BUSY,
    TAG_KEEP,
    TAG_LAUNCHER,
    TAG_RUN_DIR,
    InstanceRecord,
    PlannedInstance,
    add_instances,
)
from tflaunch.launchers.clouds.watchdog import user_data
from tflaunch.runtime.identity import Launcher
from tflaunch.runtime.run import Run


@dataclasses.dataclass(frozen=True)
class Reach:
    """What the provisioning needs of the backend that uses the instances (SSH), handed in so
    that no cloud module knows a backend: the SSH port to wait on, whether a jump host stands
    between (then sshd is not reachable from here and the connect address may be private), and
    the run's directory on the hosts (for the plan's default checkpoint directory)."""

    ssh_port: int
    via_jump: bool
    run_dir: str

    def wait_for_ssh(self, hosts: Sequence[Host], timeout: float, say: Say) -> None:
        """Wait until every host's sshd sends its banner, saying how many do as that changes;
        nothing to wait for behind a jump host (sshd is not reachable from here)."""
        if self.via_jump:
            return
        deadline, started, ready, shown = time.monotonic() + timeout, time.monotonic(), set(), -1
        while True:
            for host in hosts:
                if host.name not in ready and _ssh_banner(host.connect_address, self.ssh_port):
                    ready.add(host.name)
            if len(ready) != shown:
                waited = time.monotonic() - started
                say(f"instances accepting SSH: {len(ready)}/{len(hosts)} ({waited:.0f} s)")
                shown = len(ready)
            if len(ready) == len(hosts):
                return
            if time.monotonic() > deadline:
                missing = ", ".join(h.name for h in hosts if h.name not in ready)
                raise LaunchError(
                    f"{missing} did not accept SSH on port {self.ssh_port} within {timeout:g} s "
                    "(ssh.provision.ready_timeout); check the image runs sshd and ssh_from "
                    "covers you."
                )
            time.sleep(POLL_SECONDS)


def _ssh_banner(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=3) as sock:
            sock.settimeout(3)
            return sock.recv(4).startswith(b"SSH-")
    except OSError:
        return False


@dataclasses.dataclass
class Made:
    """What a provisioned run made or took so far, for the cleanup: host -> instance id, the
    network rules, whether a kept cluster's instances were reused, whether the run was handed
    its hosts, and the replacements (host, old id, new id)."""

    ids: dict[str, str] = dataclasses.field(default_factory=dict)
    network: str | None = None
    reused: bool = False
    started: bool = False
    replaced: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class ProvisionState:
    """One provisioned run: its settings (``ssh.provision``), cluster file, run, reach and
    provider (built once and handed in), the instances it needs and their prices, the kept
    cluster they belong to (if any), and what was made so far (:attr:`made`)."""

    section: ProvisionSection
    config: ClusterConfig
    run: Run
    reach: Reach
    provider: Provider
    planned: tuple[PlannedInstance, ...]
    prices: Mapping[str, Price]
    keep: str | None
    made: Made = dataclasses.field(default_factory=Made)

    @property
    def say(self) -> Say:
        return self.provider.say

    @functools.cached_property
    def tags(self) -> dict[str, str]:
        """What every instance of the run carries beside the provider's own tags: its
        launcher, run directory, idle limit, that the run uses it, and its kept cluster."""
        tags = {
            TAG_LAUNCHER: Launcher.current().tag(),
            TAG_RUN_DIR: str(self.run.dir),
            TAG_AUTOSTOP: f"{self.section.idle_timeout:g}",
            TAG_BUSY: self.run.id,
        }
        return {**tags, TAG_KEEP: self.keep} if self.keep else tags

    @functools.cached_property
    def user_data(self) -> str:
        """The instances' boot script: the runtime and idle watchdog."""
        return user_data(self.config.supervision.max_runtime, self.section.idle_timeout)

    def record(self, planned: Sequence[PlannedInstance], ids: Mapping[str, str]) -> None:
        """Add the instances of ``planned`` that ``ids`` names to run.json."""
        now = time.time()
        add_instances(
            self.run,
            (
                InstanceRecord(
                    ids[p.name],
                    p.name,
                    p.instance_type,
                    p.role,
                    p.spot,
                    self.prices[p.instance_type].hourly_usd,
                    now,
                    None,
                    self.keep,
                )  # fmt: skip
                for p in planned
                if p.name in ids
            ),
        )
