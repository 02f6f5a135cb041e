"""Following a batch job from the login node: its console output as it grows, its state, and a
cancel when the launcher is signalled; then the run's result from ``run.json`` or the scheduler."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import IO, Protocol

from tflaunch.launchers.batch.state import BatchDetails, JobState
from tflaunch.runtime.run import INTERRUPT_CODES, Outcome, Run, RunRecord
from tflaunch.runtime.signals import CaughtSignals


class Scheduler(Protocol):
    """What following needs of a batch backend (:class:`~.backend.BatchBackend` has it)."""

    scheduler: str
    details: type[BatchDetails]
    time_key: str
    poll_seconds: float
    cancel_wait: float

    def output_paths(self, run: Run, job_id: str) -> tuple[Path, Path | None]: ...
    def job_state(self, job_id: str) -> JobState: ...
    def cancel_job(self, job_id: str, check: bool = False) -> None: ...


class Tail:
    """New complete lines of a file that may not exist yet; those starting with ``drop`` are
    left out."""

    def __init__(self, path: Path, out: IO[str], drop: str | None = None):
        self.path, self.out, self.drop = path, out, drop
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
            text = line.decode("utf-8", "replace")
            if self.drop is None or not text.startswith(self.drop):
                self.out.write(text + "\n")
        self.out.flush()


def say(stream: IO[str], message: str) -> None:
    stream.write(f"[tflaunch] {message}\n")
    stream.flush()


def follow(
    backend: Scheduler,
    run: Run,
    job_id: str,
    caught: CaughtSignals,
    out: IO[str] = sys.stdout,
    err: IO[str] = sys.stderr,
) -> Outcome:
    """Stream the job's output until it ends; a caught signal cancels it. Returns the result."""
    stdout_path, stderr_path = backend.output_paths(run, job_id)
    # The job's coordinator says 'stopped' to a signal it cannot tell the cause of (a cancel, the
    # time limit): the verdict is the launcher's, from the scheduler (result()), said once.
    drop = f"tflaunch: run {run.id} stopped: "
    tails = [Tail(stdout_path, out, drop)] + ([Tail(stderr_path, err, drop)] if stderr_path else [])
    job = f"{backend.scheduler} job {job_id}"
    cancelled_at: float | None = None
    said = ""
    requeued = False
    while True:
        for tail in tails:
            tail.pump()
        state = backend.job_state(job_id)
        if state.ended:
            break
        if (run.record().state == "requeued") != requeued:
            requeued = not requeued
            if requeued:
                say(out, f"{job} is requeued; following it until it ends")
        if caught.signum and cancelled_at is None:
            cancelled_at = time.monotonic()
            say(err, f"{caught.name}: cancelling {job}")
            run.update_part(backend.details, cancel_requested=time.time())
            backend.cancel_job(job_id)
        if cancelled_at is not None and time.monotonic() - cancelled_at > backend.cancel_wait:
            break  # the scheduler is slow to confirm; the job was cancelled all the same
        if state.pending and state.reason not in ("None", "", said):
            said = state.reason
            say(out, f"job {job_id} is pending ({state.reason})")
        time.sleep(backend.poll_seconds)
    time.sleep(backend.poll_seconds)  # the last lines may reach a shared file system a little late
    for tail in tails:
        tail.pump(final=True)
    return result(backend, run, job_id, state, caught, err)


def _ended_first(record: RunRecord, cancel_requested: float | None) -> bool:
    """Whether the run ended by itself before any cancel was asked for."""
    if cancel_requested is None:
        return True
    return record.has_ended and record.ended is not None and record.ended < cancel_requested


def result(
    backend: Scheduler,
    run: Run,
    job_id: str,
    state: JobState,
    caught: CaughtSignals,
    err: IO[str],
) -> Outcome:
    """The run's outcome once its job ended: a launcher's signal, the coordinator's result, or
    the scheduler's verdict when the job ended without one (out of time, cancelled, failed)."""
    record = run.record()
    cancel_requested = record.part(backend.details).cancel_requested
    job = f"{backend.scheduler} job {job_id}"
    if caught.signum and not _ended_first(record, cancel_requested):
        message = f"{job} was cancelled ({caught.name} to tflaunch)"
        code = 128 + caught.signum  # the promise, whatever the tasks said while stopped
    elif record.has_ended and record.exit_code is not None and state.ending != "timeout":
        code = int(record.exit_code)
        if cancel_requested and record.state == "failed":
            # the scheduler's SIGTERM reached some task before the coordinator: still a cancel
            return run.finish(Outcome(code, f"{job} was cancelled", interrupted=True))
        outcome = Outcome(code, record.message or "", interrupted=record.state == "stopped")
        if outcome.interrupted:  # (the job's own line was left out of its output)
            err.write(f"tflaunch: {outcome.verdict(run.id)}\n")
            err.flush()
        return outcome
    elif state.ending == "completed" and not state.exit_code:
        code, message = 1, f"{job} ended without a result from the coordinator"
    elif state.ending == "timeout":
        where = f" ({backend.time_key})" if backend.time_key else ""
        code, message = 1, f"{job} reached its time limit{where}"
    elif state.ending == "cancelled":
        code, message = 143, f"{job} was cancelled"
    else:
        code = state.exit_code or 1
        message = f"{job} ended {state.state} ({state.reason or 'no reason given'})"
    outcome = Outcome(code, message, interrupted=code in INTERRUPT_CODES)
    err.write(f"tflaunch: {outcome.verdict(run.id)}\n")
    err.flush()
    return run.finish(outcome)
