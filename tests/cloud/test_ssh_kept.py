"""Kept clusters (``up --keep``) against moto's server and the SSH namespace test hosts: the
second ``up`` of a kept cluster creates nothing and waits for no SSH, syncs only what changed
and skips setup; a plan that does not fit is refused naming the difference; a second ``up``
while one holds the cluster (from another laptop) is refused naming it; ``status --cloud`` shows
the cluster busy, then idle; ``down --cluster`` leaves nothing running, also from a laptop that
did not make the cluster."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest
import yaml

from tests.cloud.fixtures import instances, kept_cluster
from tests.helpers import tflaunch

pytestmark = [pytest.mark.slow, pytest.mark.ssh]


def wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def cloud_status(endpoint: str, runs: list[str], env: dict) -> dict:
    """``status --cloud --json`` as another laptop asks it: the account named on the line."""
    listed = tflaunch("status", "--cloud", "--json", *runs, "--region", "us-east-1",
                      "--endpoint-url", endpoint, env=env)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


def up(*args: str):
    return tflaunch("up", *args, timeout=180)


def test_second_up_reuses_the_kept_cluster_and_down_cluster_ends_it(
    ssh_test_hosts, tmp_path, clean_region, monkeypatch
):
    cluster = kept_cluster(tmp_path, ssh_test_hosts, clean_region, monkeypatch)
    runs = str(tmp_path / "runs")
    first = up(str(cluster), "--keep")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "creating 1 instance(s)" in first.stderr
    assert "instances accepting SSH: 1/1" in first.stderr
    assert "kept cluster cloud-test keeps running" in first.stderr
    (kept_instance,) = instances(clean_region, ("running",))

    # A kept cluster is not leaked: gc leaves it alone.
    swept = tflaunch("gc", str(cluster))
    assert "1 instance(s) kept (kept cluster cloud-test;" in swept.stdout, swept.stdout

    (tmp_path / "src" / "notes.txt").write_text("version 2\n")  # one line of the code changed
    second = up(str(cluster), "--keep")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    err = second.stderr
    assert "reusing kept cluster cloud-test: 1 instance(s), none created" in err
    assert "creating" not in err and "instances accepting SSH" not in err
    assert "sync: copied 1 file(s) (10 B) to each of 1 host(s), 1 unchanged" in err
    assert "setup: 1 line(s) ran on 0 host(s); unchanged, skipped on worker-1" in err
    assert [i["InstanceId"] for i in instances(clean_region)] == [kept_instance["InstanceId"]]

    # 'down RUN' of a run on a kept cluster keeps the cluster.
    run_ids = sorted(p.name for p in (tmp_path / "runs").iterdir() if not p.name.startswith("."))
    down_run = tflaunch("down", run_ids[-1], "--run-dir", runs)
    assert "kept cluster cloud-test keeps running" in down_run.stdout, down_run.stderr
    assert len(instances(clean_region, ("running",))) == 1

    down = tflaunch("down", "--cluster", "cloud-test", "--run-dir", runs, timeout=120)
    assert down.returncode == 0, down.stderr
    assert "terminated 1 instance(s) of kept cluster cloud-test" in down.stdout
    assert instances(clean_region) == []


def test_a_kept_cluster_that_does_not_fit_is_refused_unless_recreate(
    ssh_test_hosts, tmp_path, clean_region, monkeypatch
):
    cluster = kept_cluster(tmp_path, ssh_test_hosts, clean_region, monkeypatch)
    runs = tmp_path / "runs"
    first = up(str(cluster), "--keep")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    (old,) = instances(clean_region, ("running",))

    # Two laptops (runs directories and homes of their own: no local file is shared) start an
    # 'up' of the cluster at once: the second is refused, naming the first and where it runs.
    # Laptop A's run works until this test releases it (a fixed 8 s could end, on a loaded
    # machine, before laptop B's 'up' had even started).
    release = tmp_path / "release-laptop-a"
    data = yaml.safe_load(cluster.read_text())
    data["program"]["env"]["RELEASE_FILE"] = str(release)
    cluster.write_text(yaml.safe_dump(data))
    laptop_b = ["--runs-dir", str(tmp_path / "laptop-b")]
    b_env = {"HOME": str(tmp_path / "home-b")}
    (tmp_path / "home-b").mkdir()
    a_log = tmp_path / "laptop-a.err"
    with open(a_log, "w") as err:
        holder = subprocess.Popen(
            [sys.executable, "-m", "tflaunch", "up", str(cluster), "--keep",
             "--run-id", "laptop-a-run"],
            stdout=subprocess.DEVNULL, stderr=err, text=True,
        )  # fmt: skip
    try:
        wait_for(lambda: "reusing kept cluster cloud-test" in a_log.read_text(), 60)
        busy = tflaunch("up", str(cluster), "--keep", *laptop_b, env=b_env, timeout=120)
        listed = cloud_status(clean_region, laptop_b, b_env)
    finally:
        release.touch()
        assert holder.wait(timeout=120) == 0, a_log.read_text()[-3000:]
    assert busy.returncode == 2, busy.stderr[-3000:]
    assert (
        f"kept cluster 'cloud-test' is in use by run laptop-a-run on {socket.gethostname()} "
        f"(pid {holder.pid}, since " in busy.stderr
    )
    assert "Traceback" not in busy.stderr
    (row,) = listed["instances"]
    assert (row["busy_run"], row["idle_seconds"], row["kept"]) == ("laptop-a-run", None, True)

    # Once the first ended, laptop B's 'up' takes the cluster; afterwards it shows idle.
    del data["program"]["env"]["RELEASE_FILE"]
    data["program"]["env"]["WORK_SECONDS"] = "1"
    cluster.write_text(yaml.safe_dump(data))
    after = tflaunch("up", str(cluster), "--keep", *laptop_b, env=b_env, timeout=180)
    assert after.returncode == 0, after.stdout[-3000:] + after.stderr[-3000:]
    assert "reusing kept cluster cloud-test: 1 instance(s), none created" in after.stderr
    (row,) = cloud_status(clean_region, laptop_b, b_env)["instances"]
    assert row["busy_run"] is None and 0 <= row["idle_seconds"] < 60, row
    assert [i["InstanceId"] for i in instances(clean_region)] == [old["InstanceId"]]

    data["ssh"]["provision"]["worker_instance_type"] = "c5.2xlarge"
    cluster.write_text(yaml.safe_dump(data))
    refused = up(str(cluster), "--keep")
    assert refused.returncode == 2
    assert (
        "kept cluster 'cloud-test' does not fit this plan: worker-1 is c5.xlarge, the plan "
        "needs c5.2xlarge" in refused.stderr
    )
    assert "Traceback" not in refused.stderr
    assert [i["InstanceId"] for i in instances(clean_region)] == [old["InstanceId"]]

    recreated = up(str(cluster), "--keep", "--recreate")
    assert recreated.returncode == 0, recreated.stdout[-3000:] + recreated.stderr[-3000:]
    assert (
        "--recreate: terminating the 1 instance(s) of kept cluster cloud-test" in recreated.stderr
    )
    (new,) = instances(clean_region, ("running",))
    assert new["InstanceType"] == "c5.2xlarge" and new["InstanceId"] != old["InstanceId"]

    # B reused the cluster, so it knows it now; laptop C (a runs directory and home of its own)
    # never used it: the cluster file names the account, the cloud's tags find the instances
    # and network rules.
    assert (tmp_path / "laptop-b" / ".clusters" / "cloud-test.json").exists()
    laptop_c = ["--runs-dir", str(tmp_path / "laptop-c")]
    (tmp_path / "home-c").mkdir()
    c_env = {"HOME": str(tmp_path / "home-c")}
    down = tflaunch("down", "--cluster", "cloud-test", "-f", str(cluster), *laptop_c, env=c_env,
                    timeout=120)  # fmt: skip
    assert down.returncode == 0, down.stderr
    assert "terminated 1 instance(s) of kept cluster cloud-test" in down.stdout
    assert instances(clean_region) == []
    assert tflaunch_groups(clean_region) == []
    assert (runs / ".clusters" / "cloud-test.json").exists()  # laptop A's, now stale
    again = tflaunch("down", "--cluster", "cloud-test", "--run-dir", str(runs), timeout=120)
    assert again.returncode == 0, again.stderr  # A's own record: nothing left to end
    assert "terminated 0 instance(s) of kept cluster cloud-test" in again.stdout
    assert not (runs / ".clusters" / "cloud-test.json").exists()


def tflaunch_groups(endpoint: str) -> list[str]:
    """The names of tflaunch's security groups (a run's own, a kept cluster's lock)."""
    import boto3

    client = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)
    groups = client.describe_security_groups()["SecurityGroups"]
    return [g["GroupName"] for g in groups if g["GroupName"].startswith("tflaunch-")]


def test_keep_needs_provisioning_and_excludes_down(tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("program: [python3, -c, pass]\n")
    result = tflaunch("up", str(cluster), "--keep", "--down")
    assert result.returncode == 2 and "pick one" in result.stderr
    result = tflaunch("up", str(cluster), "--keep")
    assert result.returncode == 2
    assert "--keep keeps the machines tflaunch makes" in result.stderr
