"""``tflaunch tensorboard RUN``: TensorBoard over a run's summaries, reachable on a local port.

Local and Slurm runs (the run directory is on this machine or a file system shared with the
nodes): TensorBoard runs here over the run directory. SSH runs: TensorBoard runs on the first
worker's host over that host's run directory, and a local port is forwarded to it through the
SSH connection (like ``ssh -L``); the remote TensorBoard is stopped when the command ends.
TensorBoard reads every event file below ``--logdir``, and the profile plugin (where installed)
shows the traces of ``tflaunch up --trace`` under ``trace/raw``.
"""

from __future__ import annotations

import importlib.util
import posixpath
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import click

from tflaunch.errors import TflaunchError
from tflaunch.runtime.run import Run

DEFAULT_PORT = 6006
NOT_INSTALLED = (
    "TensorBoard is not installed {where} ({python} cannot import tensorboard); install it "
    "there (pip install tensorboard) and run 'tflaunch tensorboard' again."
)


class TensorBoardError(TflaunchError):
    """TensorBoard is missing, or cannot be started or reached."""


def tensorboard_argv(python: str, logdir: str, port: int) -> list[str]:
    return [python, "-m", "tensorboard.main", "--logdir", logdir, "--port", str(port)] + [
        "--host",
        "127.0.0.1",
    ]


def local_tensorboard_available(python: str = sys.executable) -> bool:
    if python == sys.executable:
        return importlib.util.find_spec("tensorboard") is not None
    probe = [python, "-c", "import tensorboard"]
    return shutil.which(python) is not None and subprocess.run(probe).returncode == 0


def run_local(logdir: Path, port: int, echo: Callable[[str], None]) -> int:
    """TensorBoard here, in the foreground, until it ends or Ctrl-C."""
    if not local_tensorboard_available():
        raise TensorBoardError(NOT_INSTALLED.format(where="here", python=sys.executable))
    proc = subprocess.Popen(tensorboard_argv(sys.executable, str(logdir), port))
    echo(f"TensorBoard over {logdir} at http://127.0.0.1:{port}/ (Ctrl-C stops it)")
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return 130
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


# -- SSH: remote TensorBoard, local port forward -----------------------------------------------


def pump(source, sink) -> None:
    """Copy bytes from ``source`` to ``sink`` (sockets or paramiko channels) until EOF."""
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            try:
                end.close()
            except OSError:
                pass


def forward(
    listener: socket.socket,
    open_channel: Callable[[tuple[str, int]], object],
    stop: threading.Event,
) -> None:
    """Accept connections on ``listener`` and join each to a channel that ``open_channel``
    opens (``transport.open_channel('direct-tcpip', ...)`` over SSH), until ``stop`` is set."""
    listener.settimeout(0.2)
    while not stop.is_set():
        try:
            client, peer = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            break
        try:
            channel = open_channel(peer)
        except Exception:  # the remote side refused: drop this one connection
            client.close()
            continue
        for a, b in ((client, channel), (channel, client)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()


def run_ssh(
    run: Run,
    config,
    port: int,
    remote_port: int,
    echo: Callable[[str], None],
    logdir: str | None = None,
) -> int:
    from tflaunch.launchers.ssh.connect import SshOptions, connect, remote_command

    plan = run.read_plan()
    first = next(t for t in plan.tasks if t.job in ("chief", "worker"))
    host = plan.host(first.host)
    python = config.ssh.python
    conn = connect(
        host.name, host.connect_address, SshOptions.from_section(config.ssh, config.base_dir)
    )
    try:
        probe = conn.run(remote_command([python, "-c", "import tensorboard"]))
        if probe.exit_status != 0:
            raise TensorBoardError(NOT_INSTALLED.format(where=f"on {host.name}", python=python))
        logdir = logdir or posixpath.join(config.ssh.remote_runs_dir or config.runs_dir, run.id)
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


@click.command("tensorboard")
@click.argument("run_id")
@click.option("--runs-dir", "--run-dir", "runs_dir", default="runs", show_default=True)
@click.option("--logdir", default=None, help="Default: the run directory (on the host, for SSH).")
@click.option("--port", type=int, default=DEFAULT_PORT, show_default=True, help="Local port.")
@click.option("--remote-port", type=int, default=DEFAULT_PORT, show_default=True)
def tensorboard_command(
    run_id: str, runs_dir: str, logdir: str | None, port: int, remote_port: int
) -> None:
    """Start TensorBoard where the run's summaries are and forward it to a local port."""
    from tflaunch.cluster.config import load_config

    run = Run.open(runs_dir, run_id)
    meta = run.read_meta()
    if meta.get("backend") == "ssh":
        cluster_file = meta.get("cluster_file")
        if not cluster_file or not Path(cluster_file).exists():
            raise TensorBoardError(
                f"run {run.id} was started from {cluster_file}, which is gone: the SSH settings "
                "to reach its hosts are in it."
            )
        config = load_config(cluster_file)
        sys.exit(run_ssh(run, config, port, remote_port, click.echo, logdir))
    sys.exit(run_local(Path(logdir) if logdir else run.dir, port, click.echo))
