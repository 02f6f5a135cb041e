"""PBS on tflaunch's batch base: a job script whose ``pbsdsh`` starts one agent per node, and
``qsub``, ``qstat -x -f`` and ``qdel``. Everything else (following, cancelling with the exit-code
promise, status, down, the in-job rendezvous) is the base's."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

from tflaunch.plugin import (
    BatchBackend,
    ConfigError,
    JobState,
    LaunchError,
    placeholder_hosts,
)
from tflaunch_pbs import PbsSection

PENDING, ENDED = set("QHWT"), set("FC")
WALLTIME_CODES = (-11, -29)  # Torque's and PBS Pro's "killed at the walltime"


def pbs_command(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise LaunchError(f"'{argv[0]}' was not found: backend pbs runs where PBS's commands are.")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        raise LaunchError(
            f"'{argv[0]}' did not answer within 60 s; is the PBS server up?"
        ) from None
    if check and done.returncode != 0:
        said = done.stderr.strip() or done.stdout.strip()
        raise LaunchError(f"'{shlex.join(argv)}' failed (exit code {done.returncode}): {said}")
    return done


def shell_code(status: int) -> int:
    """PBS's Exit_status shell-style: 256 + N (killed by signal N) becomes 128 + N."""
    return 128 + status - 256 if status > 256 else status


class PbsBackend(BatchBackend):
    name = "pbs"
    scheduler = "PBS"
    script_file = "job.pbs"
    output_file = "pbs.out"
    time_key = "pbs.walltime"

    def hosts(self, config):
        if config.hosts:
            raise ConfigError(
                f"{config.source}: backend pbs takes its nodes from the job; remove 'hosts:'."
            )
        return placeholder_hosts("pbs-node", config.section(PbsSection).nodes)

    def render(self, config, run) -> str:
        pbs, output = config.section(PbsSection), str(run.dir / self.output_file)
        if re.search(r"\s", output):
            raise ConfigError(f"PBS cannot write the job's output to {output!r}: it has a space.")
        lines = [
            "#!/bin/bash",
            f"#PBS -l nodes={pbs.nodes}:ppn=1",
            "#PBS -j oe",
            f"#PBS -o {output}",
        ]
        lines += [f"#PBS -l walltime={pbs.walltime}"] if pbs.walltime else []
        lines += [f"#PBS -q {pbs.queue}"] if pbs.queue else []
        agent = [pbs.python, "-m", "tflaunch_pbs.node", "--run-dir", str(run.dir)]
        return "\n".join([*lines, *pbs.setup, "pbsdsh -u " + shlex.join(agent), ""])

    def python(self, config) -> str:
        return config.section(PbsSection).python

    def submit_job(self, script: Path, run) -> str:
        return pbs_command(["qsub", str(script)]).stdout.strip()

    def cancel_job(self, job_id: str, check: bool = False) -> None:
        pbs_command(["qdel", job_id], check=check)

    def job_state(self, job_id: str) -> JobState:
        done = pbs_command(["qstat", "-x", "-f", job_id], check=False)
        fields = dict(re.findall(r"^\s*(\w+) = (.*)$", done.stdout, re.M))
        state = fields.get("job_state", "")
        if done.returncode != 0 or not state:
            return JobState("GONE", reason=done.stderr.strip(), ending="failed")
        nodes, reason = fields.get("exec_host", ""), fields.get("comment", "")
        if state not in ENDED:
            return JobState(state, None, reason, nodes, pending=state in PENDING)
        status = int(fields.get("Exit_status", "1"))
        ending = "completed" if status == 0 else "failed"
        ending = "timeout" if status in WALLTIME_CODES else ending
        ending = "cancelled" if status in (271, 143) else ending
        return JobState(state, shell_code(status), reason, nodes, ending=ending)
