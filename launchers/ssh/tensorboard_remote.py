"""``tflaunch tensorboard`` for SSH runs: TensorBoard runs on the first worker's host over that
host's run directory, and a local port is forwarded to it through the SSH connection (like
``ssh -L``); the remote TensorBoard is stopped when the command ends."""

from __future__ import annotations

import posixpath
import socket
import threading
import time
from collections.abc import Callable

from tflaunch.launchers.ssh.connect import SshOptions, connect, remote_command
from tflaunch.launchers.ssh.section import SshSection
from tflaunch.launchers.tensorboard_serve import (
    NOT_INSTALLED,
    TensorBoardError,
    forward,
    tensorboard_argv,
)
from tflaunch.plugin import Run


def run_ssh(
    run: Run,
    config,
    port: int,
    remote_port: int,
    echo: Callable[[str], None],
    logdir: str | None = None,
) -> int:
    plan = run.read_plan()
    first = next(t for t in plan.tasks if t.job in ("chief", "worker"))
    host = plan.host(first.host)
    python = config.section(SshSection).python
    conn = connect(
        host.name,
        host.connect_address,
        SshOptions.from_section(config.section(SshSection), config.base_dir),
    )
    try:
        probe = conn.run(remote_command([python, "-c", "import tensorboard"]))
        if probe.exit_status != 0:
            raise TensorBoardError(NOT_INSTALLED.format(where=f"on {host.name}", python=python))
        logdir = logdir or posixpath.join(
            config.section(SshSection).remote_runs_dir or config.runs_dir, run.id
        )
        started = conn.run(
            remote_command(
                tensorboard_argv(python, logdir, remote_port),
                background_output=posixpath.join(logdir, "tensorboard.log"),
            )
        )
        pid = started.stdout.strip()
        if started.exit_status != 0 or not pid.isdigit():
            raise TensorBoardError(f"TensorBoard did not start on {host.name}: {started.stderr}")
        try:
            return _serve_forward(conn, host.name, logdir, port, remote_port, echo)
        finally:
            conn.run(f"kill {pid}")
    finally:
        conn.close()


def _serve_forward(conn, host: str, logdir: str, port: int, remote_port: int, echo) -> int:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", port))
    except OSError as exc:
        raise TensorBoardError(f"local port {port} is busy ({exc}); pass --port.") from None
    listener.listen(16)
    stop = threading.Event()

    def open_channel(peer):
        return conn.transport.open_channel("direct-tcpip", ("127.0.0.1", remote_port), peer)

    thread = threading.Thread(target=forward, args=(listener, open_channel, stop), daemon=True)
    thread.start()
    echo(
        f"TensorBoard on {host} over {logdir}, forwarded to http://127.0.0.1:{port}/ "
        "(Ctrl-C stops it)"
    )
    try:
        while conn.transport.is_active():
            time.sleep(0.5)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        stop.set()
        listener.close()
        thread.join(2)
