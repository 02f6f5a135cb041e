"""GPUs that pre-flight found on SSH hosts whose count the cluster file leaves open.

Pre-flight runs ``nvidia-smi`` on every host anyway. A host whose GPU count the file does not give
(no ``gpus`` on an inline host, no ``ssh.gpus`` for the IP files, no ``gpus`` in a cloud's discovery
section such as ``ssh.<cloud>.gpus``, an instance type without known GPUs) gets the GPUs found there: the plan is made again with them, the hosts'
plan files are rewritten before any agent starts, and the launcher says so. Found GPUs too few for
a host's workers leave them on CPU, and the line says that instead.
"""

from __future__ import annotations

import dataclasses

from tflaunch.launchers.ssh.preflight import HostReport
from tflaunch.launchers.ssh.section import SshSection
from tflaunch.plugin import (
    ClusterConfig,
    Host,
    LaunchError,
    Plan,
    PlanError,
    gpu_ids,
    make_plan,
    unset_gpus,
)


def file_gives_gpus(config: ClusterConfig, host: Host) -> bool:
    """Whether the cluster file (or the instance type) fixes ``host``'s GPU count."""
    if config.hosts:
        return not unset_gpus(config, host)
    if config.section(SshSection).public_ips_file:
        return config.section(SshSection).gpus is not None
    for section in config.section(
        SshSection
    ).discover.values():  # a cloud's discovery: its section's gpus
        return bool(getattr(section, "gpus", 0))
    return bool(host.gpu_ids)  # provisioned: the instance type's GPUs


def adopt_found_gpus(
    config: ClusterConfig, plan: Plan, reports: list[HostReport]
) -> tuple[Plan, list[str]]:
    """The plan with pre-flight's GPU counts for hosts the file gives none (the same program,
    checkpoint directory included), and one line per host that got some; the same plan and no
    lines when there are none."""
    found: dict[str, int] = {}
    for report in reports:
        host = plan.host(report.host)
        count = int(report.facts.get("gpus") or 0)
        if count and not host.gpu_ids and not file_gives_gpus(config, host):
            found[host.name] = count
    if not found:
        return plan, []
    hosts = [
        dataclasses.replace(
            h,
            gpu_ids=gpu_ids(found[h.name]),
            gpu_source=f"pre-flight: nvidia-smi lists {found[h.name]}",
            gpus_found=True,
        )
        if h.name in found
        else h
        for h in plan.hosts
    ]
    try:
        adopted = dataclasses.replace(make_plan(config, hosts), program=plan.program)
    except PlanError as err:
        raise LaunchError(
            f"pre-flight found GPUs on hosts the cluster file gives none, and they do not fit "
            f"the workers: {err} Give those hosts' gpus in the cluster file (0: run on CPU)."
        ) from None
    unused = {h.name: h.gpu_source for h in adopted.hosts if h.gpus_found and not h.gpu_ids}
    notes = [
        f"{name}: {unused[name]}"
        if name in unused
        else f"{name}: using the {count} GPU(s) nvidia-smi lists there (pre-flight); the cluster "
        "file gives the host none (gpus: 0 keeps it on CPU)"
        for name, count in found.items()
    ]
    return adopted, notes
