"""How agents on other machines meet their coordinator: one listener, one token, one hello.

The coordinator listens on its cluster address, publishes where (address, port and a one-run
token, in a 0600 file of the run directory, or handed over by the launcher), and accepts one
connection per expected host. An agent connects and sends one hello line,
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tflaunch.errors import LaunchError
from tflaunch.runtime.link import SocketLink

HELLO_TIMEOUT = 10.0  # seconds for a new connection to send its whole hello line
MAX_HELLO = 64 * 1024  # bytes of a hello line
BACKLOG = 128


def new_token() -> str:
    return secrets.token_hex(16)


def publish(path: Path, info: Mapping[str, Any]) -> None:
    """Write ``info`` (address, port, token, ...) to ``path`` atomically, readable by the owner only."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(dict(info), f)
    os.replace(tmp, path)


def wait_published(
    path: Path, timeout: float, current: Callable[[dict[str, Any]], bool] = lambda _: True
) -> dict[str, Any]:
    """The published info once ``path`` holds one that ``current`` accepts (e.g. this job's)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError):
            info = json.loads(path.read_text())
            if isinstance(info, dict) and current(info):
                return info
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

    def accept(self, timeout: float) -> dict[str, Joined]:
        """Admit agents until every expected host joined or ``timeout`` passed."""
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
            stop.set()
            self.close()
        return joined

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
