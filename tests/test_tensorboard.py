"""tflaunch tensorboard: the missing-TensorBoard error, the local port forward (real sockets),
and the SSH run whose cluster file is gone."""

from __future__ import annotations

import importlib.util
import json
import socket
import threading

import pytest
from click.testing import CliRunner

from tflaunch.cli import cli
from tflaunch.launchers import tensorboard_serve as tb


def _run_dir(tmp_path, **meta):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "r1", **meta}))
    return run


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None, reason="installed")
def test_without_tensorboard_exit_2_with_what_to_install(tmp_path) -> None:
    _run_dir(tmp_path, backend="local")
    result = CliRunner().invoke(cli, ["tensorboard", "r1", "--run-dir", str(tmp_path / "runs")])
    assert result.exit_code == 2
    assert "TensorBoard is not installed here" in result.output
    assert "pip install tensorboard" in result.output


def test_ssh_run_without_its_cluster_file(tmp_path) -> None:
    _run_dir(tmp_path, backend="ssh", cluster_file=str(tmp_path / "gone.yaml"))
    result = CliRunner().invoke(cli, ["tensorboard", "r1", "--run-dir", str(tmp_path / "runs")])
    assert result.exit_code == 2 and "which is gone" in result.output


def test_forward_joins_each_local_connection_to_its_own_channel() -> None:
    """The forwarder against a real echo server standing in for the SSH channel's far end."""
    echo = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        for _ in range(2):
            conn, _ = echo.accept()
            threading.Thread(target=tb.pump, args=(conn, conn), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    listener = socket.create_server(("127.0.0.1", 0))
    opened = []

    def open_channel(peer):
        opened.append(peer)
        return socket.create_connection(echo.getsockname())

    stop = threading.Event()
    thread = threading.Thread(target=tb.forward, args=(listener, open_channel, stop), daemon=True)
    thread.start()
    try:
        for message in (b"GET / HTTP/1.1\r\n\r\n", b"x" * 200_000):
            with socket.create_connection(listener.getsockname(), timeout=5) as client:
                client.sendall(message)
                got = b""
                while len(got) < len(message):
                    got += client.recv(65536)
                assert got == message
        assert len(opened) == 2
    finally:
        stop.set()
        thread.join(2)
        listener.close()
        echo.close()
    assert not thread.is_alive()


def test_tensorboard_argv_binds_loopback_only() -> None:
    argv = tb.tensorboard_argv("python3", "/r/x", 6007)
    assert argv == ["python3", "-m", "tensorboard.main", "--logdir", "/r/x", "--port", "6007",
                    "--host", "127.0.0.1"]  # fmt: skip
