"""Kept clusters: instances that outlive a run, for the next ``up`` of the same cluster name.

``tflaunch up FILE --keep`` tags the instances it creates with ``tflaunch:keep = <name>`` (the
file's ``name``) and leaves them running when the run ends. A later ``up --keep`` of that name
finds them through the provider and, when they fit its plan (the same hosts, roles, instance
types and spot choice), reuses them: nothing is created and nothing waits for SSH; the sync
copies only what changed and ``setup_once`` skips setup. A plan that does not fit is refused,
naming each difference, unless ``--recreate`` asks to terminate the kept instances and make new
ones. ``tflaunch down --cluster NAME`` terminates a kept cluster, from any machine with the
account (its instances and network rules carry :data:`TAG_KEEP`); its instances' idle watchdog
(``ssh.provision.idle_timeout``) ends them too, leaving the network rules to ``down --cluster``.

The launcher side of a kept cluster lives in ``<runs_dir>/.clusters/``: ``NAME.json`` (the
account, network rules and idle timeout: ``down --cluster NAME`` needs no more on this machine)
and ``NAME.known_hosts`` (its host keys, recorded on first contact and then required). Its lock is the cloud's (:func:`in_use`), held by the ``up``
(or ``down --cluster``) that uses the cluster, so that a second one of the same name is refused
while the first runs, from this machine or any other.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tflaunch.errors import LaunchError, TflaunchError
from tflaunch.launchers.clouds import provider_class, spec_of
from tflaunch.launchers.clouds.base import Provider, Say
from tflaunch.launchers.clouds.records import (
    GONE_STATES,
    NETWORK_PREFIX,
    TAG_KEEP,
    TAG_ROLE,
    Instance,
    LockHolder,
    PlannedInstance,
)
from tflaunch.runtime.identity import Launcher

CLUSTERS_DIR = ".clusters"
HEARTBEAT_SECONDS = 30.0  # how often the holder of a kept cluster's lock says it still runs
STALE_SECONDS = 300.0  # a lock without a heartbeat this long is broken by the next command


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


def records(runs_root: Path) -> list[dict[str, Any]]:
    """Every kept cluster recorded under ``runs_root``."""
    folder = clusters_dir(runs_root)
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


@contextlib.contextmanager
def in_use(provider: Provider, name: str, what: str, say: Say) -> Iterator[None]:
    """Hold the kept cluster for one ``up`` (or ``down --cluster``); refuse, naming the holder,
    when another command holds it, on this machine or any other. The lock lives in the cloud
    (:meth:`Provider.take_lock`); while held, a thread moves its heartbeat on every
    :data:`HEARTBEAT_SECONDS`. A lock whose holder is gone (:func:`stale`: a process of this
    machine that no longer runs, or a heartbeat older than :data:`STALE_SECONDS`) is broken,
    with a message; one whose heartbeat is younger than two periods never is."""
    now = time.time()
    me = LockHolder(what, Launcher.current().tag(), now, now)
    holder = provider.take_lock(name, me)
    if holder is not None:
        why = stale(holder, now)
        if why is None:
            raise LaunchError(
                f"kept cluster '{name}' is in use by {holder.describe(now)}; wait until that "
                "ends, or give this cluster file another name."
            )
        say(f"kept cluster '{name}': breaking the stale lock of {holder.describe(now)}: {why}")
        provider.drop_lock(name, holder)
        holder = provider.take_lock(name, me)
        if holder is not None:
            raise LaunchError(
                f"kept cluster '{name}' was taken by {holder.describe(time.time())} as its stale "
                "lock was broken; wait until that ends."
            )
    stop = threading.Event()
    beat = threading.Thread(
        target=_heartbeat, args=(provider, name, me, stop, say), daemon=True, name="kept-lock"
    )
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join(timeout=HEARTBEAT_SECONDS)
        try:
            provider.drop_lock(name, me)
        except TflaunchError as err:  # the command's own outcome stands
            say(
                f"kept cluster '{name}': could not release its lock ({err}); the next command "
                f"breaks it once its heartbeat is {STALE_SECONDS:g} s old"
            )


def stale(holder: LockHolder, now: float) -> str | None:
    """Why a lock's holder is gone, or None while it may still run. A heartbeat younger than
    two periods is never broken, whatever this machine sees: its holder runs, somewhere. Past
    that, a holder of this machine (its boot and PID namespace) whose process is gone is; one of
    another machine (or container, or an older tflaunch's tag) only once its heartbeat is older
    than :data:`STALE_SECONDS`."""
    silent = now - holder.heartbeat
    if silent < 2 * HEARTBEAT_SECONDS:
        return None
    identity = holder.identity
    alive = identity.alive() if identity is not None else None
    if alive is False:
        return f"its process (pid {holder.pid}) no longer runs on this machine"
    if alive is None and silent > STALE_SECONDS:
        return f"no heartbeat for {silent:.0f} s (more than {STALE_SECONDS:g} s)"
    return None


def _heartbeat(
    provider: Provider, name: str, me: LockHolder, stop: threading.Event, say: Say
) -> None:
    warned = False
    while not stop.wait(HEARTBEAT_SECONDS):
        try:
            taken = provider.renew_lock(name, me, time.time())
        except TflaunchError as err:  # the run goes on; a long outage makes the lock stale
            if not warned:
                say(f"kept cluster '{name}': could not renew its lock: {err}")
                warned = True
            continue
        if taken is not None:
            say(
                f"kept cluster '{name}': its lock was broken and is held by "
                f"{taken.describe(time.time())}; this run goes on"
            )
            return


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


def down_cluster(
    runs_root: Path,
    name: str,
    say: Say,
    account: tuple[str, Mapping[str, Any]] | None = None,
) -> str:
    """``tflaunch down --cluster NAME``: terminate the kept cluster, its network rules and lock.

    The cluster is found by its tags in the cloud (:data:`TAG_KEEP` on its instances and network
    rules), so any machine with the account's credentials can end it. ``account`` (cloud, access)
    says where to look, from the command line (a cluster file's ``ssh.provision``, or
    ``--cloud`` and the cloud's options: :func:`tflaunch.launchers.clouds.admin.account`);
    without it, this machine's record of the cluster (``<runs_root>/.clusters/NAME.json``) does."""
    path = record_path(runs_root, name)
    record = json.loads(path.read_text()) if path.exists() else None
    if account is None and record is None:
        raise LaunchError(
            f"no kept cluster '{name}' is recorded on this machine ({path} is missing: made "
            "from another machine, or another --runs-dir?). Name its account: 'tflaunch down "
            f"--cluster {name} -f CLUSTER_FILE' (the file's ssh.provision), or 'tflaunch down "
            f"--cluster {name} --cloud CLOUD' with the cloud's options ('tflaunch down --help' "
            "lists them)."
        )
    cloud, access = account if account is not None else (record["cloud"], record["access"])
    # This machine's record counts only for its own account: another named on the command line
    # neither gets its network rules nor, finding nothing, drops it.
    own = record is not None and _same_account((cloud, access), (record["cloud"], record["access"]))
    provider = provider_class(cloud).from_access(access, say)
    with in_use(provider, name, "tflaunch down --cluster", say):
        alive = find(provider, name)
        networks = set(provider.kept_networks(name)) | {
            network
            for i in alive
            for network, label in i.networks.items()
            if label.startswith(NETWORK_PREFIX)
        }
        if own and record.get("network"):
            networks.add(record["network"])
        if not alive and not networks and not own:
            raise LaunchError(
                f"no kept cluster '{name}' in {provider.where()}: no instance and no network "
                f"rules carry its tag ({TAG_KEEP}={name}). Check the name ('tflaunch status "
                "--cloud' lists the clusters) and the account (-f CLUSTER_FILE, --region, "
                "--profile)."
            )
        provider.terminate([i.id for i in alive])
        for network in sorted(networks):
            provider.delete_network(network, wait=300)
        if own:
            path.unlink()
            known_hosts_of(runs_root, name).unlink(missing_ok=True)
    return f"terminated {len(alive)} instance(s) of kept cluster {name}"


def _same_account(a: tuple[str, Mapping[str, Any]], b: tuple[str, Mapping[str, Any]]) -> bool:
    """Whether two (cloud, access) name one account: the same cloud and admin options."""
    keys = [option.name for option in spec_of(a[0]).admin_options]
    return a[0] == b[0] and all(a[1].get(k) == b[1].get(k) for k in keys)
