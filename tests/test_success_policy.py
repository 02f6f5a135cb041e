"""supervision.success: auto, the default (issue 40). With a chief, as Kubeflow's TFJob: the
chief's exit 0 ends the run; workers still busy (printing, using CPU) finish first, and workers
idle since (TF2 ParameterServerStrategy's, which join() their server forever) are stopped and the
run succeeds. Without a chief, every worker's own exit counts, as a benchmark's totals need.
Driven by fake agent links (no processes) and by the TensorFlow-free stand-in task."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.coordinator_fakes import FakeLink
from tests.helpers import fake_cluster, tflaunch
from tflaunch.cluster.config import parse_config
from tflaunch.cluster.placement import make_plan
from tflaunch.cluster.plan import Host
from tflaunch.runtime.coordinator import coordinate
from tflaunch.runtime.run import Run
from tflaunch.runtime.tasks import TaskBoard

TASKS = ["ps:0", "chief:0", "worker:0", "worker:1"]


def started(*tasks: str) -> list[dict]:
    return [{"event": "started", "task": t, "pid": 100 + i} for i, t in enumerate(tasks)]


class PacedLink(FakeLink):
    """A fake agent whose script's events come ``pace`` seconds apart after the first ``burst``
    (a worker printing its steps, then exiting)."""

    def __init__(self, host, tasks, script, burst: int, pace: float):
        super().__init__(host, tasks, script)
        self.burst, self.pace = burst, pace

    def start_reader(self, sink) -> None:
        self._sink = sink
        for event in self.script[: self.burst]:
            self._emit(event)

        def later() -> None:
            for event in self.script[self.burst :]:
                time.sleep(self.pace)
                if self._done:
                    return
                self._emit(event)

        threading.Thread(target=later, daemon=True).start()


def plan_of(success: str | None, chief: bool = True, finish_timeout: float = 2):
    """A plan on one host; its workers count as serving after half of ``finish_timeout``."""
    supervision = {"finish_timeout": finish_timeout, "heartbeat": 0.2}
    if success:
        supervision["success"] = success
    roles = {"ps": 1, "worker": 2, "chief": 1 if chief else 0}
    text = yaml.safe_dump({"program": ["p"], "roles": roles, "supervision": supervision})
    return make_plan(parse_config(text), [Host("a", "10.0.0.1", "10.0.0.1")])


def coordinated(tmp_path, plan, link):
    return coordinate(plan, Run.create(tmp_path / "runs", "t"), [link], out=io.StringIO())


def test_the_default_is_auto_and_a_chief_lets_its_exit_decide():
    assert plan_of(None).supervision.success == "auto"
    assert TaskBoard(plan_of(None), Run("r", Path("/nonexistent"))).chief_decides
    assert not TaskBoard(plan_of(None, chief=False), Run("r", Path("/nonexistent"))).chief_decides
    assert not TaskBoard(plan_of("workers"), Run("r", Path("/nonexistent"))).chief_decides


def test_workers_idle_after_the_chief_finished_serve_and_the_run_succeeds(tmp_path):
    script = started(*TASKS) + [
        {"event": "ready", "task": "ps:0"},
        {"event": "exited", "task": "chief:0", "code": 0},
    ]
    outcome = coordinated(tmp_path, plan_of(None), FakeLink("a", TASKS, script))
    assert outcome.code == 0, outcome.message
    assert "chief:0 finished and worker:0, worker:1, idle since, were serving" in outcome.message


def test_a_busy_worker_finishes_and_its_failure_still_counts(tmp_path):
    """A worker that prints on after the chief finished is working (its own total to come): it
    is waited for, and what it exits with counts."""
    lines = [{"event": "output", "task": "worker:1", "line": f"step {i}"} for i in range(10)]
    head = started(*TASKS) + [
        {"event": "ready", "task": "ps:0"},
        {"event": "exited", "task": "chief:0", "code": 0},
        {"event": "exited", "task": "worker:0", "code": 0},
    ]
    for code in (0, 3):
        script = head + lines + [{"event": "exited", "task": "worker:1", "code": code}]
        link = PacedLink("a", TASKS, script, burst=len(head), pace=0.3)
        # idle 2 s would be serving; it prints for 3 s, within the finish window of 4 s
        outcome = coordinated(tmp_path / str(code), plan_of(None, finish_timeout=4), link)
        assert outcome.code == code, outcome.message
        assert "serving" not in outcome.message and "still running" not in outcome.message


def test_a_busy_sample_keeps_a_silent_worker_working(tmp_path):
    """A worker that prints nothing but uses CPU (a long step) is not serving."""
    busy = {
        "event": "sample",
        "time": 1.0,
        "node": {},
        "tasks": {"worker:1": {"cpu_percent": 95.0}},
    }
    head = started(*TASKS) + [
        {"event": "ready", "task": "ps:0"},
        {"event": "exited", "task": "chief:0", "code": 0},
        {"event": "exited", "task": "worker:0", "code": 0},
    ]
    script = head + [busy] * 10 + [{"event": "exited", "task": "worker:1", "code": 0}]
    link = PacedLink("a", TASKS, script, burst=len(head), pace=0.3)
    outcome = coordinated(tmp_path, plan_of(None, finish_timeout=4), link)
    assert outcome.code == 0 and "serving" not in outcome.message, outcome.message


@pytest.mark.parametrize("success, chief", [("workers", True), (None, False)])
def test_without_the_chief_deciding_a_worker_left_running_fails_the_run(tmp_path, success, chief):
    leader = "chief:0" if chief else "worker:0"
    tasks = ["ps:0", "worker:0", "worker:1"] + (["chief:0"] if chief else [])
    script = started(*tasks) + [{"event": "exited", "task": leader, "code": 0}]
    if chief:
        script.append({"event": "exited", "task": "worker:0", "code": 0})
    outcome = coordinated(tmp_path, plan_of(success, chief=chief), FakeLink("a", tasks, script))
    assert outcome.code == 1
    assert f"worker:1 on a was still running 2 s after {leader} finished" in outcome.message
    hint = "leave supervision.success at auto" if chief else "give the cluster a chief"
    assert hint in outcome.message


@pytest.mark.slow  # default supervision: the serving worker is stopped after IDLE_S, 10 s
def test_the_pss_shape_with_stand_in_tasks_succeeds_with_default_supervision(tmp_path):
    """Chief, PS and workers of the stand-in task: the chief works and exits 0, the workers
    print 'done' and then serve, silent, as join() does (HANG_INDEX). No supervision settings
    beyond the helpers' grace and ready timeouts."""
    path = fake_cluster(tmp_path, env={"WORK_SECONDS": "0.2", "HANG_INDEX": "0"})
    data = yaml.safe_load(path.read_text())
    data["roles"] = {"ps": 1, "worker": 1, "chief": 1}
    path.write_text(yaml.safe_dump(data))
    result = tflaunch("up", str(path))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "chief:0 finished and worker:0, idle since, was serving: stopped" in result.stdout
