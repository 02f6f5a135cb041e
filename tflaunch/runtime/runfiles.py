"""Files of a run directory: their names, and their creation with the directory's permissions.

The names are here, at the bottom of the runtime, so that the login side (the backends, ``status``,
``logs``) and the node side (agents, the coordinators that run on a host) take them from one place.

A run directory is private by default (0700) and each file in it gets the directory's mode
without the search bits (0600), whatever the umask; ``run_dir_mode`` in the cluster file chooses
another mode. Writers on other hosts (agents) need not be told: they read it off the directory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

DEFAULT_DIR_MODE = 0o700

PLAN_FILE = "plan.json"  # the resolved plan
META_FILE = "run.json"  # the run's record: backend, state, exit code, backend details
META_LOCK_FILE = ".run.json.lock"  # flock'd around every read-modify-write of META_FILE
EVENTS_FILE = "events.jsonl"  # the coordinator's record of events
CONSOLE_FILE = "console.log"  # a detached coordinator's output
SAMPLES_PREFIX = "samples-"  # samples-<host>.jsonl: resource samples


def make_run_dir(path: Path, mode: int = DEFAULT_DIR_MODE) -> None:
    """Create a run directory with ``mode`` (whatever the umask), its parents as usual."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=mode)
    except FileExistsError:
        return  # a run directory made earlier (a resubmitted job, an agent beside the launcher)
    os.chmod(path, mode)


def file_mode(directory: str | os.PathLike) -> int:
    """The mode of new files in a run directory: the directory's, without the search bits."""
    try:
        return stat.S_IMODE(os.stat(directory).st_mode) & 0o666
    except OSError:
        return 0o600


def is_component(name: str) -> bool:
    """Whether ``name`` (from a remote listing, an agent's message, a run file) is one path
    component: not empty, not ``.`` or ``..``, no ``/`` and no NUL. Only such names are joined
    to a run directory's paths."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def open_run_file(path: str | os.PathLike, mode: str = "a", **kwargs: Any):
    """Open a file of a run directory for writing ("w", "a", "wb", "ab"), creating it with
    :func:`file_mode` of its directory. A symlink in its place is refused (``OSError``,
    ``ELOOP``), never followed: a run directory's files are written there and nowhere else."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    fd = os.open(path, flags, file_mode(path.parent))
    return os.fdopen(fd, mode, **kwargs)


def write_run_file(path: str | os.PathLike, text: str) -> None:
    with open_run_file(path, "w") as f:
        f.write(text)
