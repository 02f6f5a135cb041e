"""Kept clusters: instances that outlive a run, for the next ``up`` of the same cluster name.

``tflaunch up FILE --keep`` tags the instances it creates with ``tflaunch:keep = <name>`` (the
file's ``name``) and leaves them running when the run ends. A later ``up --keep`` of that name
finds them through the provider and, when they fit its plan (the same hosts, roles, instance
types and spot choice), reuses them: nothing is created and nothing waits for SSH; the sync
copies only what changed and ``setup_once`` skips setup. A plan that does not fit is refused,
naming each difference, unless ``--recreate`` asks to terminate the kept instances and make new
ones. ``tflaunch down --cluster NAME`` terminates a kept cluster; its instances' idle watchdog
(``ssh.provision.idle_timeout``) ends it too.

The launcher side of a kept cluster lives in ``<runs_dir>/.clusters/``: ``NAME.json`` (the
account, network rules and idle timeout), ``NAME.known_hosts`` (its host keys, recorded on first
contact and then required) and ``NAME.lock``, held by the ``up`` that uses the cluster, so that
a second ``up`` of the same name is refused while the first runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from tflaunch.errors import LaunchError
from tflaunch.launchers.clouds import provider_class
from tflaunch.launchers.clouds.base import (
    GONE_STATES,
    TAG_KEEP,
    TAG_ROLE,
    Instance,
    PlannedInstance,
    Provider,
    Say,
)

CLUSTERS_DIR = ".clusters"


def clusters_dir(runs_root: Path) -> Path:
    return Path(runs_root) / CLUSTERS_DIR


def known_hosts_of(runs_root: Path, name: str) -> Path:
    return clusters_dir(runs_root) / f"{name}.known_hosts"


def record_path(runs_root: Path, name: str) -> Path:
    return clusters_dir(runs_root) / f"{name}.json"


def write_record(runs_root: Path, name: str, **fields: Any) -> None:
    path = record_path(runs_root, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"name": name, **fields}, indent=2, sort_keys=True) + "\n")


def read_record(runs_root: Path, name: str) -> dict[str, Any]:
    path = record_path(runs_root, name)
    if not path.exists():
        raise LaunchError(
            f"no kept cluster '{name}' is known under {runs_root} ({path} is missing); "
            "'tflaunch status --cloud' lists the clusters the account runs."
        )
    return json.loads(path.read_text())


def records(runs_root: Path) -> list[dict[str, Any]]:
    """Every kept cluster recorded under ``runs_root``."""
    folder = clusters_dir(runs_root)
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


@contextlib.contextmanager
def in_use(runs_root: Path, name: str, holder: str) -> Iterator[None]:
    """Hold the cluster for one ``up`` (or ``down --cluster``); refuse when another holds it."""
    folder = clusters_dir(runs_root)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LaunchError(
                f"kept cluster '{name}' is in use by {_holder(lock)}; wait until that ends, "
                "or give this cluster file another name."
            ) from None
        try:
            lock.truncate(0)
            lock.write(f"{holder} (pid {os.getpid()}, since {time.strftime('%H:%M:%S')})\n")
            lock.flush()
            yield
        finally:
            lock.truncate(0)
            fcntl.flock(lock, fcntl.LOCK_UN)


def _holder(lock: IO[str]) -> str:
    lock.seek(0)
    return lock.read().strip() or "another tflaunch command"


def find(provider: Provider, name: str) -> list[Instance]:
    """The kept cluster's instances that are not ending."""
    return [i for i in provider.describe(tags={TAG_KEEP: name}) if i.state not in GONE_STATES]


def differences(planned: Sequence[PlannedInstance], kept: Sequence[Instance]) -> list[str]:
    """How the kept instances differ from what the plan needs (empty: they fit)."""
    by_host = {i.host: i for i in kept}
    problems = []
    for p in planned:
        instance = by_host.pop(p.name, None)
        if instance is None:
            problems.append(
                f"the plan needs {p.name} ({p.role}, {p.instance_type}), which it lacks"
            )
            continue
        if instance.instance_type != p.instance_type:
            problems.append(
                f"{p.name} is {instance.instance_type}, the plan needs {p.instance_type}"
            )
        if instance.tags.get(TAG_ROLE) != p.role:
            problems.append(
                f"{p.name} is a {instance.tags.get(TAG_ROLE)} host, the plan needs {p.role}"
            )
        if instance.spot != p.spot:
            want = "spot" if p.spot else "on-demand"
            problems.append(
                f"{p.name} is {'spot' if instance.spot else 'on-demand'}, the plan needs {want}"
            )
    problems.extend(
        f"it has {host} ({i.tags.get(TAG_ROLE)}, {i.instance_type}), which the plan does not use"
        for host, i in sorted(by_host.items())
    )
    return problems


def down_cluster(runs_root: Path, name: str, say: Say) -> str:
    """``tflaunch down --cluster NAME``: terminate the kept cluster and its network rules."""
    record = read_record(runs_root, name)
    with in_use(runs_root, name, "tflaunch down --cluster"):
        provider = provider_of_record(record, say)
        alive = find(provider, name)
        provider.terminate([i.id for i in alive], record.get("network"))
        record_path(runs_root, name).unlink()
        known_hosts_of(runs_root, name).unlink(missing_ok=True)
    return f"terminated {len(alive)} instance(s) of kept cluster {name}"


def provider_of_record(record: Mapping[str, Any], say: Say) -> Provider:
    return provider_class(record["cloud"]).from_access(record["access"], say)
