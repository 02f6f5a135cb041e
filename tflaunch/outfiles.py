"""Files tflaunch writes outside a run directory (``tune``'s tuned cluster file, ``report
--out``), written as run files are: never through a symlink, whole or not at all.

The file goes to a temporary name in the same folder (opened through one descriptor of that
folder, so the two names are in the folder that was checked) and is renamed over the old one:
readers see the old file or the new, never a part. What stands at the name already is replaced
only if tflaunch wrote it (the writer says how it knows its own: a mark at the file's start);
a file of the user's, or a symlink (planted or not: its target is never written), only with
``force``, which replaces the entry itself. Anything that is not a regular file or a symlink
(a folder, a FIFO) is refused.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from tflaunch.errors import ConfigError

HEAD_BYTES = 4096  # how much of an existing file its writer's mark is looked for in


def write_outside(
    path: str | os.PathLike,
    data: str | bytes,
    ours: Callable[[bytes], bool],
    force: bool = False,
    force_flag: str = "--force",
    mode: int = 0o666,
) -> Path:
    """Write ``data`` to ``path`` as the module says; ``ours`` tells from a file's first bytes
    whether tflaunch wrote it. ConfigError (exit 2) naming the file when it may not be
    replaced; ``force_flag``: the option that says replace it anyway. A new file gets ``mode``
    (less the umask). Returns ``path``."""
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _check_existing(path, folder, ours, force, force_flag)
        tmp = f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, mode, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise
    finally:
        os.close(folder)
    return path


def check_outside(
    path: str | os.PathLike,
    ours: Callable[[bytes], bool],
    force: bool = False,
    force_flag: str = "--force",
) -> None:
    """What :func:`write_outside` would refuse, said before the work that makes the file (a
    command that measures for minutes first): ConfigError, or nothing."""
    path = Path(path)
    try:
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise ConfigError(f"cannot write {path}: {err.strerror} ({path.parent})") from None
    try:
        _check_existing(path, folder, ours, force, force_flag)
    finally:
        os.close(folder)


def _check_existing(
    path: Path, folder: int, ours: Callable[[bytes], bool], force: bool, force_flag: str
) -> None:
    try:
        info = os.stat(path.name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        if force:
            return  # the link itself is replaced; its target is not touched
        target = os.readlink(path.name, dir_fd=folder)
        raise ConfigError(
            f"{path} is a symlink (to {target}); tflaunch does not write through one. Remove "
            f"it, write elsewhere, or give {force_flag} to replace the link (not its target)."
        )
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{path} exists and is not a regular file; write elsewhere.")
    if force or ours(_head(path.name, folder)):
        return
    raise ConfigError(
        f"{path} exists and was not written by tflaunch; give {force_flag} to replace it, "
        "or write elsewhere."
    )


def _head(name: str, folder: int) -> bytes:
    """The first bytes of the regular file ``name`` (b'' where it cannot be read)."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder
        )
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        return f.read(HEAD_BYTES) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
