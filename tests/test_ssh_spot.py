"""Spot workers that come back: during a provisioned run, one worker's instance is terminated
through the EC2 API (moto's server); tflaunch sees it from the provider, creates a replacement of
the same host name, role and type (mapped onto the same namespace test host by the test-only
address map), prepares it as at the start and restarts the cluster from its checkpoints, within
``supervision.restart.max_cluster_restarts``. Nothing is left running afterwards."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.helpers import read_until, start_tflaunch
from tests.hosts import ssh_hosts
from tests.test_ssh_cloud import ROOT, clean_region, cloud_cluster, instances  # noqa: F401
from tests.test_ssh_provision import aws_env  # noqa: F401 (a fixture)

ssh_test_hosts = ssh_hosts.ssh_test_hosts  # the session fixture

pytestmark = [pytest.mark.slow, pytest.mark.ssh]


def terminate_host(endpoint: str, host: str) -> str:
    """Terminate the running instance that is ``host`` (as AWS reclaiming a spot instance)."""
    import boto3

    (victim,) = [
        i
        for i in instances(endpoint, ("running",))
        if {t["Key"]: t["Value"] for t in i["Tags"]}["tflaunch:host"] == host
    ]
    client = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)
    client.terminate_instances(InstanceIds=[victim["InstanceId"]])
    return victim["InstanceId"]


def events_of(tmp_path: Path) -> list[dict]:
    (run,) = (p for p in (tmp_path / "runs").iterdir() if not p.name.startswith("."))
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def spot_cluster(tmp_path, hosts, endpoint, monkeypatch, **overrides) -> Path:
    import yaml

    cluster = cloud_cluster(tmp_path, hosts, endpoint, monkeypatch, **overrides)
    data = yaml.safe_load(cluster.read_text())
    data["ssh"]["provision"]["spot_workers"] = True
    cluster.write_text(yaml.safe_dump(data))
    return cluster


def test_a_reclaimed_spot_worker_is_replaced_and_training_resumes(
    ssh_test_hosts,
    tmp_path,
    clean_region,  # noqa: F811 (imported, a fixture)
    monkeypatch,
):
    pytest.importorskip("tensorflow")
    argv = [
        sys.executable, "-m", "tflaunch.models.pss", "--train_steps", "600",
        "--step_delay", "0.05", "--checkpoint_steps", "50", "--checkpoint_dir", "{checkpoint_dir}",
    ]  # fmt: skip
    cluster = spot_cluster(
        tmp_path,
        ssh_test_hosts,
        clean_region,
        monkeypatch,
        program={"argv": argv, "workdir": str(ROOT), "env": {"TEST_MARKER": str(tmp_path)}},
        roles={"ps": 1, "worker": 2, "chief": 1},
        supervision={
            "success": "chief",
            "ready_timeout": 180,
            "heartbeat": 1,
            "heartbeat_timeout": 20,
            "grace_period": 5,
            "restart": {
                "worker": "on-failure",
                "ps": "exit-code",
                "chief": "exit-code",
                "max_cluster_restarts": 1,
                "backoff": 0.5,
            },  # fmt: skip
        },
    )
    proc = start_tflaunch("up", str(cluster), "--down")
    try:
        saved = read_until(proc.stdout, "[chief:0]  saved checkpoint", timeout=300)
        step = int(re.findall(r"at global step (\d+)", saved)[-1])
        old = terminate_host(clean_region, "worker-3")
        seen = read_until(proc.stdout, "succeeded", timeout=400)
        assert proc.wait(timeout=120) == 0, proc.stderr.read()[-3000:]
        err = proc.stderr.read()
    finally:
        proc.kill()
    assert step > 0
    resumed = re.search(r"resumed from .* at global step (\d+)", seen)
    assert resumed and int(resumed.group(1)) > 0, seen[-3000:]
    (replaced,) = [e for e in events_of(tmp_path) if e["event"] == "instance_replaced"]
    assert replaced["host"] == "worker-3" and replaced["old"] == old
    assert replaced["new"] != old
    assert f"replaced instance of worker-3: {old} (ended) -> {replaced['new']}" in err
    assert instances(clean_region, ("pending", "running")) == []


def test_past_the_restart_limit_a_reclaimed_worker_fails_the_run(
    ssh_test_hosts,
    tmp_path,
    clean_region,  # noqa: F811 (imported, a fixture)
    monkeypatch,
):
    cluster = spot_cluster(
        tmp_path,
        ssh_test_hosts,
        clean_region,
        monkeypatch,
        program={"env": {"TEST_MARKER": str(tmp_path), "WORK_SECONDS": "120"}},
        supervision={"restart": {"worker": "on-failure", "max_cluster_restarts": 0}},
    )
    proc = start_tflaunch("up", str(cluster), "--down")
    try:
        read_until(proc.stdout, "[worker:2]", timeout=120)
        old = terminate_host(clean_region, "worker-2")
        code = proc.wait(timeout=120)
        err = proc.stderr.read()
    finally:
        proc.kill()
    assert code != 0
    assert f"host worker-2 stopped answering: its instance {old} is" in err, err[-3000:]
    assert "supervision.restart.max_cluster_restarts (0)" in err
    assert "terminating 3 instance(s)" in err
    assert instances(clean_region, ("pending", "running")) == []
    assert not [e for e in events_of(tmp_path) if e["event"] == "instance_replaced"]
