"""The SSH backend's side of a provisioned run (``ssh.provision``): what it hands the cloud
provisioning (:mod:`tflaunch.launchers.clouds.provisioning`) and how it reaches the instances.

The provisioning makes the instances and returns their plan; the backend then launches on them
once, as on any hosts, with one difference: their host keys are new, and a cloud may hand a
terminated instance's public address to the next one, so the keys go into a known_hosts file of
the run's own (of the kept cluster's, for ``up --keep``), recorded on first contact (accept-new);
a key that changes is refused. The cluster file itself is never rewritten.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tflaunch.launchers.clouds import kept, provider_for
from tflaunch.launchers.clouds.base import Provider, Say
from tflaunch.launchers.clouds.records import PlannedInstance
from tflaunch.launchers.clouds.state import Reach
from tflaunch.launchers.ssh.connect import SshOptions
from tflaunch.launchers.ssh.section import SshSection, host_run_dir
from tflaunch.plugin import ClusterConfig, Plan, Run


def provider(config: ClusterConfig, say: Say) -> Provider:
    """The cloud of the file's ``ssh.provision``, with its settings: built once per ``up`` (the
    backend keeps it from planning to provisioning) and handed in."""
    return provider_for(config.section(SshSection).provision, say)


def reach(config: ClusterConfig, run_id: str) -> Reach:
    """What the provisioning needs of SSH: the port, a jump host or not, the run's directory on
    the hosts."""
    ssh = config.section(SshSection)
    return Reach(ssh.port, ssh.jump_host is not None, host_run_dir(config, run_id))


def instance_options(config: ClusterConfig, run: Run, keep: str | None = None) -> SshOptions:
    """How to reach the run's instances: the file's SSH settings with the run's (or the kept
    cluster's) own known_hosts, unknown keys recorded on first contact."""
    known = kept.known_hosts_of(run.dir.parent, keep) if keep else run.dir / "known_hosts"
    options = SshOptions.from_section(config.section(SshSection), config.base_dir)
    return dataclasses.replace(options, known_hosts=str(known), host_key_policy="accept-new")


def coordinator_host(
    planned: Sequence[PlannedInstance], plan: Plan, watched: bool
) -> tuple[str, str]:
    """Where a detached provisioned run's coordinator runs, and why, in words: an on-demand
    instance when the run has one (spot workers make only the worker hosts spot, so a dedicated
    PS's instance is on-demand), as every spot instance can then be replaced while the run goes
    on; else the first host. ``watched``: the laptop's watcher replaces ended instances (a
    restart policy), so that losing the coordinator's own restarts the run. ``planned``: the
    instances the provisioning made."""
    spot_hosts = {p.name for p in planned if p.spot}
    hosts = [h.name for h in plan.hosts_with_tasks()]
    spot = [name for name in hosts if name in spot_hosts]
    steady = [name for name in hosts if name not in spot]
    if not spot:
        return hosts[0], "the first host"
    if steady:
        return steady[0], (
            f"an on-demand instance, so that each spot one ({', '.join(spot)}) can be replaced "
            "while the run goes on"
        )
    if watched:
        then = (
            "if its instance ends, the watcher replaces it and starts the run again there from "
            "its checkpoints (a cluster restart)"
        )
    else:
        then = "if its instance ends, the run fails (without a restart policy nothing replaces it)"
    return hosts[0], f"the first host: every instance is spot; {then}"
