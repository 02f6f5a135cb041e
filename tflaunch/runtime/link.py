"""Links: the coordinator's end of one agent's JSON-lines stream, whatever carries it.

The protocol (:mod:`tflaunch.runtime.protocol`) is the same on every transport: events from the
agent (one JSON object a line), commands to it. Links carry the wire form, JSON objects. A local agent is reached through a subprocess's
pipes (:class:`ProcessLink`), an SSH agent through a channel (the SSH backend's ``SshLink``),
agents inside a Slurm job or a detached SSH run through a TCP connection (:class:`SocketLink`).
:func:`agent_argv` is the one way an agent's command line is written.
"""

from __future__ import annotations

import contextlib
import json
import queue
import selectors
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Sequence
from typing import IO, Any, Protocol

from tflaunch.runtime import protocol

# The agent's entry (the backends' door, which hands the runtime's agent its side of up --trace)
AGENT_MODULE = "tflaunch.launchers.agent"
MAX_LINE = 1 << 20  # bytes of one event line; longer lines are cut (an agent's lines are small)


def agent_output(host: str, line: str) -> dict[str, Any]:
    """A line from the agent itself that is not an event (a crash, a warning), as its output."""
    return protocol.Output(task=f"agent@{host}", line=line).wire()


class AgentLink(Protocol):
    """The coordinator's end of one agent's event stream."""

    host: str

    def start_reader(self, sink: queue.Queue) -> None:
        """Push ``(host, event)`` for every event line, then ``(host, LinkClosed().wire())``."""

    def send(self, command: dict[str, Any]) -> None:
        """Send one command line; a dead link is ignored (its closing is reported as an event)."""

    def close(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the agent to end, then force it; never blocks longer."""


def agent_argv(
    python: str, plan: str, host: str, run_dir: str, await_start: bool = False
) -> list[str]:
    """The command that runs the agent of ``host`` from the plan file at ``plan``;
    ``await_start``: a lost host's new agent, which waits for its coordinator's ``start``."""
    return [
        python,
        "-m",
        AGENT_MODULE,
        *agent_args(plan, host, run_dir, await_start),
    ]


def agent_args(plan: str, host: str, run_dir: str, await_start: bool = False) -> list[str]:
    """The agent's arguments (``tflaunch.launchers.agent.main``'s argv)."""
    args = ["--plan", plan, "--host", host, "--run-dir", run_dir]
    return [*args, "--await-start"] if await_start else args


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
                    event = agent_output(self.host, line)
                sink.put((self.host, event))
        except (OSError, ValueError):
            pass  # the stream broke: reported as closed below
        finally:
            self.ended.set()
            sink.put((self.host, protocol.LinkClosed().wire()))

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
    """An agent on another node, reached over one TCP connection. Its events are read by the
    sink's one :class:`SocketReader` thread, however many nodes the job has."""

    def __init__(self, host: str, sock: socket.socket, first_events: Sequence[dict[str, Any]] = ()):
        super().__init__(host, *socket_streams(sock))
        self.sock = sock
        self.reader: SocketReader | None = None
        self.first_events = list(first_events)  # what happened to the host before this agent

    def start_reader(self, sink: queue.Queue) -> None:
        for event in self.first_events:
            sink.put((self.host, event))
        self.reader = SocketReader.of(sink)
        self.reader.add(self)

    def report_lost(self, message: str) -> None:
        """The host is gone (its provider says so): report it lost and cut the connection,
        so that an agent still running there stops its tasks."""
        reader = self.reader
        if reader is None or self.ended.is_set():
            return
        reader.discard(self)
        self.ended.set()
        reader.sink.put((self.host, protocol.HostLost(message=message).wire()))
        reader.sink.put((self.host, protocol.LinkClosed().wire()))
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()

    def close(self, timeout: float) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)  # the agent's input ends: it tears down
        self.ended.wait(timeout)
        if self.reader is not None:
            self.reader.discard(self)
        with contextlib.suppress(OSError):
            self.sock.close()


def socket_streams(sock: socket.socket) -> tuple[IO[str], IO[str]]:
    """Text reader and writer over one connected socket."""
    return (
        sock.makefile("r", encoding="utf-8", errors="replace", newline="\n"),
        sock.makefile("w", encoding="utf-8", newline="\n"),
    )


class SocketReader:
    """Reads the event lines of many socket links in one thread, through one selector.

    A thread per link, as :class:`StreamLink` reads, suits the handful of agents of a local or
    SSH run. A Slurm job's first node coordinates one agent per node, thousands of them, and
    thousands of reader threads contending for the interpreter stall the coordinator
    (benchmarks/coordinator_scale.py: at 4,096 agents it handled a dozen events a minute and
    held 1.5 GB). One reader serves every socket link feeding one sink.
    """

    _by_sink: weakref.WeakKeyDictionary[queue.Queue, SocketReader] = weakref.WeakKeyDictionary()
    _lock = threading.Lock()

    def __init__(self, sink: queue.Queue):
        self.sink = sink
        self.selector = selectors.DefaultSelector()
        self._partial: dict[SocketLink, bytearray] = {}
        self._skipping: set[SocketLink] = set()  # inside a line longer than MAX_LINE
        threading.Thread(target=self._read_all, daemon=True).start()

    @classmethod
    def of(cls, sink: queue.Queue) -> SocketReader:
        """The reader of ``sink``, started on first use."""
        with cls._lock:
            reader = cls._by_sink.get(sink)
            if reader is None:
                reader = cls._by_sink[sink] = cls(sink)
            return reader

    def add(self, link: SocketLink) -> None:
        self._partial[link] = bytearray()
        self.selector.register(link.sock, selectors.EVENT_READ, link)

    def _read_all(self) -> None:
        while True:
            if not self.selector.get_map():
                time.sleep(0.05)  # no link yet, or every link ended
                continue
            for key, _ in self.selector.select(timeout=1.0):
                self._read(key.data)

    def _read(self, link: SocketLink) -> None:
        try:
            data = link.sock.recv(1 << 16)  # readable: returns at once
        except OSError:
            data = b""
        if not data:
            self._end(link)
            return
        buffer = self._partial[link]
        buffer += data
        *lines, rest = buffer.split(b"\n")
        for line in lines:
            if link in self._skipping:
                self._skipping.discard(link)  # the end of an over-long line
                continue
            self._put(link, bytes(line))
        if len(rest) > MAX_LINE:  # a peer that never sends a newline costs bounded memory
            self._put(link, bytes(rest[:MAX_LINE]))
            self._skipping.add(link)
            rest = bytearray()
        self._partial[link] = bytearray(rest)

    def _put(self, link: SocketLink, line: bytes) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if not isinstance(event, dict):
            text = line.decode("utf-8", "replace").rstrip("\r")
            event = agent_output(link.host, text)
        self.sink.put((link.host, event))

    def discard(self, link: SocketLink) -> None:
        """Stop reading ``link`` (before its socket is closed, so its fd can be reused)."""
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.selector.unregister(link.sock)
        self._partial.pop(link, None)
        self._skipping.discard(link)

    def _end(self, link: SocketLink) -> None:
        self.discard(link)
        link.ended.set()
        self.sink.put((link.host, protocol.LinkClosed().wire()))
