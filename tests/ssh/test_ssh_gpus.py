"""SSH: hosts whose GPU count the cluster file leaves open get what pre-flight's nvidia-smi finds
(real sshd in the namespace test hosts; a stand-in nvidia-smi on the hosts' PATH lists 2 GPUs,
since this machine has none)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.helpers import FAKE_SMI, ROOT, tflaunch
from tests.ssh.fixtures import only_run, ssh_cluster, wait_hosts_clean

pytestmark = [pytest.mark.slow, pytest.mark.ssh]


def test_pre_flight_gpus_are_used_where_the_file_gives_none_and_said(ssh_test_hosts, tmp_path):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text(
        FAKE_SMI.replace(
            '[ "$1" = "-L" ] || exit 9', '[ "$1" = "-L" ] || { echo 0; echo 1; exit 0; }'
        )
    )
    (fake_bin / "nvidia-smi").chmod(0o755)
    python = tmp_path / "python-with-gpus"
    python.write_text(
        f'#!/bin/sh\nPATH={fake_bin}:$PATH PYTHONPATH={ROOT} exec {__import__("sys").executable} "$@"\n'
    )
    python.chmod(0o755)
    cluster = ssh_cluster(tmp_path, ssh_test_hosts)
    data = yaml.safe_load(cluster.read_text())
    data["ssh"]["python"] = str(python)
    data["roles"] = {"ps": 1, "worker": len(data["hosts"])}
    data["hosts"][0]["gpus"] = 0  # the file says none here: kept on CPU, with a warning
    cluster.write_text(yaml.safe_dump(data))
    result = tflaunch("up", str(cluster), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    first, *others = [h["name"] for h in data["hosts"]]
    for name in others:
        assert f"{name}: using the 2 GPU(s) nvidia-smi lists there (pre-flight)" in result.stderr
    assert f"{first}: using" not in result.stderr
    assert "gives the host 0 (hosts[0].gpus)" in result.stderr
    plan = json.loads((only_run(tmp_path) / "plan.json").read_text())
    gpus = {t["host"]: t["gpus"] for t in plan["tasks"] if t["job"] == "worker"}
    assert gpus == {first: [], **{name: ["0", "1"] for name in others}}
    for task in plan["tasks"]:
        if task["job"] == "worker":
            expected = "'0,1'" if task["host"] != first else "''"
            name = f"worker:{task['index']}"
            assert f"[{name}] {name} CUDA_VISIBLE_DEVICES={expected}" in result.stdout
    assert wait_hosts_clean(ssh_test_hosts, 10) == []
