"""tflaunch tensorboard on an SSH run: real sshd test hosts (slow, needs root)."""

from __future__ import annotations

import importlib.util
import shutil
import sys

import pytest
import yaml

from tests.helpers import ROOT, free_port_base, tflaunch

pytestmark = [pytest.mark.slow, pytest.mark.ssh]


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None, reason="installed")
def test_tensorboard_missing_on_the_host_is_exit_2(ssh_test_hosts, tmp_path) -> None:
    known = tmp_path / "known_hosts"
    shutil.copy(ssh_test_hosts.known_hosts, known)
    (tmp_path / "work").mkdir()
    host = ssh_test_hosts.hosts[0]
    data = {
        "name": "tb",
        "backend": "ssh",
        "program": {"argv": [sys.executable, "-c", "pass"], "workdir": str(tmp_path / "work")},
        "roles": {"ps": 0, "worker": 1},
        "ports": {"worker": free_port_base()},
        "runs_dir": str(tmp_path / "runs"),
        "hosts": ssh_test_hosts.cluster_hosts(1),
        "ssh": ssh_test_hosts.ssh_section(sys.executable, tmp_path / "remote", known),
    }
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(data))
    assert tflaunch("up", str(cluster), cwd=ROOT, timeout=120).returncode == 0
    run_id = next((tmp_path / "runs").iterdir()).name
    result = tflaunch("tensorboard", run_id, "--runs-dir", str(tmp_path / "runs"), cwd=ROOT)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"TensorBoard is not installed on {host.name}" in result.stderr
