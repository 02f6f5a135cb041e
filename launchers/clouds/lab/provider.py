"""The ``lab`` provider: a cloud whose instances are namespace hosts on this machine
(:mod:`.hosts`), found again from the records of a state directory (:mod:`.state`).

A run's network is a private bridge of its own (its cluster's traffic never meets another lab
run's), with every instance's ``eth1`` on it; there is no port filter (the hosts are yours, and
all on one machine), so the cluster's ports and ``ssh_from`` are recorded and not enforced.
Instances cost nothing, have no GPUs, and ignore the user data (a namespace cannot power off; a
forgotten one is ended by ``tflaunch gc``, and by a reboot). ``rate`` shapes each host's private
link, both ways, to a NIC of that speed.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import stat
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tflaunch.launchers.clouds.lab import hosts
from tflaunch.launchers.clouds.lab.section import (
    DEFAULT_STATE_DIR,
    LabProvisionSection,
    state_dir_problem,
)
from tflaunch.launchers.clouds.lab.state import (
    INSTANCE_ID,
    LabInstance,
    NetworkRecord,
    State,
    check_tags,
    network_number,
)
from tflaunch.plugin import (
    ALIVE_STATES,
    TAG_AUTOSTOP,
    TAG_CLUSTER,
    TAG_HOST,
    TAG_ROLE,
    TAG_RUN,
    ClusterConfig,
    ConfigError,
    Instance,
    LaunchError,
    PlannedInstance,
    Price,
    Provider,
    Say,
    network_name,
)

INSTANCE_TYPE = "netns"  # one namespace host: this machine's CPUs, shared
KEY_FILES = ("id_ed25519.pub", "id_ecdsa.pub", "id_rsa.pub")
MAX_KEY_BYTES = 16 * 1024


def authorized_keys(path: str | None) -> str:
    """The public key(s) the hosts accept, from ``path`` (default: the first of ~/.ssh's usual
    public keys), checked to be OpenSSH public key lines."""
    candidates = [Path(path).expanduser()] if path else [
        Path("~/.ssh").expanduser() / name for name in KEY_FILES
    ]  # fmt: skip
    for candidate in candidates:
        text = _read_capped(candidate, MAX_KEY_BYTES)
        if text is not None:
            break
    else:
        raise ConfigError(
            "ssh.provision.authorized_key: no public key found ("
            + ", ".join(map(str, candidates))
            + "); name the public half of ssh.identity_file there."
        )
    lines = [line.strip() for line in text.decode(errors="replace").splitlines() if line.strip()]
    if len(text) > MAX_KEY_BYTES or not lines or not all(_key_line(line) for line in lines):
        raise ConfigError(
            f"ssh.provision.authorized_key: {candidate} is not an OpenSSH public key file "
            "(lines like 'ssh-ed25519 AAAA... comment')."
        )
    return "\n".join(lines) + "\n"


def _read_capped(path: Path, limit: int) -> bytes | None:
    """At most ``limit`` + 1 bytes of ``path`` if it is a regular file (else None), read from
    the file as opened: a 300 MB file costs the bytes read, a FIFO put there does not block."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return file.read(limit + 1)


def _key_line(line: str) -> bool:
    parts = line.split()
    return (
        len(parts) >= 2
        and parts[0].startswith(("ssh-", "ecdsa-", "sk-"))
        and parts[1].startswith("AAAA")
        and "\0" not in line
    )


class LabProvider(Provider[LabProvisionSection]):
    """Namespace hosts on this machine, as instances of a cloud."""

    name = "lab"

    def __init__(self, section: LabProvisionSection, say: Say):
        super().__init__(section, say)
        self.state = State(section.state_dir, say)

    @classmethod
    def from_access(cls, access: Mapping[str, Any], say: Say) -> LabProvider:
        state_dir = access.get("state_dir") or DEFAULT_STATE_DIR
        problem = state_dir_problem(state_dir)
        if problem:
            raise LaunchError(f"lab: the state directory recorded for the run: {problem}.")
        return cls(LabProvisionSection(state_dir=state_dir), say)

    def access(self) -> dict[str, Any]:
        return {"state_dir": str(self.state.root)}

    def where(self) -> str:
        return f"lab on {socket.gethostname()} (state in {self.state.root})"

    def _require(self) -> None:
        problem = hosts.missing_requirements()
        if problem:
            raise LaunchError(f"lab: {problem}.")

    # ---- planning and prices ---------------------------------------------------------------

    def candidates(self, config: ClusterConfig) -> list[PlannedInstance]:
        """One host per worker task (chief, workers, evaluator; or ``workers_per_host`` of them)
        with co-located PS, then one per dedicated PS; none has a GPU."""
        roles, placement = config.roles, config.placement
        slots = roles.chief + roles.worker + roles.evaluator
        per_host = placement.workers_per_host or 1
        workers = [
            PlannedInstance(f"worker-{i + 1}", "worker", INSTANCE_TYPE, 0, False)
            for i in range(math.ceil(slots / per_host))
        ]
        dedicated = roles.ps if placement.ps == "dedicated" else 0
        ps = [
            PlannedInstance(f"ps-{i + 1}", "ps", INSTANCE_TYPE, 0, False) for i in range(dedicated)
        ]
        return workers + ps

    def prices(self, instance_types: Sequence[str]) -> dict[str, Price]:
        return {kind: Price(kind, 0.0, "this machine") for kind in instance_types}

    # ---- making and ending instances -------------------------------------------------------

    def open_network(
        self,
        run_id: str,
        cluster: str,
        ports: Sequence[int],
        ssh_port: int,
        ssh_from: str | None,
        tags: Mapping[str, str] | None = None,
    ) -> str:
        """A private bridge of the run's own; returns its network id."""
        self._require()
        record_tags = check_tags({**self._tags(run_id, cluster), **(tags or {})})
        with self.state.locked():
            network_id, index = self.state.new_network_id()
            record = NetworkRecord(
                network_id, index, network_name(run_id), record_tags, time.time()
            )
            self.state.save_network(record)
            hosts.ensure_public_bridge()
            hosts.make_network(index)
        return network_id

    def _tags(self, run_id: str, cluster: str, **extra: str) -> dict[str, str]:
        return {**self.section.tags, TAG_RUN: run_id, TAG_CLUSTER: cluster, **extra}

    def create(
        self,
        planned: Sequence[PlannedInstance],
        run_id: str,
        cluster: str,
        network: str,
        tags: Mapping[str, str],
        user_data: str,
        same_address: Mapping[str, Instance] | None = None,
    ) -> dict[str, str]:
        """One namespace host per planned host, each recorded (pending) before it is built and
        running once its sshd greets. The user data is not run (see the module's note)."""
        self._require()
        keys = authorized_keys(self.section.authorized_key)
        rate = self.section.rate
        network_index = network_number(network)
        created: dict[str, str] = {}
        for p in planned:
            record_tags = check_tags(
                self._tags(run_id, cluster, **tags, **{TAG_HOST: p.name, TAG_ROLE: p.role})
            )
            record_tags.pop(TAG_AUTOSTOP, None)  # no watchdog runs: promise no self-termination
            old = (same_address or {}).get(p.name)
            wanted = _index_of(old.id) if old is not None else None
            with self.state.locked():
                if network not in {n.id for n in self.state.networks()}:
                    raise LaunchError(f"lab: network {network} does not exist (ended meanwhile?).")
                self.state.prune(time.time())
                instance_id, index = self.state.new_instance_id(wanted)
                record = LabInstance(
                    instance_id, index, network, p.instance_type, "pending", record_tags,
                    time.time(), rate=rate,
                )  # fmt: skip
                self.state.save_instance(record)
                host = self.state.host_of(record, network_index)
                try:
                    hosts.make_host(host, keys, rate)
                except BaseException:
                    hosts.remove_host(host)
                    self.state.save_instance(_ended(record))
                    raise
                self.state.save_instance(_with(record, state="running"))
            created[p.name] = instance_id
        return created

    def describe(
        self,
        ids: Sequence[str] | None = None,
        tags: Mapping[str, str | None] | None = None,
        states: Sequence[str] = ALIVE_STATES,
    ) -> list[Instance]:
        if ids is not None and not ids:
            return []
        networks = {n.id: n for n in self.state.networks()}
        aliases = hosts.link_aliases() if self.state.exists() else {}
        found = []
        for record in self.state.instances():
            if ids is not None and record.id not in ids:
                continue
            if any(
                key not in record.tags or (value is not None and record.tags[key] != value)
                for key, value in (tags or {}).items()
            ):
                continue
            instance = self._instance(record, networks.get(record.network), aliases)
            if instance.state in states:
                found.append(instance)
        return found

    def _instance(
        self, record: LabInstance, network: NetworkRecord | None, aliases: dict[str, str]
    ) -> Instance:
        """The instance as it is now: a running record whose host is gone (ended outside
        tflaunch; its number's links are absent or another instance's) is terminated, one
        whose sshd is gone is stopped."""
        host = self.state.host_of(record, network.index if network else 1)
        state = record.state
        if state == "running" and hosts.owner(host, aliases) != record.id:
            state = "terminated"
        elif state == "running" and not hosts.sshd_running(host):
            state = "stopped"
        return Instance(
            id=record.id,
            state=state,
            instance_type=record.type,
            tags=record.tags,
            launched=record.launched,
            connect_address=host.public_address if state != "terminated" else None,
            cluster_address=host.private_address,
            networks={network.id: network.name} if network is not None else {},
        )

    def tag(self, ids: Sequence[str], tags: Mapping[str, str], remove: Sequence[str] = ()) -> None:
        if not ids:
            return
        with self.state.locked():
            for record in self.state.instances():
                if record.id in ids:
                    kept = {k: v for k, v in record.tags.items() if k not in remove}
                    self.state.save_instance(_with(record, tags=check_tags({**kept, **tags})))

    def terminate(self, ids: Sequence[str], network: str | None = None, wait: float = 300) -> None:
        """End every process of the instances' namespaces and remove them; then the network."""
        if ids:
            self._require()
            networks = {n.id: n.index for n in self.state.networks()}
            with self.state.locked():
                aliases = hosts.link_aliases()
                ending = [
                    (r, self.state.host_of(r, networks.get(r.network, 1)))
                    for r in self.state.instances()
                    if r.id in ids and r.state != "terminated"
                ]
                # A number another instance holds now is not this one's to end (its own host
                # went earlier); a half-made host (no owner yet) is removed.
                mine = [(r, h) for r, h in ending if hosts.owner(h, aliases) in (None, r.id)]
                # Every process of every namespace at once: one grace period, not one each.
                hosts.kill_all([pid for _, h in mine for pid in hosts.namespace_pids(h.namespace)])
                for record, host in ending:
                    if (record, host) in mine:
                        hosts.remove_host(host, wait=min(wait, 10.0))
                    self.state.forget_host(record.id)  # its keys and logs: the record stays
                    self.state.save_instance(_ended(record))
        if network:
            self.delete_network(network, wait)
        self._tidy()

    def delete_network(self, network: str, wait: float) -> None:
        """Remove the run's private bridge once no live instance is on it."""
        index = network_number(network)
        with self.state.locked():
            users = [
                r.id for r in self.state.instances()
                if r.network == network and r.state != "terminated"
            ]  # fmt: skip
            if users:
                self.say(f"lab: network {network} is still used by {', '.join(users)}; kept")
                return
            attached = hosts.remove_network(index)
            if attached:  # a host its records do not show: never pull the bridge from under it
                self.say(
                    f"lab: network {network} still has {', '.join(attached)} attached; kept "
                    "('tflaunch gc --cloud lab' ends what is left)"
                )
                return
            self.state.forget_network(network)
        self._tidy()

    def _tidy(self) -> None:
        """With no lab host or network left on the machine, the public bridge goes too."""
        if self.state.exists():
            with self.state.locked():
                hosts.remove_public_bridge()


def _index_of(instance_id: str) -> int:
    match = INSTANCE_ID.fullmatch(instance_id)
    if not match:
        raise LaunchError(f"lab: '{instance_id}' is not a lab instance id.")
    return int(match.group(1))


def _with(record: LabInstance, **changes: Any) -> LabInstance:
    return dataclasses.replace(record, **changes)


def _ended(record: LabInstance) -> LabInstance:
    return _with(record, state="terminated", terminated=time.time())
