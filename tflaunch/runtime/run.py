"""Run state: one directory per ``tflaunch up``, so status, logs, down and report work later.

``<run_dir>/<run-id>/`` holds ``plan.json`` (the resolved plan: the cluster once, one small
entry per task), ``cluster_spec.json`` (the ClusterSpec alone, for programs that read the
cluster from a file), ``run.json`` (backend, its
launcher's identity (:mod:`tflaunch.runtime.identity`), state, exit code, and backend details such as a Slurm job id), ``events.jsonl``
(task lifecycle events, one JSON object a line), one ``<job>-<index>.log`` per task, and whatever a
backend adds (``job.sbatch``, ``samples.jsonl``). ``.run.json.lock`` is the lock that writers of
run.json (several processes: a coordinator, a watcher, ``status``) hold while they rewrite it.

Plans hold ``program.env`` values and logs hold whatever the program prints, so a run directory is
private by default: 0700, its files 0600 (the cluster file's ``run_dir_mode`` chooses otherwise,
e.g. ``'0750'`` for a group). Every writer creates its files through :func:`tflaunch.runtime.runfiles.open_run_file`, which
takes the file mode from the directory's, so agents on other hosts need not be told.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import posixpath
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from tflaunch.cluster.plan import Plan
from tflaunch.cluster.render import cluster_file_path, cluster_file_text
from tflaunch.errors import RunNotFoundError
from tflaunch.runtime.identity import Launcher
from tflaunch.runtime.runfiles import (
    DEFAULT_DIR_MODE,
    EVENTS_FILE,
    EVENTS_LIMIT,
    META_FILE,
    META_LIMIT,
    META_LOCK_FILE,
    PLAN_FILE,
    PLAN_LIMIT,
    RunFileError,
    file_mode,
    is_component,
    json_lines,
    make_run_dir,
    read_run_json,
    read_run_text,
    replace_run_file,
)

# A run's states, in run.json: created → (submitted →) starting → running → one of ENDED; a
# Slurm run may go running → requeued → running again before it ends.
ENDED = ("succeeded", "failed", "stopped")
INTERRUPT_CODES = (129, 130, 143)  # SIGHUP, SIGINT, SIGTERM: the run was stopped, not failed


@dataclass(frozen=True)
class Outcome:
    """How a run ended: its exit code, one message (the failure report), and whether it was
    stopped (Ctrl-C, ``tflaunch down``, a cancelled job) rather than failed. A run stopped to be
    requeued (Slurm) has not ended: its state is ``requeued`` until the requeued job ends it."""

    code: int
    message: str
    interrupted: bool = False
    requeued: bool = False

    @property
    def state(self) -> str:
        if self.requeued:
            return "requeued"
        return "succeeded" if self.code == 0 else "stopped" if self.interrupted else "failed"

    def verdict(self, run_id: str) -> str:
        """The run's one verdict line, as ``status`` says its state: ``run ID stopped: ...``
        for a signal (Ctrl-C, SIGTERM, ``down``), ``run ID failed: ...`` otherwise."""
        return f"run {run_id} {self.state}: {self.message}"


T = TypeVar("T")


@dataclass(frozen=True)
class RunRecord:
    """``run.json``, typed: what every run records. A backend adds details of its own (a Slurm
    job id, its SSH hosts' paths, EC2 instances); they are kept in ``details`` and a backend reads
    them through a dataclass of its own (:meth:`part`). On disk the record is one flat JSON object
    (sorted keys), as it always was; :class:`Run` reads it (:meth:`Run.record`) and writes it
    (:meth:`Run.update_meta` for these fields, :meth:`Run.update_part` for a backend's, a few
    fields at a time, so that writers on either side never drop each other's fields), nothing
    else (``tests/test_run_record.py`` checks)."""

    run_id: str | None = None
    name: str | None = None
    backend: str | None = None
    state: str | None = None  # see ENDED and the states above
    cluster_file: str | None = None
    created: float | None = None
    started: float | None = None
    ended: float | None = None
    hosts: list[str] = field(default_factory=list)
    # The process that coordinates the run (from Run.start), or before that the one that makes
    # it (from Run.create): its machine, pid and start time (tflaunch.runtime.identity).
    launcher: Launcher | None = None
    exit_code: int | None = None
    message: str | None = None
    details: dict[str, Any] = field(default_factory=dict)  # the backend's own

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """The record of a run.json object; a field of the wrong type (a hand-edited or
        corrupt file) is left out (:func:`record_problems` names it)."""
        known = _core_fields()
        bad = {name for name, _ in _wrong_types(data)}
        core = {k: v for k, v in data.items() if k in known and k not in bad}
        if "launcher" in core:
            core["launcher"] = Launcher.from_dict(core["launcher"])
        return cls(**core, details={k: v for k, v in data.items() if k not in known})

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        """A run.json's text (e.g. read from another host) as a record; empty when unreadable."""
        return cls.from_dict(_meta_of(text))

    @property
    def has_ended(self) -> bool:
        return self.state in ENDED

    def part(self, cls: type[T]) -> T:
        """The backend's details as its own dataclass ``cls`` (absent fields take its defaults)."""
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in self.details.items() if k in names})


def _core_fields() -> set[str]:
    return {f.name for f in fields(RunRecord)} - {"details"}


_NUMBER = (int, float)
# The JSON types each core field of run.json may hold (None aside): a record is read back by
# status, rm and down, so a value of another type is not used.
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "run_id": (str,),
    "name": (str,),
    "backend": (str,),
    "state": (str,),
    "cluster_file": (str,),
    "created": _NUMBER,
    "started": _NUMBER,
    "ended": _NUMBER,
    "hosts": (list,),
    "launcher": (dict,),
    "exit_code": (int,),
    "message": (str,),
}


def _wrong_types(data: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for name, types in _FIELD_TYPES.items():
        value = data.get(name)
        if value is None:
            continue
        wrong = not isinstance(value, types) or isinstance(value, bool)
        if name == "hosts" and not wrong:
            wrong = not all(isinstance(h, str) for h in value)
        if name == "launcher" and not wrong:
            wrong = Launcher.from_dict(value) is None
        if wrong:
            yield name, value


def record_problems(data: Any) -> list[str]:
    """What is wrong with a run.json's parsed content, as short phrases (none: it is a record)."""
    if not isinstance(data, dict):
        return [f"it holds a JSON {type(data).__name__}, not an object"]
    return [f"{name} is {value!r:.40}" for name, value in _wrong_types(data)]


def _part_fields(part: type) -> set[str]:
    if not is_dataclass(part):
        raise TypeError(f"{part!r} is not a dataclass: a run.json part is one")
    return {f.name for f in fields(part)}


def _meta_of(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def remote_record_path(run_dir: str) -> str:
    """The run.json of a run directory on another host (a POSIX path), to read as
    :meth:`RunRecord.from_json`."""
    return posixpath.join(run_dir, META_FILE)


def new_run_id(name: str) -> str:
    """``<name>-<YYYYmmdd-HHMMSS>-<4 hex>``: sortable by time, unique across concurrent starts.
    The name keeps letters, digits, ``-``, ``_`` and ``.``, and starts with neither of the last
    three, so that an id never reads as an option nor names a hidden folder."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name).lstrip("-_.") or "run"
    return f"{safe}-{stamp}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class Run:
    """A run directory and the files in it."""

    id: str
    dir: Path

    @classmethod
    def create(
        cls,
        root: str | os.PathLike,
        name: str,
        run_id: str | None = None,
        mode: int = DEFAULT_DIR_MODE,
    ) -> Run:
        """Make the run's directory and its first record (``created``), naming this process
        as its launcher from the first moment, before any machine is asked for: a run that
        waits for its instances is live, not lost. A directory that exists already (an agent
        beside the launcher on a shared file system, a requeued job) keeps its record."""
        run_id = run_id or new_run_id(name)
        path = Path(root).resolve() / run_id
        make_run_dir(path, mode)
        run = cls(run_id, path)
        if not run.recorded:
            run.update_meta(
                run_id=run_id,
                name=name,
                state="created",
                created=time.time(),
                launcher=Launcher.current(),
            )
        return run

    def discard(self) -> None:
        """Remove the directory of a run that :meth:`create` just made and nothing used (its
        plan could not be made)."""
        for name in (META_FILE, META_LOCK_FILE):
            with contextlib.suppress(FileNotFoundError):
                (self.dir / name).unlink()
        self.dir.rmdir()

    @classmethod
    def open(cls, root: str | os.PathLike, run_id: str) -> Run:
        """Find a run by id (or a unique prefix of one, or a path to its directory)."""
        found = cls.find(root, run_id)
        resolved = found.resolve()
        return cls(found.name if found.name not in ("", ".", "..") else resolved.name, resolved)

    @classmethod
    def find(cls, root: str | os.PathLike, run_id: str) -> Path:
        """The run directory named by ``run_id`` (see :meth:`open`) as found, not resolved: a
        symlink stays one (``rm`` refuses to delete through it). An empty id and one with
        glob characters name no run: ids are matched by prefix, never as patterns (a path, with
        a ``/``, is taken as it is written)."""
        if not run_id.strip() or ("/" not in run_id and any(c in run_id for c in "*?[")):
            raise RunNotFoundError(
                f"{run_id!r} is not a run id: give one as 'tflaunch status' lists it "
                "(or a unique start of one, or its directory's path)."
            )
        as_path = Path(run_id)
        if os.path.lexists(as_path / META_FILE):
            return as_path
        root = Path(root)
        if not is_component(run_id):
            matches = []  # a path, and not one to a run directory
        elif os.path.lexists(root / run_id / META_FILE):
            return root / run_id
        else:
            matches = sorted(p for p in list_runs(root) if p.name.startswith(run_id))
        if len(matches) == 1:
            return matches[0]
        if matches:
            shown = ", ".join(p.name for p in matches[:10])
            more = f" and {len(matches) - 10} more" if len(matches) > 10 else ""
            raise RunNotFoundError(
                f"run '{run_id}' is ambiguous under {root}/: it starts {len(matches)} run ids "
                f"({shown}{more}). Give more of the id."
            )
        known = ", ".join(p.name for p in list_runs(root)[-5:]) or "none"
        what = "was not found"
        raise RunNotFoundError(
            f"run '{run_id}' {what} under {root}/ (recent runs: {known}). "
            "Give the full run id, or --runs-dir where the runs are kept."
        )

    @property
    def plan_path(self) -> Path:
        return self.dir / PLAN_FILE

    @property
    def events_path(self) -> Path:
        return self.dir / EVENTS_FILE

    @property
    def meta_path(self) -> Path:
        return self.dir / META_FILE

    def log_path(self, log_name: str) -> Path:
        """A task's log, by its plan's name for it: one file of the run directory (a plan that
        names another path is refused)."""
        if not is_component(log_name):
            raise RunFileError(
                f"{self.plan_path} names a log {log_name!r} outside the run directory"
            )
        return self.dir / log_name

    def write_plan(self, plan: Plan) -> None:
        """plan.json, and the cluster file its tasks may read (``{cluster_file}``)."""
        _atomic_write(self.plan_path, plan.to_json())
        write_cluster_file(plan, self.dir)

    def read_plan(self) -> Plan:
        """plan.json (``FileNotFoundError`` before there is one, :class:`RunFileError` when it
        is not a plan)."""
        data = read_run_json(self.plan_path, PLAN_LIMIT)
        try:
            return Plan.from_dict(data)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise RunFileError(
                f"{self.plan_path} is not a plan ({type(e).__name__}: {e})"
            ) from None

    @property
    def recorded(self) -> bool:
        """Whether the run has a run.json (a directory named by a tag may be gone)."""
        return os.path.lexists(self.meta_path)

    def record(self) -> RunRecord:
        """run.json as a typed record (an empty one when it is missing or unreadable): the one
        way to read it."""
        return RunRecord.from_dict(self._read_meta())

    def checked_record(self) -> RunRecord:
        """run.json as :meth:`record` reads it, but :class:`RunFileError` saying why when it is
        there and not a record (not a regular file, too big, not JSON, a field of the wrong
        type): the run list shows that run as unreadable."""
        data = read_run_json(self.meta_path, META_LIMIT)
        problems = record_problems(data)
        if problems:
            raise RunFileError(f"{self.meta_path} is not a run record: {'; '.join(problems)}")
        return RunRecord.from_dict(data)

    def _read_meta(self) -> dict[str, Any]:
        try:
            data = read_run_json(self.meta_path, META_LIMIT)
        except OSError:
            return {}
        return data if isinstance(data, dict) else {}

    def update_meta(self, **values: Any) -> None:
        """Write fields of :class:`RunRecord` (a backend's own go through :meth:`update_part`)."""
        self._write(_core_fields(), values)

    def update_part(self, part: type, **values: Any) -> None:
        """Write fields of a backend's part ``part`` (a dataclass read back with
        :meth:`RunRecord.part`), and of :class:`RunRecord`, in one write."""
        self._write(_part_fields(part) | _core_fields(), values, part.__name__)

    def _write(self, known: set[str], values: dict[str, Any], part: str = "RunRecord") -> None:
        strays = sorted(set(values) - known)
        if strays:
            raise TypeError(f"run.json: {', '.join(strays)} is not a field of {part}")
        with self._locked():
            meta = self._read_meta()
            meta.update(
                {k: v.to_dict() if isinstance(v, Launcher) else v for k, v in values.items()}
            )
            _atomic_write(self.meta_path, json.dumps(meta, indent=2, sort_keys=True) + "\n")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the run directory's run.json lock: writers are several processes (the
        coordinator, an SSH run's laptop-side watcher, ``tflaunch status`` mirroring a detached
        run, ``down``), and each rewrites the whole file, so without it one writer's read before
        another's write drops the other's fields. Readers need no lock (writes are renames)."""
        path = self.dir / META_LOCK_FILE
        flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, file_mode(self.dir))
            except PermissionError:  # another user's lock file in a shared (group) run directory
                fd = os.open(path, os.O_RDONLY | flags)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise RunFileError(f"{path} is a symlink; run.json is not written through it") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def start(
        self, backend: str, hosts: list[str], part: type | None = None, **values: Any
    ) -> None:
        """Record that this process coordinates the run from now on, as its launcher (machine,
        pid and start time, so that a later ``down`` or ``rm`` can tell it from another process
        that reused its pid, or one on another machine); ``values`` are fields of the backend's
        ``part``, if any."""
        write = self.update_meta if part is None else partial(self.update_part, part)
        write(
            backend=backend,
            state="starting",
            launcher=Launcher.current(),
            started=time.time(),
            hosts=hosts,
            **values,
        )

    def finish(self, outcome: Outcome) -> Outcome:
        """Record how the run ended: the one place a run's end is written. A run stopped to be
        requeued has not ended: only its state and message are written."""
        if outcome.requeued:
            self.update_meta(state=outcome.state, message=outcome.message)
            return outcome
        self.update_meta(
            state=outcome.state, exit_code=outcome.code, ended=time.time(), message=outcome.message
        )
        return outcome

    @property
    def ended(self) -> bool:
        return self.record().has_ended

    def events(self) -> Iterator[dict[str, Any]]:
        """events.jsonl's objects, in order (none before there is one; a line cut short by a
        crash is skipped). :class:`RunFileError` when it is not a regular file or too big."""
        yield from json_lines(self.events_path, EVENTS_LIMIT)


def write_cluster_file(plan: Plan, run_dir: str | os.PathLike) -> Path:
    """Write ``<run_dir>/cluster_spec.json`` unless it already holds this plan's cluster (an
    agent on a shared file system finds the one the coordinator wrote)."""
    path = Path(cluster_file_path(run_dir))
    text = cluster_file_text(plan)
    try:
        if path.stat().st_size == len(text) and read_run_text(path, len(text)) == text:
            return path
    except OSError:
        pass  # not there yet
    _atomic_write(path, text)
    return path


def list_runs(root: str | os.PathLike) -> list[Path]:
    """The run directories under ``root`` (those with a run.json, be it readable or not), as
    found (not resolved), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if os.path.lexists(p / META_FILE)), key=_modified)


def _modified(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:
        return 0.0


def _atomic_write(path: Path, text: str) -> None:
    replace_run_file(path, text)
