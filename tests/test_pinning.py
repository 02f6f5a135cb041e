"""placement.cpus_per_task end to end on the local backend: each task runs bound to its own
cores (read back from inside the task), and too few cores is an error before anything starts."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.helpers import tflaunch, write_cluster

ROOT = Path(__file__).resolve().parent.parent
SHOW = "import os; print('cpus', sorted(os.sched_getaffinity(0)))"
CORES = sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(len(CORES) < 2, reason="needs two usable cores")
def test_each_task_runs_on_its_own_cores(tmp_path) -> None:
    program = {"argv": [sys.executable, "-c", SHOW]}
    cluster = write_cluster(
        tmp_path / "c.yaml", program, roles={"ps": 0, "worker": 2}, placement={"cpus_per_task": 1}
    )
    result = tflaunch("up", str(cluster), cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"[worker:0] cpus [{CORES[0]}]" in result.stdout
    assert f"[worker:1] cpus [{CORES[1]}]" in result.stdout


def test_too_few_cores_is_an_error_before_anything_starts(tmp_path) -> None:
    marker = tmp_path / "started"
    program = {"argv": [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]}
    cluster = write_cluster(
        tmp_path / "c.yaml",
        program,
        roles={"ps": 0, "worker": 2},
        placement={"cpus_per_task": len(CORES)},
    )
    result = tflaunch("up", str(cluster), cwd=ROOT)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"lets tasks use {len(CORES)} cores" in result.stdout + result.stderr
    assert "cpus_per_task" in result.stdout + result.stderr
    assert not marker.exists()
