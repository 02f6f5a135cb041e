"""Surviving failures with real TensorFlow: the TF2 ParameterServerStrategy program
(models/pss.py) with 2 PS, 2 workers and a chief, losing a worker or a PS mid-training."""

from __future__ import annotations

import json
import re
import sys

import pytest

from tests.helpers import (
    processes_mentioning,
    read_until,
    up_until,
    wait_until_gone,
    write_cluster,
)

pytest.importorskip("tensorflow")
pytestmark = pytest.mark.slow


# Steps are slowed (0.05 s each) so that a task can be killed mid-training; once the whole
# cluster was restarted ($TFLAUNCH_CLUSTER_RESTARTS > 0) the resumed training runs at full speed.
PSS = (
    'delay=0.05; [ "$TFLAUNCH_CLUSTER_RESTARTS" -gt 0 ] 2>/dev/null && delay=0; '
    'exec "$0" -m tflaunch.models.pss --train_steps 300 --step_delay "$delay" '
    '--checkpoint_steps 50 --checkpoint_dir "$1"'
)


def pss_cluster(tmp_path, restart: dict):
    program = {
        "argv": ["sh", "-c", PSS, sys.executable, "{checkpoint_dir}"],
        "env": {"TEST_MARKER": str(tmp_path)},
    }
    return write_cluster(
        tmp_path / "cluster.yaml",
        program,
        roles={"ps": 2, "worker": 2, "chief": 1},
        supervision={
            "success": "chief",
            "ready_timeout": 120,
            "restart": {"backoff": 0.5, **restart},
        },
    )


def kill_task(marker: str, task: str) -> None:
    (victim,) = [
        p for p in processes_mentioning(marker) if p.environ().get("TFLAUNCH_TASK") == task
    ]
    victim.kill()


def run_events(tmp_path):
    (run,) = (tmp_path / "runs").iterdir()
    return run, [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def test_worker_killed_mid_training_is_restarted_and_training_completes(tmp_path):
    marker = str(tmp_path)
    cluster = pss_cluster(tmp_path, {"worker": "on-failure"})
    with up_until(cluster, "[chief:0]  global step 100:", timeout=240) as (proc, _):
        kill_task(marker, "worker:1")
        seen = read_until(proc.stdout, "succeeded", timeout=240)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert "worker:1 exited with code 137 (SIGKILL); restarting it" in seen
    assert "global step 300:" in seen
    assert "restarts: worker:1 restarted 1 time(s) (failures: 137 (SIGKILL))" in seen
    accuracy = float(re.search(r"test accuracy: ([0-9.]+)", seen).group(1))
    assert accuracy > 0.9
    _, evs = run_events(tmp_path)
    assert [e["task"] for e in evs if e["event"] == "restarting"] == ["worker:1"]
    assert wait_until_gone(marker) == []


def test_ps_killed_restarts_the_cluster_which_resumes_from_its_checkpoint(tmp_path):
    marker = str(tmp_path)
    cluster = pss_cluster(tmp_path, {"ps": "on-failure"})
    with up_until(cluster, "[chief:0]  saved checkpoint", timeout=240) as (proc, saved):
        checkpoint_step = int(re.findall(r"at global step (\d+)", saved)[-1])
        kill_task(marker, "ps:1")
        seen = read_until(proc.stdout, "succeeded", timeout=300)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert "restarting the whole cluster from its checkpoints" in seen
    resumed = int(re.search(r"resumed from \S+ at global step (\d+)", seen).group(1))
    assert resumed >= checkpoint_step > 0
    run, evs = run_events(tmp_path)
    for task in ("ps:0", "ps:1", "chief:0", "worker:0", "worker:1"):
        generations = [
            e["generation"] for e in evs if e["event"] == "started" and e["task"] == task
        ]
        assert generations == [0, 1], task
    assert (run / "checkpoints" / "checkpoint").exists()  # the default {checkpoint_dir}
    assert wait_until_gone(marker) == []
