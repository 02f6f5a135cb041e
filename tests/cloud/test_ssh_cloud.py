"""From an empty (stand-in) region to a finished run and back: ``tflaunch up`` with
``ssh.provision`` against moto's server, the created instances pointed at the SSH namespace test
hosts through the test-only address map (``TFLAUNCH_EC2_ADDRESS_MAP``). After every way a run
ends, moto must list none of the run's instances as running.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.cloud.fixtures import instances
from tests.helpers import (
    processes_mentioning,
    read_until,
    start_tflaunch,
    tflaunch,
    wait_until_gone,
)
from tests.hosts import ssh_hosts
from tflaunch.launchers.clouds.records import TAG_RUN

pytestmark = [pytest.mark.slow, pytest.mark.ssh]


def only_run(tmp_path: Path) -> Path:
    (run,) = (tmp_path / "runs").iterdir()
    return run


def test_success_with_down_terminates(cloud_file, ssh_test_hosts, tmp_path):
    cluster = cloud_file()
    result = tflaunch("up", str(cluster), "--down", timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    err = result.stderr
    assert err.index("estimated cost: USD 0.5100 per hour for 3 instance(s)") < err.index(
        "creating 3 instance(s)"
    )
    assert "terminating 3 instance(s)" in err
    # New instances' host keys go to the run's own known_hosts, recorded on first contact.
    known = (only_run(tmp_path) / "known_hosts").read_text().splitlines()
    assert sorted(line.split()[0] for line in known) == [
        h.public_address for h in ssh_test_hosts.hosts
    ]
    meta = json.loads((only_run(tmp_path) / "run.json").read_text())
    assert [r["name"] for r in meta["instances"]] == ["worker-1", "worker-2", "worker-3"]
    assert all(r["terminated"] and r["hourly_usd"] == 0.17 for r in meta["instances"])


def test_failing_task_with_terminate_at_end(cloud_file):
    cluster = cloud_file(env={"FAIL_INDEX": "1", "FAIL_CODE": "3"})
    data = yaml.safe_load(cluster.read_text())
    data["ssh"]["provision"]["terminate_at_end"] = True
    cluster.write_text(yaml.safe_dump(data))
    result = tflaunch("up", str(cluster), timeout=180)
    assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-3000:]
    assert "terminating 3 instance(s)" in result.stderr


def test_ctrl_c_with_down_terminates(cloud_file, clean_region):
    cluster = cloud_file(env={"WORK_SECONDS": "120"})
    proc = start_tflaunch("up", str(cluster), "--down")
    try:
        read_until(proc.stdout, "[worker:2]", timeout=120)
        assert len(instances(clean_region, ("running",))) == 3
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130


def test_kill_9_then_gc_terminates(cloud_file, ssh_test_hosts, tmp_path, clean_region):
    cluster = cloud_file(env={"WORK_SECONDS": "120"})
    proc = start_tflaunch("up", str(cluster), "--down")
    try:
        read_until(proc.stdout, "[worker:2]", timeout=120)
    finally:
        proc.kill()  # SIGKILL: no cleanup of any kind runs in the launcher
        proc.wait(timeout=10)
    assert len(instances(clean_region, ("running",))) == 3  # leaked
    dry = tflaunch("gc", str(cluster), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "3 instance(s) would terminate (its launcher is gone)" in dry.stdout
    assert len(instances(clean_region, ("running",))) == 3
    swept = tflaunch("gc", str(cluster))
    assert "3 instance(s) terminated (its launcher is gone)" in swept.stdout
    meta = json.loads((only_run(tmp_path) / "run.json").read_text())
    assert all(r["terminated"] for r in meta["instances"])
    assert meta["ec2"]["network"].startswith("sg-")
    deadline = time.monotonic() + 20  # the agents stop by heartbeat timeout (6 s)
    while time.monotonic() < deadline and any(
        ssh_hosts.processes_in(h) for h in ssh_test_hosts.hosts
    ):
        time.sleep(0.2)
    assert [p for h in ssh_test_hosts.hosts for p in ssh_hosts.processes_in(h)] == []


def test_from_provisioning_to_termination_and_report(
    cloud_file, ssh_test_hosts, tmp_path, clean_region
):
    """up --down provisions, runs on the private addresses, terminates and reports the cost.
    The launcher is the subject: the TensorFlow-free stand-in runs (MNIST on SSH hosts is
    tests/ssh/test_ssh_backend.py's one TensorFlow run)."""
    cluster = cloud_file(env={"WORK_SECONDS": "0.5"})
    result = tflaunch("up", str(cluster), "--down", timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = only_run(tmp_path)
    for i in range(3):
        assert (run / f"worker-{i}.log").read_text().splitlines()[-1] == "done", i
    plan = json.loads((run / "plan.json").read_text())
    assert plan["cluster"]["worker"] == [f"{h.private_address}:2220" for h in ssh_test_hosts.hosts]
    assert "terminating 3 instance(s)" in result.stderr
    run_id = run.name
    tags = [
        {t["Key"]: t["Value"] for t in i["Tags"]} for i in instances(clean_region, ("terminated",))
    ]
    assert sum(1 for t in tags if t[TAG_RUN] == run_id) == 3
    report = tflaunch("report", run_id, "--run-dir", str(tmp_path / "runs"), timeout=120)
    assert report.returncode == 0, report.stderr
    assert "instances: 3; " in report.stdout and "instance-hours, USD " in report.stdout


def test_kept_instances_take_exec_and_down_terminates(
    cloud_file, ssh_test_hosts, tmp_path, clean_region
):
    cluster = cloud_file()
    result = tflaunch("up", str(cluster), timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "the instances keep running: 'tflaunch down" in result.stderr
    assert len(instances(clean_region, ("running",))) == 3
    run_id, runs = only_run(tmp_path).name, str(tmp_path / "runs")
    command = ["sh", "-c", "hostname -I | cut -d' ' -f1; pwd; exit 4"]
    done = tflaunch("exec", run_id, "--run-dir", runs, "--", *command)
    assert done.returncode == 4, done.stderr
    for name, host in zip(["worker-1", "worker-2", "worker-3"], ssh_test_hosts.hosts, strict=True):
        assert f"[{name}] {host.public_address}" in done.stdout
        assert f"[{name}] {tmp_path / 'work'}" in done.stdout
        assert f"[{name}] exit code 4" in done.stdout
    down = tflaunch("down", run_id, "--run-dir", runs)
    assert down.returncode == 0, down.stderr
    assert "terminated 3 instance(s)" in down.stdout


def test_max_runtime_stops_the_run_and_terminates(cloud_file):
    cluster = cloud_file(env={"WORK_SECONDS": "120"}, supervision={"max_runtime": 8})
    result = tflaunch("up", str(cluster), "--down", timeout=180)
    assert result.returncode == 130, result.stdout[-3000:] + result.stderr[-3000:]
    assert "reached supervision.max_runtime (8 s); stopping it" in result.stderr
    assert "terminating 3 instance(s)" in result.stderr


def test_detached_run_keeps_its_instances_until_down(cloud_file, tmp_path, clean_region):
    cluster = cloud_file(env={"WORK_SECONDS": "120"})
    started = tflaunch("up", str(cluster), "--detach", "--down", timeout=180)
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    run_id = started.stdout.strip().splitlines()[-1]
    assert len(instances(clean_region, ("running",))) == 3  # the run goes on without the laptop
    down = tflaunch("down", run_id, "--run-dir", str(tmp_path / "runs"), timeout=120)
    assert down.returncode == 0, down.stderr
    assert "terminated 3 instance(s)" in down.stdout


def test_down_of_a_detached_run_with_its_hosts_unreachable_still_ends_the_billing(
    cloud_file, ssh_test_hosts, tmp_path, clean_region
):
    """The laptop changed networks (its link to the hosts is down): 'down' cannot reach the
    coordinator, yet terminates the instances with the account alone and says what it could
    not collect; the run is recorded stopped."""
    cluster = cloud_file(env={"WORK_SECONDS": "600"}, ssh={"connect_timeout": 2})
    started = tflaunch("up", str(cluster), "--detach", timeout=180)
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    run_id = started.stdout.strip().splitlines()[-1]
    assert len(instances(clean_region, ("running",))) == 3
    ssh_hosts.cut_launcher_link(ssh_test_hosts)
    try:
        down = tflaunch("down", run_id, "--run-dir", str(tmp_path / "runs"), timeout=180)
    finally:
        ssh_hosts.restore_launcher_link(ssh_test_hosts)
        # moto's instances are records, not machines: end what ran on the test hosts, as
        # terminating real instances would.
        for proc in processes_mentioning(str(tmp_path)):
            with contextlib.suppress(psutil.Error):
                proc.kill()
    assert down.returncode == 0, down.stderr
    assert instances(clean_region, ("pending", "running", "stopping", "stopped")) == []
    assert f"run {run_id} is down (state: stopped): terminated 3 instance(s)" in down.stdout
    assert "Its hosts could not be reached (3 of 3)" in down.stdout
    assert "was not collected: the coordinator's last events and state" in down.stdout
    assert "nothing was started" not in down.stdout + down.stderr
    meta = json.loads((tmp_path / "runs" / run_id / "run.json").read_text())
    assert meta["state"] == "stopped" and "could not reach the hosts" in meta["message"]
    assert all(i.get("terminated") for i in meta["instances"])
    assert wait_until_gone(str(tmp_path), 15) == []
