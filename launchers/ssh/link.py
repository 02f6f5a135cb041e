"""The coordinator's end of an agent over SSH: :class:`SshLink`, the agent's event stream on the
channel its pre-flight probe became (or a lost host's new agent's), with a liveness probe of the
connection (an SSH global request, like ``ServerAliveInterval``) that reports the host lost when
it stops answering, and the agent's stderr shown as its own output."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

import paramiko

from tflaunch.launchers.ssh.connect import Connection
from tflaunch.plugin import StreamLink, agent_output
from tflaunch.runtime import protocol


class SshLink(StreamLink):
    """An agent's event stream over an SSH channel, with a liveness probe of the connection."""

    def __init__(
        self,
        host: str,
        conn: Connection,
        channel: paramiko.Channel,
        heartbeat: float,
        timeout: float,
        first_events: Sequence[dict[str, Any]] = (),
    ):
        super().__init__(host, channel.makefile("r"), channel.makefile_stdin("w"))
        self.conn, self.channel = conn, channel
        self.heartbeat, self.timeout = heartbeat, timeout
        self.first_events = list(first_events)  # what happened to the host before this agent
        self._closed = threading.Event()
        self._sink: queue.Queue | None = None

    def start_reader(self, sink: queue.Queue) -> None:
        self._sink = sink
        for event in self.first_events:
            sink.put((self.host, event))
        super().start_reader(sink)
        threading.Thread(target=self._pump_stderr, args=(sink,), daemon=True).start()
        threading.Thread(target=self._probe, args=(sink,), daemon=True).start()

    def _pump_stderr(self, sink: queue.Queue) -> None:
        """The agent's stderr (Python warnings, a crash) shown as the agent's own output."""
        with contextlib.suppress(OSError, ValueError, EOFError):
            for line in self.channel.makefile_stderr("r"):
                sink.put((self.host, agent_output(self.host, line.rstrip())))

    def _probe(self, sink: queue.Queue) -> None:
        """Report the host lost when the connection stops answering for ``timeout`` seconds."""
        transport = self.conn.transport

        def ask(answered: threading.Event) -> None:
            with contextlib.suppress(Exception):  # any outcome but silence is an answer
                transport.global_request("keepalive@openssh.com", wait=True)
            answered.set()

        while not self._closed.wait(self.heartbeat):
            answered = threading.Event()
            threading.Thread(target=ask, args=(answered,), daemon=True).start()
            if not answered.wait(self.timeout) and not self._closed.is_set():
                message = (
                    f"its SSH connection ({self.conn.address}) stopped answering for "
                    f"{self.timeout:g} s"
                )
                sink.put((self.host, protocol.HostLost(message=message).wire()))
                sink.put((self.host, protocol.LinkClosed().wire()))
                self.conn.close()  # unblocks the reader
                return

    def report_lost(self, message: str) -> None:
        """The host is gone (its provider says so): report it lost and cut the connection."""
        if self._sink is None or self._closed.is_set():
            return
        self._closed.set()
        self._sink.put((self.host, protocol.HostLost(message=message).wire()))
        self._sink.put((self.host, protocol.LinkClosed().wire()))
        self.conn.close()

    def send(self, command: dict[str, Any]) -> None:
        if self.channel.closed:
            return  # a lost connection: nothing is buffered for a channel that is gone
        with contextlib.suppress(EOFError, OSError, paramiko.SSHException):
            super().send(command)  # a lost connection is reported by the probe and the reader

    def close(self, timeout: float) -> None:
        """Close the agent's input (it tears down), wait up to ``timeout``, then the channel."""
        self._closed.set()
        with contextlib.suppress(EOFError, OSError, ValueError, paramiko.SSHException):
            super().close(timeout)
        deadline = time.monotonic() + timeout
        while not self.channel.exit_status_ready() and time.monotonic() < deadline:
            if self.channel.closed:
                break
            time.sleep(0.05)
        self.channel.close()
