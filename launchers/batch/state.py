"""What a batch job is, in the base's words: the scheduler's report of a job (:class:`JobState`)
and what a batch run adds to run.json (:class:`BatchDetails`)."""

from __future__ import annotations

from dataclasses import dataclass

ENDINGS = ("completed", "timeout", "cancelled", "failed")


@dataclass(frozen=True)
class BatchDetails:
    """What a batch run adds to run.json (:class:`tflaunch.runtime.run.RunRecord`'s details).
    A scheduler may subclass it under its own name (``SlurmDetails``)."""

    job_id: str | None = None
    cancel_requested: float | None = None  # when the cancel was asked for (a cancel, not a failure)
    coordinator_host: str | None = None
    nodes: list[str] | None = None
    submitted: float | None = None  # when the scheduler took the job ...
    script: str | None = None  # ... and the job script it was given


@dataclass(frozen=True)
class JobState:
    """A job as its scheduler reports it: its own words (``state``, ``reason``) for people, and
    what the base acts on: ``pending`` while queued, ``ending`` (one of :data:`ENDINGS`) once it
    ended. ``exit_code`` is the job script's, shell-style (128 + signal), where known."""

    state: str
    exit_code: int | None = None
    reason: str = ""
    nodes: str = ""
    ending: str = ""  # "" while queued or running
    pending: bool = False

    def __post_init__(self) -> None:
        if self.ending and self.ending not in ENDINGS:
            raise ValueError(f"JobState.ending {self.ending!r} is not one of {ENDINGS}")

    @property
    def ended(self) -> bool:
        return bool(self.ending)
