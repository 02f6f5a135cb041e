"""The rendezvous listener that Slurm jobs and detached SSH runs share, against hostile clients.

Each case connects a misbehaving client and a real agent at the same time: the client is refused
without disturbing anything, and the agent joins."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import threading
import time

import pytest

from tflaunch.errors import LaunchError
from tflaunch.runtime import rendezvous
from tflaunch.runtime.rendezvous import (
    Listener,
    Rendezvous,
    connect,
    publish,
    read_published,
    wait_published,
)

TOKEN = "0123456789abcdef"


def agent_joins(listener: Listener, host: str = "node2", delay: float = 0.3) -> threading.Thread:
    def join() -> None:
        time.sleep(delay)
        sock = connect("127.0.0.1", listener.port, TOKEN, host, timeout=5, gpu_ids=["1"])
        sock.recv(1)  # hold the connection until the listener side closes it

    thread = threading.Thread(target=join, daemon=True)
    thread.start()
    return thread


def hostile(port: int, payload: bytes, pause: float = 0.0, keep: float = 0.0) -> None:
    """Send ``payload`` (a byte at a time every ``pause`` seconds when pause > 0)."""

    def run() -> None:
        # The listener cutting this client off (a broken pipe) is the expected end.
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)) as sock:
            if pause:
                for byte in payload:
                    sock.sendall(bytes([byte]))
                    time.sleep(pause)
            else:
                sock.sendall(payload)
            time.sleep(keep)

    threading.Thread(target=run, daemon=True).start()


CASES = {
    "non_ascii_token": json.dumps({"hello": "node2", "token": "é"}).encode() + b"\n",
    "json_array": b"[]\n",
    "json_number": b"42\n",
    "not_json": b"hello there\n",
    "wrong_token": json.dumps({"hello": "node2", "token": "f" * 16}).encode() + b"\n",
    "token_not_a_string": json.dumps({"hello": "node2", "token": 7}).encode() + b"\n",
    "unexpected_host": json.dumps({"hello": "mallory", "token": TOKEN}).encode() + b"\n",
    "invalid_utf8": b'{"hello": "node2", "token": "\xff\xfe"}\n',
    "huge_line": b"x" * (4 * rendezvous.MAX_HELLO),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_client_is_refused_and_the_agent_still_joins(case):
    listener = Listener("127.0.0.1", TOKEN, {"node2"})
    hostile(listener.port, CASES[case], keep=2.0)
    agent_joins(listener, delay=0.3)
    joined = listener.accept(timeout=8)
    assert set(joined) == {"node2"} and joined["node2"].hello["gpu_ids"] == ["1"]
    assert listener.rejected >= 1 or case == "huge_line"  # (the huge line may still be arriving)
    joined["node2"].link.close(timeout=1)


def test_slow_sender_cannot_hold_the_rendezvous(monkeypatch):
    """One byte every 0.4 s never ends a line; the hello deadline is total, not per byte, and
    connections are screened concurrently, so the real agent behind it joins at once."""
    monkeypatch.setattr(rendezvous, "HELLO_TIMEOUT", 1.5)
    listener = Listener("127.0.0.1", TOKEN, {"node2", "node3"})
    hostile(listener.port, b'{"hello": "node3", "token": "' + TOKEN.encode(), pause=0.4)
    agent_joins(listener, "node2", delay=0.2)
    agent_joins(listener, "node3", delay=2.5)  # after the slow client's deadline
    started = time.monotonic()
    joined = listener.accept(timeout=10)
    assert set(joined) == {"node2", "node3"}
    assert time.monotonic() - started < 6
    for agent in joined.values():
        agent.link.close(timeout=1)


def test_a_second_hello_for_a_joined_host_is_refused():
    listener = Listener("127.0.0.1", TOKEN, {"node2", "node3"})
    agent_joins(listener, "node2", delay=0.1)
    agent_joins(listener, "node2", delay=0.6)
    agent_joins(listener, "node3", delay=1.2)
    joined = listener.accept(timeout=8)
    assert set(joined) == {"node2", "node3"} and listener.rejected == 1


def test_listener_binds_the_given_address_only():
    listener = Listener("127.0.0.1", TOKEN, {"node2"})
    assert listener.server.getsockname()[0] == "127.0.0.1"
    listener.close()


def test_publish_is_private_and_wait_published_checks_whose(tmp_path):
    publish(tmp_path, Rendezvous(TOKEN, "10.0.0.1", 1, attempt="7.0"))
    path = tmp_path / "coordinator.json"
    assert path.stat().st_mode & 0o777 == 0o600
    assert wait_published(tmp_path, 1, lambda r: r.attempt == "7.0").port == 1
    with pytest.raises(LaunchError, match="did not publish"):
        wait_published(tmp_path, 0.3, lambda r: r.attempt == "8.0")


def test_one_schema_from_the_token_handed_ahead_to_the_listening_coordinator(tmp_path):
    ahead = Rendezvous.ahead()
    publish(tmp_path, ahead)
    with pytest.raises(LaunchError, match="did not publish"):
        wait_published(tmp_path, 0.3)  # no coordinator listens yet: no port
    listener = Listener("127.0.0.1", ahead.token, {"node2"})
    try:
        publish(tmp_path, read_published(tmp_path).listening(listener, host="node1"))
        record = wait_published(tmp_path, 1)
    finally:
        listener.close()
    assert record == Rendezvous(ahead.token, "127.0.0.1", listener.port, "node1", os.getpid())
    assert set(json.loads((tmp_path / "coordinator.json").read_text())) == {
        "token", "address", "port", "host", "pid", "attempt"
    }  # fmt: skip
    (tmp_path / "coordinator.json").write_text('{"job_id": "7"}')
    assert read_published(tmp_path) is None


def test_connect_gives_up_after_its_timeout():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(LaunchError, match="cannot reach the coordinator"):
            connect("127.0.0.1", port, TOKEN, "node2", timeout=0.5)


def test_with_later_the_listener_hands_on_later_hellos_of_expected_hosts():
    """A detached provisioned run's coordinator: after the first join, a replaced host's agent
    (and the laptop's watcher) still get in with the token; strangers and bad tokens do not."""
    from launchers.ssh.on_host import Rejoins

    listener = Listener("127.0.0.1", TOKEN, {"node2"})
    rejoins = Rejoins(heartbeat=0.2)
    agent_joins(listener)
    joined = listener.accept(5, later=rejoins.hello)
    assert set(joined) == {"node2"}
    first = joined["node2"].link
    rejoins.links["node2"] = first
    sink: queue.Queue = queue.Queue()
    first.start_reader(sink)
    hostile(listener.port, json.dumps({"hello": "node9", "token": TOKEN}).encode() + b"\n")
    hostile(listener.port, json.dumps({"hello": "node2", "token": "x"}).encode() + b"\n")
    lost = socket.create_connection(("127.0.0.1", listener.port))
    lost.sendall(json.dumps({"hello": "node2", "token": TOKEN, "lost": "gone"}).encode() + b"\n")
    assert sink.get(timeout=5) == ("node2", {"event": "host_lost", "message": "gone"})
    assert sink.get(timeout=5)[1]["event"] == "link_closed"
    new = connect("127.0.0.1", listener.port, TOKEN, "node2", 5, replaced=["i-1", "i-2"])
    new.settimeout(5)
    assert new.recv(200).startswith(b'{"cmd": "ping"')  # parked until taken, and pinged
    link = rejoins.take("node2", time.monotonic() + 5)
    link.start_reader(sink)
    assert sink.get(timeout=5) == (
        "node2",
        {"event": "instance_replaced", "old": "i-1", "new": "i-2"},
    )
    with pytest.raises(LaunchError, match="no agent of its replacement joined"):
        rejoins.take("node2", time.monotonic() + 0.5)
    assert listener.rejected >= 2
    listener.close()
    new.close()
    lost.close()
