"""``tflaunch status --cloud``: what tflaunch runs on the accounts it knows, and what it costs.

The accounts are those of the kept clusters and runs recorded under the runs directory (and one
named on the command line); the instances are whatever each provider lists with tflaunch's tags,
across runs and kept clusters, from this machine or another.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tflaunch.errors import TflaunchError
from tflaunch.launchers.clouds import kept, provider_class, run_access
from tflaunch.launchers.clouds.base import (
    TAG_AUTOSTOP,
    TAG_CLUSTER,
    TAG_KEEP,
    TAG_ROLE,
    TAG_RUN,
    Instance,
    Say,
)
from tflaunch.runtime.run import Run, list_runs
from tflaunch.text import aligned


def accounts(
    runs_root: Path, extra: tuple[str, Mapping[str, Any]] | None
) -> list[tuple[str, dict]]:
    """(cloud, access) of every account the runs directory knows, each once."""
    found: dict[str, tuple[str, dict]] = {}

    def add(cloud: str, access: Mapping[str, Any]) -> None:
        plain = {k: access.get(k) for k in ("region", "profile", "endpoint_url")}
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


def cloud_table(
    runs_root: Path, extra: tuple[str, Mapping[str, Any]] | None, say: Say
) -> list[str]:
    """One row per live tflaunch instance: cluster, host, role, type, state, age, autostop,
    cost per hour and so far; then the total per hour."""
    now = time.time()
    rows = [("CLUSTER", "HOST", "ROLE", "TYPE", "STATE", "AGE", "AUTOSTOP", "USD/HOUR",
             "USD SO FAR", "INSTANCE", "RUN")]  # fmt: skip
    seen: set[str] = set()
    total = 0.0
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
            total += hourly or 0.0
            cluster = i.tags.get(TAG_KEEP) or i.tags.get(TAG_CLUSTER, "?")
            rows.append((
                cluster + (" (kept)" if i.tags.get(TAG_KEEP) else ""),
                i.host or "?",
                i.tags.get(TAG_ROLE, "?") + (" spot" if i.spot else ""),
                i.instance_type,
                i.state,
                _age(now - i.launched),
                f"idle {i.tags[TAG_AUTOSTOP]} s" if i.tags.get(TAG_AUTOSTOP) else "-",
                "?" if hourly is None else f"{hourly:.4f}",
                "?" if hourly is None else f"{hourly * (now - i.launched) / 3600:.4f}",
                i.id,
                i.tags.get(TAG_RUN, "?"),
            ))  # fmt: skip
    notes = [f"not listed: {u}" for u in unreachable]
    if len(rows) == 1:
        return [
            "no tflaunch instances are running on the accounts this runs directory knows",
            *notes,
        ]
    out = aligned(rows)
    out.append(f"{len(rows) - 1} instance(s), USD {total:.4f} per hour")
    return out + notes
