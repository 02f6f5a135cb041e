"""A client for Slurm's commands: sbatch, squeue, sacct, scancel and scontrol, with bounded waits.

The only module that runs Slurm's client commands. ``job_state`` asks squeue (plain format while
the job lives, JSON once it ended) and falls back to sacct where accounting exists.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tflaunch.plugin import JobState, LaunchError

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
COMMAND_TIMEOUT = 60.0


def slurm_command(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
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


# Slurm's final states in the base's words (JobState.ending); any other final state: "failed"
ENDINGS = {
    "COMPLETED": "completed",
    "TIMEOUT": "timeout",
    "CANCELLED": "cancelled",
}


def slurm_state(
    state: str, exit_code: int | None = None, reason: str = "", nodes: str = ""
) -> JobState:
    """Slurm's words as the batch base's :class:`JobState`: ``state`` is GONE when Slurm no
    longer knows the job; ``exit_code`` is shell-style (128 + signal for a signalled script)."""
    ending = ENDINGS.get(state, "failed") if state in FINAL_STATES else ""
    return JobState(state, exit_code, reason, nodes, ending=ending, pending=state == "PENDING")


def _wait_status_code(status: int) -> int:
    return 128 + (status & 0x7F) if status & 0x7F else status >> 8


def job_state(job_id: str) -> JobState:
    """The job's state from squeue, else sacct (where accounting exists); GONE when neither
    knows the job any more.

    Polling uses squeue's plain format, filtered to the job and cheap; the JSON form (Slurm
    21.08+), which also carries the exit code, is read once the job has ended — in 22.05 it lists
    every job of the cluster whatever ``--jobs`` says.
    """
    plain = squeue_plain_state(job_id)
    if plain is not None and not plain.ended:
        return plain
    return squeue_json_state(job_id) or plain or _sacct_state(job_id)


def squeue_json_state(job_id: str) -> JobState | None:
    result = slurm_command(["squeue", "--json", "--states=all", f"--jobs={job_id}"], check=False)
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
            return slurm_state(
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


def squeue_plain_state(job_id: str) -> JobState | None:
    """squeue's plain format: state, reason and nodes only (no exit code, no user text)."""
    result = slurm_command(
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
    return slurm_state(state, None, reason, nodes)


def _sacct_state(job_id: str) -> JobState:
    result = slurm_command(
        ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"], check=False
    )
    line = (
        result.stdout.strip().splitlines()[0]
        if result.returncode == 0 and result.stdout.strip()
        else ""
    )
    if not line:
        return slurm_state("GONE")
    state, _, exit_code = line.partition("|")
    code, _, sig = exit_code.partition(":")
    number = 128 + int(sig) if sig.isdigit() and int(sig) else int(code) if code.isdigit() else None
    return slurm_state(state.split()[0], number)


def submit(script: Path) -> str:
    """``sbatch --parsable``; returns the job id."""
    result = slurm_command(["sbatch", "--parsable", str(script)])
    job_id = result.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise LaunchError(f"sbatch answered {result.stdout.strip()!r}, not a job id.")
    return job_id


def cancel(job_id: str, check: bool = False) -> None:
    """``scancel`` the job."""
    slurm_command(["scancel", job_id], check=check)


def requeue(job_id: str) -> None:
    """``scontrol requeue`` the job: Slurm stops it and queues it again under the same id."""
    slurm_command(["scontrol", "requeue", job_id])
