"""Slurm backend, login-node side: the batch base (:mod:`tflaunch.launchers.batch.backend`) with
Slurm's job script, ``sbatch``, ``squeue``/``sacct`` and ``scancel``.

``tflaunch up`` writes ``<run_dir>/<run-id>/job.sbatch`` (see :mod:`tflaunch.launchers.slurm.script`), a
snapshot of the cluster file, and ``slurm.json``; submits with ``sbatch --parsable``; prints the
job id; then follows the job until it ends, streaming the job's output file — where the
coordinator on the first node writes every task's output with a ``[worker:1]`` prefix — and exits
with the run's result (the coordinator's exit code from ``run.json``; Slurm's verdict when the job
ended without one: cancelled, out of time, node failure). Ctrl-C, SIGTERM or SIGHUP while
following cancels the job. ``--detach`` returns after submission. A job requeued (``slurm.requeue``,
or Slurm's own requeue) is followed on through the requeue: its output file is appended to, and the
run ends when the requeued job ends.

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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tflaunch.launchers.slurm import client
from tflaunch.launchers.slurm.script import (
    SCRIPT_FILE,
    SETUP_FILE,
    Layout,
    ScriptInputs,
    SlurmDetails,
    layout,
    render_sbatch,
)
from tflaunch.launchers.slurm.section import SlurmSection
from tflaunch.plugin import (
    BatchBackend,
    ClusterConfig,
    ConfigError,
    Host,
    JobState,
    LaunchError,
    Run,
    placeholder_hosts,
)


def slurm_placeholders(job: Layout) -> list[Host]:
    """Stand-ins for the nodes Slurm will allocate: worker nodes (with GPUs), then PS nodes."""
    return placeholder_hosts("slurm-node", job.worker_nodes, job.gpus_per_node, job.ps_nodes)


class SlurmBackend(BatchBackend):
    name = "slurm"
    scheduler = "Slurm"
    script_file = SCRIPT_FILE
    setup_file = SETUP_FILE
    time_key = "slurm.time"
    details = SlurmDetails

    def hosts(self, config: ClusterConfig) -> list[Host]:
        if config.hosts:
            raise ConfigError(
                f"{config.source}: backend slurm takes its nodes from the allocation, so 'hosts:' "
                "does not apply; remove it and set slurm.nodes (or leave that out to get as "
                "many nodes as the plan needs)."
            )
        return slurm_placeholders(layout(config))

    def render(self, config: ClusterConfig, run: Run) -> str:
        """The job script of ``run`` (the run directory need not exist yet)."""
        cluster_file = str(Path(config.source).resolve())
        inputs = ScriptInputs(run_id=run.id, run_dir=str(run.dir), cluster_file=cluster_file)
        return render_sbatch(config, layout(config), inputs)

    def setup_extra(self, config: ClusterConfig) -> dict[str, Any]:
        """sbatch's output patterns, resolved by :meth:`output_paths`."""
        return {
            "job_name": config.name,
            "output": config.section(SlurmSection).output,
            "error": config.section(SlurmSection).error,
        }

    def output_paths(self, run: Run, job_id: str) -> tuple[Path, Path | None]:
        """Where the job's stdout and stderr go (None: stderr goes to the stdout file)."""
        setup = json.loads((run.dir / SETUP_FILE).read_text())

        def resolve(path: str) -> Path:
            path = path.replace("%j", job_id).replace("%A", job_id).replace("%x", setup["job_name"])
            return Path(setup["submit_dir"], path.replace("%%", "%"))

        output = (
            resolve(setup["output"]) if setup.get("output") else run.dir / f"slurm-{job_id}.out"
        )
        error = resolve(setup["error"]) if setup.get("error") else None
        return output, error

    def submit_job(self, script: Path, run: Run) -> str:
        return client.submit(script)

    def job_state(self, job_id: str) -> JobState:
        return client.job_state(job_id)

    def cancel_job(self, job_id: str, check: bool = False) -> None:
        client.cancel(job_id, check=check)

    def check_environment(self, config: ClusterConfig, environ: Mapping[str, str]) -> None:
        """sbatch passes this environment to the job, and program.env_from relies on that."""
        export = environ.get("SBATCH_EXPORT", "ALL")
        if config.program.env_from and not export.startswith("ALL"):
            raise LaunchError(
                f"SBATCH_EXPORT={export} would keep sbatch from passing program.env_from "
                f"({', '.join(config.program.env_from)}) to the job; unset SBATCH_EXPORT."
            )

    def python(self, config: ClusterConfig) -> str:
        return config.section(SlurmSection).python
