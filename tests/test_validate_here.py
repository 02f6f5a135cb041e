"""``validate`` checks what can be checked from here before starting (the program on PATH, free
ports, hosts that resolve; ``--offline`` skips it), and an ``up`` that fails before any task
starts leaves no run that ``status`` lists as ``created`` or ``lost``."""

from __future__ import annotations

import json
import socket
import sys

from tests.helpers import FAKE_TASK, tflaunch, write_cluster


def cluster(tmp_path, argv, **overrides):
    return write_cluster(tmp_path / "c.yaml", {"argv": argv}, **overrides)


def states(tmp_path) -> list[str]:
    listed = tflaunch("status", "--runs-dir", str(tmp_path / "runs"), "--json")
    assert listed.returncode == 0, listed.stderr
    return [row["state"] for row in json.loads(listed.stdout)]


def test_a_missing_program_fails_validate_and_up_leaves_a_failed_run(tmp_path):
    path = cluster(tmp_path, ["no-such-binary-for-tflaunch"])
    result = tflaunch("validate", str(path))
    assert result.returncode == 2
    assert "the program 'no-such-binary-for-tflaunch' was not found" in result.stderr
    assert "--offline" in result.stderr and "Traceback" not in result.stderr
    offline = tflaunch("validate", "--offline", str(path))
    assert offline.returncode == 0 and ": ok (3 tasks" in offline.stdout
    up = tflaunch("up", str(path))
    assert up.returncode == 2 and "no-such-binary-for-tflaunch" in up.stderr
    assert states(tmp_path) == ["failed"]


def test_a_busy_port_fails_validate_naming_it(tmp_path):
    path = cluster(tmp_path, [sys.executable, str(FAKE_TASK)])
    port = json.loads(tflaunch("plan", "--json", str(path)).stdout)["tasks"][0]["port"]
    with socket.socket() as holder:
        holder.bind(("", port))
        holder.listen()
        result = tflaunch("validate", str(path))
        assert result.returncode == 2, result.stdout
        assert f"port {port} on localhost is already in use" in result.stderr
        up = tflaunch("up", str(path))
        assert up.returncode == 2 and f"port {port}" in up.stderr
    assert states(tmp_path) == ["failed"]
    assert tflaunch("validate", str(path)).returncode == 0  # free again


def test_a_host_that_does_not_resolve_fails_validate(tmp_path):
    path = cluster(
        tmp_path,
        [sys.executable, str(FAKE_TASK)],
        hosts=["localhost", {"name": "nowhere.invalid"}],
    )
    result = tflaunch("validate", str(path))
    assert result.returncode == 2
    assert "host 'nowhere.invalid' does not resolve on this machine" in result.stderr
    assert tflaunch("validate", "--offline", str(path)).returncode == 0


def test_program_env_from_is_checked_here(tmp_path):
    program = {"argv": [sys.executable, str(FAKE_TASK)], "env_from": ["TFLAUNCH_TEST_UNSET_VAR"]}
    path = write_cluster(tmp_path / "c.yaml", program)
    result = tflaunch("validate", str(path))
    assert result.returncode == 2 and "TFLAUNCH_TEST_UNSET_VAR" in result.stderr
    assert tflaunch("validate", "--offline", str(path)).returncode == 0
