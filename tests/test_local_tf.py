"""End to end with real TensorFlow processes on the local backend (slow: each task imports TF)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import (
    assert_kill_ends_cluster,
    read_until,
    start_tflaunch,
    tflaunch,
    wait_until_gone,
    write_cluster,
)

pytest.importorskip("tensorflow")
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
RESOLVE = Path(__file__).resolve().parent / "programs" / "resolve_tf_config.py"


def test_example_local_trains_to_90_percent_and_leaves_nothing(tmp_path):
    """The README's first command: examples/local.yaml, here on free ports."""
    example = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
    example["program"]["env"] = {"TEST_MARKER": str(tmp_path)}
    cluster = write_cluster(
        tmp_path / "local.yaml", example["program"], name=example["name"], roles=example["roles"]
    )
    result = tflaunch("up", str(cluster), cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    accuracy = [
        float(line.rsplit(":", 1)[1])
        for line in result.stdout.splitlines()
        if line.startswith("[worker:0] test accuracy:")
    ]
    assert accuracy and accuracy[0] > 0.9, result.stdout[-2000:]
    assert "[worker:1] train accuracy:" in result.stdout
    assert wait_until_gone(str(tmp_path)) == []


def test_tf_config_resolves_to_the_plan_and_a_killed_worker_ends_the_cluster(tmp_path):
    cluster = write_cluster(
        tmp_path / "cluster.yaml",
        {
            "argv": [sys.executable, str(RESOLVE)],
            "env": {"TEST_MARKER": str(tmp_path), "WORK_SECONDS": "120"},
        },
        roles={"ps": 1, "worker": 2, "chief": 1},
    )
    plan = json.loads(tflaunch("plan", "--json", str(cluster)).stdout)
    proc = start_tflaunch("up", str(cluster))
    try:
        seen = ""
        while seen.count("resolved: ") < 4:
            seen += read_until(proc.stdout, "resolved: ", timeout=60)
        resolved = {}
        for line in seen.splitlines():
            if "resolved: " in line:
                task = line.split("]", 1)[0].lstrip("[")
                resolved[task] = json.loads(line.split("resolved: ", 1)[1])
        for task in plan["tasks"]:
            got = resolved[f"{task['job']}:{task['index']}"]
            assert got["cluster"] == {j: list(a) for j, a in plan["cluster"].items()}
            assert (got["task_type"], got["task_id"]) == (task["job"], task["index"])
        assert resolved["ps:0"]["cuda_visible_devices"] == ""  # exported, and empty
        assert resolved["ps:0"]["gpus_seen"] == 0

        assert_kill_ends_cluster(proc, str(tmp_path))
    finally:
        proc.kill()
    assert wait_until_gone(str(tmp_path)) == []
