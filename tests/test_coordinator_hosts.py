"""The coordinator with fake agent links: a host that stops answering (fail, or wait for it and
restart the cluster), and Slurm's warning signal leading to a requeue. No processes, no sockets;
but for a lost host's new agent, with real agents and fake_task over pipes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import psutil

from tests.helpers import FAKE_TASK, free_port_base
from tflaunch.cluster.config import parse_config
from tflaunch.cluster.placement import make_plan
from tflaunch.cluster.plan import Host
from tflaunch.runtime.coordinator import Requeue, Revive, coordinate
from tflaunch.runtime.link import ProcessLink, agent_argv
from tflaunch.runtime.run import Run


class Agent:
    """A fake agent link that obeys stop, stop_tasks and start_tasks like the real agent;
    ``start=False``: a lost host's new agent, which starts its tasks when told ``start``."""

    def __init__(self, host: str, tasks: list[str], start: bool = True):
        self.host, self.tasks = host, tasks
        self.sent: list[dict] = []
        self.running: set[str] = set()
        self.sink: queue.Queue | None = None
        self.pending: list[dict] = []
        self.start = start
        self.ended = threading.Event()
        self.lock = threading.Lock()

    def start_reader(self, sink: queue.Queue) -> None:
        self.sink = sink
        for event in self.pending:  # what a real link's stream held until it was read
            sink.put((self.host, event))
        if self.start:
            self._start_all()

    def _start_all(self, generation: int = 0) -> None:
        for task in self.tasks:
            self.running.add(task)
            self.emit({"event": "started", "task": task, "pid": 1, "generation": generation})
            if task.startswith("ps:"):
                self.emit({"event": "ready", "task": task})

    def emit(self, event: dict) -> None:
        if self.sink is None:
            self.pending.append(event)
        else:
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
            if cmd == "start" and not self.start:
                self._start_all(command.get("generation", 0))
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


def make(tmp_path, restart: str = "{}", grace: float = 0):
    config = parse_config(
        "program: [p]\nroles: {ps: 1, worker: 2}\nplacement: {workers_per_host: 1}\n"
        f"hosts: [a, b]\nsupervision: {{heartbeat: 0.2, grace_period: {grace}, "
        f"restart: {restart}}}\n"
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
    new_b = Agent("b", ["worker:1"], start=False)
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
    # its tasks were started by the new agent itself, told the restarts so far
    assert new_b.commands() == ["start", "stop"]
    assert new_b.sent[0] == {"cmd": "start", "restarts": {"worker:1": 0}, "generation": 1}
    # asked at once: nothing waits for the old agent, the new one stops what it left
    assert [host for host, _ in asked] == ["b"] and 29 < asked[0][1] <= 30
    kinds = [e["event"] for e in events(run)]
    assert kinds.index("host_lost") < kinds.index("host_back")
    assert (
        "b was lost (silent for 6 s); stopping the tasks on the other hosts and waiting up to 30 s"
        in (out.getvalue())
    )


def test_a_lost_host_of_task_scoped_roles_restarts_its_tasks_alone(tmp_path):
    plan, run = make(tmp_path, "{worker: on-failure, ps: exit-code}")
    a, b = Agent("a", ["ps:0", "worker:0"]), Agent("b", ["worker:1"])
    new_b = Agent("b", ["worker:1"], start=False)
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
    assert new_b.commands() == ["start", "stop"]
    assert new_b.sent[0] == {"cmd": "start", "restarts": {"worker:1": 1}, "generation": 0}
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


def test_a_host_wait_shorter_than_the_grace_period_still_brings_the_host_back(tmp_path):
    """No minimum: the backend is asked for the new agent as soon as the host is lost (it used
    to be asked only after the grace period and 10 s more, past a wait this short)."""
    plan, run = make(tmp_path, "{worker: on-failure}", grace=5)
    a, b = Agent("a", ["ps:0", "worker:0"]), Agent("b", ["worker:1"])
    new_b = Agent("b", ["worker:1"], start=False)

    def revive(host: str, deadline: float):
        assert deadline - time.monotonic() > 1.5  # asked at once
        time.sleep(1)  # the host answers again after 1 s
        assert time.monotonic() < deadline
        return new_b

    thread, result, out = run_in_thread(plan, run, [a, b], revive=Revive(3, revive))
    wait_for(lambda: b.sink is not None)
    b.lose()
    wait_for(lambda: "start" in new_b.commands())
    a.finish("worker:0")
    new_b.finish("worker:1")
    thread.join(10)
    assert result["outcome"].code == 0, result["outcome"].message + out.getvalue()


def outcome_of_losing_b(plan, run):
    """The outcome of a run whose host b (worker:1) is lost once, its agent back at once."""
    a, b = Agent("a", ["ps:0", "worker:0"]), Agent("b", ["worker:1"])
    thread, result, _ = run_in_thread(plan, run, [a, b], revive=Revive(30, lambda h, d: b))
    wait_for(lambda: b.sink is not None)
    b.lose()
    thread.join(10)
    return result["outcome"]


def test_a_lost_host_past_its_tasks_restart_limit_fails_the_run(tmp_path):
    outcome = outcome_of_losing_b(
        *make(tmp_path, "{worker: {policy: on-failure, max_restarts: 0}}")
    )
    message = outcome.message
    assert outcome.code == 1
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
    message = outcome_of_losing_b(*make(tmp_path, "{max_cluster_restarts: 0}")).message
    assert "host b was lost: silent for 6 s. Not restarted: the cluster was " in (message)
    assert "supervision.restart.max_cluster_restarts (0)" in message


# --- real agents (processes, pipes): a lost host's new agent ----------------------------------


class LosableLink:
    """A real agent's link whose host can be 'lost': the coordinator hears host_lost and
    nothing more from it, while the old agent and its tasks run on (a host cut off from the
    launcher, whose agent has not reached its heartbeat timeout yet)."""

    def __init__(self, link: ProcessLink):
        self.link, self.host = link, link.host
        self.lost = False
        self.ended = threading.Event()
        self.sink: queue.Queue | None = None
        self.events: list[dict] = []

    def start_reader(self, sink: queue.Queue) -> None:
        self.sink = sink
        inner: queue.Queue = queue.Queue()
        self.link.start_reader(inner)

        def forward() -> None:
            while True:
                host, event = inner.get()
                self.events.append(event)
                if not self.lost:
                    sink.put((host, event))
                if event.get("event") == "link_closed":
                    self.ended.set()
                    return

        threading.Thread(target=forward, daemon=True).start()

    def lose(self) -> None:
        assert self.sink is not None
        self.lost = True
        self.sink.put((self.host, {"event": "host_lost", "message": "cut off in the test"}))
        self.sink.put((self.host, {"event": "link_closed"}))

    def send(self, command: dict) -> None:
        if not self.lost:
            self.link.send(command)

    def close(self, timeout: float) -> None:
        self.link.close(timeout)


def real_cluster(tmp_path, restart: str, env: dict[str, str], order: str = "ab"):
    """Hosts a and b (the first in ``order`` gets ps:0 and worker:0, the other worker:1) on
    loopback addresses, fake_task as the program; returns (plan, run)."""
    base = free_port_base()
    config = parse_config(
        f"program: {{argv: [{sys.executable}, {FAKE_TASK}], env: {json.dumps(env)}}}\n"
        f"roles: {{ps: 1, worker: 2}}\nplacement: {{workers_per_host: 1}}\n"
        f"hosts: [{', '.join(order)}]\n"
        f"ports: {{ps: {base}, worker: {base + 10}}}\n"
        "supervision: {heartbeat: 0.2, heartbeat_timeout: 120, grace_period: 2, "
        f"restart: {restart}}}\n"
    )
    addresses = {"a": "127.0.0.1", "b": "127.0.0.2"}
    hosts = [Host(h, addresses[h], addresses[h]) for h in order]
    run = Run.create(tmp_path / "runs", "t")
    plan = make_plan(config, hosts, run.dir)
    run.write_plan(plan)
    return plan, run


def agent_link(run: Run, host: str, await_start: bool = False) -> LosableLink:
    argv = agent_argv(sys.executable, str(run.plan_path), host, str(run.dir), await_start)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return LosableLink(ProcessLink(host, proc))


@contextlib.contextmanager
def coordinating_a_and_revivable_b(plan, run):
    """Real agents on hosts a and b, coordinate() over them in a thread, and a lost b revived by
    a new agent (started awaiting its start command); yields (a, b, thread, result, output) and
    closes every link on the way out."""
    a, b = agent_link(run, "a"), agent_link(run, "b")
    new_b: list[LosableLink] = []

    def revive(host: str, deadline: float) -> LosableLink:
        new_b.append(agent_link(run, host, await_start=True))
        return new_b[0]

    try:
        yield (a, b, *run_in_thread(plan, run, [a, b], revive=Revive(30, revive)))
    finally:
        for link in [a, b, *new_b]:
            link.close(10)


def task_pid(link: LosableLink, task: str, runs: int = 1) -> int:
    """The pid of ``task``'s latest start on ``link``'s agent, once its ``runs``-th run
    printed its restart counters."""

    def printed() -> int:
        return len([e for e in link.events if e.get("line", "").startswith(f"{task} restarts")])

    wait_for(lambda: printed() >= runs, 30)
    return [e["pid"] for e in link.events if e.get("event") == "started" and e["task"] == task][-1]


def restart_lines(run: Run, task: str) -> list[str]:
    log = run.dir / f"{task.replace(':', '-')}.log"
    return [line for line in log.read_text().splitlines() if " restarts: " in line]


def test_a_task_restarted_on_a_lost_hosts_new_agent_counts_every_restart_of_the_run(tmp_path):
    """worker:1 restarts in place once (its agent counts 1), then its host is lost and a new
    agent starts it: $TFLAUNCH_TASK_RESTARTS is 2 there, from the coordinator's count. The old
    agent still runs (its heartbeat timeout is far off): the new one stops its worker:1 first."""
    plan, run = real_cluster(
        tmp_path,
        "{worker: on-failure, ps: exit-code}",
        # worker:0 ends after 1 s, worker:1 only in a run that counts 2 restarts
        {"WORK_SECONDS": "1", "WORK_STEP": "120", "FINISH_AT_RESTART": "2"},
    )
    with coordinating_a_and_revivable_b(plan, run) as (a, b, thread, result, out):
        first = task_pid(b, "worker:1")
        os.kill(first, signal.SIGKILL)  # restarted in place by its agent: restart 1
        second = task_pid(b, "worker:1", runs=2)
        assert second != first
        b.lose()
        thread.join(60)
        assert not thread.is_alive()
        outcome = result["outcome"]
        assert outcome.code == 0, outcome.message + out.getvalue()
        assert not psutil.pid_exists(second) or psutil.Process(second).status() == "zombie"
    assert restart_lines(run, "worker:1") == [
        "worker:1 restarts: task 0 cluster 0",
        "worker:1 restarts: task 1 cluster 0",
        "worker:1 restarts: task 2 cluster 0",
    ]
    assert restart_lines(run, "worker:0") == ["worker:0 restarts: task 0 cluster 0"]
    evs = events(run)
    (stopped,) = [e for e in evs if e["event"] == "old_tasks_stopped"]
    assert (stopped["host"], stopped["tasks"]) == ("b", ["worker:1"])
    restarted = [e for e in evs if e["event"] == "started" and e["task"] == "worker:1"]
    assert [e["restarts"] for e in restarted] == [0, 1, 2]
    assert b.link.proc.wait(10) is not None  # the old agent ended once its input closed


def test_a_cluster_restart_for_a_lost_host_counts_on_and_frees_the_old_ps_port(tmp_path):
    """b (ps:0, worker:0) is lost while its old agent runs on: the cluster restarts, b's new
    agent stops the old PS that holds its port, and starts its tasks as cluster restart 1."""
    plan, run = real_cluster(
        tmp_path, "{ps: exit-code}", {"WORK_SECONDS": "120", "FINISH_AT_RESTART": "1"}, "ba"
    )
    assert [t.name for t in plan.tasks_on("b")] == ["ps:0", "worker:0"]
    with coordinating_a_and_revivable_b(plan, run) as (a, b, thread, result, out):
        task_pid(b, "worker:0")
        # worker:1, on a, starts only once a's agent sees ps:0's port (on b) accept: under load
        # that can come after b's PS is ready; losing b before it printed its first line would
        # leave worker:1 with only its cluster-restart run (the flake of a loaded full suite)
        task_pid(a, "worker:1")
        wait_for(lambda: any(e.get("event") == "ready" for e in b.events), 30)
        b.lose()
        thread.join(60)
        assert not thread.is_alive()
        outcome = result["outcome"]
        assert outcome.code == 0, outcome.message + out.getvalue()
    for task in ("ps:0", "worker:0", "worker:1"):
        assert restart_lines(run, task) == [
            f"{task} restarts: task 0 cluster 0",
            f"{task} restarts: task 0 cluster 1",
        ], task
    (stopped,) = [e for e in events(run) if e["event"] == "old_tasks_stopped"]
    assert stopped["tasks"] == ["ps:0", "worker:0"]
    assert "restarts: b was lost 1 time(s); the cluster restarted 1 time(s)" in outcome.message


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
