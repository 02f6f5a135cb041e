"""Detached SSH runs: the tasks outlive the launcher and its link; status/logs/down reconnect."""

from __future__ import annotations

import time

import pytest

from tests.helpers import tflaunch
from tests.hosts import ssh_hosts
from tests.test_ssh_backend import left_on_hosts, ssh_cluster, wait_hosts_clean

ssh_test_hosts = ssh_hosts.ssh_test_hosts  # the session fixture

pytestmark = [pytest.mark.slow, pytest.mark.ssh]


def detach(cluster) -> str:
    result = tflaunch("up", "--detach", str(cluster), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "detached: the coordinator runs on host1" in result.stderr
    return result.stdout.strip().splitlines()[-1]


def cli(tmp_path, *args: str, timeout: float = 120):
    return tflaunch(*args, "--run-dir", str(tmp_path / "runs"), timeout=timeout)


def test_detached_run_finishes_without_the_launcher(ssh_test_hosts, tmp_path):
    cluster = ssh_cluster(tmp_path, ssh_test_hosts, env={"WORK_SECONDS": "6"})
    run_id = detach(cluster)
    # The launcher has exited; the cluster runs on (coordinator on host 1, agents, tasks).
    running = left_on_hosts(ssh_test_hosts)
    assert any("tflaunch.launchers.ssh.on_host coordinate" in p for p in running)
    assert any("fake_task.py" in p for p in running)
    status = cli(tmp_path, "status", run_id)
    assert status.returncode == 0, status.stderr
    assert "detached: coordinator on host1" in status.stdout
    assert "worker:2" in status.stdout and "host3" in status.stdout
    logs = cli(tmp_path, "logs", "-f", run_id)
    assert logs.returncode == 0, logs.stderr
    assert "[worker:2] done" in logs.stdout and "[worker:0] done" in logs.stdout
    status = cli(tmp_path, "status", run_id)
    assert f"run {run_id}: succeeded" in status.stdout
    run_dir = tmp_path / "runs" / run_id
    assert (run_dir / "worker-1.log").read_text().splitlines()[-1] == "done"
    assert "succeeded: 5 tasks on 3 host(s)" in (run_dir / "console.log").read_text()
    assert wait_hosts_clean(ssh_test_hosts, 15) == []


def test_detached_run_survives_a_cut_link_and_down_stops_it(ssh_test_hosts, tmp_path):
    cluster = ssh_cluster(tmp_path, ssh_test_hosts, env={"WORK_SECONDS": "600"})
    run_id = detach(cluster)
    ssh_hosts.cut_launcher_link()
    try:
        time.sleep(10)  # longer than supervision.heartbeat_timeout (6 s)
    finally:
        ssh_hosts.restore_launcher_link()
    tasks = [p for p in left_on_hosts(ssh_test_hosts) if "fake_task.py" in p]
    assert len(tasks) == 5  # 2 PS + 3 workers still running
    stopped_at = time.monotonic()
    down = cli(tmp_path, "down", run_id)
    assert down.returncode == 0, down.stderr
    assert f"run {run_id} is down (state: stopped)" in down.stdout
    assert wait_hosts_clean(ssh_test_hosts, max(1.0, 30 - (time.monotonic() - stopped_at))) == []
    status = cli(tmp_path, "status", run_id)
    assert f"run {run_id}: stopped" in status.stdout
