"""The coordinator with fake agent links: a host that stops answering (fail, or wait for it and
restart the cluster), and Slurm's warning signal leading to a requeue. No processes, no sockets."""

from __future__ import annotations

import io
import json
import os
import queue
import signal
import threading
import time

import pytest

from tflaunch.cluster.config import parse_config
from tflaunch.cluster.plan import Host, make_plan
from tflaunch.runtime.coordinator import Requeue, Revive, coordinate
from tflaunch.runtime.revival import HostRevival
from tflaunch.runtime.run import Run


class Agent:
    """A fake agent link that obeys stop, stop_tasks and start_tasks like the real agent."""

    def __init__(self, host: str, tasks: list[str], start: bool = True):
        self.host, self.tasks = host, tasks
        self.sent: list[dict] = []
        self.running: set[str] = set()
        self.sink: queue.Queue | None = None
        self.start = start
        self.ended = threading.Event()
        self.lock = threading.Lock()

    def start_reader(self, sink: queue.Queue) -> None:
        self.sink = sink
        if self.start:
            self._start_all()

    def _start_all(self, generation: int = 0) -> None:
        for task in self.tasks:
            self.running.add(task)
            self.emit({"event": "started", "task": task, "pid": 1, "generation": generation})
            if task.startswith("ps:"):
                self.emit({"event": "ready", "task": task})

    def emit(self, event: dict) -> None:
        assert self.sink is not None
        self.sink.put((self.host, event))

    def lose(self, message: str = "silent for 6 s") -> None:
        """What SshLink's probe reports when the host stops answering."""
        self.emit({"event": "host_lost", "message": message})
        self.ended.set()
        self.emit({"event": "link_closed"})

    def finish(self, task: str, code: int = 0) -> None:
        self.running.discard(task)
        self.emit({"event": "exited", "task": task, "code": code})

    def send(self, command: dict) -> None:
        with self.lock:
            self.sent.append(command)
            if self.ended.is_set():
                return
            cmd = command.get("cmd")
            if cmd in ("stop", "stop_tasks"):
                for task in sorted(self.running):
                    self.emit({"event": "exited", "task": task, "code": 143, "stopped_by": "x"})
                self.running.clear()
            if cmd == "stop_tasks":
                self.emit({"event": "tasks_stopped"})
            elif cmd == "start_tasks":
                self._start_all(command.get("generation", 1))
            elif cmd == "stop":
                self.ended.set()
                self.emit({"event": "link_closed"})

    def close(self, timeout: float) -> None:
        self.ended.set()

    def commands(self) -> list[str]:
        return [c["cmd"] for c in self.sent if c["cmd"] != "ping"]


def make(tmp_path, restart: str = "{}"):
    config = parse_config(
        "program: [p]\nroles: {ps: 1, worker: 2}\nplacement: {workers_per_host: 1}\n"
        f"hosts: [a, b]\nsupervision: {{heartbeat: 0.2, grace_period: 0, restart: {restart}}}\n"
    )
    plan = make_plan(config, [Host("a", "10.0.0.1", "10.0.0.1"), Host("b", "10.0.0.2", "10.0.0.2")])
    return plan, Run.create(tmp_path / "runs", "t")


def run_in_thread(plan, run, links, **kwargs):
    """coordinate() in a thread (no signal handlers there); returns (thread, result, output)."""
    result: dict = {}
    out = io.StringIO()

    def target() -> None:
        result["outcome"] = coordinate(plan, run, links, out=out, **kwargs)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result, out


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def events(run: Run) -> list[dict]:
    return list(run.events())


@pytest.fixture(autouse=True)
def short_margin(monkeypatch):
    monkeypatch.setattr(HostRevival, "OLD_AGENT_MARGIN", 0.2)


def test_a_host_that_stops_answering_fails_the_run_naming_the_host(tmp_path):
    plan, run = make(tmp_path)
    a, b = Agent("a", ["ps:0", "worker:0"]), Agent("b", ["worker:1"])
    thread, result, _ = run_in_thread(plan, run, [a, b])  # ssh.host_wait not set
    wait_for(lambda: b.sink is not None)
    b.lose()
    thread.join(10)
    outcome = result["outcome"]
    assert outcome.code == 1
    assert outcome.message.startswith("host b stopped answering: silent for 6 s.")
    assert "Its tasks (worker:1) are stopped by its agent" in outcome.message
    assert "Set ssh.host_wait" in outcome.message
    assert a.commands() == ["stop"]


def test_the_cluster_restarts_once_the_lost_host_answers_again(tmp_path):
    plan, run = make(tmp_path)
    a, b = Agent("a", ["ps:0", "worker:0"]), Agent("b", ["worker:1"])
    new_b = Agent("b", ["worker:1"])
    asked: list[tuple[str, float]] = []

    def revive(host: str, deadline: float):
        asked.append((host, deadline - time.monotonic()))
        return new_b  # its agent starts its own tasks

    thread, result, out = run_in_thread(plan, run, [a, b], revive=Revive(30, revive))
    wait_for(lambda: b.sink is not None)
    b.lose()
    wait_for(lambda: new_b.sink is not None)
    wait_for(lambda: "start_tasks" in a.commands())  # after the backoff (1 s)
    a.finish("worker:0")
    new_b.finish("worker:1")
    thread.join(10)
    outcome = result["outcome"]
    assert outcome.code == 0, outcome.message
    assert "restarts: b was lost 1 time(s); the cluster restarted 1 time(s)" in (outcome.message)
    assert a.commands() == ["stop_tasks", "start_tasks", "stop"]
    assert new_b.commands() == ["stop"]  # its tasks were started by the new agent itself
    assert [host for host, _ in asked] == ["b"] and 25 < asked[0][1] <= 30
    kinds = [e["event"] for e in events(run)]
    assert kinds.index("host_lost") < kinds.index("host_back")
    assert (
        "b was lost (silent for 6 s); stopping the tasks on the other hosts and waiting up to 30 s"
        in (out.getvalue())
    )


def test_a_lost_host_of_task_scoped_roles_restarts_its_tasks_alone(tmp_path):
    plan, run = make(tmp_path, "{worker: on-failure, ps: exit-code}")
    a, b = Agent("a", ["ps:0", "worker:0"]), Agent("b", ["worker:1"])
    new_b = Agent("b", ["worker:1"])
    revive = Revive(30, lambda host, deadline: new_b, doing=lambda host: f"replacing {host}")
    thread, result, out = run_in_thread(plan, run, [a, b], revive=revive)
    wait_for(lambda: b.sink is not None)
    b.lose("its instance i-1 is terminated")
    wait_for(lambda: new_b.sink is not None)
    a.finish("worker:0")
    new_b.finish("worker:1")
    thread.join(10)
    outcome = result["outcome"]
    assert outcome.code == 0, outcome.message
    assert a.commands() == ["stop"]  # never stopped for b's loss
    assert new_b.commands() == ["stop"]
    assert "restarts: worker:1 restarted 1 time(s) (failures: lost); b was lost 1 time(s)" in (
        outcome.message
    )
    assert (
        "b was lost (its instance i-1 is terminated); replacing b, then restarting its tasks "
        "(worker:1) there alone while the other hosts keep running (restart 1 of at most 3 "
        "per task)"
    ) in out.getvalue()
    evs = events(run)
    kinds = [e["event"] for e in evs]
    assert "cluster_restarting" not in kinds
    (restarting,) = [e for e in evs if e["event"] == "restarting"]
    assert (restarting["task"], restarting["cause"]) == ("worker:1", "host_lost")
    assert [e["task"] for e in evs if e["event"] == "running_again"] == ["worker:1"]


def test_a_lost_host_past_its_tasks_restart_limit_fails_the_run(tmp_path):
    plan, run = make(tmp_path, "{worker: {policy: on-failure, max_restarts: 0}}")
    a, b = Agent("a", ["ps:0", "worker:0"]), Agent("b", ["worker:1"])
    thread, result, _ = run_in_thread(plan, run, [a, b], revive=Revive(30, lambda h, d: b))
    wait_for(lambda: b.sink is not None)
    b.lose()
    thread.join(10)
    message = result["outcome"].message
    assert result["outcome"].code == 1
    assert message.startswith(
        "host b was lost: silent for 6 s. Not restarted: worker:1: it was restarted 0 time(s), "
        "the limit of supervision.restart.worker.max_restarts (0)"
    ), message


def test_a_host_still_silent_after_host_wait_fails_the_run_naming_it(tmp_path):
    plan, run = make(tmp_path)
    a, b = Agent("a", ["ps:0", "worker:0"]), Agent("b", ["worker:1"])

    def revive(host: str, deadline: float):
        time.sleep(max(0.0, deadline - time.monotonic()))
        raise OSError("no route to host")

    thread, result, _ = run_in_thread(plan, run, [a, b], revive=Revive(1, revive))
    wait_for(lambda: b.sink is not None)
    b.lose()
    thread.join(15)
    outcome = result["outcome"]
    assert outcome.code == 1
    assert outcome.message.startswith(
        "host b did not answer again within 1 s (ssh.host_wait): no route to host."
    )
    assert "restarts: b was lost 1 time(s)" in outcome.message
    assert a.commands() == ["stop_tasks", "stop"]
    assert json.loads(run.meta_path.read_text())["state"] == "failed"


def test_host_losses_past_max_cluster_restarts_fail_the_run(tmp_path):
    plan, run = make(tmp_path, "{max_cluster_restarts: 0}")
    a, b = Agent("a", ["ps:0", "worker:0"]), Agent("b", ["worker:1"])
    thread, result, _ = run_in_thread(plan, run, [a, b], revive=Revive(30, lambda h, d: b))
    wait_for(lambda: b.sink is not None)
    b.lose()
    thread.join(10)
    message = result["outcome"].message
    assert "host b was lost: silent for 6 s. Not restarted: the cluster was " in (message)
    assert "supervision.restart.max_cluster_restarts (0)" in message


# --- Slurm's warning signal and requeue (signal handlers: the main thread) ----------------------


def test_the_warning_signal_stops_the_run_for_a_requeue_after_the_wait(tmp_path):
    plan, run = make(tmp_path)
    a, b = Agent("a", ["ps:0", "worker:0"]), Agent("b", ["worker:1"])
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    out = io.StringIO()
    started = time.monotonic()
    outcome = coordinate(plan, run, [a, b], out=out, requeue=Requeue(1.0, "requeue 1 of at most 2"))
    assert 1.4 < time.monotonic() - started < 5
    assert outcome.requeued and outcome.state == "requeued"
    assert "stopped 1 s after Slurm's SIGUSR1 to be requeued (requeue 1 of at most 2)" in (
        outcome.message
    )
    assert a.commands() == ["pass_on", "stop"] and b.commands() == ["pass_on", "stop"]
    meta = json.loads(run.meta_path.read_text())
    assert meta["state"] == "requeued" and "exit_code" not in meta and not run.ended
    kinds = [e["event"] for e in events(run)]
    assert kinds.count("requeue_scheduled") == 1 and kinds.count("requeueing") == 1


def test_a_cancel_during_the_wait_is_never_requeued(tmp_path):
    plan, run = make(tmp_path)
    a, b = Agent("a", ["ps:0", "worker:0"]), Agent("b", ["worker:1"])
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    threading.Timer(0.8, os.kill, (os.getpid(), signal.SIGTERM)).start()  # scancel
    outcome = coordinate(plan, run, [a, b], out=io.StringIO(), requeue=Requeue(5.0, "r"))
    assert not outcome.requeued and outcome.interrupted and outcome.code == 143
    assert json.loads(run.meta_path.read_text())["state"] == "stopped"


def test_past_the_requeue_limit_the_warning_is_only_passed_on(tmp_path):
    plan, run = make(tmp_path)
    a, b = Agent("a", ["ps:0", "worker:0"]), Agent("b", ["worker:1"])
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    threading.Timer(1.0, lambda: (a.finish("worker:0"), b.finish("worker:1"))).start()
    out = io.StringIO()
    refused = Requeue(refused="the job is not requeued again: it was requeued 2 time(s)")
    outcome = coordinate(plan, run, [a, b], out=out, requeue=refused)
    assert outcome.code == 0 and not outcome.requeued
    assert "SIGUSR1 from Slurm passed on to the tasks; the job is not requeued again" in (
        out.getvalue()
    )
    assert a.commands() == ["pass_on", "stop"]
