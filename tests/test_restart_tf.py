"""Surviving failures with real TensorFlow: the TF2 ParameterServerStrategy program
(models/pss.py) with a PS, a worker and a chief, losing its PS and then its worker
mid-training, in one run."""

from __future__ import annotations

import json
import re
import sys

from tests.helpers import (
    processes_mentioning,
    read_until,
    tensorflow_module,
    up_until,
    wait_until_gone,
    write_cluster,
)

pytestmark = tensorflow_module()


# Steps are slowed (0.05 s each) so that a task can be killed mid-training, also after the
# cluster was restarted from its checkpoint.
PSS = (
    'exec "$0" -m tflaunch.models.pss --train_steps 300 --step_delay 0.05 '
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
        roles={"ps": 1, "worker": 1, "chief": 1},
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


def test_a_killed_ps_restarts_the_cluster_from_its_checkpoint_then_a_killed_worker_in_place(
    tmp_path,
):
    """One run for what were two tests, each starting its own PSS cluster (2 PS, 2 workers and a
    chief; 16 TensorFlow processes between them, 7 here): the PS killed after the first
    checkpoint restarts the whole cluster, which resumes from that checkpoint; then the worker
    killed mid-training is restarted in place (it alone), and training completes (accuracy >
    0.9). One worker and one PS: the coordinator can only finish once the restarted worker is
    back (with two, the other carried the steps), and a second PS proved nothing."""
    marker = str(tmp_path)
    cluster = pss_cluster(tmp_path, {"worker": "on-failure", "ps": "on-failure"})
    with up_until(cluster, "[chief:0]  saved checkpoint", timeout=240) as (proc, seen):
        checkpoint_step = int(re.findall(r"at global step (\d+)", seen)[-1])
        kill_task(marker, "ps:0")
        seen += read_until(proc.stdout, "resumed from", timeout=300)
        assert "restarting the whole cluster from its checkpoints" in seen
        resumed = int(re.search(r"resumed from \S+ at global step (\d+)", seen).group(1))
        assert resumed >= checkpoint_step > 0
        # mid-training again, in the cluster's second generation
        seen += read_until(proc.stdout, "[chief:0]  global step", timeout=240)
        kill_task(marker, "worker:0")
        seen += read_until(proc.stdout, "succeeded", timeout=300)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert "worker:0 exited with code 137 (SIGKILL); restarting it" in seen
    assert seen.count("restarting the whole cluster") == 1  # the worker's loss did not
    assert "global step 300:" in seen
    assert "worker:0 restarted 1 time(s) (failures: 137 (SIGKILL))" in seen
    assert "the cluster restarted 1 time(s)" in seen
    accuracy = float(re.search(r"test accuracy: ([0-9.]+)", seen).group(1))
    assert accuracy > 0.9
    run, evs = run_events(tmp_path)
    assert [e["task"] for e in evs if e["event"] == "restarting"] == ["worker:0"]
    assert [e["task"] for e in evs if e["event"] == "cluster_restarting"] == ["ps:0"]
    for task in ("ps:0", "chief:0", "worker:0"):
        generations = [
            e["generation"] for e in evs if e["event"] == "started" and e["task"] == task
        ]
        # worker:0 started once more, in place, within the second generation
        assert generations == ([0, 1, 1] if task == "worker:0" else [0, 1]), task
    assert (run / "checkpoints" / "checkpoint").exists()  # the default {checkpoint_dir}
    assert wait_until_gone(marker) == []
