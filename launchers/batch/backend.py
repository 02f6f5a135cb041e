"""The login side of a batch scheduler's backend: write the job script, submit it, follow the job.

``tflaunch up`` writes the job script (``script_file``), a snapshot of the cluster file
(``cluster.yaml``) and the job's setup (``setup_file``: what the nodes need beside the file, such
as the variables ``--trace`` added to ``program.env``) into the run directory; submits the script;
prints the job id; follows the job's console output — where the coordinator on the first node
writes every task's output with a ``[worker:1]`` prefix — until the job ends; and exits with the
run's result (the coordinator's exit code from ``run.json``, else the scheduler's verdict).

Promises kept here once, for every scheduler:

- Ctrl-C, SIGTERM or SIGHUP while submitting or following cancels the job, and ``up`` exits
  128 + the signal (130, 143, 129) with the run ``stopped``, whatever the tasks reported while
  they were stopped.
- A submission that fails ends the run ``failed`` with the scheduler's message (never ``lost``).
- ``status`` asks the scheduler (:meth:`BatchBackend.cluster_alive`, :meth:`~BatchBackend.describe`),
  not this machine's process table; ``down`` cancels the job and waits, bounded, for its end.

A scheduler fills in five hooks: :meth:`~BatchBackend.render` (the script),
:meth:`~BatchBackend.submit_job`, :meth:`~BatchBackend.job_state`, :meth:`~BatchBackend.cancel_job`
and ``hosts`` (placeholders for the nodes it will allocate, :func:`placeholder_hosts`); the
script starts ``python -m <its node module>`` on every node, which hands over to
:func:`tflaunch.launchers.batch.job.main`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from abc import abstractmethod
from pathlib import Path
from typing import IO, Any, ClassVar

from tflaunch.cluster.config import ClusterConfig, parse_config
from tflaunch.cluster.plan import Host, Plan
from tflaunch.errors import LaunchError, TflaunchError
from tflaunch.launchers.base import Backend, LaunchOptions
from tflaunch.launchers.batch.follow import follow, say
from tflaunch.launchers.batch.state import BatchDetails, JobState
from tflaunch.runtime.run import Outcome, Run
from tflaunch.runtime.runfiles import write_run_file
from tflaunch.runtime.signals import CaughtSignals

SETUP_FILE = "job.json"  # the job's setup, read by its nodes (a scheduler may name it otherwise)
SNAPSHOT_FILE = "cluster.yaml"  # the cluster file as it was submitted


def placeholder_hosts(
    prefix: str, worker_nodes: int, gpus_per_node: int = 0, ps_nodes: int = 0
) -> list[Host]:
    """Stand-ins for the nodes a job will get (``<prefix>1..N``): worker nodes with their GPUs,
    then dedicated PS nodes. The plan made on them checks the node count and shows ``plan``; the
    first node plans again on the real names once the job runs."""
    gpus = tuple(str(i) for i in range(gpus_per_node))
    names = [f"{prefix}{i + 1}" for i in range(worker_nodes + ps_nodes)]
    return [Host(n, n, n, gpus) for n in names[:worker_nodes]] + [
        Host(n, n, n, ()) for n in names[worker_nodes:]
    ]


class BatchBackend(Backend):
    """A backend whose agents a batch scheduler starts, inside a job."""

    scheduler: ClassVar[str] = ""  # its name in messages: "Slurm", "PBS"
    script_file: ClassVar[str] = "job.sh"
    setup_file: ClassVar[str] = SETUP_FILE
    output_file: ClassVar[str] = "job.out"  # the job's console output, in the run directory
    time_key: ClassVar[str] = ""  # the cluster file's walltime key ("slurm.time"), for messages
    details: ClassVar[type[BatchDetails]] = BatchDetails
    poll_seconds: ClassVar[float] = 0.5
    cancel_wait: ClassVar[float] = 120.0  # seconds a cancelled job may take to end

    # --- what a scheduler fills in ------------------------------------------------------------

    @abstractmethod
    def render(self, config: ClusterConfig, run: Run) -> str:
        """The job script (pure: the run directory need not exist yet)."""

    @abstractmethod
    def submit_job(self, script: Path, run: Run) -> str:
        """Submit ``script``; the job id. A refusal is a LaunchError with the scheduler's words."""

    @abstractmethod
    def job_state(self, job_id: str) -> JobState:
        """The job's state now (an ended one once the scheduler forgot it)."""

    @abstractmethod
    def cancel_job(self, job_id: str, check: bool = False) -> None:
        """Ask the scheduler to end the job (``check``: a refusal is a LaunchError)."""

    def output_paths(self, run: Run, job_id: str) -> tuple[Path, Path | None]:
        """Where the job's stdout and stderr go (None: into stdout's file). Default: the run
        directory's ``output_file``, where the script sends both."""
        return run.dir / self.output_file, None

    def setup_extra(self, config: ClusterConfig) -> dict[str, Any]:
        """What the scheduler's nodes or :meth:`output_paths` need in the setup file beyond the
        base's fields."""
        return {}

    # --- the base ------------------------------------------------------------------------------

    def start_agents(self, config: ClusterConfig, plan: Plan, run: Run) -> list:
        raise LaunchError(
            f"{self.scheduler} starts the agents inside the job (one per node), not the login node."
        )

    def dry_run(self, config: ClusterConfig, plan: Plan, run: Run) -> str:
        return self.render(config, run)

    def prepare(self, config: ClusterConfig, run: Run) -> Path:
        """Write the job script and what the nodes read (cluster file snapshot, setup file)."""
        script = run.dir / self.script_file
        write_run_file(script, self.render(config, run))
        snapshot = Path(config.source).read_text()
        write_run_file(run.dir / SNAPSHOT_FILE, snapshot)
        filed = parse_config(snapshot, config.source, config.base_dir).program.env
        setup = {
            "run_id": run.id,
            "cluster_file": str(Path(config.source).resolve()),
            "base_dir": config.base_dir,
            "submit_dir": os.getcwd(),
            # what the launcher set beyond the file (up --trace's variables): the nodes plan
            # from the snapshot, so they add it back
            "program_env": {k: v for k, v in config.program.env.items() if filed.get(k) != v},
            **self.setup_extra(config),
        }
        write_run_file(run.dir / self.setup_file, json.dumps(setup, indent=2) + "\n")
        return script

    def submit(self, config: ClusterConfig, run: Run, out: IO[str] = sys.stdout) -> str:
        """Prepare and submit; the job id. A failed submission ends the run ``failed``."""
        try:
            script = self.prepare(config, run)
            job_id = self.submit_job(script, run)
        except TflaunchError as err:
            run.finish(Outcome(err.exit_code, str(err)))
            raise
        run.update_part(
            self.details,
            backend=self.name,
            job_id=job_id,
            state="submitted",
            submitted=time.time(),
            script=str(script),
        )
        say(out, f"submitted {self.scheduler} job {job_id} for run {run.id} ({script})")
        return job_id

    def launch(
        self, config: ClusterConfig, plan: Plan, run: Run, options: LaunchOptions | None = None
    ) -> Outcome:
        """Submit and follow to the end; a signal from submission on cancels the job."""
        with CaughtSignals() as caught:
            try:
                job_id = self.submit(config, run)
            except TflaunchError:
                if not caught.signum:
                    raise
                # the signal reached the submit command too: nothing (known) to cancel
                message = f"interrupted by {caught.name} while submitting the job"
                return run.finish(Outcome(128 + caught.signum, message, interrupted=True))
            return follow(self, run, job_id, caught)

    def detach(
        self, config: ClusterConfig, plan: Plan, run: Run, options: LaunchOptions | None = None
    ) -> str:
        """Submit and return: the job runs on without the login node."""
        self.submit(config, run, out=sys.stderr)
        return run.id

    def job_id(self, run: Run) -> str | None:
        job_id = run.record().part(self.details).job_id
        return str(job_id) if job_id else None

    def cluster_alive(self, run: Run) -> bool:
        job_id = self.job_id(run)
        return bool(job_id) and not self.job_state(str(job_id)).ended

    def describe(self, run: Run) -> list[str]:
        """The scheduler's view of the run's job, for ``tflaunch status``."""
        job_id = self.job_id(run)
        if not job_id:
            return [f"{self.scheduler} job: not submitted"]
        state = self.job_state(job_id)
        extra = [f"nodes {state.nodes}"] if state.nodes else []
        extra += [f"reason {state.reason}"] if state.reason and state.reason != "None" else []
        extra += (
            [f"exit code {state.exit_code}"] if state.ended and state.exit_code is not None else []
        )
        return [
            f"{self.scheduler} job {job_id}: {state.state}"
            + (f" ({', '.join(extra)})" if extra else "")
        ]

    def down(self, run: Run, grace: float) -> str:
        """Cancel the job and wait (bounded) until the scheduler reports it ended."""
        job_id = self.job_id(run)
        if not job_id:
            raise LaunchError(
                f"run {run.id} has no {self.scheduler} job id in {run.meta_path}; nothing to "
                "cancel."
            )
        state = self.job_state(job_id)
        if not state.ended:
            # The scheduler signals every process of the job at once, so tasks may report their
            # SIGTERM before the coordinator does: the marker says the run was stopped, not failed.
            run.update_part(self.details, cancel_requested=time.time())
            self.cancel_job(job_id, check=True)
            deadline = time.monotonic() + grace + 60
            while not state.ended and time.monotonic() < deadline:
                time.sleep(self.poll_seconds)
                state = self.job_state(job_id)
        record = run.record()
        if record.part(self.details).cancel_requested and record.state != "succeeded":
            message = f"cancelled with tflaunch down ({self.scheduler} job {job_id})"
            code = 143 if record.exit_code is None else int(record.exit_code)
            run.finish(Outcome(code, message, interrupted=True))
        if not state.ended:
            return (
                f"run {run.id}: {self.scheduler} job {job_id} was cancelled but is still "
                f"{state.state}"
            )
        return f"run {run.id} is down ({self.scheduler} job {job_id}: {state.state})"
