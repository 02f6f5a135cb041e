"""The coordinator's view of every task: its state, its last lines of output, and the sets that
readiness and success are read from, kept as states change so that each event costs the same with
30,000 tasks as with 3.

Success (``supervision.success``): ``workers`` waits for the chief (else worker 0) and every
worker to exit 0; ``chief`` ends the run at the chief's exit 0; ``auto`` (the default) is
``workers`` without a chief and, with one, Kubeflow TFJob's convention: the chief's exit 0 ends
the run. Workers still running then may finish by themselves while they are busy (they print, or
use CPU: a benchmark's worker finishing its own steps and printing its total), and once every one
of them has been idle for :data:`IDLE_S` (or half ``finish_timeout``, when less: the coordinator
says) they are taken to serve until stopped, as TensorFlow's ParameterServerStrategy tutorial
writes its workers (``server.join()``), and the run succeeds."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass, field

from tflaunch.cluster.plan import Plan
from tflaunch.runtime.diagnose import OutputTail
from tflaunch.runtime.run import Run

IDLE_S = 10.0  # a worker quiet this long after the chief finished (success: auto) serves
BUSY_CPU_PERCENT = 10.0  # a resource sample at or above this (of one core) is work, not serving


@dataclass
class TaskState:
    name: str
    host: str
    state: str = "pending"  # pending, started, ready, exited, restarting
    pid: int | None = None
    code: int | None = None
    log: str | None = None
    executable: str | None = None  # where its agent found its program
    tail: OutputTail = field(default_factory=OutputTail)  # its last lines, and its error's


class TaskBoard:
    """Every task of a plan, by name and by host; which keep the cluster from being ready; which
    trainers (chief and workers) finished."""

    def __init__(self, plan: Plan, run: Run):
        self.tasks = {
            t.name: TaskState(t.name, t.host, log=str(run.log_path(t.log_name))) for t in plan.tasks
        }
        self.leader = "chief:0" if "chief:0" in self.tasks else "worker:0"
        self.success = plan.supervision.success
        self.unready = set(self.tasks)
        self.trainers = {n for n in self.tasks if n.startswith(("worker:", "chief:"))}
        self.trainers_done: set[str] = set()
        self.by_host: dict[str, list[TaskState]] = collections.defaultdict(list)
        for state in self.tasks.values():
            self.by_host[state.host].append(state)
        self.announced = False  # "cluster ready" was said (since the last cluster restart)
        self.leader_done_at: float | None = None  # when the chief (or worker 0) exited 0
        # success: auto with a chief: the chief's exit decides, and idle workers serve
        self.chief_decides = self.success == "auto" and "chief:0" in self.tasks
        self.last_busy: dict[str, float] = {}  # a trainer's last line or busy sample (monotonic)

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[TaskState]:
        return iter(self.tasks.values())

    def get(self, name: str) -> TaskState | None:
        return self.tasks.get(name)

    def track(self, state: TaskState) -> None:
        """Note a task's new state in the sets readiness and success are read from."""
        ps = state.name.startswith("ps:")
        ok = state.state in ("ready", "exited") if ps else state.state != "pending"
        (self.unready.discard if ok else self.unready.add)(state.name)
        if state.name in self.trainers:
            done = state.state == "exited" and state.code == 0
            (self.trainers_done.add if done else self.trainers_done.discard)(state.name)

    def set(self, state: TaskState, new: str, **values: object) -> None:
        state.state = new
        for key, value in values.items():
            setattr(state, key, value)
        self.track(state)

    @property
    def ready(self) -> bool:
        """Every PS ready (or gone), every other task started."""
        return not self.unready

    def training_done(self) -> bool:
        if self.success == "chief" and "chief:0" in self.tasks:
            chief = self.tasks["chief:0"]
            return chief.state == "exited" and chief.code == 0
        return self.trainers_done == self.trainers

    def busy(self, name: str, at: float, cpu_percent: float | None = None) -> None:
        """``name`` printed a line (``cpu_percent`` None) or was sampled using that much CPU, at
        ``at`` (monotonic): where the chief's exit decides, it is working, not serving."""
        working = cpu_percent is None or cpu_percent >= BUSY_CPU_PERCENT
        if working and self.chief_decides and name in self.trainers:
            self.last_busy[name] = at

    def serving(self, now: float, idle_s: float = IDLE_S) -> list[str] | None:
        """Where the chief's exit decides and the chief exited 0: the trainers still running,
        once every one of them has been idle ``idle_s`` (and the chief finished as long ago);
        None while the chief runs or a trainer still works."""
        done_at = self.leader_done_at
        if not self.chief_decides or done_at is None or now - done_at < idle_s:
            return None
        late = self.late_trainers()
        if any(now - self.last_busy.get(s.name, done_at) < idle_s for s in late):
            return None
        return [s.name for s in late]

    def unfinished(self, host: str) -> list[str]:
        return [s.name for s in self.by_host[host] if s.state != "exited"]

    def late_trainers(self) -> list[TaskState]:
        """Chief and workers still running (after the leader finished)."""
        return [
            s
            for s in self.tasks.values()
            if s.name.startswith(("worker:", "chief:")) and s.state != "exited"
        ]

    def names_on(self, host: str) -> list[str]:
        return [s.name for s in self.tasks.values() if s.host == host]

    def reset(self) -> None:
        """Every task pending again, for a cluster restart."""
        self.announced = False
        self.last_busy.clear()
        for state in self.tasks.values():
            state.state, state.code, state.pid = "pending", None, None
            self.track(state)
