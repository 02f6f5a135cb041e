"""``tflaunch exec RUN -- CMD``: run one command on every host of an SSH run, in its workdir.

The command is an argument list (no shell; write ``-- sh -c '...'`` for one). It runs on all hosts
in parallel with stdout and stderr merged and every line prefixed ``[host]``; the exit code is 0
when it succeeded everywhere, else the first failing host's code (255 for an unreachable host).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence

from tflaunch.launchers.ssh.connect import Connection, parallel, remote_command
from tflaunch.launchers.ssh.details import SshDetails
from tflaunch.launchers.ssh.session import HostSession
from tflaunch.plugin import LaunchError, Run


def exec_on_hosts(
    session: HostSession, run: Run, argv: Sequence[str], show: Callable[[str], None]
) -> int:
    """Run ``argv`` on every host of ``run``; stream prefixed output; the worst exit code."""
    if not argv:
        raise LaunchError("exec: give the command after '--', e.g. tflaunch exec RUN -- nvidia-smi")
    if run.record().part(SshDetails).ssh_options is None:
        raise LaunchError(
            f"run {run.id} never reached its hosts (no connection settings in run.json); "
            "exec needs a run that got as far as the pre-flight check."
        )
    session.reconnect(run)
    lock = threading.Lock()

    def one(conn: Connection) -> int:
        command = ["sh", "-c", 'exec "$@" 2>&1', "sh", *argv]
        paths = session.paths.get(conn.name)
        channel = conn.start(remote_command(command, cwd=paths.workdir if paths else None))
        with contextlib.suppress(OSError, EOFError):
            for raw in channel.makefile("rb"):
                with lock:
                    show(f"[{conn.name}] {raw.decode(errors='replace').rstrip()}")
        code = channel.recv_exit_status()
        channel.close()
        return code

    try:
        results = parallel(one, session.connections.values())
    finally:
        session.close()
    codes = []
    for conn, code, err in results:
        if err is not None:
            show(f"[{conn.name}] exec failed: {err}")
            code = 255
        elif code != 0:
            show(f"[{conn.name}] exit code {code}")
        codes.append(code)
    return next((c for c in codes if c != 0), 0)
