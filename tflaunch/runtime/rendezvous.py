"""How agents on other machines meet their coordinator: one listener, one token, one hello.

The coordinator listens on its cluster address, publishes where — one file of the run directory,
``coordinator.json`` (mode 0600), with one schema, :class:`Rendezvous`: address, port, a one-run
token, the coordinator's host and pid, and which start of the run published it — and accepts one
connection per expected host. Agents read it from the run directory: on a shared file system
(Slurm) the coordinator's own record; on hosts without one (detached SSH runs) the launcher hands
every host the record's token ahead (a record with no address yet), the coordinator on the first
host publishes the whole record, and the launcher passes its address on to the agents. An agent connects and sends one hello line,
``{"hello": HOST, "token": TOKEN, ...}``; what follows on the connection is the usual JSON-lines
stream (:mod:`tflaunch.runtime.link`). Used inside a Slurm job and by detached SSH runs.

The listener is open to whoever can reach it, so it trusts nothing before the token: every
connection's hello is read in a thread of its own under a total deadline (a client sending one
byte every few seconds cannot hold the rendezvous), lines are bounded, tokens are compared as bytes
in constant time, and anything malformed or foreign is dropped without disturbing the agents
joining beside it.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import queue
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tflaunch.errors import LaunchError
from tflaunch.runtime.link import SocketLink

RENDEZVOUS_FILE = "coordinator.json"
HELLO_TIMEOUT = 10.0  # seconds for a new connection to send its whole hello line
MAX_HELLO = 64 * 1024  # bytes of a hello line
BACKLOG = 128


def new_token() -> str:
    return secrets.token_hex(16)


@dataclass(frozen=True)
class Rendezvous:
    """Where a run's coordinator listens, and the token that admits its agents."""

    token: str
    address: str = ""  # empty until the coordinator listens
    port: int = 0
    host: str = ""  # the coordinator's host
    pid: int = 0  # the coordinator's process there
    attempt: str = ""  # which start of the run published it: a Slurm job id and requeue count

    @classmethod
    def ahead(cls) -> Rendezvous:
        """A new run's record before its coordinator listens: the token alone."""
        return cls(new_token())

    def listening(self, listener: Listener, host: str = "", attempt: str = "") -> Rendezvous:
        """This record with where ``listener`` listens, from this process."""
        return replace(
            self,
            address=listener.address,
            port=listener.port,
            host=host,
            pid=os.getpid(),
            attempt=attempt,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Rendezvous | None:
        """The record in ``text``, or None (malformed, or not this schema)."""
        try:
            data = json.loads(text)
            return cls(**data) if isinstance(data, dict) else None
        except (ValueError, TypeError):
            return None


def rendezvous_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / RENDEZVOUS_FILE


def publish(run_dir: str | os.PathLike, record: Rendezvous) -> None:
    """Write ``record`` to the run directory's rendezvous file atomically, readable by the owner
    only."""
    path = rendezvous_path(run_dir)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(record.to_json())
    os.replace(tmp, path)


def read_published(run_dir: str | os.PathLike) -> Rendezvous | None:
    try:
        return Rendezvous.from_json(rendezvous_path(run_dir).read_text())
    except OSError:
        return None


def wait_published(
    run_dir: str | os.PathLike,
    timeout: float,
    current: Callable[[Rendezvous], bool] = lambda r: bool(r.port),
) -> Rendezvous:
    """The published record once the run directory holds one that ``current`` accepts (by
    default: one with a port, i.e. a coordinator listening; or this job's, for Slurm)."""
    path = rendezvous_path(run_dir)
    deadline = time.monotonic() + timeout
    while True:
        record = read_published(run_dir)
        if record is not None and current(record):
            return record
        if time.monotonic() > deadline:
            raise LaunchError(
                f"the coordinator did not publish {path} within {timeout:g} s; is the run "
                "directory on a file system every node shares, and did the coordinator start?"
            )
        time.sleep(0.1)


@dataclass
class Joined:
    """An agent that connected and proved it belongs to the run."""

    host: str
    hello: dict[str, Any]
    link: SocketLink = field(repr=False)


class Listener:
    """The coordinator's side: a listening socket that admits the expected hosts' agents."""

    def __init__(self, address: str, token: str, expected: set[str]):
        self.token, self.expected = token.encode(), set(expected)
        self.server = socket.create_server((address, 0), backlog=BACKLOG)
        self.address, self.port = address, self.server.getsockname()[1]
        self.rejected = 0

    def accept(
        self, timeout: float, later: Callable[[socket.socket, dict[str, Any]], None] | None = None
    ) -> dict[str, Joined]:
        """Admit agents until every expected host joined or ``timeout`` passed. With ``later``,
        the listener stays open afterwards and hands every later authentic hello (a replaced
        host's new agent, a launcher's message) to ``later``, in a thread of its own."""
        joined: dict[str, Joined] = {}
        hellos: queue.Queue[tuple[socket.socket, dict[str, Any]] | None] = queue.Queue()
        deadline = time.monotonic() + timeout
        stop = threading.Event()
        acceptor = threading.Thread(target=self._accept_loop, args=(hellos, stop), daemon=True)
        acceptor.start()
        try:
            while set(joined) != self.expected:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = hellos.get(timeout=min(remaining, 0.5))
                except queue.Empty:
                    continue
                if item is None:
                    continue
                sock, hello = item
                host = hello["hello"]
                if host in joined or host not in self.expected:
                    self.rejected += 1
                    sock.close()
                    continue
                sock.settimeout(None)
                joined[host] = Joined(host, hello, SocketLink(host, sock))
        finally:
            if later is None or set(joined) != self.expected:
                stop.set()
                self.close()
        if later is not None and set(joined) == self.expected:
            threading.Thread(target=self._hand_on, args=(hellos, later), daemon=True).start()
        return joined

    def _hand_on(
        self, hellos: queue.Queue, later: Callable[[socket.socket, dict[str, Any]], None]
    ) -> None:
        while True:
            item = hellos.get()
            if item is None:
                continue
            sock, hello = item
            if hello["hello"] not in self.expected:
                self.rejected += 1
                sock.close()
                continue
            sock.settimeout(None)
            later(sock, hello)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.server.close()

    def _accept_loop(self, hellos: queue.Queue, stop: threading.Event) -> None:
        self.server.settimeout(0.2)
        while not stop.is_set():
            try:
                sock, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            threading.Thread(target=self._screen, args=(sock, hellos, stop), daemon=True).start()

    def _screen(self, sock: socket.socket, hellos: queue.Queue, stop: threading.Event) -> None:
        hello = read_hello(sock, time.monotonic() + HELLO_TIMEOUT)
        if hello is None or stop.is_set() or not self._authentic(hello):
            self.rejected += 1
            with contextlib.suppress(OSError):
                sock.close()
            return
        hellos.put((sock, hello))

    def _authentic(self, hello: dict[str, Any]) -> bool:
        token, host = hello.get("token"), hello.get("hello")
        if not isinstance(token, str) or not isinstance(host, str):
            return False
        return hmac.compare_digest(token.encode("utf-8", "surrogatepass"), self.token)


def read_hello(sock: socket.socket, deadline: float) -> dict[str, Any] | None:
    """The first line of a new connection as a JSON object, or None (late, long, malformed).

    Read byte by byte: what follows the line belongs to the link's own reader."""
    data = bytearray()
    try:
        while not data.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or len(data) >= MAX_HELLO:
                return None
            sock.settimeout(remaining)
            chunk = sock.recv(1)
            if not chunk:
                return None
            data += chunk
        hello = json.loads(data.decode("utf-8"))
    except (OSError, ValueError):
        return None
    return hello if isinstance(hello, dict) else None


def connect(
    address: str, port: int, token: str, host: str, timeout: float, **extra: Any
) -> socket.socket:
    """The agent's side: connect (retrying until ``timeout``) and say hello."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((address, port), timeout=5)
            break
        except OSError as err:
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"{host}: cannot reach the coordinator at {address}:{port} within "
                    f"{timeout:g} s ({err})."
                ) from None
            time.sleep(0.2)
    sock.sendall((json.dumps({"hello": host, "token": token, **extra}) + "\n").encode())
    sock.settimeout(None)
    return sock
