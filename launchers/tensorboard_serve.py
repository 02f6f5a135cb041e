"""TensorBoard over a run's summaries, for the backends: its command line, TensorBoard here, and
the port forwarding a backend whose hosts are elsewhere uses to make theirs reachable here.

TensorBoard reads every event file below ``--logdir``, and the profile plugin (where installed)
shows the traces of ``tflaunch up --trace`` under ``trace/raw``.
"""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from tflaunch.errors import TflaunchError

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


# -- a local port joined to a remote one --------------------------------------------------------


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
