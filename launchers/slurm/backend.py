"""Slurm backend, login-node side: render the job script, submit it, follow the job, cancel it.

``tflaunch up`` writes ``<run_dir>/<run-id>/job.sbatch`` (see :mod:`tflaunch.launchers.slurm.script`), a
snapshot of the cluster file, and ``slurm.json``; submits with ``sbatch --parsable``; prints the
job id; then follows the job until it ends, streaming the job's output file — where the
coordinator on the first node writes every task's output with a ``[worker:1]`` prefix — and exits
with the run's result (the coordinator's exit code from ``run.json``; Slurm's verdict when the job
ended without one: cancelled, out of time, node failure). Ctrl-C, SIGTERM or SIGHUP while
following cancels the job. ``--detach`` returns after submission.

The run directory must be on a file system that the login node and every compute node share
(``$SCRATCH`` on Piz Daint): the nodes read the plan inputs from it and write logs and events there.

Before submission the plan is made for placeholder nodes ``slurm-node1..N``: that checks the node
count (with the counts in the message) and shows ``tflaunch plan``; the real node names are known
once the job starts, when the first node rewrites ``plan.json``.

``status``, ``logs`` and ``down`` ask Slurm with ``squeue --json`` (``sacct`` once the controller
has forgotten the job, where accounting exists) and cancel with ``scancel``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tflaunch.launchers.base import Backend
from tflaunch.launchers.slurm.node import SETUP_FILE, SNAPSHOT_FILE
from tflaunch.launchers.slurm.script import Layout, ScriptInputs, layout, render_sbatch

from tflaunch.config import ClusterConfig
from tflaunch.coordinator import Outcome
from tflaunch.errors import ConfigError, LaunchError
from tflaunch.plan import Host, Plan
from tflaunch.run import Run

SCRIPT_FILE = "job.sbatch"
FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
    "GONE",
}
ENDED_RUN_STATES = ("succeeded", "failed", "stopped")
COMMAND_TIMEOUT = 60.0
POLL_SECONDS = 0.5


def placeholder_hosts(job: Layout) -> list[Host]:
    """Stand-ins for the nodes Slurm will allocate: worker nodes (with GPUs), then PS nodes."""
    gpus = tuple(str(i) for i in range(job.gpus_per_node))
    names = [f"slurm-node{i + 1}" for i in range(job.nodes)]
    return [Host(n, n, n, gpus) for n in names[: job.worker_nodes]] + [
        Host(n, n, n, ()) for n in names[job.worker_nodes :]
    ]


# --- talking to Slurm --------------------------------------------------------------------------


def _slurm(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise LaunchError(
            f"'{argv[0]}' was not found: backend slurm runs on a Slurm login node "
            "(with the Slurm client commands on PATH)."
        )
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        raise LaunchError(
            f"'{' '.join(argv)}' did not answer within {COMMAND_TIMEOUT:g} s; is "
            "the Slurm controller up?"
        ) from None
    if check and result.returncode != 0:
        raise LaunchError(
            f"'{' '.join(argv)}' failed (exit code {result.returncode}): "
            f"{result.stderr.strip() or result.stdout.strip()}"
        )
    return result


@dataclass(frozen=True)
class JobState:
    """What Slurm says about a job. ``state`` is GONE when Slurm no longer knows it."""

    state: str
    exit_code: int | None = None  # shell-style: 128 + signal for a signalled batch script
    reason: str = ""
    nodes: str = ""

    @property
    def ended(self) -> bool:
        return self.state in FINAL_STATES


def _wait_status_code(status: int) -> int:
    return 128 + (status & 0x7F) if status & 0x7F else status >> 8


def job_state(job_id: str) -> JobState:
    """The job's state from squeue, else sacct (where accounting exists); GONE when neither
    knows the job any more.

    Polling uses squeue's plain format, filtered to the job and cheap; the JSON form (Slurm
    21.08+), which also carries the exit code, is read once the job has ended — in 22.05 it lists
    every job of the cluster whatever ``--jobs`` says.
    """
    plain = _squeue_format_state(job_id)
    if plain is not None and not plain.ended:
        return plain
    return _squeue_json_state(job_id) or plain or _sacct_state(job_id)


def _squeue_json_state(job_id: str) -> JobState | None:
    result = _slurm(["squeue", "--json", "--states=all", f"--jobs={job_id}"], check=False)
    if result.returncode != 0:
        return None
    try:
        jobs = json.loads(result.stdout).get("jobs", [])
    except ValueError:
        return None
    for job in jobs:  # 22.05 lists every job whatever --jobs says: pick ours (component 0)
        if str(job.get("job_id")) == job_id:
            state = job.get("job_state")
            state = state[0] if isinstance(state, list) and state else state
            return JobState(
                str(state),
                _json_exit_code(job.get("exit_code")),
                str(job.get("state_reason", "")),
                str(job.get("nodes", "")),
            )
    return None


def _json_exit_code(code: Any) -> int | None:
    if isinstance(code, int):  # Slurm 21.08-22.05: the batch script's wait status
        return _wait_status_code(code)
    if isinstance(code, dict):  # Slurm 23.02+: {"status": ..., "return_code": {"number": N}}
        number = code.get("return_code")
        number = number.get("number") if isinstance(number, dict) else number
        return number if isinstance(number, int) else None
    return None


def _squeue_format_state(job_id: str) -> JobState | None:
    """squeue's plain format: state, reason and nodes only (no exit code, no user text)."""
    result = _slurm(
        ["squeue", "-h", "--states=all", f"--jobs={job_id}", "-o", "%T|%r|%N"], check=False
    )
    line = (
        result.stdout.strip().splitlines()[0]
        if result.returncode == 0 and result.stdout.strip()
        else ""
    )
    if not line:
        return None
    state, reason, nodes = (line.split("|") + ["", ""])[:3]
    return JobState(state, None, reason, nodes)


def _sacct_state(job_id: str) -> JobState:
    result = _slurm(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"], check=False)
    line = (
        result.stdout.strip().splitlines()[0]
        if result.returncode == 0 and result.stdout.strip()
        else ""
    )
    if not line:
        return JobState("GONE")
    state, _, exit_code = line.partition("|")
    code, _, sig = exit_code.partition(":")
    number = 128 + int(sig) if sig.isdigit() and int(sig) else int(code) if code.isdigit() else None
    return JobState(state.split()[0], number)


def submit(script: Path) -> str:
    """``sbatch --parsable``; returns the job id."""
    result = _slurm(["sbatch", "--parsable", str(script)])
    job_id = result.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise LaunchError(f"sbatch answered {result.stdout.strip()!r}, not a job id.")
    return job_id


# --- following a job ---------------------------------------------------------------------------


class _Tail:
    """New complete lines of a file that may not exist yet."""

    def __init__(self, path: Path, out: IO[str]):
        self.path, self.out = path, out
        self.offset = 0
        self.partial = b""

    def pump(self, final: bool = False) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        if final and self.partial:
            lines.append(self.partial)
            self.partial = b""
        for line in lines:
            self.out.write(line.decode("utf-8", "replace") + "\n")
        self.out.flush()


def output_paths(run: Run, job_id: str) -> tuple[Path, Path | None]:
    """Where the job's stdout and stderr go (None: stderr goes to the stdout file)."""
    setup = json.loads((run.dir / SETUP_FILE).read_text())

    def resolve(path: str) -> Path:
        path = path.replace("%j", job_id).replace("%A", job_id).replace("%x", setup["job_name"])
        return Path(setup["submit_dir"], path.replace("%%", "%"))

    output = resolve(setup["output"]) if setup.get("output") else run.dir / f"slurm-{job_id}.out"
    error = resolve(setup["error"]) if setup.get("error") else None
    return output, error


def follow(run: Run, job_id: str, out: IO[str] = sys.stdout, err: IO[str] = sys.stderr) -> Outcome:
    """Stream the job's output until it ends; Ctrl-C/SIGTERM/SIGHUP cancel it. Returns the result."""
    stdout_path, stderr_path = output_paths(run, job_id)
    tails = [_Tail(stdout_path, out)] + ([_Tail(stderr_path, err)] if stderr_path else [])
    caught: list[int] = []
    previous = _catch_signals(caught)
    cancelled_at: float | None = None
    said = ""
    try:
        while True:
            for tail in tails:
                tail.pump()
            state = job_state(job_id)
            if state.ended:
                break
            if caught and cancelled_at is None:
                cancelled_at = time.monotonic()
                _say(err, f"{signal.Signals(caught[0]).name}: cancelling Slurm job {job_id}")
                run.update_meta(cancel_requested=time.time())
                _slurm(["scancel", job_id], check=False)
            if cancelled_at is not None and time.monotonic() - cancelled_at > 120:
                break  # Slurm is slow to confirm; the job was cancelled all the same
            if state.state == "PENDING" and state.reason not in ("None", "", said):
                said = state.reason
                _say(out, f"job {job_id} is pending ({state.reason})")
            time.sleep(POLL_SECONDS)
    finally:
        _restore_signals(previous)
    time.sleep(POLL_SECONDS)  # the last lines may reach a shared file system a little late
    for tail in tails:
        tail.pump(final=True)
    return _outcome(run, job_id, state, caught[0] if caught else None, err)


def _outcome(run: Run, job_id: str, state: JobState, signum: int | None, err: IO[str]) -> Outcome:
    meta = run.read_meta()
    if meta.get("state") in ENDED_RUN_STATES and "exit_code" in meta and state.state != "TIMEOUT":
        code = int(meta["exit_code"])
        if meta.get("cancel_requested") and meta["state"] == "failed":
            # Slurm's SIGTERM reached some task before the coordinator: still a cancel.
            meta = run.update_meta(state="stopped", message=f"Slurm job {job_id} was cancelled")
        return Outcome(code, meta.get("message", ""), interrupted=meta["state"] == "stopped")
    if signum is not None:
        code, message = 128 + signum, f"Slurm job {job_id} was cancelled"
    elif state.state == "COMPLETED" and state.exit_code == 0:
        code, message = 1, f"Slurm job {job_id} ended without a result from the coordinator"
    elif state.state == "TIMEOUT":
        code, message = 1, f"Slurm job {job_id} reached its time limit (slurm.time)"
    elif state.state == "CANCELLED":
        code, message = 143, f"Slurm job {job_id} was cancelled"
    else:
        code = state.exit_code or 1
        message = f"Slurm job {job_id} ended {state.state} ({state.reason or 'no reason given'})"
    run.update_meta(
        state="stopped" if code in (129, 130, 143) else "failed",
        exit_code=code,
        ended=time.time(),
        message=message,
    )
    err.write(f"tflaunch: run {run.id}: {message}\n")
    err.flush()
    return Outcome(code, message, interrupted=code in (129, 130, 143))


def _catch_signals(caught: list[int]) -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, lambda signum, _f: caught.append(signum))
    return previous


def _restore_signals(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _say(stream: IO[str], message: str) -> None:
    stream.write(f"[tflaunch] {message}\n")
    stream.flush()


# --- the backend -------------------------------------------------------------------------------


class SlurmBackend(Backend):
    name = "slurm"

    def hosts(self, config: ClusterConfig) -> list[Host]:
        if config.hosts:
            raise ConfigError(
                f"{config.source}: backend slurm takes its nodes from the allocation, so 'hosts:' "
                "does not apply; remove it and set slurm.nodes (or leave that out to get as "
                "many nodes as the plan needs)."
            )
        return placeholder_hosts(layout(config))

    def start_agents(self, config: ClusterConfig, plan: Plan, run: Run) -> list:
        raise LaunchError(
            "Slurm starts the agents: one srun step inside the job "
            "(tflaunch.launchers.slurm.node), not the login node."
        )

    def render(self, config: ClusterConfig, run: Run) -> str:
        """The job script of ``run`` (the run directory need not exist yet)."""
        cluster_file = str(Path(config.source).resolve())
        inputs = ScriptInputs(run_id=run.id, run_dir=str(run.dir), cluster_file=cluster_file)
        return render_sbatch(config, layout(config), inputs)

    def prepare(self, config: ClusterConfig, run: Run) -> Path:
        """Write the job script and what the nodes read (cluster file snapshot, slurm.json)."""
        script = run.dir / SCRIPT_FILE
        script.write_text(self.render(config, run))
        snapshot = Path(config.source).read_text()
        (run.dir / SNAPSHOT_FILE).write_text(snapshot)
        setup = {
            "run_id": run.id,
            "cluster_file": str(Path(config.source).resolve()),
            "base_dir": config.base_dir,
            "job_name": config.name,
            "output": config.slurm.output,
            "error": config.slurm.error,
            "submit_dir": os.getcwd(),
        }
        (run.dir / SETUP_FILE).write_text(json.dumps(setup, indent=2) + "\n")
        return script

    def submit(self, config: ClusterConfig, run: Run, out: IO[str] = sys.stdout) -> str:
        script = self.prepare(config, run)
        job_id = submit(script)
        run.update_meta(
            backend=self.name,
            job_id=job_id,
            state="submitted",
            submitted=time.time(),
            script=str(script),
        )
        _say(out, f"submitted Slurm job {job_id} for run {run.id} ({script})")
        return job_id

    def launch(self, config: ClusterConfig, plan: Plan, run: Run, on_ready: Any = None) -> Outcome:
        job_id = self.submit(config, run)
        return follow(run, job_id)

    def detach(
        self, config: ClusterConfig, plan: Plan, run: Run, cluster_file: str, run_root: str
    ) -> str:
        """Submit and return: the job runs on without the login node."""
        self.submit(config, run, out=sys.stderr)
        return run.id

    def dry_run(self, config: ClusterConfig, plan: Plan, run: Run) -> str:
        return self.render(config, run)

    def cluster_alive(self, run: Run) -> bool:
        job_id = run.read_meta().get("job_id")
        return bool(job_id) and not job_state(str(job_id)).ended

    def describe(self, run: Run) -> list[str]:
        """Slurm's view of the run's job, for ``tflaunch status``."""
        job_id = run.read_meta().get("job_id")
        if not job_id:
            return ["Slurm job: not submitted"]
        state = job_state(str(job_id))
        extra = [f"nodes {state.nodes}"] if state.nodes else []
        extra += [f"reason {state.reason}"] if state.reason and state.reason != "None" else []
        extra += (
            [f"exit code {state.exit_code}"] if state.ended and state.exit_code is not None else []
        )
        return [f"Slurm job {job_id}: {state.state}" + (f" ({', '.join(extra)})" if extra else "")]

    def down(self, run: Run, grace: float) -> str:
        """scancel the job and wait (bounded) until Slurm reports it ended."""
        job_id = run.read_meta().get("job_id")
        if not job_id:
            raise LaunchError(
                f"run {run.id} has no Slurm job id in {run.meta_path}; nothing to cancel."
            )
        state = job_state(str(job_id))
        if not state.ended:
            # Slurm signals every process of the step at once, so tasks may report their SIGTERM
            # before the coordinator does: the marker says the run was stopped, not failed.
            run.update_meta(cancel_requested=time.time())
            _slurm(["scancel", str(job_id)])
            deadline = time.monotonic() + grace + 60
            while not state.ended and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)
                state = job_state(str(job_id))
        meta = run.read_meta()
        if meta.get("cancel_requested") and meta.get("state") != "succeeded":
            run.update_meta(
                state="stopped",
                ended=meta.get("ended") or time.time(),
                message=f"cancelled with tflaunch down (scancel {job_id})",
            )
        if not state.ended:
            return f"run {run.id}: Slurm job {job_id} was cancelled but is still {state.state}"
        return f"run {run.id} is down (Slurm job {job_id}: {state.state})"
