"""Links: the coordinator's end of one agent's JSON-lines stream, whatever carries it.

The protocol is the same on every transport: events from the agent (one JSON object a line),
commands to it (``stop``, ``ping``, ``start``). A local agent is reached through a subprocess's
pipes (:class:`ProcessLink`), an SSH agent through a channel (the SSH backend's ``SshLink``),
agents inside a Slurm job or a detached SSH run through a TCP connection (:class:`SocketLink`).
:func:`agent_argv` is the one way an agent's command line is written.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import subprocess
import threading
from typing import IO, Any, Protocol

MAX_LINE = 1 << 20  # bytes of one event line; longer lines are cut (an agent's lines are small)


class AgentLink(Protocol):
    """The coordinator's end of one agent's event stream."""

    host: str

    def start_reader(self, sink: queue.Queue) -> None:
        """Push ``(host, event)`` for every event line, then ``(host, {"event": "link_closed"})``."""

    def send(self, command: dict[str, Any]) -> None:
        """Send one command line; a dead link is ignored (its closing is reported as an event)."""

    def close(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the agent to end, then force it; never blocks longer."""


def agent_argv(
    python: str, plan: str, host: str, run_dir: str, heartbeat_timeout: float | None = None
) -> list[str]:
    """The command that runs the agent of ``host`` from the plan file at ``plan``."""
    argv = [python, "-m", "tflaunch.agent", "--plan", plan, "--host", host, "--run-dir", run_dir]
    if heartbeat_timeout is not None:
        argv += ["--heartbeat-timeout", f"{heartbeat_timeout:g}"]
    return argv


def read_lines(stream: IO[str], limit: int = MAX_LINE):
    """Lines of ``stream`` (without their newline), each cut at ``limit`` characters: a peer
    that never sends a newline costs bounded memory."""
    while True:
        line = stream.readline(limit)
        if not line:
            return
        if not line.endswith("\n"):
            while True:  # skip the rest of an over-long line
                rest = stream.readline(limit)
                if not rest or rest.endswith("\n"):
                    break
        yield line.rstrip("\r\n")


class StreamLink:
    """An agent reached through a pair of text streams (pipes of a subprocess, an SSH channel)."""

    def __init__(self, host: str, reader: IO[str], writer: IO[str]):
        self.host = host
        self._reader, self._writer = reader, writer
        self._lock = threading.Lock()
        self.ended = threading.Event()  # the reader saw the stream end

    def start_reader(self, sink: queue.Queue) -> None:
        threading.Thread(target=self._pump, args=(sink,), daemon=True).start()

    def _pump(self, sink: queue.Queue) -> None:
        try:
            for line in read_lines(self._reader):
                try:
                    event = json.loads(line)
                except ValueError:
                    event = None
                if not isinstance(event, dict):
                    event = {"event": "output", "task": f"agent@{self.host}", "line": line}
                sink.put((self.host, event))
        except (OSError, ValueError):
            pass  # the stream broke: reported as closed below
        finally:
            self.ended.set()
            sink.put((self.host, {"event": "link_closed"}))

    def send(self, command: dict[str, Any]) -> None:
        with self._lock:
            try:
                self._writer.write(json.dumps(command) + "\n")
                self._writer.flush()
            except (OSError, ValueError):
                pass  # a dead agent's link closing is reported by the reader

    def close(self, timeout: float) -> None:
        with self._lock, contextlib.suppress(OSError, ValueError):
            self._writer.close()


class ProcessLink(StreamLink):
    """A local agent subprocess."""

    def __init__(self, host: str, proc: subprocess.Popen):
        if proc.stdout is None or proc.stdin is None:
            raise ValueError("the agent's process needs stdin and stdout pipes")
        super().__init__(host, proc.stdout, proc.stdin)
        self.proc = proc

    def close(self, timeout: float) -> None:
        super().close(timeout)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


class SocketLink(StreamLink):
    """An agent on another node, reached over one TCP connection."""

    def __init__(self, host: str, sock: socket.socket):
        super().__init__(host, *socket_streams(sock))
        self.sock = sock

    def close(self, timeout: float) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)  # the agent's input ends: it tears down
        self.ended.wait(timeout)
        with contextlib.suppress(OSError):
            self.sock.close()


def socket_streams(sock: socket.socket) -> tuple[IO[str], IO[str]]:
    """Text reader and writer over one connected socket."""
    return (
        sock.makefile("r", encoding="utf-8", errors="replace", newline="\n"),
        sock.makefile("w", encoding="utf-8", newline="\n"),
    )
