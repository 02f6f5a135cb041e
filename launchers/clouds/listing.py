"""What tflaunch runs in the clouds, and what it costs: ``tflaunch status --cloud`` over the
accounts it knows, and ``tflaunch status RUN``'s lines for one run's instances
(:func:`instance_lines`).

The accounts are those of the kept clusters and runs recorded under the runs directory (and one
named on the command line); the instances are whatever each provider lists with tflaunch's tags,
across runs and kept clusters, from this machine or another. Each row's idle time comes from the
instance's tags (:func:`idle_of`), not from the host, so stopped and unreachable instances have
one too.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tflaunch.errors import TflaunchError
from tflaunch.launchers.clouds import kept, provider_class, provider_of_run, run_access, spec_of
from tflaunch.launchers.clouds.base import Say
from tflaunch.launchers.clouds.records import (
    ALIVE_STATES,
    GONE_STATES,
    TAG_AUTOSTOP,
    TAG_BUSY,
    TAG_CLUSTER,
    TAG_IDLE_SINCE,
    TAG_KEEP,
    TAG_ROLE,
    TAG_RUN,
    Instance,
    InstanceRecord,
    instance_records,
)
from tflaunch.runtime.run import Run, list_runs
from tflaunch.text import aligned


def accounts(
    runs_root: Path, extra: tuple[str, Mapping[str, Any]] | None
) -> list[tuple[str, dict]]:
    """(cloud, access) of every account the runs directory knows, each once."""
    found: dict[str, tuple[str, dict]] = {}

    def add(cloud: str, access: Mapping[str, Any]) -> None:
        # one account per cloud and admin options (EC2: region, profile, endpoint)
        plain = {o.name: access.get(o.name) for o in spec_of(cloud).admin_options}
        found.setdefault(json.dumps([cloud, plain], sort_keys=True), (cloud, plain))

    if extra is not None:
        add(*extra)
    for record in kept.records(runs_root):
        add(record["cloud"], record["access"])
    for path in list_runs(runs_root):
        found_in_run = run_access(Run(path.name, path).record())
        if found_in_run is not None:
            add(*found_in_run)
    return list(found.values())


def _age(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclasses.dataclass(frozen=True)
class CloudRow:
    """One live tflaunch instance as ``status --cloud`` shows it (``--json``: these fields)."""

    cluster: str
    kept: bool
    host: str
    role: str
    spot: bool
    instance_type: str
    state: str
    age_seconds: float
    busy_run: str | None  # the run using it now
    idle_seconds: float | None  # since the last run on it ended; None: busy, or not recorded
    autostop_seconds: float | None
    usd_per_hour: float | None
    usd_so_far: float | None
    instance: str
    run: str  # the run that made it
    cloud: str
    region: str | None


@dataclasses.dataclass(frozen=True)
class CloudListing:
    rows: list[CloudRow]
    not_listed: list[str]  # accounts that could not be asked, and why

    @property
    def usd_per_hour(self) -> float:
        return sum(r.usd_per_hour or 0.0 for r in self.rows)


def idle_of(instance: Instance, runs_root: Path, now: float) -> tuple[str | None, float | None]:
    """(run using the instance, seconds idle), from the tags the launcher writes at a run's start
    and end (:data:`TAG_BUSY`, :data:`TAG_IDLE_SINCE`). They are the cloud's, so the answer holds
    for a stopped or unreachable instance and on any machine. A busy run that this runs
    directory knows has ended (a detached run: no launcher was there to retag) counts as idle
    since its end."""
    busy = instance.tags.get(TAG_BUSY)
    if busy:
        record = Run(busy, Path(runs_root) / busy).record()
        if record.has_ended and record.ended is not None:
            return None, max(0.0, now - record.ended)
        return busy, None
    since = instance.tags.get(TAG_IDLE_SINCE)
    try:
        return None, max(0.0, now - float(since)) if since else None
    except ValueError:
        return None, None


def cloud_listing(
    runs_root: Path, extra: tuple[str, Mapping[str, Any]] | None, say: Say
) -> CloudListing:
    """Every live tflaunch instance of the accounts the runs directory knows (and ``extra``)."""
    now = time.time()
    rows: list[CloudRow] = []
    seen: set[str] = set()
    unreachable = []
    for cloud, access in accounts(runs_root, extra):
        try:
            provider = provider_class(cloud).from_access(access, say)
            listed = provider.describe(tags={TAG_RUN: None})
        except TflaunchError as err:  # one account out of reach does not hide the others
            unreachable.append(f"{cloud} {access.get('region') or ''}: {err}")
            continue
        live: list[Instance] = [i for i in listed if i.id not in seen]
        prices = provider.prices(sorted({i.instance_type for i in live}))
        for i in sorted(live, key=lambda i: (i.tags.get(TAG_CLUSTER, ""), i.host)):
            seen.add(i.id)
            hourly = prices[i.instance_type].hourly_usd
            busy, idle = idle_of(i, runs_root, now)
            autostop = i.tags.get(TAG_AUTOSTOP)
            rows.append(CloudRow(
                cluster=i.tags.get(TAG_KEEP) or i.tags.get(TAG_CLUSTER, "?"),
                kept=bool(i.tags.get(TAG_KEEP)), host=i.host or "?",
                role=i.tags.get(TAG_ROLE, "?"), spot=i.spot, instance_type=i.instance_type,
                state=i.state, age_seconds=round(now - i.launched, 1), busy_run=busy,
                idle_seconds=None if idle is None else round(idle, 1),
                autostop_seconds=float(autostop) if autostop else None,
                usd_per_hour=hourly,
                usd_so_far=None if hourly is None else round(hourly * (now - i.launched) / 3600, 6),
                instance=i.id, run=i.tags.get(TAG_RUN, "?"), cloud=cloud,
                region=access.get("region"),
            ))  # fmt: skip
    return CloudListing(rows, unreachable)


def _idle_text(row: CloudRow) -> str:
    if row.busy_run is not None:
        return "busy"
    return "?" if row.idle_seconds is None else _age(row.idle_seconds)


def cloud_table(
    runs_root: Path, extra: tuple[str, Mapping[str, Any]] | None, say: Say
) -> list[str]:
    """One row per live tflaunch instance: cluster, host, role, type, state, age, idle time,
    autostop, cost per hour and so far; then the total per hour."""
    listing = cloud_listing(runs_root, extra, say)
    notes = [f"not listed: {u}" for u in listing.not_listed]
    if not listing.rows:
        return [
            "no tflaunch instances are running on the accounts this runs directory knows",
            *notes,
        ]
    rows = [("CLUSTER", "HOST", "ROLE", "TYPE", "STATE", "AGE", "IDLE", "AUTOSTOP", "USD/HOUR",
             "USD SO FAR", "INSTANCE", "RUN")]  # fmt: skip
    for r in listing.rows:
        rows.append((
            r.cluster + (" (kept)" if r.kept else ""), r.host, r.role + (" spot" if r.spot else ""),
            r.instance_type, r.state, _age(r.age_seconds), _idle_text(r),
            "-" if r.autostop_seconds is None else f"idle {r.autostop_seconds:g} s",
            "?" if r.usd_per_hour is None else f"{r.usd_per_hour:.4f}",
            "?" if r.usd_so_far is None else f"{r.usd_so_far:.4f}",
            r.instance, r.busy_run or r.run,
        ))  # fmt: skip
    out = aligned(rows)
    out.append(f"{len(listing.rows)} instance(s), USD {listing.usd_per_hour:.4f} per hour")
    return out + notes


def cloud_json(
    runs_root: Path, extra: tuple[str, Mapping[str, Any]] | None, say: Say
) -> dict[str, Any]:
    """``status --cloud --json``: the same listing as :func:`cloud_table`, one object per
    instance (the fields of :class:`CloudRow`)."""
    listing = cloud_listing(runs_root, extra, say)
    return {
        "instances": [dataclasses.asdict(r) for r in listing.rows],
        "usd_per_hour": round(listing.usd_per_hour, 6),
        "not_listed": listing.not_listed,
    }


def instance_lines(run: Run, say: Say, unwatched: bool = False) -> list[str]:
    """For ``status RUN``: the run's instances, their state now (from the provider) and price.
    ``unwatched`` (a detached run without a watcher: its coordinator has no cloud credentials,
    and nothing replaces an instance that ends) adds a warning for each instance that ended by
    itself."""
    records = instance_records(run)
    provider = provider_of_run(run.record(), say) if records else None
    if provider is None:
        return []
    try:
        listed = provider.describe(
            ids=[r.id for r in records], states=(*ALIVE_STATES, *GONE_STATES)
        )
        states = {i.id: i.state for i in listed}
        unlisted = "gone"
    except TflaunchError as err:  # no credentials or no network now: what run.json knows
        say(f"cannot ask {provider.name} for the instances' states: {err}")
        states, unlisted = {}, "?"
    rows = [("HOST", "INSTANCE", "TYPE", "ROLE", "STATE", "USD/HOUR")]
    for r in records:
        rows.append((
            r.name, r.id, r.instance_type, r.role + (" spot" if r.spot else ""),
            states.get(r.id, unlisted) + (f" (kept cluster {r.kept})" if r.kept else ""),
            "?" if r.hourly_usd is None else f"{r.hourly_usd:.4f}",
        ))  # fmt: skip
    lines = ["instances:", *("  " + line for line in aligned(rows))]
    if unwatched:
        lines += _unwatched_losses(run, provider.name, records, states)
    return lines


def _unwatched_losses(
    run: Run, cloud: str, records: Sequence[InstanceRecord], states: dict[str, str]
) -> list[str]:
    """A warning for each instance of a detached run that ended without tflaunch ending it."""
    lost = [
        r
        for r in records
        if r.terminated is None and r.id in states and states[r.id] not in ("pending", "running")
    ]
    if not lost:
        return []
    ended = ", ".join(f"{r.name} ({r.id}, {states[r.id]})" for r in lost)
    return [
        f"lost: the instance(s) of {ended} ended, says {cloud}, and nothing replaces them: a "
        "detached run's coordinator runs on a host without cloud credentials, and this run "
        "has no watcher here (one is started by 'up --detach' only with a restart policy in "
        "supervision.restart). Its coordinator notices the lost host only when its connection "
        f"times out; 'tflaunch down {run.id}' stops the run and terminates its instances."
    ]
