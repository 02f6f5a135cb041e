"""Restart policies and the stall watchdog on the local backend, with real processes (stand-in
tasks without TensorFlow, so these are fast)."""

from __future__ import annotations

import json
import signal
import time

from tests.helpers import (
    fake_cluster,
    processes_mentioning,
    read_until,
    tflaunch,
    up_until,
    wait_until_gone,
)


def events(tmp_path):
    (run,) = (tmp_path / "runs").iterdir()
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def supervision(**restart):
    return {"grace_period": 2, "ready_timeout": 60, "restart": {"backoff": 0.2, **restart}}


def kill_task(marker: str, task: str) -> int:
    (victim,) = [
        p for p in processes_mentioning(marker) if p.environ().get("TFLAUNCH_TASK") == task
    ]
    victim.kill()
    return victim.pid


def test_on_failure_restarts_the_worker_in_place_and_the_run_succeeds(tmp_path):
    cluster = fake_cluster(
        tmp_path,
        env={"FAIL_INDEX": "1", "FAIL_CODE": "3", "FAIL_RUNS": "1", "WORK_SECONDS": "0.5"},
        supervision=supervision(worker="on-failure"),
    )
    result = tflaunch("up", str(cluster))
    assert result.returncode == 0, result.stderr
    assert "worker:1 exited with code 3; restarting it in 0.2 s (restart 1 of at most 3)" in (
        result.stdout
    )
    assert "restarts: worker:1 restarted 1 time(s) (failures: 3)" in result.stdout
    evs = events(tmp_path)
    starts = [e for e in evs if e["event"] == "started" and e["task"] == "worker:1"]
    assert [e["restarts"] for e in starts] == [0, 1]
    (restarting,) = [e for e in evs if e["event"] == "restarting"]
    assert (restarting["task"], restarting["code"], restarting["cause"]) == (
        "worker:1",
        3,
        "exited",
    )
    assert [e["task"] for e in evs if e["event"] == "running_again"] == ["worker:1"]
    # the same port, TF_CONFIG and log: the restarted run appended to worker-1.log
    (run,) = (tmp_path / "runs").iterdir()
    assert (run / "worker-1.log").read_text().count("all ps reachable at start: True") == 2
    status = tflaunch("status", run.name, "--run-dir", str(tmp_path / "runs"))
    (row,) = [line for line in status.stdout.splitlines() if line.startswith("worker:1")]
    assert row.endswith("1 (last: 3)")
    assert wait_until_gone(str(cluster.parent)) == []


def test_exit_code_policy_fails_on_exit_1_with_the_report(tmp_path):
    cluster = fake_cluster(
        tmp_path,
        env={"FAIL_INDEX": "1", "FAIL_CODE": "1", "WORK_SECONDS": "0.5"},
        supervision=supervision(worker="exit-code"),
    )
    result = tflaunch("up", str(cluster))
    assert result.returncode == 1
    assert "worker:1 on localhost exited with code 1." in result.stderr
    assert "Not restarted: its restart policy 'exit-code' restarts only on a signal" in (
        result.stderr
    )
    assert not [e for e in events(tmp_path) if e["event"] == "restarting"]
    assert wait_until_gone(str(cluster.parent)) == []


def test_exit_code_policy_restarts_a_worker_killed_with_sigkill(tmp_path):
    marker = str(tmp_path)
    cluster = fake_cluster(
        tmp_path,
        env={"WORK_SECONDS": "6", "WORK_STEP": "0"},
        supervision=supervision(worker="exit-code"),
    )
    with up_until(cluster, "[worker:1] all ps reachable") as (proc, _):
        kill_task(marker, "worker:1")
        read_until(proc.stdout, "worker:1 exited with code 137 (SIGKILL); restarting it", 10)
        end = read_until(proc.stdout, "succeeded", timeout=60)
        assert "worker:1 restarted 1 time(s) (failures: 137 (SIGKILL))" in end
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    assert wait_until_gone(marker) == []


def test_max_restarts_exceeded_names_task_exits_and_limit(tmp_path):
    cluster = fake_cluster(
        tmp_path,
        env={"FAIL_INDEX": "1", "FAIL_CODE": "3", "WORK_SECONDS": "0.2"},
        supervision=supervision(worker={"policy": "on-failure", "max_restarts": 2}),
    )
    result = tflaunch("up", str(cluster))
    assert result.returncode == 3
    assert "worker:1 on localhost exited with code 3." in result.stderr
    assert (
        "Not restarted: it was restarted 2 time(s), the limit of "
        "supervision.restart.worker.max_restarts (2). Its failures: 3, 3, 3." in result.stderr
    )
    assert wait_until_gone(str(cluster.parent)) == []


def test_ps_loss_restarts_the_whole_cluster(tmp_path):
    marker = str(tmp_path)
    cluster = fake_cluster(
        tmp_path,
        env={"WORK_SECONDS": "5"},
        supervision=supervision(ps="on-failure"),
    )
    with up_until(cluster, "[worker:1] all ps reachable") as (proc, _):
        kill_task(marker, "ps:0")
        read_until(proc.stdout, "restarting the whole cluster from its checkpoints", 10)
        end = read_until(proc.stdout, "succeeded", timeout=60)
        assert "ps:0 restarted 1 time(s)" in end and "the cluster restarted 1 time(s)" in end
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    evs = events(tmp_path)
    for task in ("ps:0", "worker:0", "worker:1"):
        generations = [
            e["generation"] for e in evs if e["event"] == "started" and e["task"] == task
        ]
        assert generations == [0, 1], task
    assert wait_until_gone(marker) == []


def test_silent_worker_is_reported_stalled_within_timeout_plus_5s(tmp_path):
    cluster = fake_cluster(
        tmp_path,
        env={"HANG_INDEX": "1", "WORK_SECONDS": "0.2"},
        supervision={"grace_period": 1, "stall_timeout": 3},
    )
    with up_until(cluster, "[worker:1] done") as (proc, _):
        silent_since = time.monotonic()
        read_until(proc.stdout, "worker:1 stalled: no output for", timeout=3 + 5)
        assert time.monotonic() - silent_since < 3 + 5
        proc.wait(timeout=30)
        assert proc.returncode == 143
        assert "worker:1 on localhost stalled and was stopped (exit 143 (SIGTERM))" in (
            proc.stderr.read()
        )
    assert wait_until_gone(str(cluster.parent)) == []


def test_sigusr1_to_the_launcher_is_passed_on_to_every_task_and_stops_nothing(tmp_path):
    cluster = fake_cluster(tmp_path, env={"WORK_SECONDS": "4"})
    with up_until(cluster, "[worker:1] all ps reachable") as (proc, _):
        proc.send_signal(signal.SIGUSR1)
        seen = read_until(proc.stdout, "succeeded", timeout=30)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    for task in ("ps:0", "worker:0", "worker:1"):
        assert f"[{task}]".ljust(10) + " got SIGUSR1" in seen
    assert [e["signal"] for e in events(tmp_path) if e["event"] == "signal_passed_on"] == [
        "SIGUSR1"
    ]
    assert wait_until_gone(str(cluster.parent)) == []
