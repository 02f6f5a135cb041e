"""Fakes for coordinator tests: an agent link driven by a script of events."""

from __future__ import annotations

import queue
import threading


class FakeLink:
    """An agent that sends a script of events and, told to stop, reports its still-running
    tasks as exited by SIGTERM and closes, as a real agent's teardown does."""

    def __init__(self, host: str, tasks: list[str], script: list[dict]):
        self.host, self.tasks, self.script = host, tasks, script
        self.sent: list[dict] = []
        self.closed = False
        self._sink: queue.Queue | None = None
        self._running = set(tasks)
        self._lock = threading.Lock()
        self._done = False

    def start_reader(self, sink: queue.Queue) -> None:
        self._sink = sink
        for event in self.script:
            self._emit(event)

    def _emit(self, event: dict) -> None:
        if event.get("event") == "exited":
            self._running.discard(event["task"])
        assert self._sink is not None
        self._sink.put((self.host, event))

    def send(self, command: dict) -> None:
        self.sent.append(command)
        with self._lock:
            if command.get("cmd") != "stop" or self._done:
                return
            self._done = True
        for task in sorted(self._running):
            self._emit({"event": "exited", "task": task, "code": 143})
        self._emit({"event": "link_closed"})

    def close(self, timeout: float) -> None:
        self.closed = True
