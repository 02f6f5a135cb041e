"""The protocol module: typed messages whose wire form keeps the bytes of events.jsonl, and the one
place event and command names are spelled (a scan of the tree finds strays)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from tests.helpers import python_files
from tflaunch.runtime import protocol

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("tflaunch", "launchers", "models", "benchmarks", "scripts")
PROTOCOL_FILE = ROOT / "tflaunch" / "runtime" / "protocol.py"
NAMES = protocol.EVENT_NAMES | protocol.COMMAND_NAMES
# Words that are protocol names and also mean something else in the tree: task states (started,
# ready, exited, restarting, stalled), run states (failed), a cluster restart's phases (stopping,
# waiting), Slurm's output/error files, a requeue count (restart), a time span (start), a cloud
# instance state (stopping) ... A string equal to one of them is no stray by itself; building or
# reading a message still needs the "event"/"cmd" key, which only protocol.py may spell.
SECOND_MEANINGS = frozenset(
    {"started", "ready", "exited", "restarting", "stalled", "failed", "stopping", "waiting"}
    | {"error", "output", "restart", "start", "stop", "coordinator_started"}
)
WIRE_KEYS = {protocol.EVENT_KEY, protocol.COMMAND_KEY}


def strays(paths: list[Path]) -> list[str]:
    """``file:line: what`` for every event or command name, wire key or protocol key constant
    spelled in ``paths`` outside protocol.py (docstrings aside)."""
    found = []
    for path in paths:
        if path.resolve() == PROTOCOL_FILE:
            continue
        tree = ast.parse(path.read_text(), str(path))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            where = f"{path}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) in docstrings:
                    continue
                if node.value in WIRE_KEYS:
                    found.append(f"{where}: the wire key {node.value!r}")
                elif node.value in NAMES and node.value not in SECOND_MEANINGS:
                    found.append(f"{where}: the protocol name {node.value!r}")
            elif isinstance(node, ast.Attribute) and node.attr in ("EVENT_KEY", "COMMAND_KEY"):
                found.append(f"{where}: protocol.{node.attr}")
    return found


def shipped_files() -> list[Path]:
    return python_files(*SHIPPED)


def test_event_and_command_names_are_spelled_only_in_the_protocol_module():
    found = strays(shipped_files())
    assert found == [], "spell these through tflaunch.runtime.protocol:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "code",
    [
        'sink.put((host, {"event": "link_closed"}))',
        'link.send({"cmd": "ping"})',
        'if data.get("event") == "exited":\n    pass',
        'kind = "cluster_ready"',
        'if command in ("stop_tasks", "start_tasks"):\n    pass',
        "key = protocol.EVENT_KEY",
    ],
)
def test_the_scan_finds_a_stray_added_to_a_copy_of_a_module(tmp_path, code):
    copy = tmp_path / "agent.py"
    copy.write_text((ROOT / "tflaunch" / "runtime" / "agent.py").read_text() + "\n\n" + code + "\n")
    assert strays([copy])
    assert strays([ROOT / "tflaunch" / "runtime" / "agent.py"]) == []


def test_the_scan_leaves_docstrings_and_second_meanings_alone(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        '"""Reads the "event" key of cluster_ready lines."""\n\n'
        'def f(state):\n    """Sends {"cmd": "stop"}."""\n    return state == "exited"\n'
    )
    assert strays([module]) == []


def test_wire_form_keeps_the_key_order_and_leaves_out_unset_fields():
    started = protocol.Started(task="worker:0", pid=7, log="l", restarts=1, generation=0)
    assert json.dumps(started.wire()) == (
        '{"event": "started", "task": "worker:0", "pid": 7, "log": "l", "restarts": 1, '
        '"generation": 0}'
    )
    assert protocol.Exited(task="ps:0", code=143, stopped_by="x").wire() == {
        "event": "exited",
        "task": "ps:0",
        "code": 143,
        "stopped_by": "x",
    }
    assert list(protocol.ClusterRestarting(cause="host_lost", host="b", delay=1.0).wire()) == [
        "event",
        "cause",
        "host",
        "delay",
        "generation",
    ]
    assert protocol.Ping().wire() == {"cmd": "ping"}


def test_every_message_reads_back_from_its_wire_form():
    for name in protocol.EVENT_NAMES:
        event = protocol.event_of({"event": name})
        assert event is not None and name == event.NAME
        assert protocol.event_of(event.wire()) == event
    for name in protocol.COMMAND_NAMES:
        command = protocol.command_of({"cmd": name})
        assert command is not None and protocol.command_of(command.wire()) == command
    sample = protocol.event_of({"event": "sample", "node": {"cpu": 1}, "tasks": {}})
    assert sample == protocol.Sample({"node": {"cpu": 1}, "tasks": {}})


def test_foreign_and_malformed_messages_read_as_none():
    assert protocol.event_of({"event": "no_such_event"}) is None
    assert protocol.event_of(["event", "started"]) is None
    assert protocol.command_of({"event": "stop"}) is None
    assert protocol.is_command({"cmd": "anything"}) and not protocol.is_command({"cmd": 3})
    record = protocol.record_of({"host": "a", "time": 1.5, "event": "ready", "task": "ps:0"})
    assert record == protocol.Record(1.5, "a", protocol.Ready(task="ps:0"))
