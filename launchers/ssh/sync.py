"""Code sync (``ssh.sync``): the local source tree copied to every host's workdir, incrementally.

* What is copied: every regular file under the source directory, minus what its ``.gitignore``
  files ignore (top-level and nested, with git's rules via pathspec), minus ``.git/`` and the
  local run directory. Symbolic links are copied as the files they point to.
* Incremental, as rsync's quick check: a file is copied when the host has no file of the same
  size and modification time (one ``find`` per host lists them); copied files get the local
  modification time, so the next run skips them. Touching a file copies it again.
* Removed files: a file that an earlier sync copied and that is gone locally (or now ignored) is
  deleted on the hosts. Files that sync never copied (outputs, checkpoints, data put there by
  hand) are never touched. The list of copied files is kept in ``.tflaunch-sync.json`` in the
  host's workdir.
* All hosts in parallel, one SFTP session each; the summary says files, bytes and seconds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pathspec

from tflaunch.launchers.ssh.connect import Connection, parallel, remote_command
from tflaunch.plugin import LaunchError

MANIFEST = ".tflaunch-sync.json"


@dataclasses.dataclass(frozen=True)
class LocalFile:
    path: Path
    size: int
    mtime: int  # whole seconds: what every file system on the way keeps


@dataclasses.dataclass(frozen=True)
class HostSync:
    """What one host's sync did."""

    copied: int
    bytes: int
    unchanged: int
    removed: int


def local_tree(root: Path, exclude: tuple[Path, ...] = ()) -> dict[str, LocalFile]:
    """Relative POSIX path -> file, for every file under ``root`` that git would not ignore."""
    root = root.resolve()
    excluded = {p.resolve() for p in exclude}
    specs: list[tuple[str, pathspec.PathSpec]] = []  # (directory relative to root, its rules)
    files: dict[str, LocalFile] = {}
    for directory, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(directory)
        rel_dir = here.relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir
        specs = [(d, s) for d, s in specs if rel_dir == d or rel_dir.startswith(d + "/") or d == ""]
        ignore_file = here / ".gitignore"
        if ignore_file.is_file():
            specs.append(
                (rel_dir, pathspec.GitIgnoreSpec.from_lines(ignore_file.read_text().splitlines()))
            )
        keep_dirs = []
        for name in sorted(dirnames):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if name == ".git" or (here / name).resolve() in excluded or _ignored(specs, rel + "/"):
                continue
            keep_dirs.append(name)
        dirnames[:] = keep_dirs
        for name in sorted(filenames):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if _ignored(specs, rel):
                continue
            try:
                info = (here / name).stat()
            except OSError:
                continue  # a dangling link
            if stat.S_ISREG(info.st_mode):
                files[rel] = LocalFile(here / name, info.st_size, int(info.st_mtime))
    return files


def _ignored(specs: list[tuple[str, pathspec.PathSpec]], rel: str) -> bool:
    """git's rule: the deepest .gitignore with a matching pattern decides (negations included)."""
    for directory, spec in reversed(specs):
        inner = rel[len(directory) + 1 :] if directory else rel
        result = spec.check_file(inner)
        if result.include is not None:
            return bool(result.include)
    return False


def _remote_listing(conn: Connection, workdir: str) -> dict[str, tuple[int, int]]:
    """Relative path -> (size, mtime) of every file under the host's workdir."""
    command = remote_command(["find", ".", "-type", "f", "-printf", r"%P\0%s\0%T@\0"], cwd=workdir)
    result = conn.run(command, timeout=120)
    if result.exit_status != 0:
        raise LaunchError(f"cannot list {workdir}: {result.stderr.strip()}")
    fields = result.stdout.split("\0")
    return {
        fields[i]: (int(fields[i + 1]), int(float(fields[i + 2])))
        for i in range(0, len(fields) - 2, 3)
    }


def sync_host(conn: Connection, files: Mapping[str, LocalFile], workdir: str) -> HostSync:
    """Bring one host's workdir up to date with ``files``."""
    with conn.sftp() as sftp:
        makedirs(sftp, "/" if workdir.startswith("/") else "", workdir.strip("/"))
    remote = _remote_listing(conn, workdir)
    changed = [rel for rel, f in files.items() if remote.get(rel) != (f.size, f.mtime)]
    with conn.sftp() as sftp:
        previous = _read_manifest(sftp, workdir)
        made = set()
        for rel in changed:
            target = posixpath.join(workdir, rel)
            parent = posixpath.dirname(rel)
            if parent and parent not in made:
                makedirs(sftp, workdir, parent)
                made.add(parent)
            local = files[rel]
            sftp.put(str(local.path), target)
            sftp.chmod(target, local.path.stat().st_mode & 0o777)
            sftp.utime(target, (local.mtime, local.mtime))
        removed = 0
        for rel in sorted(set(previous) - set(files)):
            if rel in remote:
                sftp.remove(posixpath.join(workdir, rel))
                removed += 1
        with sftp.open(posixpath.join(workdir, MANIFEST), "w") as out:
            out.write(json.dumps(sorted(files)))
    return HostSync(
        len(changed), sum(files[r].size for r in changed), len(files) - len(changed), removed
    )


def _read_manifest(sftp, workdir: str) -> list[str]:
    try:
        with sftp.open(posixpath.join(workdir, MANIFEST), "r") as f:
            return list(json.loads(f.read().decode()))
    except (OSError, ValueError):
        return []


def makedirs(sftp, base: str, rel: str) -> None:
    """``mkdir -p base/rel`` over SFTP. A directory that appears between the look and the
    mkdir (another host's sync making it on a file system they share, as NFS homes are) is
    as good as one made here: SFTP reports that mkdir only as a generic failure."""
    current = base
    for part in filter(None, rel.split("/")):
        current = posixpath.join(current, part)
        try:
            sftp.stat(current)
        except OSError:
            try:
                sftp.mkdir(current)
            except OSError:
                if not _is_dir(sftp, current):
                    raise


def _is_dir(sftp, path: str) -> bool:
    try:
        return stat.S_ISDIR(sftp.stat(path).st_mode or 0)
    except OSError:
        return False


def sync_all(
    connections: Mapping[str, Connection],
    source: Path,
    workdirs: Mapping[str, str],
    say: Callable[[str], None],
    exclude: tuple[Path, ...] = (),
) -> dict[str, HostSync]:
    """Sync ``source`` to every host's workdir in parallel; say one summary line."""
    if not source.is_dir():
        raise LaunchError(
            f"ssh.sync: {source} is not a directory here; name the local source tree."
        )
    started = time.monotonic()
    files = local_tree(source, exclude)
    results = parallel(lambda c: sync_host(c, files, workdirs[c.name]), connections.values())
    failures = [f"{c.name}: {err}" for c, _, err in results if err is not None]
    if failures:
        raise LaunchError("code sync failed; nothing was started.\n  " + "\n  ".join(failures))
    done = {c.name: r for c, r, _ in results}
    say(summary(done, len(files), time.monotonic() - started))
    return done


def summary(done: Mapping[str, HostSync], total: int, seconds: float) -> str:
    """``sync: copied 1 file (12 B) to each of 3 hosts, 41 unchanged, 0 removed, in 0.4 s``."""
    kinds = set(done.values())
    if len(kinds) == 1:
        (one,) = kinds
        return (
            f"sync: copied {one.copied} file(s) ({one.bytes} B) to each of {len(done)} host(s), "
            f"{one.unchanged} unchanged, {one.removed} removed, {total} in the tree, "
            f"in {seconds:.2f} s"
        )
    parts = [
        f"{name} {r.copied} file(s) ({r.bytes} B), {r.removed} removed"
        for name, r in sorted(done.items())
    ]
    return f"sync: copied {'; '.join(parts)}; {total} in the tree, in {seconds:.2f} s"
