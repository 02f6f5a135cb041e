"""The Slurm backend end to end on a real Slurm cluster (three slurmd in network namespaces).

``tflaunch up`` submits from the root namespace (the "login node"); the job's agents run in the
node namespaces. TensorFlow-free stand-ins (tests/programs/fake_task.py, tflaunch.models.smoke)
cover supervision and placement; real TensorFlow runs where it is the subject (tests/README.md):
one distributed MNIST run (models/mnist.py, few steps), the PSS requeue and one trace.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.conftest import skip_or_fail
from tests.helpers import (
    FAKE_TASK,
    ROOT,
    free_port_base,
    mnist_argv,
    processes_mentioning,
    start_tflaunch,
    tflaunch,
)
from tests.hosts import slurm_cluster

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

REPORT_ENV = Path(__file__).parent / "programs" / "report_env.py"
NASTY = "a'; echo foo"
MNIST_STEPS = "30"


@pytest.fixture(scope="module")
def cluster():
    reason = slurm_cluster.missing_requirements()
    if reason:
        skip_or_fail(reason)
    with slurm_cluster.session() as conf:
        yield conf


def write_cluster(
    tmp_path: Path,
    argv: list[str],
    roles: dict,
    env: dict | None = None,
    name: str = "slurm-test",
    **sections,
) -> Path:
    base = free_port_base()
    data = {
        "name": name,
        "backend": "slurm",
        "program": {
            "argv": argv,
            "workdir": str(ROOT),
            "env": {"TEST_MARKER": str(tmp_path), **(env or {})},
        },
        "roles": roles,
        "ports": {"ps": base, "worker": base + 10, "chief": base + 8},
        "supervision": {"grace_period": 3, "ready_timeout": 120},
        "runs_dir": str(tmp_path / "runs"),
        "slurm": {"python": sys.executable},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def fake(tmp_path: Path, roles: dict, env: dict | None = None, **sections) -> Path:
    return write_cluster(tmp_path, [sys.executable, str(FAKE_TASK)], roles, env, **sections)


def mnist(tmp_path: Path, roles: dict, **sections) -> Path:
    argv = [
        sys.executable,
        str(REPORT_ENV),
        *mnist_argv(sys.executable, "--train_steps", MNIST_STEPS, "--log_every", "10"),
    ]
    return write_cluster(tmp_path, argv, roles, name="mnist", **sections)


def smoke(tmp_path: Path, roles: dict, **sections) -> Path:
    """The TensorFlow-free stand-in of ``mnist``: the same TF1 flags and TF_CONFIG report; each
    worker reaches every PS, counts three steps and prints 'worker:N done'."""
    argv = [sys.executable, str(REPORT_ENV), *mnist_argv(sys.executable)]
    argv[argv.index("tflaunch.models.mnist")] = "tflaunch.models.smoke"
    argv += ["--steps", "3", "--step-seconds", "0.1"]
    return write_cluster(tmp_path, argv, roles, name="smoke", **sections)


def the_run(tmp_path: Path, root: Path | None = None) -> Path:
    (run,) = [p for p in (root or tmp_path / "runs").iterdir() if (p / "run.json").exists()]
    return run


def leftovers(marker: str) -> list[str]:
    """Task, agent and coordinator processes of this test still alive on any node."""
    return [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in processes_mentioning(marker)]


def wait_gone(marker: str, timeout: float = 15.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and leftovers(marker):
        time.sleep(0.3)
    return leftovers(marker)


def check_tasks_got_their_planned_tf_config(run: Path) -> None:
    plan = json.loads((run / "plan.json").read_text())
    assert {h["name"] for h in plan["hosts"]} == {"node1", "node2", "node3"}
    for task in plan["tasks"]:
        log = (run / task["log_name"]).read_text()
        reported = [
            line.split("=", 1)[1]
            for line in log.splitlines()
            if line.startswith("REPORT_ENV TF_CONFIG=")
        ]
        planned = {
            "cluster": plan["cluster"],
            "task": {"type": task["job"], "index": task["index"]},
        }
        assert [json.loads(r) for r in reported] == [planned], task["log_name"]
        assert planned["task"] == {"type": task["job"], "index": task["index"]}
        for addresses in planned["cluster"].values():
            assert all(a.split(":")[0] in ("node1", "node2", "node3") for a in addresses)


# --- done-when: MNIST, and its stand-in -----------------------------------------------------------


# One real MNIST run on Slurm (TensorFlow's training is the subject); the 2-PS placement is the
# launcher's, and the stand-in proves it at a fraction of the CPU.
@pytest.mark.parametrize(("ps", "program"), [(1, mnist), (2, smoke)], ids=["mnist", "stand-in"])
def test_colocated_ps_three_workers_succeeds(cluster, tmp_path, ps, program) -> None:
    path = program(tmp_path, {"ps": ps, "worker": 3})
    result = tflaunch("up", str(path), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "submitted Slurm job" in result.stdout
    if program is mnist:
        assert "[worker:0] test accuracy:" in result.stdout
    else:
        assert all(f"[worker:{i}] worker:{i} done" in result.stdout for i in range(3))
    run = the_run(tmp_path)
    names = {f"ps-{i}.log" for i in range(ps)} | {f"worker-{i}.log" for i in range(3)}
    assert names <= {p.name for p in run.iterdir()}
    check_tasks_got_their_planned_tf_config(run)
    plan = json.loads((run / "plan.json").read_text())
    hosts = {t["job"] + str(t["index"]): t["host"] for t in plan["tasks"]}
    assert [hosts[f"worker{i}"] for i in range(3)] == ["node1", "node2", "node3"]
    assert [hosts[f"ps{i}"] for i in range(ps)] == ["node1", "node2"][:ps]
    meta = json.loads((run / "run.json").read_text())
    assert meta["state"] == "succeeded" and meta["exit_code"] == 0
    assert wait_gone(str(tmp_path)) == []


def test_dedicated_ps_runs_as_heterogeneous_job(cluster, tmp_path) -> None:
    path = smoke(tmp_path, {"ps": 1, "worker": 2}, placement={"ps": "dedicated"})
    result = tflaunch("up", str(path), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = the_run(tmp_path)
    assert "#SBATCH hetjob" in (run / "job.sbatch").read_text()
    assert "--het-group=0,1" in (run / "job.sbatch").read_text()
    plan = json.loads((run / "plan.json").read_text())
    hosts = {t["job"] + str(t["index"]): t["host"] for t in plan["tasks"]}
    assert hosts == {"worker0": "node1", "worker1": "node2", "ps0": "node3"}
    check_tasks_got_their_planned_tf_config(run)
    assert wait_gone(str(tmp_path)) == []


# --- supervision with stand-in tasks ---------------------------------------------------------------


def test_worker_killed_on_node2_ends_the_job_within_10s(cluster, tmp_path) -> None:
    path = fake(tmp_path, {"ps": 1, "worker": 3}, {"WORK_SECONDS": "120", "SPAWN_CHILD": "1"})
    proc = start_tflaunch("up", str(path))
    try:
        worker = _wait_started(tmp_path, "worker:1", timeout=60)
        assert worker["host"] == "node2"
        killed_at = time.monotonic()
        psutil.Process(worker["pid"]).kill()
        out, err = proc.communicate(timeout=30)
        elapsed = time.monotonic() - killed_at
    finally:
        proc.kill()
    assert elapsed < 10, elapsed
    assert proc.returncode == 137
    report = out + err
    assert "worker:1 on node2 exited with code 137 (SIGKILL)" in report
    assert report.count("worker:1 on node2 exited") == 1  # one failure report
    assert "worker-1.log" in report
    meta = json.loads((the_run(tmp_path) / "run.json").read_text())
    assert meta["state"] == "failed" and meta["exit_code"] == 137
    assert wait_gone(str(tmp_path)) == []


def _wait_started(tmp_path: Path, task: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = tmp_path / "runs"
        for events in runs.glob("*/events.jsonl") if runs.exists() else []:
            for line in events.read_text().splitlines():
                event = json.loads(line)
                if event.get("event") == "started" and event.get("task") == task:
                    return event
        time.sleep(0.2)
    raise AssertionError(f"{task} did not start within {timeout} s")


def test_detach_status_logs_down_leave_no_task_on_any_node(cluster, tmp_path) -> None:
    path = fake(tmp_path, {"ps": 2, "worker": 3}, {"WORK_SECONDS": "300", "SPAWN_CHILD": "1"})
    result = tflaunch("up", "--detach", str(path))
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.strip()
    assert "submitted Slurm job" in result.stderr
    for task in ("ps:0", "ps:1", "worker:0", "worker:1", "worker:2"):
        _wait_started(tmp_path, task, timeout=60)
    runs = str(tmp_path / "runs")
    status = tflaunch("status", "--run-dir", runs, run_id)
    assert status.returncode == 0, status.stderr
    assert "RUNNING (nodes node[1-3])" in status.stdout
    # 5 tasks on 3 nodes, each with a child of its own (started just after the task itself)
    assert _wait_task_processes(str(tmp_path), 10) >= 10
    logs = tflaunch("logs", "--run-dir", runs, run_id)
    assert "[worker:2] worker:2 CUDA_VISIBLE_DEVICES=''" in logs.stdout

    down = tflaunch("down", "--run-dir", runs, run_id)
    assert down.returncode == 0, down.stderr
    assert "is down" in down.stdout and "CANCELLED" in down.stdout
    # Slurm reports the job ended only after its processes are gone: no wait needed here.
    assert leftovers(str(tmp_path)) == []
    for node in slurm_cluster.NODES:
        in_node = [psutil.Process(pid) for pid in _namespace_pids(node.netns)]
        assert {p.name() for p in in_node if p.is_running()} == {"slurmd"}, node.name
    meta = json.loads((the_run(tmp_path) / "run.json").read_text())
    assert meta["state"] == "stopped"


def _wait_task_processes(marker: str, count: int, timeout: float = 15) -> int:
    deadline = time.monotonic() + timeout
    while True:
        found = 0
        for proc in processes_mentioning(marker):
            try:
                found += "TFLAUNCH_TASK" in proc.environ()
            except psutil.Error:
                continue
        if found >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def _namespace_pids(netns: str) -> list[int]:
    out = subprocess.run(
        ["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    return [
        int(p)
        for p in out.split()
        if psutil.pid_exists(int(p)) and psutil.Process(int(p)).status() != psutil.STATUS_ZOMBIE
    ]


def test_workers_get_the_gpus_slurm_gave_their_node(cluster, tmp_path) -> None:
    # Another job holds GPUs 0 and 1 of every node, so Slurm gives this one 2 and 3.
    holder = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--nodes=3",
            "--gpus-per-node=2",
            "--output=/dev/null",
            "--wrap=sleep 300",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()
    try:
        _wait_running(holder)
        path = fake(
            tmp_path,
            {"ps": 1, "worker": 2},
            {"WORK_SECONDS": "0.5"},
            placement={"workers_per_host": 2},
            slurm={"nodes": 1, "gpus_per_node": 2},
        )
        result = tflaunch("up", str(path), timeout=120)
    finally:
        subprocess.run(["scancel", holder], timeout=30, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[worker:0] worker:0 CUDA_VISIBLE_DEVICES='2'" in result.stdout
    assert "[worker:1] worker:1 CUDA_VISIBLE_DEVICES='3'" in result.stdout
    assert "[ps:0]     ps:0 CUDA_VISIBLE_DEVICES=''" in result.stdout
    plan = json.loads((the_run(tmp_path) / "plan.json").read_text())
    assert {t["job"] + str(t["index"]): t["gpus"] for t in plan["tasks"]} == {
        "ps0": [],
        "worker0": ["2"],
        "worker1": ["3"],
    }


def _wait_running(job_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
        if state == "RUNNING":
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not start")


def test_nasty_names_and_paths_reach_slurm_and_the_shell_intact(cluster, tmp_path) -> None:
    weird = tmp_path / NASTY
    weird.mkdir()
    path = fake(
        weird,
        {"ps": 1, "worker": 1},
        {"WORK_SECONDS": "0.2"},
        slurm={"options": [f"--comment={NASTY} # \\ not a comment"]},
    )
    data = yaml.safe_load(path.read_text())
    data["name"] = NASTY
    path.write_text(yaml.safe_dump(data))
    result = tflaunch("up", str(path), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    run = the_run(weird)
    assert (run / "worker-0.log").read_text().splitlines()[-1] == "done"
    # had the run directory's quote escaped the srun line, bash would have run `echo foo`
    job_output = next(run.glob("slurm-*.out")).read_text()
    assert "foo" not in job_output.splitlines()
    job_id = json.loads((run / "run.json").read_text())["job_id"]
    jobs = json.loads(
        subprocess.run(
            ["squeue", "--json", "--states=all"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    )["jobs"]
    (job,) = [j for j in jobs if str(j["job_id"]) == job_id]
    assert job["name"] == NASTY
    assert job["comment"] == f"{NASTY} # \\ not a comment"


def test_cancelled_while_following_stops_the_job(cluster, tmp_path) -> None:
    path = fake(tmp_path, {"ps": 1, "worker": 2}, {"WORK_SECONDS": "300"})
    proc = start_tflaunch("up", str(path))
    try:
        _wait_started(tmp_path, "worker:1", timeout=60)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, out + err  # Ctrl-C's code, as on every backend
    assert "cancelling Slurm job" in err
    assert wait_gone(str(tmp_path)) == []


def test_job_state_from_squeue_json_and_plain_format_agree(cluster) -> None:
    from tflaunch.launchers.slurm.client import job_state, squeue_json_state, squeue_plain_state

    job_id = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--output=/dev/null", "--wrap=exit 3"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()
    deadline = time.monotonic() + 30
    while not job_state(job_id).ended and time.monotonic() < deadline:
        time.sleep(0.2)
    from_json, plain = squeue_json_state(job_id), squeue_plain_state(job_id)
    assert (from_json.state, from_json.exit_code) == ("FAILED", 3)
    assert (plain.state, plain.nodes) == ("FAILED", from_json.nodes)
    assert job_state("999999").state == "GONE"  # unknown to squeue, and no accounting here


def test_env_from_reaches_the_tasks_and_no_run_file(cluster, tmp_path) -> None:
    """program.env_from: sbatch exports the submitting environment; plan.json and the job's
    copy of the cluster file name the variable, never its value."""
    secret = "env-from-secret-4711"
    argv = [sys.executable, "-c", "import os; print('got', os.environ['TFL_SECRET'])"]
    path = write_cluster(tmp_path, argv, {"ps": 0, "worker": 2})
    data = yaml.safe_load(path.read_text())
    data["program"]["env_from"] = ["TFL_SECRET"]
    path.write_text(yaml.safe_dump(data))
    result = tflaunch("up", str(path), timeout=300, env={"TFL_SECRET": secret})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = the_run(tmp_path)
    for log in ("worker-0.log", "worker-1.log"):
        assert f"got {secret}" in (run / log).read_text()
    assert run.stat().st_mode & 0o777 == 0o700
    for name in ("plan.json", "run.json", "cluster.yaml", "job.sbatch", "slurm.json"):
        assert (run / name).stat().st_mode & 0o777 == 0o600, name
        assert secret not in (run / name).read_text(), name


# --- time limit, warning signal, requeue ------------------------------------------------------------


def test_time_limit_warning_checkpoints_requeues_and_the_requeued_job_resumes(
    cluster, tmp_path
) -> None:
    """A run that does not fit its 2-minute limit: Slurm's warning (USR1, 50 s ahead) makes the
    chief checkpoint, tflaunch stops the cluster and requeues the job, and the requeued job
    resumes from that checkpoint and completes; `up` follows it to the end. The program is the
    TensorFlow-free stand-in of models/pss.py (tflaunch.models.smoke --checkpoint-dir): the
    warning, the requeue and the resume are the launcher's; the PSS restart from its checkpoints
    is test_restart_tf's.

    slurmctld checks time limits every 30 s and sends the warning at the first check that is
    within 30 s of the warning time: 40-70 s after each start, once the chief is surely
    training (with 90 s ahead, 0-30 s: sometimes before the chief had started, and the job was
    requeued without a checkpoint). The first job's 900 steps take 0.15 s each, so that its
    training outlasts that and checkpoint_wait; the requeued job ($SLURM_RESTART_COUNT set)
    counts the steps left at once."""
    program = (
        'seconds=0.15; [ "$SLURM_RESTART_COUNT" -gt 0 ] 2>/dev/null && seconds=0; '
        'exec "$0" -m tflaunch.models.smoke --steps 900 --step-seconds "$seconds" '
        '--checkpoint-dir "$1"'
    )
    argv = ["sh", "-c", program, sys.executable, "{checkpoint_dir}"]
    path = write_cluster(
        tmp_path,
        argv,
        {"ps": 1, "worker": 1, "chief": 1},
        name="requeue",
        supervision={"success": "chief"},
        slurm={"time": "2", "signal": "USR1@50", "requeue": 1, "checkpoint_wait": 5},
    )
    result = tflaunch("up", str(path), timeout=600)
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-3000:]
    run = the_run(tmp_path)
    assert "--requeue" in (run / "job.sbatch").read_text()
    job_id = json.loads((run / "run.json").read_text())["job_id"]
    assert f"Slurm job {job_id} is requeued; following it until it ends" in out
    assert "[chief:0]  chief:0: got signal 10: checkpointing now" in out
    saved = int(re.findall(r"saved checkpoint \S+ at step (\d+)", out)[0])
    resumed = int(re.search(r"resumed from \S+ at step (\d+)", out).group(1))
    assert resumed == saved > 0  # the warning's checkpoint, not step 0
    assert "[chief:0]  chief:0 step 900/900" in out
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds.count("coordinator_started") == 2
    assert kinds.count("requeue_scheduled") == 1 and kinds.count("requeueing") == 1
    meta = json.loads((run / "run.json").read_text())
    assert meta["state"] == "succeeded" and meta["exit_code"] == 0
    show = subprocess.run(
        ["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30
    ).stdout
    assert "Restarts=1" in show and "JobState=COMPLETED" in show
    assert wait_gone(str(tmp_path)) == []


# --- up --trace of a plain TensorFlow program ------------------------------------------------------


def test_plain_tf1_program_traced_on_slurm(cluster, tmp_path) -> None:
    """``up --trace`` of a program that knows nothing of tflaunch: the coordinator runs on the
    first node of the allocation and reaches every task's profiler port; one merged trace with
    a track per task lands in the (shared) run directory."""
    pytest.importorskip("tensorflow")
    argv = [sys.executable, str(Path(__file__).parent / "programs" / "tf1_between_graph.py")]
    for flag in ("job_name", "task_index", "ps_hosts", "worker_hosts"):
        argv += [f"--{flag}", "{" + flag + "}"]
    path = write_cluster(tmp_path, argv, {"ps": 1, "worker": 2}, name="traced")
    result = tflaunch("up", str(path), "--trace", "100:10", timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "no trace" not in result.stdout + result.stderr, result.stdout[-3000:]
    trace = json.loads((the_run(tmp_path) / "trace" / "trace.json").read_text())
    names = {
        e["args"]["name"].split()[0] for e in trace["traceEvents"] if e["name"] == "process_name"
    }
    assert names == {"ps:0", "worker:0", "worker:1"}
    assert "ui.perfetto.dev" in result.stdout
    assert wait_gone(str(tmp_path)) == []


def test_a_failed_sbatch_leaves_a_failed_run_never_lost(cluster, tmp_path) -> None:
    """sbatch refuses the job (a partition the cluster does not have): up exits 2 with Slurm's
    words, and the run is listed 'failed' with them, for status and for validate's user."""
    path = fake(tmp_path, {"ps": 1, "worker": 1}, slurm={"partition": "no-such-partition"})
    result = tflaunch("up", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no-such-partition" in result.stderr.lower() or "partition" in result.stderr.lower()
    listed = tflaunch("status", "--runs-dir", str(tmp_path / "runs"), "--json")
    rows = json.loads(listed.stdout)
    assert [row["state"] for row in rows] == ["failed"], rows
    detached = tflaunch("up", "--detach", str(path))
    assert detached.returncode == 2
    rows = json.loads(tflaunch("status", "--runs-dir", str(tmp_path / "runs"), "--json").stdout)
    assert [row["state"] for row in rows] == ["failed", "failed"], rows
