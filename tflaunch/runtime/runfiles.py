"""Files of a run directory: their names, and their creation with the directory's permissions.

The names are here, at the bottom of the runtime, so that the login side (the backends, ``status``,
``logs``) and the node side (agents, the coordinators that run on a host) take them from one place.

A run directory is private by default (0700) and each file in it gets the directory's mode
without the search bits (0600), whatever the umask; ``run_dir_mode`` in the cluster file chooses
another mode. Writers on other hosts (agents) need not be told: they read it off the directory.

A run directory's files are untrusted when read back (a shared runs directory, a crashed writer, a
planted link): every reader opens them through :func:`open_for_reading`, which never blocks (a
FIFO), never follows a symlink where the run's own file is meant, reads only regular files and
caps their size, and says what is wrong in a :class:`RunFileError` (an ``OSError``, and a
:class:`~tflaunch.errors.TflaunchError` for the CLI: one paragraph, exit code 2).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from tflaunch.errors import TflaunchError

DEFAULT_DIR_MODE = 0o700

PLAN_FILE = "plan.json"  # the resolved plan
META_FILE = "run.json"  # the run's record: backend, state, exit code, backend details
META_LOCK_FILE = ".run.json.lock"  # flock'd around every read-modify-write of META_FILE
EVENTS_FILE = "events.jsonl"  # the coordinator's record of events
CONSOLE_FILE = "console.log"  # a detached coordinator's output
SAMPLES_PREFIX = "samples-"  # samples-<host>.jsonl: resource samples

MiB = 1 << 20
# The most bytes read from a run file that is read whole. run.json is one run's record (an EC2
# run's instances included); a plan holds one small entry per task (thousands of nodes fit);
# events.jsonl holds lifecycle events only (resource samples have their own files).
META_LIMIT = 16 * MiB
PLAN_LIMIT = 64 * MiB
EVENTS_LIMIT = 64 * MiB
TEXT_LIMIT = 16 * MiB  # a text or plot of a report
LINE_LIMIT = 1 * MiB  # a longer line of a log or a .jsonl file is read in pieces of this size


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


def open_run_file(
    path: str | os.PathLike, mode: str = "a", perms: int | None = None, **kwargs: Any
):
    """Open a file of a run directory for writing ("w", "a", "wb", "ab"), creating it with
    :func:`file_mode` of its directory (or ``perms``, which an existing file is given too: a
    run's report written elsewhere keeps the run's mode). A symlink in its place is refused
    (``OSError``, ``ELOOP``), never followed: a run directory's files are written there and
    nowhere else."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    fd = os.open(path, flags, file_mode(path.parent) if perms is None else perms)
    if perms is not None:
        with contextlib.suppress(PermissionError):  # another user's file in a shared folder
            os.fchmod(fd, perms)
    return os.fdopen(fd, mode, **kwargs)


def write_run_file(path: str | os.PathLike, text: str, perms: int | None = None) -> None:
    with open_run_file(path, "w", perms) as f:
        f.write(text)


def replace_run_file(path: str | os.PathLike, data: str | bytes, perms: int | None = None) -> None:
    """Write a whole file at once: readers see the old file or the new one, never a part, and
    whatever stood at ``path`` (a planted symlink too) is replaced, never written through."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open_run_file(tmp, "wb" if isinstance(data, bytes) else "w", perms) as f:
        f.write(data)
    os.replace(tmp, path)


class RunFileError(TflaunchError, OSError):
    """A file of a run directory that is there but cannot be read as one: a symlink, a FIFO or
    device, too big, not UTF-8 or not the JSON it should be. The message names the file and why."""


_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


def open_for_reading(
    path: str | os.PathLike, limit: int | None = None, root: str | os.PathLike | None = None
) -> IO[bytes]:
    """Open a run file to read it (binary): without blocking (a FIFO would hang a reader),
    never through a symlink, only a regular file, at most ``limit`` bytes large. With ``root``
    (a folder above ``path``), no folder between the two may be a symlink either: what a run
    directory holds is read from it, never from where a planted link points.

    A missing file raises ``FileNotFoundError`` as usual; anything else wrong, :class:`RunFileError`.
    """
    path = Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    parent_fd = _open_folder(Path(root), path) if root is not None else None
    try:
        name = path.name if parent_fd is not None else path
        fd = os.open(name, flags, dir_fd=parent_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RunFileError(
                f"{path} is a symlink; a run's files are read only from its directory"
            ) from None
        raise
    finally:
        if parent_fd is not None:
            os.close(parent_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
            raise RunFileError(f"{path} is {kind}, not a regular file")
        if limit is not None and info.st_size > limit:
            raise RunFileError(
                f"{path} is {_size(info.st_size)}, more than the {_size(limit)} read from such a file"
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _open_folder(root: Path, path: Path) -> int:
    """A descriptor of ``path``'s folder, reached from ``root`` one folder at a time without
    following a symlink."""
    try:
        parts = path.parent.relative_to(root).parts
    except ValueError:
        raise RunFileError(f"{path} is not inside {root}") from None
    return open_run_folder(root, parts, shown=path)


def open_run_folder(
    root: str | os.PathLike,
    parts: Sequence[str],
    create: bool = False,
    shown: str | os.PathLike | None = None,
) -> int:
    """A descriptor of the folder ``root/parts...``, reached from ``root`` one folder at a time
    (``O_DIRECTORY | O_NOFOLLOW`` at every component, each made first with ``create``): a
    symlink anywhere below ``root`` is never followed, :class:`RunFileError` names it (and
    ``shown``, the path the caller is after)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)  # the umask decides, as for any folder
            try:
                next_fd = os.open(
                    part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise RunFileError(
                        f"{shown or Path(root, *parts)}: {part} is not a folder of {root} "
                        "(a symlink?)"
                    ) from None
                raise
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_run_bytes(
    path: str | os.PathLike, limit: int = TEXT_LIMIT, root: str | os.PathLike | None = None
) -> bytes:
    """A whole run file (see :func:`open_for_reading`), at most ``limit`` bytes (one that grew
    past it while read is refused too)."""
    with open_for_reading(path, limit, root) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise RunFileError(f"{path} is more than the {_size(limit)} read from such a file")
    return data


def read_run_text(
    path: str | os.PathLike, limit: int = TEXT_LIMIT, root: str | os.PathLike | None = None
) -> str:
    """A whole run file as text; bytes that are not UTF-8 are shown as \ufffd."""
    return read_run_bytes(path, limit, root).decode("utf-8", errors="replace")


def read_run_json(path: str | os.PathLike, limit: int) -> Any:
    """A run file that holds one JSON document, parsed."""
    data = read_run_bytes(path, limit)
    try:
        return json.loads(data)
    except ValueError as e:  # UnicodeDecodeError is one
        raise RunFileError(f"{path} is not JSON ({e})") from None


def run_file_lines(
    path: str | os.PathLike, limit: int | None = None, line_limit: int = LINE_LIMIT
) -> Iterator[bytes]:
    """The lines of a run file (without their newline); a line longer than ``line_limit`` comes
    in pieces of that size, so a file without newlines never fills memory. Nothing when the
    file is missing."""
    try:
        f = open_for_reading(path, limit)
    except FileNotFoundError:
        return
    with f:
        for line in iter(lambda: f.readline(line_limit), b""):
            yield line.rstrip(b"\n")


def json_lines(path: str | os.PathLike, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """The JSON objects of a ``.jsonl`` run file, one a line (:func:`json_objects`)."""
    return json_objects(run_file_lines(path, limit))


def json_objects(lines: Iterable[str | bytes]) -> Iterator[dict[str, Any]]:
    """The JSON objects among ``lines``, one a line; a line that is not one (cut short by a
    crash, a piece of an over-long line) is skipped."""
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record


def tail_lines(path: str | os.PathLike, count: int, most: int = LINE_LIMIT) -> list[str]:
    """The last ``count`` lines of a run file (a task's log), read from its end: at most
    ``most`` bytes, whatever the file's size."""
    with open_for_reading(path) as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - most))
        data = f.read(most)
    lines = data.decode("utf-8", errors="replace").splitlines()
    if size > most and lines:
        lines = lines[1:]  # the first is cut at the window's start
    return lines[-count:] if count > 0 else []


def _size(count: int) -> str:
    return f"{count / MiB:.1f} MiB" if count >= MiB else f"{count} bytes"
