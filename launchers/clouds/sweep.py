"""``tflaunch gc``: find and terminate provisioned instances that nothing will terminate otherwise.

An instance is swept when it carries the ``tflaunch:run`` tag, is not terminated, and

* its run ended (the run directory named by its ``tflaunch:run-dir`` tag says succeeded, failed or
  stopped), or
* its launcher is gone: the ``tflaunch:launcher`` tag names a process of this machine (its boot
  and PID namespace, pid and start time: :class:`~tflaunch.runtime.identity.Launcher`) that no
  longer runs, and the run was not detached (a detached run lives on its hosts and stays until
  it ends).

Instances of a kept cluster (``tflaunch:keep``) stay while their cluster is kept: 'down
--cluster' or their idle watchdog ends them. Instances started from another machine are listed
but kept: only that machine can tell whether their launcher still runs (another host, or a
container or PID namespace with this hostname). The run's network rules
(security group) go with its last instance.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tflaunch.launchers.clouds.base import Provider, Say
from tflaunch.launchers.clouds.records import (
    TAG_KEEP,
    TAG_LAUNCHER,
    TAG_RUN,
    TAG_RUN_DIR,
    CloudDetails,
    Instance,
    mark_terminated,
    network_name,
)
from tflaunch.runtime.identity import Launcher
from tflaunch.runtime.run import Run


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One run's live instances and whether the sweep terminates them, and why."""

    run_id: str
    instance_ids: tuple[str, ...]
    sweep: bool
    reason: str


def judge(run_id: str, tags: dict[str, str]) -> tuple[bool, str]:
    """Whether a run's instances are leaked, from their tags and the run directory they name."""
    if tags.get(TAG_KEEP):
        return False, f"kept cluster {tags[TAG_KEEP]}; 'tflaunch down --cluster' ends it"
    run_dir = Path(tags.get(TAG_RUN_DIR, "/nonexistent"))
    record = Run(run_id, run_dir).record()  # an empty one when the directory is gone
    if record.has_ended:
        return True, f"its run {record.state}"
    launcher = Launcher.from_tag(tags.get(TAG_LAUNCHER, ""))
    alive = launcher.alive() if launcher is not None else None
    if alive is None:
        where = launcher.describe() if launcher is not None else "an unknown machine"
        return False, f"started from {where}; only that machine can tell, sweep there"
    if alive:
        return False, "its launcher is running"
    if record.part(CloudDetails).detached:
        return False, "a detached run that has not ended"
    return True, "its launcher is gone"


def sweep(provider: Provider, say: Say, dry_run: bool = False) -> list[Verdict]:
    """Judge every tflaunch-tagged live instance by run; terminate the leaked ones."""
    by_run: dict[str, list[Instance]] = {}
    for instance in provider.describe(tags={TAG_RUN: None}):
        by_run.setdefault(instance.tags[TAG_RUN], []).append(instance)
    verdicts = []
    for run_id, instances in sorted(by_run.items()):
        tags = dict(instances[0].tags)
        leaked, reason = judge(run_id, tags)
        ids = tuple(i.id for i in instances)
        verdicts.append(Verdict(run_id, ids, leaked, reason))
        if not leaked or dry_run:
            continue
        networks = {  # the run's own rules only, never ones the instances merely share
            network
            for i in instances
            for network, name in i.networks.items()
            if name == network_name(run_id)
        }
        provider.terminate(list(ids))
        for network in sorted(networks):
            provider.delete_network(network, wait=60)
        run = Run(run_id, Path(tags.get(TAG_RUN_DIR, "/nonexistent")))
        if run.recorded:
            mark_terminated(run, set(ids))
    return verdicts


def format_verdicts(verdicts: list[Verdict], dry_run: bool) -> list[str]:
    if not verdicts:
        return ["no tflaunch instances are running"]
    done = "would terminate" if dry_run else "terminated"
    return [
        f"{v.run_id}: {len(v.instance_ids)} instance(s) {done if v.sweep else 'kept'} "
        f"({v.reason}): {', '.join(v.instance_ids)}"
        for v in verdicts
    ]
