"""What the cloud tests share: AWS credentials for moto only, a clean stand-in region, cluster
files that provision (EC2 through moto, instances played by the SSH test hosts), and the
instances the stand-in holds. ``conftest.py`` re-exports the fixtures; tests import the helpers
from here (never from another test module)."""

from __future__ import annotations

import functools
import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import FAKE_TASK, ROOT
from tflaunch.cluster.config import parse_config
from tflaunch.launchers.clouds import base, state
from tflaunch.launchers.clouds.ec2.provider import ADDRESS_MAP_ENV

HEAD = "program: [python, train.py]\nbackend: ssh\n"


def provision_config(tmp_path: Path, extra: str = "", endpoint: str | None = None, **over):
    text = provision_text(extra, endpoint, **over)
    return parse_config(text, source=str(tmp_path / "c.yaml"), base_dir=str(tmp_path))


def provision_text(extra: str = "", endpoint: str | None = None, **over) -> str:
    lines = [
        "ssh:",
        f"  port: {over.get('ssh_port', 22)}",
        "  provision:",
        "    image: ami-12c6146b",
        "    region: us-east-1",
        "    ssh_from: 198.51.100.7/32",
        "    ps_instance_type: c5.xlarge",
        f"    worker_instance_type: {over.get('worker_type', 'p3.2xlarge')}",
        "    ready_timeout: 20",
    ]
    if endpoint:
        lines.append(f"    endpoint_url: {endpoint}")
    return over.get("head", HEAD) + extra + "\n".join(lines) + "\n" + over.get("more", "")


def uploads_stay_in(tmp_path: Path, data: dict) -> None:
    """The test hosts share this machine's disk: a file uploaded into a workdir outside the
    test's folder (the checkout, say) is a stray copy there, left behind after the test."""
    workdir = Path(data["program"].get("workdir", "."))
    assert not data["ssh"].get("upload") or workdir.is_relative_to(tmp_path), (
        f"ssh.upload would copy {data['ssh']['upload']} into {workdir}, outside the test's "
        "folder; upload nothing there, or keep the workdir under tmp_path"
    )


@pytest.fixture()
def aws_env(aws_credentials, monkeypatch):
    """The stand-in's credentials; it answers at once, so poll quickly."""
    monkeypatch.setattr(base, "POLL_SECONDS", 0.1)
    monkeypatch.setattr(state, "POLL_SECONDS", 0.1)


def python_here(tmp_path: Path) -> str:
    """The hosts' interpreter, importing this checkout's tflaunch (the hosts share the disk)."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec env PYTHONPATH={ROOT} {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def cloud_cluster(
    tmp_path: Path,
    hosts,
    endpoint: str,
    monkeypatch,
    env: dict[str, str] | None = None,
    **overrides,
) -> Path:
    """Three provisioned worker instances (PS co-located), mapped onto the three test hosts;
    ``env``: the stand-in's settings (WORK_SECONDS, FAIL_INDEX, ...) beside its TEST_MARKER."""
    known = tmp_path / "known_hosts"
    shutil.copy(hosts.known_hosts, known)
    names = ["worker-1", "worker-2", "worker-3"]
    mapping = {
        name: {"connect": h.public_address, "address": h.private_address}
        for name, h in zip(names, hosts.hosts, strict=True)
    }
    (tmp_path / "addresses.json").write_text(json.dumps(mapping))
    monkeypatch.setenv(ADDRESS_MAP_ENV, str(tmp_path / "addresses.json"))
    data = {
        "name": "cloud-test",
        "backend": "ssh",
        "program": {
            "argv": [sys.executable, "fake_task.py"],
            "workdir": str(tmp_path / "work"),
            "env": {"TEST_MARKER": str(tmp_path)},
        },
        "roles": {"ps": 2, "worker": 3},
        "supervision": {"grace_period": 2, "heartbeat": 1, "heartbeat_timeout": 6},
        "runs_dir": str(tmp_path / "runs"),
        "ssh": hosts.ssh_section(
            python_here(tmp_path),
            tmp_path / "remote",
            known,
            upload=[str(FAKE_TASK)],
            provision={
                "image": "ami-12c6146b",
                "region": "us-east-1",
                "endpoint_url": endpoint,
                "worker_instance_type": "c5.xlarge",
                "ssh_from": f"{hosts.launcher_address}/32",
                "ready_timeout": 30,
            },
        ),
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    data["program"].setdefault("env", {}).update(env or {})
    uploads_stay_in(tmp_path, data)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def kept_cluster(
    tmp_path: Path, hosts, endpoint: str, monkeypatch, setup_seconds: float = 3.0
) -> Path:
    """One provisioned worker instance (PS co-located) whose code (the stand-in task and
    ``src/notes.txt``) comes by ssh.sync; a setup line of ``setup_seconds`` stands for
    installing requirements: the first ``up --keep`` pays for it, a reuse not."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "fake_task.py").write_text(FAKE_TASK.read_text())
    (source / "notes.txt").write_text("version 1\n")
    cluster = cloud_cluster(tmp_path, hosts, endpoint, monkeypatch, roles={"ps": 1, "worker": 1})
    data = yaml.safe_load(cluster.read_text())
    setup = [f"sleep {setup_seconds:g}; echo set up"]
    data["ssh"].update(upload=[], sync=str(source), setup=setup, setup_once=True)
    cluster.write_text(yaml.safe_dump(data))
    return cluster


@pytest.fixture()
def cloud_file(ssh_test_hosts, tmp_path, clean_region, monkeypatch):
    """:func:`cloud_cluster` for this test's hosts, folder and clean region:
    ``cloud_file(env=..., **overrides)`` writes the cluster file and returns its path."""
    return functools.partial(cloud_cluster, tmp_path, ssh_test_hosts, clean_region, monkeypatch)


LIVE_STATES = ("pending", "running", "stopping", "stopped")  # an instance that may still bill


def instances(endpoint: str, states=LIVE_STATES) -> list[dict]:
    import boto3

    client = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)
    found = client.describe_instances(
        Filters=[{"Name": "tag:tflaunch:cluster", "Values": ["cloud-test"]},
                 {"Name": "instance-state-name", "Values": list(states)}]
    )  # fmt: skip
    return [i for r in found["Reservations"] for i in r["Instances"]]


@pytest.fixture(autouse=True)
def region_left_clean(request):
    """The stand-in serves a whole module: whatever a test left in it (a test that failed
    half-way through an 'up --keep', say) is ended after it, so that the next test does not find
    a kept cluster or a lock of this one's. Only instances and lock groups: what tests look for."""
    endpoint = (
        request.getfixturevalue("ec2_endpoint") if "ec2_endpoint" in request.fixturenames else None
    )
    yield
    if endpoint is not None:
        sweep_region(endpoint)


def sweep_region(endpoint: str) -> None:
    """Terminate every instance of the stand-in and delete every kept-cluster lock group."""
    import boto3

    client = boto3.client(
        "ec2",
        region_name="us-east-1",
        endpoint_url=endpoint,
        aws_access_key_id="testing",  # the test's credentials may be undone by now
        aws_secret_access_key="testing",
    )
    live = client.describe_instances(
        Filters=[{"Name": "instance-state-name", "Values": list(LIVE_STATES)}]
    )["Reservations"]
    ids = [i["InstanceId"] for r in live for i in r["Instances"]]
    if ids:
        client.terminate_instances(InstanceIds=ids)
    for group in client.describe_security_groups()["SecurityGroups"]:
        if group["GroupName"].startswith("tflaunch-lock-"):
            client.delete_security_group(GroupId=group["GroupId"])


@pytest.fixture()
def clean_region(ec2_endpoint, aws_env):  # noqa: F811 (aws_env is imported)
    """No instance of an earlier test of this module is left running in the stand-in."""
    assert instances(ec2_endpoint) == []
    yield ec2_endpoint
    assert instances(ec2_endpoint) == []
