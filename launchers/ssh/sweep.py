"""``tflaunch gc``: find and terminate provisioned instances that nothing will terminate otherwise.

An instance is swept when it carries the ``tflaunch:run`` tag, is not terminated, and

* its run ended (the run directory named by its ``tflaunch:run-dir`` tag says succeeded, failed or
  stopped), or
* its launcher is gone: the ``tflaunch:launcher`` tag names a process of this machine (host, pid,
  start time) that no longer runs, and the run was not detached (a detached run lives on its hosts
  and stays until it ends).

Instances started from another machine are listed but kept: only that machine can tell whether
their launcher still runs. The run's security group goes with its last instance.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from tflaunch.launchers.ssh.provision import (
    ALIVE_STATES,
    TAG_LAUNCHER,
    TAG_RUN,
    TAG_RUN_DIR,
    Provisioner,
    launcher_alive,
    mark_terminated,
)
from tflaunch.runtime.run import ENDED, Run


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One run's live instances and whether the sweep terminates them, and why."""

    run_id: str
    instance_ids: tuple[str, ...]
    sweep: bool
    reason: str


def judge(run_id: str, tags: dict[str, str]) -> tuple[bool, str]:
    """Whether a run's instances are leaked, from their tags and the run directory they name."""
    run_dir = Path(tags.get(TAG_RUN_DIR, "/nonexistent"))
    meta = Run(run_id, run_dir).read_meta() if (run_dir / "run.json").exists() else {}
    if meta.get("state") in ENDED:
        return True, f"its run {meta['state']}"
    alive = launcher_alive(tags.get(TAG_LAUNCHER, ""))
    if alive is None:
        return False, f"started from {tags.get(TAG_LAUNCHER, '?').split(':')[0]}; sweep there"
    if alive:
        return False, "its launcher is running"
    if meta.get("detached"):
        return False, "a detached run that has not ended"
    return True, "its launcher is gone"


def sweep(access, say: Callable[[str], None], dry_run: bool = False) -> list[Verdict]:
    """Judge every tflaunch-tagged live instance by run; terminate the leaked ones."""
    prov = Provisioner(access, "gc", say)
    found = prov.describe(
        [{"Name": "tag-key", "Values": [TAG_RUN]},
         {"Name": "instance-state-name", "Values": ALIVE_STATES}]
    )  # fmt: skip
    by_run: dict[str, list[dict]] = {}
    for instance in found:
        tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
        by_run.setdefault(tags[TAG_RUN], []).append({**instance, "tags": tags})
    verdicts = []
    for run_id, instances in sorted(by_run.items()):
        tags = instances[0]["tags"]
        leaked, reason = judge(run_id, tags)
        ids = tuple(i["InstanceId"] for i in instances)
        verdicts.append(Verdict(run_id, ids, leaked, reason))
        if not leaked or dry_run:
            continue
        groups = {  # the run's own group only, never one the instances merely share
            g["GroupId"]
            for i in instances
            for g in i.get("SecurityGroups", [])
            if g.get("GroupName") == f"tflaunch-{run_id}"
        }
        prov.terminate(list(ids))
        for group in sorted(groups):
            prov.delete_group(group, wait=60)
        run_dir = Path(tags.get(TAG_RUN_DIR, "/nonexistent"))
        if (run_dir / "run.json").exists():
            mark_terminated(Run(run_id, run_dir))
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
