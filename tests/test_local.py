"""The local backend with real processes (stand-in tasks without TensorFlow, so these are fast)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time

import psutil
import pytest

from tests.helpers import (
    assert_kill_ends_cluster,
    fake_cluster,
    processes_mentioning,
    read_until,
    tflaunch,
    up_detached,
    up_until,
    wait_until_gone,
    write_cluster,
)
from tflaunch.runtime.identity import Launcher, machine_id
from tflaunch.runtime.run import Run


def events(tmp_path):
    (run,) = (tmp_path / "runs").iterdir()
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()], run


def test_success_stops_ps_and_exits_zero(tmp_path):
    cluster = fake_cluster(tmp_path, env={"PS_DELAY": "1"})
    result = tflaunch("up", str(cluster))  # returns at all: a PS never exits by itself
    assert result.returncode == 0, result.stderr
    assert "[worker:1] all ps reachable at start: True" in result.stdout
    assert "[ps:0]     ps:0 CUDA_VISIBLE_DEVICES=''" in result.stdout
    assert "succeeded: 3 tasks" in result.stdout
    evs, run = events(tmp_path)
    ps_ready = next(e["time"] for e in evs if e["event"] == "ready" and e["task"] == "ps:0")
    worker_started = min(
        e["time"] for e in evs if e["event"] == "started" and e["task"].startswith("worker")
    )
    assert worker_started >= ps_ready  # PS first, workers only once every PS port accepts
    assert (run / "worker-1.log").read_text().splitlines()[-1] == "done"
    assert json.loads((run / "run.json").read_text())["state"] == "succeeded"
    assert wait_until_gone(str(cluster.parent)) == []


def test_failed_worker_ends_cluster_with_its_code_and_a_report(tmp_path):
    cluster = fake_cluster(
        tmp_path, env={"FAIL_INDEX": "1", "FAIL_CODE": "7", "WORK_SECONDS": "0.5"}
    )
    result = tflaunch("up", str(cluster))
    assert result.returncode == 7
    assert "worker:1 on localhost exited with code 7" in result.stderr
    assert "last" in result.stderr and "    done" in result.stderr
    assert "worker-1.log" in result.stderr
    assert "Traceback" not in result.stderr
    assert wait_until_gone(str(cluster.parent)) == []


def test_worker_killed_mid_run_ends_cluster_within_5s(tmp_path):
    cluster = fake_cluster(tmp_path, env={"WORK_SECONDS": "60"})
    with up_until(cluster, "[worker:1] all ps reachable") as (proc, _):
        assert_kill_ends_cluster(proc, str(cluster.parent))
    assert wait_until_gone(str(cluster.parent)) == []


@pytest.mark.parametrize(
    "sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
)
def test_signal_to_launcher_leaves_no_process(tmp_path, sig, code):
    cluster = fake_cluster(tmp_path, env={"WORK_SECONDS": "60", "SPAWN_CHILD": "1"})
    with up_until(cluster, "cluster ready") as (proc, seen):
        # A task says "child pid" as it starts, before or after the cluster is ready.
        if "child pid" not in seen:
            read_until(proc.stdout, "child pid", timeout=10)
        children = [p for p in processes_mentioning(str(tmp_path)) if p.name() == "sleep"]
        assert children
        proc.send_signal(sig)
        proc.wait(timeout=20)
        assert proc.returncode == code
    assert wait_until_gone(str(cluster.parent)) == []
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_killed_launcher_leaves_no_process_and_status_says_lost(tmp_path):
    """kill -9 of tflaunch: the agent sees its input close and tears the tasks down; the run's
    record, left saying running, reads lost."""
    cluster = fake_cluster(tmp_path, env={"WORK_SECONDS": "60"})
    with up_until(cluster, "cluster ready") as (proc, _):
        proc.kill()
        proc.wait(timeout=5)
    assert wait_until_gone(str(cluster.parent), timeout=15) == []
    (run,) = (tmp_path / "runs").iterdir()
    assert json.loads((run / "run.json").read_text())["state"] == "running"  # as left behind
    status = tflaunch("status", run.name, "--runs-dir", str(tmp_path / "runs"))
    assert status.returncode == 0 and f"run {run.name}: lost" in status.stdout, status.stdout


def test_task_children_die_with_the_task(tmp_path):
    cluster = fake_cluster(tmp_path, env={"SPAWN_CHILD": "1", "WORK_SECONDS": "0.2"})
    result = tflaunch("up", str(cluster))
    assert result.returncode == 0, result.stderr
    pids = [
        int(line.rsplit(" ", 1)[1]) for line in result.stdout.splitlines() if "child pid" in line
    ]
    assert len(pids) == 3
    time.sleep(0.5)
    assert not [
        p
        for p in pids
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]


def test_worker_hanging_after_chief_finished_fails_after_finish_timeout(tmp_path):
    cluster = fake_cluster(
        tmp_path, env={"HANG_INDEX": "1", "WORK_SECONDS": "0.2"}, supervision={"finish_timeout": 2}
    )
    result = tflaunch("up", str(cluster))
    assert result.returncode == 1
    assert "worker:1 on localhost was still running 2 s after worker:0 finished" in result.stderr
    assert wait_until_gone(str(cluster.parent)) == []


def test_busy_port_is_bad_input_and_starts_nothing(tmp_path):
    import socket

    cluster = fake_cluster(tmp_path)
    import yaml

    port = yaml.safe_load(cluster.read_text())["ports"]["worker"]
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", port))
        holder.listen()
        result = tflaunch("up", str(cluster))
    assert result.returncode == 2
    assert f"worker:0: port {port} on localhost is already in use" in result.stderr
    evs, _ = events(tmp_path)
    assert not [e for e in evs if e["event"] == "started"]


def test_missing_program_is_bad_input(tmp_path):
    cluster = write_cluster(tmp_path / "cluster.yaml", {"argv": ["no-such-program-xyz"]})
    result = tflaunch("up", str(cluster))
    assert result.returncode == 2
    assert "the program 'no-such-program-xyz' was not found" in result.stderr
    assert "Traceback" not in result.stderr


def test_detach_status_logs_down(tmp_path):
    cluster = fake_cluster(tmp_path, env={"WORK_SECONDS": "60"})
    runs = str(tmp_path / "runs")
    run_id = up_detached(cluster)
    try:
        status = tflaunch("status", run_id, "--run-dir", runs)
        assert f"run {run_id}: running" in status.stdout
        assert "worker:1" in status.stdout and "ps:0" in status.stdout
        deadline = time.monotonic() + 10
        while (
            "all ps reachable"
            not in tflaunch("logs", run_id, "--run-dir", runs, "--task", "worker:1").stdout
        ):
            assert time.monotonic() < deadline
            time.sleep(0.3)
        logs = tflaunch("logs", run_id, "--run-dir", runs)
        assert "[worker:0] worker:0 CUDA_VISIBLE_DEVICES=''" in logs.stdout
        down = tflaunch("down", run_id, "--run-dir", runs)
        assert down.returncode == 0 and "is down (state: stopped)" in down.stdout
    finally:
        tflaunch("down", run_id, "--run-dir", runs)
    assert wait_until_gone(str(cluster.parent)) == []
    status = tflaunch("status", run_id, "--run-dir", runs)
    assert "stopped" in status.stdout


def test_unknown_run_is_bad_input(tmp_path):
    result = tflaunch("status", "nope", "--run-dir", str(tmp_path))
    assert result.returncode == 2
    assert "run 'nope' was not found" in result.stderr


def test_down_signals_nothing_when_the_coordinator_pid_was_reused(tmp_path):
    """run.json names a pid that now belongs to another process (here: a sleep started after
    the recorded coordinator start time): down must leave it alone."""
    runs = tmp_path / "runs"
    run = Run.create(runs, "stale")
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        run.update_meta(
            backend="local",
            state="running",
            launcher=Launcher(
                socket.gethostname(), machine_id(), bystander.pid, Launcher.current().started
            ),
        )
        program = {"argv": ["p"], "env": {}, "tf_config": True, "checkpoint_dir": ""}
        (run.dir / "plan.json").write_text(
            json.dumps(
                {
                    "name": "stale",
                    "hosts": [],
                    "tasks": [],
                    "cluster": {},
                    "program": program,
                    "supervision": {},
                }
            )
        )
        down = tflaunch("down", run.id, "--runs-dir", str(runs))
        assert down.returncode == 0, down.stderr
        assert bystander.poll() is None  # not signalled
        assert json.loads((run.dir / "run.json").read_text())["state"] == "stopped"
    finally:
        bystander.kill()


def _daemon_cluster(tmp_path, **env):
    return fake_cluster(tmp_path, env={"SPAWN_DAEMON": "1", **env})


def test_setsid_daemon_of_a_task_is_gone_after_success(tmp_path):
    cluster = _daemon_cluster(tmp_path, WORK_SECONDS="1")
    result = tflaunch("up", str(cluster))
    assert result.returncode == 0, result.stderr
    assert "daemon pid" in result.stdout
    assert wait_until_gone(str(tmp_path), timeout=10) == []


def test_setsid_daemon_of_a_task_is_gone_after_ctrl_c(tmp_path):
    cluster = _daemon_cluster(tmp_path, WORK_SECONDS="60")
    with up_until(cluster, "cluster ready") as (proc, seen):
        # Said as the task starts, before or after the cluster is ready.
        if "daemon pid" not in seen:
            read_until(proc.stdout, "daemon pid", timeout=30)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    assert proc.returncode == 130
    assert wait_until_gone(str(tmp_path), timeout=10) == []


def test_setsid_daemon_of_a_task_is_gone_after_down(tmp_path):
    cluster = _daemon_cluster(tmp_path, WORK_SECONDS="60")
    runs = str(tmp_path / "runs")
    run_id = up_detached(cluster)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(processes_mentioning(str(tmp_path))) < 4:
        time.sleep(0.2)  # three tasks and at least one daemon
    down = tflaunch("down", run_id, "--runs-dir", runs)
    assert down.returncode == 0, down.stderr
    assert wait_until_gone(str(tmp_path), timeout=10) == []
