"""The runs under a runs directory: ``tflaunch status`` without a run id lists them, ``rm`` and
``prune`` remove their directories.

A row is read from each run's ``run.json`` (backend, state, times, exit code), its ``plan.json``
(how many tasks) and its ``events.jsonl`` (how many restarts). A run that has not ended but whose
coordinator is gone (a killed ``up``, a vanished Slurm job) is shown as ``lost``, as ``status RUN``
shows it. A run whose files cannot be read (a corrupt or planted run.json, plan.json or
events.jsonl: a FIFO, a symlink, garbage, a huge file) is one ``unreadable`` row that says why;
the others list as usual. Live runs are never removed: stop them with ``tflaunch down`` first;
nor is a symlinked run directory (its target is not ours to delete). A run whose launcher is on
another machine (another host, container or PID namespace sharing the runs directory) is
``unknown``: only that machine can tell whether it runs, so ``prune`` keeps it and ``rm`` asks
for ``--force``.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from tflaunch import launch
from tflaunch.errors import ConfigError, LaunchError, TflaunchError
from tflaunch.runtime import protocol
from tflaunch.runtime.run import ENDED, Run, list_runs
from tflaunch.runtime.runfiles import RunFileError
from tflaunch.text import aligned, local_time, usable_time
from tflaunch.threads import in_threads

DEFAULT_LIMIT = 20
RESTART_EVENTS = (protocol.Restarting, protocol.ClusterRestarting)
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
UNREADABLE = "unreadable"
UNKNOWN = "unknown"  # whether it still runs cannot be told here (its launcher is elsewhere)
# How long the run list waits for the runs' backends, all of them together (see probe).
PROBE_DEADLINE_S = 3.0
MAX_ASKERS = 64  # threads asking backends at once
# What a run's files can throw at their readers besides RunFileError: an events line or plan
# entry of the wrong shape (e.g. a string where a number belongs).
_BAD_DATA = (RunFileError, OSError, ValueError, TypeError, KeyError, AttributeError)


# A run's liveness as asked of its backend: (state, why unknown), or what asking it ran into.
Liveness = tuple[str, str | None] | BaseException


@dataclass(frozen=True)
class RunRow:
    """One line of the run list."""

    id: str
    name: str | None
    backend: str | None
    state: str
    started: float | None
    duration: float | None
    tasks: int | None
    restarts: int
    exit_code: int | None
    problem: str | None = None  # why its state is unknown or its files unreadable


def run_row(run: Run, now: float | None = None, probed: Liveness | None = None) -> RunRow:
    """The list's view of one run; an ``unreadable`` row, saying why, when its files are not
    what tflaunch wrote. ``probed``: its liveness as :func:`probe` found it (else asked here)."""
    try:
        return _read_row(run, now, probed)
    except _BAD_DATA as err:
        why = str(err) if isinstance(err, OSError) else f"{type(err).__name__}: {err}"
        return RunRow(run.id, None, None, UNREADABLE, None, None, None, 0, None, why)


def _read_row(run: Run, now: float | None, probed: Liveness | None) -> RunRow:
    record = run.checked_record()
    started = usable_time(record.started or record.created)
    ended = usable_time(record.ended)
    answer = liveness(run) if probed is None else probed
    if isinstance(answer, BaseException):
        raise answer  # what asking its backend ran into: an unreadable row
    state, problem = answer
    if started is None:
        duration = None
    elif ended is not None:
        duration = max(0.0, ended - started)
    elif state in ENDED or state == "lost":
        duration = None  # no end was recorded: how long it ran is unknown
    else:
        duration = max(0.0, (now or time.time()) - started)
    return RunRow(
        id=run.id,
        name=record.name,
        backend=record.backend,
        state=state,
        started=started,
        duration=duration,
        tasks=_task_count(run),
        restarts=sum(
            1 for r in protocol.records(run.events()) if isinstance(r.event, RESTART_EVENTS)
        ),
        exit_code=record.exit_code,
        problem=problem,
    )


def _task_count(run: Run) -> int | None:
    try:
        return len(run.read_plan().tasks)
    except FileNotFoundError:
        return None  # no plan yet: its machines are being made


def run_rows(runs_dir: str | Path, limit: int | None = DEFAULT_LIMIT) -> tuple[list[RunRow], int]:
    """The newest ``limit`` runs under ``runs_dir`` (by start, else creation), and how many
    there are. Only the rows shown are built: each reads its plan and events and may ask its
    backend (squeue) whether it still runs."""
    found = list_runs(runs_dir)
    runs = [Run(p.name, p.resolve()) for p in found]
    modified = {run.id: _modified(p) for run, p in zip(runs, found, strict=True)}
    runs.sort(key=lambda run: _start_of(run) or modified[run.id], reverse=True)
    shown = runs if limit is None else runs[:limit]
    probed = probe(shown, PROBE_DEADLINE_S)
    return [run_row(r, probed=probed.get(r.id)) for r in shown], len(runs)


def probe(runs: list[Run], deadline_s: float) -> dict[str, Liveness]:
    """The liveness of every run that has not ended, asked of their backends all at once (a
    detached run's hosts over SSH, a scheduler's queue); a run whose answer has not come
    ``deadline_s`` seconds after the questions went out is ``unknown``, saying so, and nothing
    waits for it: hosts that accept a connection but never speak cost the list ``deadline_s``
    in all, not a connect timeout per run. The askers are daemon threads: one still waiting
    does not hold the process at its exit."""
    asking = [run for run in runs if run.record().state not in ENDED]
    for backend in {run.record().backend or "local" for run in asking}:
        try:  # imported before the clock starts: the deadline is for the answers
            launch.backend_for(backend)
        except TflaunchError:
            pass  # an unknown backend: its runs' rows say so
    asked = in_threads(liveness, asking, MAX_ASKERS, deadline_s, name="tflaunch-status")
    late = (
        f"no answer within {deadline_s:g} s (its hosts or its scheduler did not reply in "
        "time); 'tflaunch status RUN_ID' of this run alone waits for them"
    )
    found: dict[str, Liveness] = {}
    for answer in asked:
        if not answer.done:
            found[answer.item.id] = (UNKNOWN, late)
        else:  # what asking raised becomes the row's: an unreadable row, or a traceback
            found[answer.item.id] = answer.value if answer.error is None else answer.error
    return found


def _start_of(run: Run) -> float:
    record = run.record()  # an empty one when unreadable: sorted by its directory's time
    return usable_time(record.started or record.created) or 0.0


def _modified(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:
        return 0.0


def rows_json(rows: list[RunRow]) -> list[dict]:
    return [asdict(row) for row in rows]


def format_rows(rows: list[RunRow], shown_all: bool, total: int) -> list[str]:
    """The run list as a table, and a line saying how many were left out."""
    table = [
        ("RUN", "NAME", "BACKEND", "STATE", "STARTED", "DURATION", "TASKS", "RESTARTS", "EXIT")
    ]
    for row in rows:
        table.append(
            (
                row.id,
                row.name or "-",
                row.backend or "-",
                row.state,
                local_time(row.started),
                _duration(row.duration),
                "-" if row.tasks is None else str(row.tasks),
                str(row.restarts),
                "-" if row.exit_code is None else str(row.exit_code),
            )
        )
    lines = aligned(table)
    lines += [
        f"{row.id}: {'unreadable' if row.state == UNREADABLE else 'state unknown'}: {row.problem}"
        for row in rows
        if row.problem
    ]
    if not shown_all and total > len(rows):
        lines.append(f"({total - len(rows)} older run(s) not shown; --all shows every run)")
    return lines


def is_live(state: str) -> bool:
    """Whether a run in ``state`` (from :func:`tflaunch.launch.run_state`) may still have tasks
    running: not ended, and its coordinator not gone (an ``unknown`` one may run elsewhere)."""
    return state not in (*ENDED, "lost")


def find_removable(runs_dir: str | Path, run_id: str) -> Path:
    """The directory ``rm`` would delete for ``run_id`` (an exact id, a unique start of one, or a
    path; never a pattern nor an empty id), refusing a symlink: its target is not ours."""
    found = Run.find(runs_dir, run_id)
    if found.is_symlink():
        raise LaunchError(
            f"{found} is a symlink (to {os.readlink(found)}), not a run directory; tflaunch "
            "never deletes through one. Remove the link itself with 'rm' if it is yours."
        )
    return found


def check_removable(found: Path, force: bool = False) -> None:
    """Refuse to remove a live run, and one whose liveness only another machine can tell
    (unless ``force``: the user says it ended there)."""
    run = Run(found.name, found.resolve())
    state, why = liveness(run)
    if state in (UNKNOWN, UNREADABLE):
        if force:
            return
        raise LaunchError(
            f"run {run.id} may still be running: {why}. Stop it with 'tflaunch down {run.id}' "
            "where it runs; if you know it ended, 'tflaunch rm --force' removes its directory "
            "(its logs, events and plan) even if its tasks still write to it."
        )
    if is_live(state):
        raise LaunchError(
            f"run {run.id} is still running (state {state}); stop it with "
            f"'tflaunch down {run.id}' first, then remove it."
        )


def remove_run(found: Path) -> str:
    """Delete the run directory ``found`` (from :func:`find_removable`, checked with
    :func:`check_removable`)."""
    shutil.rmtree(found)  # the directory as found: rmtree refuses a symlink put in its place
    return f"removed {found.resolve()}"


def parse_age(text: str) -> float:
    """``30m``, ``12h``, ``7d``, ``2w`` or plain seconds → seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not match:
        raise ConfigError(
            f"--older-than {text!r} is not an age; write a number with s, m, h, d or w "
            "(e.g. 7d, 12h, 30m)."
        )
    return float(match.group(1)) * UNITS[match.group(2) or "s"]


def prune(
    runs_dir: str | Path, older_than: float, dry_run: bool, say: Callable[[str], None]
) -> int:
    """Remove every run under ``runs_dir`` that ended (or was lost) more than ``older_than``
    seconds ago; live runs, runs whose files cannot be read and symlinked run directories are
    kept and named, and the others go on. Returns how many were (or would be) removed."""
    now = time.time()
    removed = 0
    for path in list_runs(runs_dir):
        run = Run(path.name, path.resolve())
        try:
            removed += _prune_one(path, run, now - older_than, dry_run, say)
        except _BAD_DATA as err:  # one broken run is named and kept; the rest are pruned
            say(
                f"kept {run.id}: unreadable: {err} ('tflaunch rm --force {run.id}' removes it "
                "if it is done)"
            )
    return removed


def _prune_one(
    path: Path, run: Run, before: float, dry_run: bool, say: Callable[[str], None]
) -> int:
    """:func:`prune` of one run: 1 if removed (or, with ``dry_run``, would be)."""
    if path.is_symlink():
        say(f"kept {run.id}: {path} is a symlink; tflaunch never deletes through one")
        return 0
    try:
        record = run.checked_record()
    except RunFileError as err:
        say(f"kept {run.id}: {err} (remove it with 'tflaunch rm {run.id}' if it is done)")
        return 0
    last = usable_time(record.ended or record.started or record.created) or 0.0
    if last > before:  # younger than --older-than
        return 0
    state, why = liveness(run)
    if state in (UNKNOWN, UNREADABLE):
        doubt = (
            f"unreadable: {why}"
            if state == UNREADABLE
            else f"cannot tell whether it still runs ({why})"
        )
        say(
            f"kept {run.id}: {doubt}; 'tflaunch rm --force {run.id}' removes it if you know it ended"
        )
        return 0
    if is_live(state):
        say(f"kept {run.id}: still running (stop it with 'tflaunch down {run.id}')")
        return 0
    if not dry_run:
        shutil.rmtree(path)
    say(f"{'would remove' if dry_run else 'removed'} {run.id} ({state})")
    return 1


def liveness(run: Run) -> tuple[str, str | None]:
    """:func:`tflaunch.launch.run_liveness`, ``unknown`` where the backend cannot be asked and
    ``unreadable`` where the run's files do not say how to ask it (a detached run's hosts are
    in its plan.json): both with why."""
    try:
        return launch.run_liveness(run)
    except RunFileError as err:
        return UNREADABLE, str(err)
    except TflaunchError as err:  # e.g. a Slurm run listed where squeue is not installed
        return UNKNOWN, str(err)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
