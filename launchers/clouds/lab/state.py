"""What the ``lab`` cloud knows of its instances and networks: one small JSON file each in a
state directory (default ``/run/tflaunch-lab``, on tmpfs, so it goes with the namespaces at a
reboot), read back by every later command (``status --cloud``, ``down``, ``gc``) to find them
again from their tags.

Layout::

    STATE/lock                    flock: numbers are taken and records change under it
    STATE/instances/<id>.json     {id, index, network, type, state, tags, launched, terminated, rate}
    STATE/networks/<id>.json      {id, index, name, tags, created}
    STATE/hosts/<id>/             the host's key, sshd configuration, pid file, log

The files are untrusted input (anyone who can write there could aim ``down`` elsewhere): the
directory must be owned by this user and writable by no one else, files are opened without
following links and bounded in size, every field is checked for type and range, a record's id
must match its file's name, and what tflaunch then acts on (namespace, links, addresses) derives
from the checked numbers, never from free text. A record that fails a check is skipped with a
warning, never acted on; except that a record whose file is named by an instance id (its
number, hence its namespace) but whose content fails a check is read for what it can still say
(its tags, network and state where those pass) and kept in the list with a warning, so that
``down`` and ``gc`` end the host it names instead of leaving a live namespace nobody can see.
Values are written in one normal form (a rate as bits per second, ``1000000000bit``) and read
back in exactly that form; records of earlier versions (a rate as the user spelt it) are
normalised on reading.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from tflaunch.launchers.clouds.lab.addresses import MAX_HOSTS, MAX_NETWORKS, NamespaceHost
from tflaunch.launchers.clouds.lab.hosts import (
    canonical_rate,
    link_aliases,
    numbers_in_use,
    owner,
)
from tflaunch.plugin import LaunchError, Say

RATE = re.compile(r"[1-9][0-9]{0,15}bit")  # the one form a rate is written in: bits per second

MACHINE_LOCK = Path("/run/tflaunch-lab.lock")
MAX_FILE_BYTES = 64 * 1024
MAX_TAGS, MAX_TAG_KEY, MAX_TAG_VALUE = 50, 128, 256  # as EC2 bounds them
TOMBSTONE_SECONDS = 3600.0  # a terminated instance stays listed this long, as on EC2
INSTANCE_ID = re.compile(r"lab-([1-9][0-9]{0,2})-[0-9a-f]{8}")
NETWORK_ID = re.compile(r"labnet-([1-9][0-9]?)-[0-9a-f]{8}")
STATES = ("pending", "running", "stopped", "terminated")
RecordT = TypeVar("RecordT")  # a record of the state folder (LabInstance, NetworkRecord)


@dataclasses.dataclass(frozen=True)
class LabInstance:
    """One lab instance as lab's state directory keeps it (its namespace host, network and
    rate); run.json's record of it is :class:`~tflaunch.launchers.clouds.records.InstanceRecord`."""

    id: str
    index: int
    network: str  # the network record's id
    type: str
    state: str  # what tflaunch last did: pending (being made), running, terminated
    tags: Mapping[str, str]
    launched: float
    terminated: float | None = None
    rate: str | None = None  # bits per second (RATE), the section's canonical form
    damaged: bool = dataclasses.field(default=False, compare=False)  # salvaged, see the module


@dataclasses.dataclass(frozen=True)
class NetworkRecord:
    id: str
    index: int
    name: str
    tags: Mapping[str, str]
    created: float


def network_number(network_id: str) -> int:
    match = NETWORK_ID.fullmatch(network_id)
    if not match:
        raise LaunchError(f"lab: '{network_id}' is not a lab network id (labnet-N-xxxxxxxx).")
    return int(match.group(1))


def unsafe_parent(path: Path) -> str | None:
    """Why a folder above ``path`` would let another user swap it after it is checked, or
    None: each must be root's (or this user's) and writable by no one else, unless it is
    sticky (``/tmp``: there only an entry's owner may rename or remove it). The folders are
    checked as named and where links among them lead."""
    euid = os.geteuid()
    named = reversed(path.parents)
    real = reversed(Path(os.path.realpath(path)).parents)
    for folder in [*named, *real]:
        try:
            info = os.lstat(folder)
        except FileNotFoundError:
            continue  # made below, by this user
        if info.st_uid not in (0, euid):
            return f"{folder} belongs to another user (uid {info.st_uid})"
        writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if not stat.S_ISLNK(info.st_mode) and writable and not info.st_mode & stat.S_ISVTX:
            return f"{folder} may be written by others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


class State:
    """The state directory: records in, records out, numbers taken under its lock."""

    def __init__(self, root: str | Path, say: Say):
        self.root, self.say = Path(root), say

    # ---- the directory and its lock ------------------------------------------------------

    def _check_dir(self, path: Path, create: bool) -> bool:
        """Whether ``path`` is a directory this user owns that no one else may write; made
        (0700) when ``create``. Anything else is refused, and so is a state directory under a
        folder through which another user could swap it (:func:`unsafe_parent`)."""
        problem = unsafe_parent(path) if path == self.root else None
        if problem:
            raise LaunchError(
                f"lab: the state directory {path} could be swapped after it is checked: "
                f"{problem}. Set the lab section's state_dir under folders of root's."
            )
        if create:
            with contextlib.suppress(FileExistsError):
                path.mkdir(mode=0o700, parents=path == self.root)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise LaunchError(
                f"lab: {path} is not a directory of this user; remove it or set the lab "
                "section's state_dir elsewhere."
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise LaunchError(
                f"lab: {path} may be written by others (mode {stat.S_IMODE(info.st_mode):o}); "
                f"'chmod go-w {path}' or remove it."
            )
        return True

    def exists(self) -> bool:
        return self._check_dir(self.root, create=False)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the lab's lock: numbers are taken and records change under it. Numbers are the
        machine's (namespace and link names), so as root the lock is the machine's too
        (:data:`MACHINE_LOCK`), whichever state directory is used; else the directory's."""
        self._check_dir(self.root, create=True)
        for sub in ("instances", "networks", "hosts"):
            self._check_dir(self.root / sub, create=True)
        path = MACHINE_LOCK if os.geteuid() == 0 else self.root / "lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def host_folder(self, instance_id: str) -> Path:
        if not INSTANCE_ID.fullmatch(instance_id):
            raise LaunchError(f"lab: '{instance_id}' is not a lab instance id.")
        return self.root / "hosts" / instance_id

    def host_of(self, record: LabInstance, network_index: int) -> NamespaceHost:
        return NamespaceHost(record.index, network_index, self.host_folder(record.id), record.id)

    # ---- reading -------------------------------------------------------------------------

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as err:
            self.say(f"lab: skipping {path}: {err}")
            return None
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                self.say(f"lab: skipping {path}: not a regular file")
                return None
            raw = file.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            self.say(f"lab: skipping {path}: larger than {MAX_FILE_BYTES} bytes")
            return None
        try:
            data = json.loads(raw)
        except ValueError as err:
            self.say(f"lab: skipping {path}: not JSON ({err})")
            return None
        if not isinstance(data, dict):
            self.say(f"lab: skipping {path}: not a JSON object")
            return None
        return data

    def instances(self) -> list[LabInstance]:
        """Every instance record that passes the checks, by number; one that fails them stays
        listed with what can be read of it, so that its host can still be ended."""
        found = self._records("instances", _instance_record, _salvaged_record)
        return sorted(found, key=lambda r: r.index)

    def networks(self) -> list[NetworkRecord]:
        """Every network record that passes the checks, by id."""
        return self._records("networks", _network_record)

    def _records(
        self,
        kind: str,
        parse: Callable[[Mapping[str, Any], str], RecordT],
        salvage: Callable[[Mapping[str, Any], str], RecordT | None] | None = None,
    ) -> list[RecordT]:
        """The records of folder ``kind``, by file name: each file's JSON object read as
        ``parse(data, id)`` (the id is the file's name); one that fails its checks is skipped
        with a line, unless ``salvage`` keeps an instance of it."""
        folder = self.root / kind
        if not self.exists() or not self._check_dir(folder, create=False):
            return []
        found = []
        for path in sorted(folder.glob("*.json")):
            data = self._read(path)
            if data is None:
                continue
            file_id = path.name[: -len(".json")]
            try:
                found.append(parse(data, file_id))
            except ValueError as err:
                salvaged = salvage(data, file_id) if salvage else None
                if salvaged is None:
                    self.say(f"lab: skipping {path}: {err}")
                    continue
                self.say(
                    f"lab: {path}: {err}; its host {file_id} is still listed (state "
                    f"{salvaged.state}) so that 'tflaunch down' and 'tflaunch gc' can end it"
                )
                found.append(salvaged)
        return found

    # ---- writing (under the lock) --------------------------------------------------------

    def _write(self, path: Path, data: dict[str, Any]) -> None:
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as file:
            json.dump(data, file)
        os.replace(temporary, path)

    def save_instance(self, record: LabInstance) -> None:
        data = dataclasses.asdict(record)
        del data["damaged"]
        self._write(self.root / "instances" / f"{record.id}.json", data)

    def save_network(self, record: NetworkRecord) -> None:
        self._write(self.root / "networks" / f"{record.id}.json", dataclasses.asdict(record))

    def forget_network(self, network_id: str) -> None:
        network_number(network_id)  # a checked id: one path component
        (self.root / "networks" / f"{network_id}.json").unlink(missing_ok=True)

    def forget_host(self, instance_id: str) -> None:
        """Remove an ended host's folder (its host key, sshd configuration and log)."""
        _remove_folder(self.host_folder(instance_id))

    def prune(self, now: float) -> None:
        """Under the lock: mark terminated the running instances whose host is gone (ended
        outside tflaunch, or its number taken by another), so that nothing acts on them; forget
        terminated ones older than :data:`TOMBSTONE_SECONDS` and their folders."""
        aliases = link_aliases()
        for record in self.instances():
            mine = owner(self.host_of(record, 1), aliases) == record.id
            if record.state == "running" and not mine:
                record = dataclasses.replace(record, state="terminated", terminated=now)
                self.save_instance(record)
                self.forget_host(record.id)
            if record.state == "terminated" and now - (record.terminated or 0) > TOMBSTONE_SECONDS:
                (self.root / "instances" / f"{record.id}.json").unlink(missing_ok=True)
                _remove_folder(self.host_folder(record.id))

    def new_instance_id(self, wanted: int | None = None) -> tuple[str, int]:
        """A fresh instance id and the free host number it uses (``wanted`` if given and
        free)."""
        taken = {r.index for r in self.instances() if r.state != "terminated"}
        taken |= numbers_in_use()[0]
        if wanted is not None and wanted in taken:
            raise LaunchError(f"lab: host number {wanted} is in use; it cannot be taken again.")
        free = [wanted] if wanted is not None else [
            i for i in range(1, MAX_HOSTS + 1) if i not in taken
        ]  # fmt: skip
        if not free:
            raise LaunchError(
                f"lab: all {MAX_HOSTS} host numbers are in use; 'tflaunch gc' ends leaked ones."
            )
        return f"lab-{free[0]}-{secrets.token_hex(4)}", free[0]

    def new_network_id(self) -> tuple[str, int]:
        taken = {r.index for r in self.networks()} | numbers_in_use()[1]
        free = [i for i in range(1, MAX_NETWORKS + 1) if i not in taken]
        if not free:
            raise LaunchError(
                f"lab: all {MAX_NETWORKS} networks are in use; 'tflaunch gc' ends leaked runs."
            )
        return f"labnet-{free[0]}-{secrets.token_hex(4)}", free[0]


def _remove_folder(folder: Path) -> None:
    """Remove a host's folder: plain files only, one level, no link followed."""
    if not folder.is_dir() or folder.is_symlink():
        return
    for entry in folder.iterdir():
        if entry.is_file() or entry.is_symlink():
            entry.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        folder.rmdir()


# ---- checks --------------------------------------------------------------------------------


def _text(data: Mapping[str, Any], key: str, limit: int = MAX_TAG_VALUE) -> str:
    value = data.get(key)
    if not isinstance(value, str) or len(value) > limit or "\0" in value:
        raise ValueError(f"'{key}' is not a string of at most {limit} characters")
    return value


def _number(data: Mapping[str, Any], key: str, optional: bool = False) -> float | None:
    value = data.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e11:
        raise ValueError(f"'{key}' is not a time in seconds since the epoch")
    return float(value)


def check_tags(tags: Any) -> dict[str, str]:
    """Tags as a provider may hold them: at most 50 strings, keys up to 128 characters and
    values up to 256, as on EC2."""
    if not isinstance(tags, dict) or len(tags) > MAX_TAGS:
        raise ValueError(f"'tags' is not a mapping of at most {MAX_TAGS} entries")
    for key, value in tags.items():
        if not isinstance(key, str) or not 0 < len(key) <= MAX_TAG_KEY:
            raise ValueError(f"tag key {str(key)[:40]!r} is not 1 to {MAX_TAG_KEY} characters")
        if not isinstance(value, str) or len(value) > MAX_TAG_VALUE:
            raise ValueError(f"tag {key!r} is not a string of at most {MAX_TAG_VALUE} characters")
    return dict(tags)


def _instance_record(data: Mapping[str, Any], file_id: str) -> LabInstance:
    instance_id = _text(data, "id", 32)
    match = INSTANCE_ID.fullmatch(instance_id)
    if not match or instance_id != file_id:
        raise ValueError(f"id {instance_id!r} is not a lab instance id or not the file's name")
    index = data.get("index")
    if index != int(match.group(1)) or not 1 <= index <= MAX_HOSTS:
        raise ValueError(f"index {index!r} does not match the id")
    network = _text(data, "network", 32)
    if not NETWORK_ID.fullmatch(network):
        raise ValueError(f"network {network!r} is not a lab network id")
    state = _text(data, "state", 16)
    if state not in STATES:
        raise ValueError(f"state {state!r} is not one of {', '.join(STATES)}")
    return LabInstance(
        id=instance_id,
        index=index,
        network=network,
        type=_text(data, "type", 64),
        state=state,
        tags=check_tags(data.get("tags")),
        launched=_number(data, "launched") or 0.0,
        terminated=_number(data, "terminated", optional=True),
        rate=_rate(data),
    )


def _rate(data: Mapping[str, Any]) -> str | None:
    """The record's rate in its normal form. Earlier versions stored it as the user spelt it
    (``1Gbit``, `` 500mbit``): any spelling the section accepts is read and normalised."""
    rate = data.get("rate")
    if rate is None:
        return None
    rate = canonical_rate(rate[:40] if isinstance(rate, str) else rate)
    if not isinstance(rate, str) or not RATE.fullmatch(rate):
        raise ValueError(f"rate {str(data.get('rate'))[:40]!r} is not a link rate")
    return rate


def _salvaged_record(data: Mapping[str, Any], file_id: str) -> LabInstance | None:
    """What can be read of a record that fails a check, when its file's name is an instance id
    (so its number, namespace and links are known): each field that passes its own check, a
    neutral value for the others. Its state is kept when readable, else ``running``: the host
    is taken to be there until its links say otherwise (the provider checks its owner)."""
    match = INSTANCE_ID.fullmatch(file_id)
    if not match:
        return None

    def lenient(read: Callable[[], Any], default: Any) -> Any:
        try:
            return read()
        except (ValueError, TypeError, AttributeError):
            return default

    network = data.get("network")
    state = data.get("state")
    return LabInstance(
        id=file_id,
        index=int(match.group(1)),
        network=network if isinstance(network, str) and NETWORK_ID.fullmatch(network) else "",
        type=lenient(lambda: _text(data, "type", 64), "unknown"),
        state=state if state in STATES else "running",
        tags=lenient(lambda: check_tags(data.get("tags")), {}),
        launched=lenient(lambda: _number(data, "launched"), 0.0) or 0.0,
        terminated=lenient(lambda: _number(data, "terminated", optional=True), None),
        rate=lenient(lambda: _rate(data), None),
        damaged=True,
    )


def _network_record(data: Mapping[str, Any], file_id: str) -> NetworkRecord:
    network_id = _text(data, "id", 32)
    if network_id != file_id:
        raise ValueError(f"id {network_id!r} is not the file's name")
    match = NETWORK_ID.fullmatch(network_id)
    index = data.get("index")
    if not match or index != int(match.group(1)):
        raise ValueError(f"id {network_id!r} is not a lab network id, or index {index!r} not its")
    return NetworkRecord(
        id=network_id,
        index=index,
        name=_text(data, "name", 128),
        tags=check_tags(data.get("tags")),
        created=_number(data, "created") or 0.0,
    )
