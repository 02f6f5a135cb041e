"""Slurm backend, login-node side: render the job script, submit it, follow the job, cancel it.

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
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from tflaunch.cluster.config import ClusterConfig, parse_config
from tflaunch.cluster.plan import Host, Plan
from tflaunch.errors import ConfigError, LaunchError
from tflaunch.launchers.base import Backend, LaunchOptions
from tflaunch.launchers.slurm.client import JobState, cancel, job_state, submit
from tflaunch.launchers.slurm.script import (
    SCRIPT_FILE,
    SETUP_FILE,
    SNAPSHOT_FILE,
    Layout,
    ScriptInputs,
    SlurmDetails,
    layout,
    render_sbatch,
)
from tflaunch.runtime.run import INTERRUPT_CODES, Outcome, Run
from tflaunch.runtime.runfiles import write_run_file

POLL_SECONDS = 0.5


def placeholder_hosts(job: Layout) -> list[Host]:
    """Stand-ins for the nodes Slurm will allocate: worker nodes (with GPUs), then PS nodes."""
    gpus = tuple(str(i) for i in range(job.gpus_per_node))
    names = [f"slurm-node{i + 1}" for i in range(job.nodes)]
    return [Host(n, n, n, gpus) for n in names[: job.worker_nodes]] + [
        Host(n, n, n, ()) for n in names[job.worker_nodes :]
    ]


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
        if not data and self.path.exists() and self.path.stat().st_size < self.offset:
            self.offset, self.partial = 0, b""  # truncated (a requeued job without append)
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
    requeued = False
    try:
        while True:
            for tail in tails:
                tail.pump()
            state = job_state(job_id)
            if state.ended:
                break
            if (run.record().state == "requeued") != requeued:
                requeued = not requeued
                if requeued:
                    _say(out, f"Slurm job {job_id} is requeued; following it until it ends")
            if caught and cancelled_at is None:
                cancelled_at = time.monotonic()
                _say(err, f"{signal.Signals(caught[0]).name}: cancelling Slurm job {job_id}")
                run.update_part(SlurmDetails, cancel_requested=time.time())
                cancel(job_id)
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
    record = run.record()
    slurm = record.part(SlurmDetails)
    if record.has_ended and record.exit_code is not None and state.state != "TIMEOUT":
        code = int(record.exit_code)
        if slurm.cancel_requested and record.state == "failed":
            # Slurm's SIGTERM reached some task before the coordinator: still a cancel.
            return run.finish(Outcome(code, f"Slurm job {job_id} was cancelled", interrupted=True))
        return Outcome(code, record.message or "", interrupted=record.state == "stopped")
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
    err.write(f"tflaunch: run {run.id}: {message}\n")
    err.flush()
    return run.finish(Outcome(code, message, interrupted=code in INTERRUPT_CODES))


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
        write_run_file(script, self.render(config, run))
        snapshot = Path(config.source).read_text()
        write_run_file(run.dir / SNAPSHOT_FILE, snapshot)
        filed = parse_config(snapshot, config.source, config.base_dir).program.env
        setup = {
            "run_id": run.id,
            "cluster_file": str(Path(config.source).resolve()),
            "base_dir": config.base_dir,
            "job_name": config.name,
            "output": config.slurm.output,
            "error": config.slurm.error,
            "submit_dir": os.getcwd(),
            # what the launcher set beyond the file (up --trace's variables): the nodes plan
            # from the snapshot, so they add it back
            "program_env": {k: v for k, v in config.program.env.items() if filed.get(k) != v},
        }
        write_run_file(run.dir / SETUP_FILE, json.dumps(setup, indent=2) + "\n")
        return script

    def submit(self, config: ClusterConfig, run: Run, out: IO[str] = sys.stdout) -> str:
        script = self.prepare(config, run)
        job_id = submit(script)
        run.update_part(
            SlurmDetails,
            backend=self.name,
            job_id=job_id,
            state="submitted",
            submitted=time.time(),
            script=str(script),
        )
        _say(out, f"submitted Slurm job {job_id} for run {run.id} ({script})")
        return job_id

    def launch(
        self, config: ClusterConfig, plan: Plan, run: Run, options: LaunchOptions | None = None
    ) -> Outcome:
        job_id = self.submit(config, run)
        return follow(run, job_id)

    def detach(
        self,
        config: ClusterConfig,
        plan: Plan,
        run: Run,
        cluster_file: str,
        run_root: str,
        options: LaunchOptions | None = None,
    ) -> str:
        """Submit and return: the job runs on without the login node."""
        self.submit(config, run, out=sys.stderr)
        return run.id

    def dry_run(self, config: ClusterConfig, plan: Plan, run: Run) -> str:
        return self.render(config, run)

    def check_environment(self, config: ClusterConfig, environ: Mapping[str, str]) -> None:
        """sbatch passes this environment to the job, and program.env_from relies on that."""
        export = environ.get("SBATCH_EXPORT", "ALL")
        if config.program.env_from and not export.startswith("ALL"):
            raise LaunchError(
                f"SBATCH_EXPORT={export} would keep sbatch from passing program.env_from "
                f"({', '.join(config.program.env_from)}) to the job; unset SBATCH_EXPORT."
            )

    def python(self, config: ClusterConfig) -> str:
        return config.slurm.python

    def cluster_alive(self, run: Run) -> bool:
        job_id = run.record().part(SlurmDetails).job_id
        return bool(job_id) and not job_state(str(job_id)).ended

    def describe(self, run: Run) -> list[str]:
        """Slurm's view of the run's job, for ``tflaunch status``."""
        job_id = run.record().part(SlurmDetails).job_id
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
        job_id = run.record().part(SlurmDetails).job_id
        if not job_id:
            raise LaunchError(
                f"run {run.id} has no Slurm job id in {run.meta_path}; nothing to cancel."
            )
        state = job_state(str(job_id))
        if not state.ended:
            # Slurm signals every process of the step at once, so tasks may report their SIGTERM
            # before the coordinator does: the marker says the run was stopped, not failed.
            run.update_part(SlurmDetails, cancel_requested=time.time())
            cancel(str(job_id), check=True)
            deadline = time.monotonic() + grace + 60
            while not state.ended and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)
                state = job_state(str(job_id))
        record = run.record()
        if record.part(SlurmDetails).cancel_requested and record.state != "succeeded":
            message = f"cancelled with tflaunch down (scancel {job_id})"
            code = 143 if record.exit_code is None else int(record.exit_code)
            run.finish(Outcome(code, message, interrupted=True))
        if not state.ended:
            return f"run {run.id}: Slurm job {job_id} was cancelled but is still {state.state}"
        return f"run {run.id} is down (Slurm job {job_id}: {state.state})"
