"""A traced run's trace directory: its layout, the hook's place in a task's environment, the
hook's notes, and the verdict.

Each host's tasks write into their host's own trace directory (:func:`host_trace_dir`: the
agent's run directory's ``trace/``): the hook (``tflaunch/tracehook``, put first on a traced
task's ``PYTHONPATH`` by :func:`with_hook`) leaves notes in its ``tasks/`` (:func:`read_notes`),
the profilers save under ``raw/``, the capture writes ``capture.log``, ``trace.json`` and the
summary. Whatever happens, the coordinator's trace directory ends with ``verdict.json``: a trace,
or one line saying why there is none (:func:`read_verdict`). Nothing here imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import tflaunch.tracehook
from tflaunch.runtime.runfiles import write_run_file
from tflaunch.trace.request import DIR_ENV, HOOK_ENV

# The hook's folder; it imports nothing of tflaunch (its own import contract).
HOOK_DIR = Path(tflaunch.tracehook.__file__).resolve().parent
VERDICT_FILE = "verdict.json"
WINDOW_FILE = "window.json"  # read by the hook: tasks that end inside the window wait for it
NOTES_DIR = "tasks"
IN_PROGRAM_SUFFIX = ".inprogram"  # the note of a task on tflaunch.trace.profiler's own tracer
CAPTURE_LOG = "capture.log"
MAX_SHIP = 512 * 1024 * 1024  # bytes of trace files one host sends at most (and is taken from)
FIX_LOADED = "loaded"  # the hook's note when tflaunch's fix for TensorFlow's profiler is in


def host_trace_dir(run_dir: str | os.PathLike) -> Path:
    """The trace directory of the tasks whose agent's run directory is ``run_dir``: the run's
    own where the hosts share it (local, Slurm), each host's own over SSH."""
    return Path(os.path.expanduser(run_dir)).resolve() / "trace"


def with_hook(env: Mapping[str, str], run_dir: str | os.PathLike | None = None) -> dict[str, str]:
    """A traced task's environment: the hook's folder first on ``PYTHONPATH``, and (given the
    agent's ``run_dir``) the trace directory of its host (:func:`host_trace_dir`), where its
    notes and profile go."""
    out = dict(env)
    if out.get(HOOK_ENV) == "1":
        rest = out.get("PYTHONPATH", "")
        out["PYTHONPATH"] = str(HOOK_DIR) + (os.pathsep + rest if rest else "")
        if run_dir is not None:
            out[DIR_ENV] = str(host_trace_dir(run_dir))
    return out


@dataclass(frozen=True)
class Notes:
    """What the tasks' hooks noted: which ran Python, which imported TensorFlow (and on which
    profiler port), which failed to start a server, which take their own trace, and what came
    of the fix for TensorFlow's profiler in each (``"loaded"`` or why not)."""

    python: frozenset[str]
    tf_ports: Mapping[str, int]
    errors: Mapping[str, str]
    in_program: frozenset[str]
    fixes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Python older than the hook needs (task -> "2.7"): the hook only noted the version there.
    old_python: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # TensorFlow imported by a child process that left the port to the task's first Python
    # process (task -> {"pid": child, "claimant": first}).
    tf_children: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)


def read_notes(trace_dir: Path) -> Notes:
    """The notes under ``trace_dir`` (a note that cannot be read or parsed is left out)."""
    folder = trace_dir / NOTES_DIR
    python, in_program, ports, errors, fixes = set(), set(), {}, {}, {}
    old_python: dict[str, str] = {}
    children: dict[str, dict[str, str]] = {}
    for path in sorted(folder.glob("*.*")) if folder.is_dir() else []:
        task, kind = path.stem.replace("-", ":", 1), path.suffix[1:]
        if kind == "python":
            python.add(task)
        elif kind == "inprogram":
            in_program.add(task)
        elif kind == "oldpython":
            with contextlib.suppress(OSError):
                old_python[task] = path.read_text(errors="replace").strip()[:20]
        elif kind in ("tf", "tfchild"):
            try:
                note = json.loads(path.read_text())
                if not isinstance(note, dict):
                    continue
                if kind == "tfchild":
                    children[task] = {k: str(note.get(k, "?")) for k in ("pid", "claimant")}
                elif "error" in note:
                    errors[task] = str(note["error"])
                else:
                    ports[task] = int(note["port"])
                    fixes[task] = str(note.get("profiler_fix", "not known (an older hook)"))
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return Notes(
        frozenset(python), ports, errors, frozenset(in_program), fixes, old_python, children
    )


def write_verdict(trace_dir: Path, ok: bool, line: str) -> None:
    trace_dir.mkdir(parents=True, exist_ok=True)
    write_run_file(trace_dir / VERDICT_FILE, json.dumps({"ok": ok, "line": line}) + "\n")


def read_verdict(trace_dir: Path) -> tuple[bool, str] | None:
    try:
        data = json.loads((trace_dir / VERDICT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return bool(data.get("ok")), str(data.get("line", ""))
