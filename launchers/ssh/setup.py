"""Setup lines (``ssh.setup``): shell lines run once on every host, in its workdir, before the
pre-flight check (install a wheel, create an environment).

The lines run in order in one ``sh`` on each host, all hosts in parallel; their output (stdout and
stderr together) streams with a ``[setup@host]`` prefix. The first failing line stops that host's
setup; when any host failed, one report names every failing host, the line (number and text) and
its exit code, and the launch stops with exit code 2 before any task started.

With ``ssh.setup_once`` a host where the same lines (and the same ``ssh.setup_inputs`` files)
already succeeded is skipped: success writes their digest to ``.tflaunch-setup.sha256`` in the
workdir.
"""

from __future__ import annotations

import contextlib
import hashlib
import posixpath
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from tflaunch.launchers.ssh.connect import Connection, parallel, remote_command
from tflaunch.launchers.ssh.section import SshSection
from tflaunch.plugin import LaunchError

MARK = "\x1etflaunch-setup-line "
DONE_FILE = ".tflaunch-setup.sha256"


def setup_script(lines: Sequence[str], digest: str | None) -> str:
    """The sh program: each line announced by a marker, then run; a failure exits with its code."""
    out = ["exec 2>&1"]
    for number, line in enumerate(lines, start=1):
        out.append(f"printf '{MARK}%d\\n' {number}")
        out.append(line)
        out.append('__tfl_rc=$?; [ "$__tfl_rc" -eq 0 ] || exit "$__tfl_rc"')
    out.append(f"printf '{MARK}0\\n'")
    if digest:
        out.append(f"printf '%s\\n' {digest} > {DONE_FILE}")
    return "\n".join(out) + "\n"


def digest_of(lines: Sequence[str], inputs: Sequence[Path]) -> str:
    """What decides whether setup must run again: the lines and the inputs' contents."""
    digest = hashlib.sha256("\n".join(lines).encode())
    for path in inputs:
        try:
            digest.update(path.read_bytes())
        except OSError as err:
            raise LaunchError(
                f"ssh.setup_inputs: cannot read {path} ({err.strerror}); list files relative to "
                "the cluster file."
            ) from err
    return digest.hexdigest()


class HostFailure(Exception):
    def __init__(self, line: int, code: int, tail: list[str]):
        super().__init__(f"line {line}, exit code {code}")
        self.line, self.code, self.tail = line, code, tail


def _already_done(conn: Connection, workdir: str, digest: str) -> bool:
    path = posixpath.join(workdir, DONE_FILE)
    with conn.sftp() as sftp, contextlib.suppress(OSError), sftp.open(path, "r") as f:
        return f.read().decode().strip() == digest
    return False


def setup_host(
    conn: Connection,
    lines: Sequence[str],
    workdir: str,
    show: Callable[[str], None],
    digest: str | None,
) -> bool:
    """Run the lines on one host (False when skipped); raise HostFailure on a failing line."""
    if digest and _already_done(conn, workdir, digest):
        return False
    channel = conn.start(remote_command(["sh", "-c", setup_script(lines, digest)], cwd=workdir))
    current, tail = 0, deque(maxlen=10)
    with contextlib.suppress(OSError, EOFError):
        for raw in channel.makefile("rb"):
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith(MARK):
                current = int(line[len(MARK) :])
                continue
            tail.append(line)
            show(f"[setup@{conn.name}] {line}")
    code = channel.recv_exit_status()
    channel.close()
    if code != 0:
        raise HostFailure(current, code, list(tail))
    return True


def run_setup(
    connections: Mapping[str, Connection],
    lines: Sequence[str],
    workdirs: Mapping[str, str],
    say: Callable[[str], None],
    show: Callable[[str], None],
    digest: str | None = None,
) -> None:
    """Run the setup lines on every host in parallel; one LaunchError naming each failure."""
    lock = threading.Lock()

    def locked_show(text: str) -> None:
        with lock:
            show(text)

    results = parallel(
        lambda c: setup_host(c, lines, workdirs[c.name], locked_show, digest), connections.values()
    )
    failures = []
    for conn, _, err in results:
        if isinstance(err, HostFailure):
            text = lines[err.line - 1] if 0 < err.line <= len(lines) else "(the script itself)"
            failures.append(
                f"{conn.name}: line {err.line} of ssh.setup failed with exit code {err.code}: "
                f"{text}" + "".join(f"\n    | {t}" for t in err.tail[-5:])
            )
        elif err is not None:
            failures.append(f"{conn.name}: {err}")
    if failures:
        raise LaunchError(
            "setup failed; nothing was started. Fix the line (or the host) and run again.\n  "
            + "\n  ".join(failures)
        )
    ran = [c.name for c, did, _ in results if did]
    skipped = [c.name for c, did, _ in results if not did]
    say(
        f"setup: {len(lines)} line(s) ran on {len(ran)} host(s)"
        + (f"; unchanged, skipped on {', '.join(skipped)}" if skipped else "")
    )


def prepare_hosts(
    config,
    connections: Mapping[str, Connection],
    workdirs: Mapping[str, str],
    say: Callable[[str], None],
    out: IO[str],
    exclude: tuple[Path, ...] = (),
) -> None:
    """Before pre-flight: sync the code (``ssh.sync``), then run the setup lines (``ssh.setup``),
    their output written to ``out``."""
    from tflaunch.launchers.ssh.sync import sync_all

    def show(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    base = Path(config.base_dir)
    if config.section(SshSection).sync:
        sync_all(
            connections,
            base / Path(config.section(SshSection).sync).expanduser(),
            workdirs,
            say,
            exclude,
        )
    if config.section(SshSection).setup:
        digest = None
        if config.section(SshSection).setup_once:
            inputs = [base / Path(p).expanduser() for p in config.section(SshSection).setup_inputs]
            digest = digest_of(config.section(SshSection).setup, inputs)
        run_setup(connections, config.section(SshSection).setup, workdirs, say, show, digest)
