"""The agent's pieces that need no cluster: the event emitter and the command listener."""

from __future__ import annotations

import io
import json
import os
import threading
import time

from tflaunch.runtime.agent import LineEmitter


def test_emitter_writes_whole_json_lines_and_flushes_on_close():
    out = io.StringIO()
    emit = LineEmitter(out, "node1")
    for i in range(100):
        emit({"event": "output", "task": "worker:0", "line": f"line {i}"})
    emit({"event": "exited", "task": "worker:0", "code": 0})
    emit.close()
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(events) == 101 and events[-1]["event"] == "exited"
    assert all(e["host"] == "node1" and "time" in e for e in events)


def test_a_stalled_stream_never_blocks_the_agent():
    """A cut link whose buffers are full: emitting returns at once, lifecycle events still queue,
    surplus output is dropped (it is in the log) and a note says how much."""
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    emit = LineEmitter(stream, "node1", max_pending=1000)

    def flood() -> None:
        for i in range(20000):
            emit({"event": "output", "task": "worker:0", "line": "x" * 200 + str(i)})
        emit({"event": "exited", "task": "worker:0", "code": 0})
        emit.close(timeout=0.5)  # returns although nothing can be written

    # A blocking emit or close would never return: the join's bound catches a hang, not a
    # slow machine (the work takes well under a second of CPU).
    flooding = threading.Thread(target=flood, daemon=True)
    flooding.start()
    flooding.join(timeout=120)
    assert not flooding.is_alive(), "emit or close blocked on the stalled stream"
    assert emit.dropped > 0
    # Once the reader drains the pipe, the queued lifecycle event and the drop note arrive.
    reader = os.fdopen(read_end)
    emit({"event": "output", "task": "worker:0", "line": "after"})
    lines = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any('"exited"' in line for line in lines):
        lines.append(reader.readline())
    assert any('"exited"' in line for line in lines)
