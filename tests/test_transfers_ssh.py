"""The benchmark's transfer order and staged variables on the SSH backend (real TensorFlow on the
SSH test hosts: one PS host and one worker host; tests/test_transfers.py's local runs check two
workers). Apart from tests/test_transfers.py so that its local runs and pure tests spread over
the workers instead of joining the SSH hosts' group."""

from __future__ import annotations

import re

import pytest

from tests.helpers import ROOT, checkout_python, tflaunch, tiny_benchmark_argv, write_cluster
from tests.hosts import ssh_hosts

ssh_test_hosts = ssh_hosts.ssh_test_hosts  # the session fixture


@pytest.mark.slow
@pytest.mark.ssh
def test_tic_and_staged_on_the_ssh_backend(ssh_test_hosts, tmp_path) -> None:
    argv = tiny_benchmark_argv(["--staged_vars", "--transfer_order", "tic"])
    program = {"argv": argv, "workdir": str(ROOT), "env": {"TEST_MARKER": str(tmp_path)}}
    cluster = write_cluster(
        tmp_path / "c.yaml",
        program,
        backend="ssh",
        roles={"ps": 1, "worker": 1},
        placement={"ps": "dedicated", "workers_per_host": 1},
        supervision={"ready_timeout": 300},
        hosts=ssh_test_hosts.cluster_hosts(2),
        ssh=ssh_test_hosts.ssh_section(checkout_python(tmp_path), tmp_path / "remote"),
    )
    result = tflaunch("up", str(cluster), cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "transfer order tic: 190 variables in 8 buckets" in result.stdout
    assert "staged variables:" in result.stdout
    totals = re.findall(r"^\[worker:\d\]\s+total images/sec: ([\d.]+)$", result.stdout, re.M)
    assert len(totals) == 1 and float(totals[0]) > 0
