"""A PBS backend written on the batch base, from a package of its own that imports only
tflaunch.plugin (tests/data/pbs_backend, at most 200 lines), installed in a fresh venv and run
against stand-in PBS commands (tests/data/pbs_standin: qsub, qstat, qdel and pbsdsh that really
run the job on this machine, as a one-node PBS would).

Checked as for the built-in backends: ``validate``; ``up`` to success; a failing worker ends the
run with its code and one failure report; Ctrl-C to the launcher exits 130 and leaves nothing
running (by process table); a refused ``qsub`` leaves a ``failed`` run, not a ``lost`` one;
``--detach``, ``status`` and ``down``; a restart policy."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, fake_cluster, read_until, wait_until_gone
from tests.plugin_venv import clean_env, install_venv, run_in

pytestmark = pytest.mark.slow

PACKAGE = ROOT / "tests" / "data" / "pbs_backend"
STANDIN = ROOT / "tests" / "data" / "pbs_standin"


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    return install_venv(tmp_path_factory.mktemp("pbs"), [PACKAGE])


def pbs_env(venv: Path, tmp_path: Path) -> dict[str, str]:
    """The stand-in PBS commands first on PATH, their spool in the test's folder."""
    path = f"{STANDIN}:{venv / 'bin'}:{os.environ['PATH']}"
    return {"PATH": path, "PBS_STANDIN_SPOOL": str(tmp_path / "spool")}


def pbs_cluster(venv: Path, tmp_path: Path, env: dict | None = None, **overrides) -> Path:
    pbs = {"python": str(venv / "bin" / "python"), **overrides.pop("pbs", {})}
    return fake_cluster(tmp_path, env, backend="pbs", pbs=pbs, **overrides)


def tflaunch(venv: Path, tmp_path: Path, *args, timeout: float = 180):
    return run_in([venv / "bin" / "tflaunch", *args], tmp_path, timeout, pbs_env(venv, tmp_path))


def the_run(tmp_path: Path) -> tuple[Path, dict]:
    (run_dir,) = (tmp_path / "runs").iterdir()
    return run_dir, json.loads((run_dir / "run.json").read_text())


def test_the_package_is_small_and_imports_only_the_plugin():
    files = [p for p in PACKAGE.rglob("*") if p.is_file() and "egg-info" not in str(p)]
    assert sum(len(p.read_text().splitlines()) for p in files) <= 200
    for path in PACKAGE.rglob("*.py"):
        imports = [  # of tflaunch itself; the package's own modules (tflaunch_pbs) are its own
            ln
            for ln in path.read_text().splitlines()
            if re.match(r"\s*(from|import) tflaunch[.\s]", ln)
        ]
        assert all(ln.startswith("from tflaunch.plugin import") for ln in imports), path


def test_validate_and_up_run_the_cluster_through_pbs(venv, tmp_path):
    cluster = pbs_cluster(venv, tmp_path, {"WORK_SECONDS": "0.2"})
    validated = tflaunch(venv, tmp_path, "validate", cluster)
    assert validated.returncode == 0, validated.stderr
    assert "3 tasks on 1 host(s), backend pbs" in validated.stdout

    up = tflaunch(venv, tmp_path, "up", cluster)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "submitted PBS job 1.standin for run" in up.stdout
    assert "[worker:1] worker:1 CUDA_VISIBLE_DEVICES=''" in up.stdout  # from the job's output
    run_dir, meta = the_run(tmp_path)
    assert (meta["backend"], meta["state"], meta["exit_code"]) == ("pbs", "succeeded", 0)
    assert meta["job_id"] == "1.standin" and meta["coordinator_host"]
    assert "pbsdsh -u" in (run_dir / "job.pbs").read_text()
    status = tflaunch(venv, tmp_path, "status", run_dir.name, "--run-dir", tmp_path / "runs")
    assert "succeeded (backend pbs" in status.stdout, status.stdout + status.stderr
    assert "PBS job 1.standin: F (nodes " in status.stdout
    assert wait_until_gone(str(tmp_path)) == []


def test_its_section_is_checked_with_the_core_s_messages(venv, tmp_path):
    cluster = pbs_cluster(venv, tmp_path, pbs={"walltme": "01:00:00"})
    result = tflaunch(venv, tmp_path, "validate", cluster)
    assert result.returncode == 2 and "did you mean 'walltime'?" in result.stderr
    cluster = pbs_cluster(venv, tmp_path, pbs={"walltime": "1h"})
    result = tflaunch(venv, tmp_path, "validate", cluster)
    assert result.returncode == 2 and "pbs.walltime: '1h' is not [[HH:]MM:]SS" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_failing_worker_ends_the_job_with_its_code_and_one_report(venv, tmp_path):
    env = {"FAIL_INDEX": "1", "FAIL_CODE": "7", "WORK_SECONDS": "0.5"}
    up = tflaunch(venv, tmp_path, "up", pbs_cluster(venv, tmp_path, env))
    assert up.returncode == 7, up.stdout + up.stderr
    output = up.stdout + up.stderr
    assert output.count("worker:1 on ") == 1 and "exited with code 7" in output
    assert "worker-1.log" in output
    _, meta = the_run(tmp_path)
    assert (meta["state"], meta["exit_code"]) == ("failed", 7)
    assert wait_until_gone(str(tmp_path)) == []


def test_a_refused_submission_is_a_failed_run(venv, tmp_path):
    cluster = pbs_cluster(venv, tmp_path, pbs={"queue": "nosuchqueue"})
    up = tflaunch(venv, tmp_path, "up", cluster)
    assert up.returncode == 2
    assert "Unknown queue" in up.stderr and "Traceback" not in up.stderr
    run_dir, meta = the_run(tmp_path)
    assert meta["state"] == "failed" and "Unknown queue" in meta["message"]
    status = tflaunch(venv, tmp_path, "status", run_dir.name, "--run-dir", tmp_path / "runs")
    assert "failed (backend pbs" in status.stdout and "lost" not in status.stdout


def test_ctrl_c_cancels_the_job_exits_130_and_leaves_nothing(venv, tmp_path):
    cluster = pbs_cluster(venv, tmp_path, {"WORK_SECONDS": "120"})
    proc = subprocess.Popen(
        [venv / "bin" / "tflaunch", "up", cluster],
        cwd=tmp_path,
        env=clean_env(pbs_env(venv, tmp_path)),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        read_until(proc.stdout, "[worker:1] worker:1 CUDA_VISIBLE_DEVICES", 60)
        proc.send_signal(signal.SIGINT)  # the launcher alone, not its process group
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "SIGINT: cancelling PBS job 1.standin" in err
    _, meta = the_run(tmp_path)
    assert (meta["state"], meta["exit_code"]) == ("stopped", 130)
    assert wait_until_gone(str(tmp_path)) == []  # tasks, agents, the job's runner
    assert (tmp_path / "spool" / "1" / "exit").read_text() == "271"  # qdel ended the job


def test_detach_status_and_down(venv, tmp_path):
    cluster = pbs_cluster(venv, tmp_path, {"WORK_SECONDS": "120"})
    up = tflaunch(venv, tmp_path, "up", "--detach", cluster)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip().splitlines()[-1]
    runs = tmp_path / "runs"
    deadline_lines = ""
    for _ in range(100):
        status = tflaunch(venv, tmp_path, "status", run_id, "--run-dir", runs)
        deadline_lines = status.stdout
        if "running (backend pbs" in status.stdout:
            break
    assert "running (backend pbs" in deadline_lines and "PBS job 1.standin: R" in deadline_lines
    down = tflaunch(venv, tmp_path, "down", run_id, "--run-dir", runs)
    assert down.returncode == 0, down.stderr
    assert f"run {run_id} is down (PBS job 1.standin: F)" in down.stdout
    status = tflaunch(venv, tmp_path, "status", run_id, "--run-dir", runs)
    assert "stopped (backend pbs" in status.stdout, status.stdout
    assert wait_until_gone(str(tmp_path)) == []


def test_a_restart_policy_restarts_the_failed_worker_in_the_job(venv, tmp_path):
    env = {"FAIL_INDEX": "1", "FAIL_CODE": "3", "FAIL_RUNS": "1", "WORK_SECONDS": "0.5"}
    restart = {"backoff": 0.2, "worker": "on-failure"}
    cluster = pbs_cluster(
        venv,
        tmp_path,
        env,
        supervision={"grace_period": 2, "ready_timeout": 60, "restart": restart},
    )
    up = tflaunch(venv, tmp_path, "up", cluster)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "worker:1 exited with code 3; restarting it in 0.2 s (restart 1 of at most 3)" in (
        up.stdout
    )
    assert "restarts: worker:1 restarted 1 time(s) (failures: 3)" in up.stdout
    _, meta = the_run(tmp_path)
    assert meta["state"] == "succeeded"
