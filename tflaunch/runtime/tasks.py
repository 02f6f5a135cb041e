"""The coordinator's view of every task: its state, its last lines of output, and the sets that
readiness and success are read from, kept as states change so that each event costs the same with
30,000 tasks as with 3."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass, field

from tflaunch.cluster.plan import Plan
from tflaunch.runtime.diagnose import OutputTail
from tflaunch.runtime.run import Run


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
        for state in self.tasks.values():
            state.state, state.code, state.pid = "pending", None, None
            self.track(state)
