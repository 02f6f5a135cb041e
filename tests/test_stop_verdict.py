"""A stop is a stop (issue 40): one verdict per run, the true one. SIGTERM to a local ``up``
prints ``stopped`` (as ``status`` says), not "failed: interrupted by SIGTERM"; a batch job's
launcher says the one verdict (cancelled, the time limit) and leaves the job's coordinator's
'stopped' line (a signal whose cause it cannot tell) out of the output it streams."""

from __future__ import annotations

import io
import json
import signal
from dataclasses import dataclass, field
from pathlib import Path

from tests.coordinator_fakes import FakeLink
from tests.helpers import fake_cluster, tflaunch, up_until
from tflaunch.cluster.config import parse_config
from tflaunch.cluster.placement import make_plan
from tflaunch.cluster.plan import Host
from tflaunch.launchers.batch.follow import CaughtSignals, follow
from tflaunch.launchers.batch.state import BatchDetails, JobState
from tflaunch.runtime.coordinator import coordinate
from tflaunch.runtime.run import Outcome, Run

TWO = ["ps:0", "worker:0"]


def test_sigterm_to_up_prints_stopped_once(tmp_path):
    path = fake_cluster(tmp_path, env={"WORK_SECONDS": "120"})
    with up_until(path, "cluster ready", timeout=60) as (proc, _):
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    verdicts = [line for line in err.splitlines() if line.startswith("tflaunch: run ")]
    assert len(verdicts) == 1 and " stopped: interrupted by SIGTERM" in verdicts[0], err
    assert "failed" not in err
    listed = json.loads(tflaunch("status", "--runs-dir", str(tmp_path / "runs"), "--json").stdout)
    assert [row["state"] for row in listed] == ["stopped"]


@dataclass
class FakeScheduler:
    """A batch backend's scheduler side for follow(): the job runs for ``polls`` polls and then
    ends as ``ending``; its output file is written as the job's would be."""

    ending: str
    polls: int = 2
    scheduler: str = "PBS"
    details: type[BatchDetails] = BatchDetails
    time_key: str = "pbs.walltime"
    poll_seconds: float = 0.01
    cancel_wait: float = 5.0
    cancelled: list[str] = field(default_factory=list)
    output: Path = Path("/nonexistent")

    def output_paths(self, run: Run, job_id: str) -> tuple[Path, Path | None]:
        return self.output, None

    def job_state(self, job_id: str) -> JobState:
        self.polls -= 1
        if self.polls > 0 and not self.cancelled:
            return JobState("R")
        return JobState("F", exit_code=271, ending=self.ending)

    def cancel_job(self, job_id: str, check: bool = False) -> None:
        self.cancelled.append(job_id)
        self.on_cancel()

    def on_cancel(self) -> None:
        """What the job does when cancelled (its coordinator ends the run)."""


def followed(tmp_path: Path, ending: str, signum: int | None, coordinator: Outcome):
    run = Run.create(tmp_path / "runs", "batch")
    scheduler = FakeScheduler(ending, output=run.dir / "pbs.out")
    scheduler.output.write_text("[worker:0] step 1\n")

    def coordinator_ends() -> None:  # the job's coordinator ends the run and says so
        run.finish(coordinator)
        with scheduler.output.open("a") as f:
            f.write(f"tflaunch: {coordinator.verdict(run.id)}\n")

    if signum is None:
        coordinator_ends()  # by itself (a signal from the scheduler, or its own result)
    else:
        scheduler.on_cancel = coordinator_ends  # once the launcher's cancel reaches it
    caught = CaughtSignals()
    caught.signum = signum
    out, err = io.StringIO(), io.StringIO()
    outcome = follow(scheduler, run, "12", caught, out=out, err=err)
    return run, outcome, out.getvalue(), err.getvalue()


def verdicts(run: Run, *streams: str) -> list[str]:
    return [
        line
        for text in streams
        for line in text.splitlines()
        if line.startswith(f"tflaunch: run {run.id}")
    ]


def test_ctrl_c_on_a_batch_backend_is_one_verdict_cancelled(tmp_path):
    stopped = Outcome(130, "interrupted by SIGINT; the cluster was stopped", interrupted=True)
    run, outcome, out, err = followed(tmp_path, "cancelled", signal.SIGINT, stopped)
    assert outcome.code == 130 and outcome.state == "stopped"
    assert verdicts(run, out, err) == [
        f"tflaunch: run {run.id} stopped: PBS job 12 was cancelled (SIGINT to tflaunch)"
    ]
    assert "[worker:0] step 1" in out


def test_a_time_limit_on_a_batch_backend_is_one_verdict_naming_the_limit(tmp_path):
    stopped = Outcome(143, "interrupted by SIGTERM; the cluster was stopped", interrupted=True)
    run, outcome, out, err = followed(tmp_path, "timeout", None, stopped)
    (verdict,) = verdicts(run, out, err)
    assert "PBS job 12 reached its time limit (pbs.walltime)" in verdict
    assert "interrupted by SIGTERM" not in out + err


def test_a_batch_run_the_job_stopped_by_itself_still_says_stopped_once(tmp_path):
    """``down`` from another terminal: the job's coordinator stopped the run; the launcher
    (no signal of its own) says the verdict from run.json."""
    stopped = Outcome(143, "interrupted by SIGTERM; the cluster was stopped", interrupted=True)
    run, outcome, out, err = followed(tmp_path, "cancelled", None, stopped)
    assert outcome.state == "stopped"
    assert verdicts(run, out, err) == [
        f"tflaunch: run {run.id} stopped: interrupted by SIGTERM; the cluster was stopped"
    ]


def test_a_failed_batch_run_keeps_its_coordinators_report(tmp_path):
    failed = Outcome(3, "worker:1 on n2 exited with code 3.\nlog: /x/worker-1.log")
    run, outcome, out, err = followed(tmp_path, "failed", None, failed)
    assert outcome.code == 3
    assert verdicts(run, out, err) == [
        f"tflaunch: run {run.id} failed: worker:1 on n2 exited with code 3."
    ]


def test_a_task_whose_agent_was_signalled_stops_the_run_not_fails_it(tmp_path):
    """A scheduler's cancel or time limit signals every process of the job: an agent that got
    SIGTERM stops its tasks, and the first such exit the coordinator hears is a stop (its
    launcher then says whether it was a cancel or the time limit)."""
    config = parse_config("program: [p]\nroles: {ps: 1, worker: 1}\n")
    plan = make_plan(config, [Host("a", "10.0.0.1", "10.0.0.1")])
    script = [{"event": "started", "task": t, "pid": 100 + i} for i, t in enumerate(TWO)]
    script.append({"event": "exited", "task": "worker:0", "code": 143, "stopped_by": "signal 15"})
    outcome = coordinate(plan, Run.create(tmp_path / "runs", "t"), [FakeLink("a", TWO, script)])
    assert (outcome.code, outcome.state) == (143, "stopped")
    assert outcome.message == "worker:0 on a was stopped by its agent, which got SIGTERM"
    lost = script[:-1] + [
        {
            "event": "exited",
            "task": "worker:0",
            "code": 143,
            "stopped_by": "its launcher went quiet",
        }
    ]
    failed = coordinate(plan, Run.create(tmp_path / "runs", "u"), [FakeLink("a", TWO, lost)])
    assert failed.state == "failed"  # a lost launcher is no stop
