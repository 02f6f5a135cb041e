"""What a failure report can say beyond "it exited": the causes a new user meets first, read from
the task's last lines and its program, each turned into the one thing to do.

- A Python task that died of ``ModuleNotFoundError``/``ImportError``: which module, which Python
  (the interpreter the task ran, as its agent found it on the host), and the fix — the ``tf``
  extra for tflaunch's own programs (``python -m tflaunch.models...``), else installing the module
  into that Python.
- A PS whose program has no PS role (an all-reduce program: Keras ``MultiWorkerMirroredStrategy``,
  Horovod): TensorFlow's "There is no id for task_type 'ps'", or a PS that exited by itself with
  code 0: the file wants ``roles.ps: 0``.

Pure functions of text, so that the coordinator (on the laptop or inside a Slurm job) and tests
call them alike.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

OWN_PROGRAMS = "tflaunch.models"
TF_EXTRA = "pip install 'tflaunch[tf]'"
# Import names whose distribution is called otherwise (what to pip install).
DISTRIBUTIONS = {
    "sklearn": "scikit-learn",
    "yaml": "pyyaml",
    "cv2": "opencv-python",
    "PIL": "pillow",
    "tf_keras": "tf_keras",
    "google": "protobuf",
}
_MISSING = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")
# python -m of a module that is not there: "/usr/bin/python3: No module named x.y"
_NO_MAIN_MODULE = re.compile(r"^\S*python[\d.]*: No module named (\S+)$")
_CANNOT_IMPORT = re.compile(r"^\s*ImportError: cannot import name '[^']+' from '([^']+)'")
_IMPORT_ERROR = re.compile(r"^\s*ImportError: (.+)")
_NO_PS_ID = re.compile(r"no id for task_type '?ps'?", re.IGNORECASE)
MAX_NAME = 200  # a module name longer than this is not one


@dataclass(frozen=True)
class ImportFailure:
    """The error line of a task that could not import something."""

    line: str
    module: str | None  # the top-level module, when the line names one


def import_failure(tail: Sequence[str]) -> ImportFailure | None:
    """The last import error among a task's last lines, if it ended with one."""
    for line in reversed(list(tail)[-8:]):
        match = _MISSING.search(line) or _CANNOT_IMPORT.match(line)
        if match and len(match.group(1)) <= MAX_NAME:
            return ImportFailure(line.strip(), match.group(1).split(".")[0])
        match = _NO_MAIN_MODULE.match(line.strip())
        if match and len(match.group(1)) <= MAX_NAME:
            return ImportFailure(line.strip(), match.group(1))
        if _IMPORT_ERROR.match(line):
            return ImportFailure(line.strip(), None)
    return None


def own_program(argv: Sequence[str]) -> str | None:
    """The module of tflaunch's own programs that ``argv`` runs (``-m tflaunch.models.x``)."""
    for flag, module in zip(argv, argv[1:], strict=False):
        if flag == "-m" and module.startswith(OWN_PROGRAMS):
            return module
    return None


def interpreter(argv: Sequence[str], executable: str | None, host: str) -> str:
    """The task's program as its agent found it: ``python3 (/usr/bin/python3) on host``."""
    name = argv[0] if argv else "its program"
    found = f" ({executable})" if executable and executable != name else ""
    return f"{name}{found} on {host}"


def missing_module_note(
    tail: Sequence[str], argv: Sequence[str], executable: str | None, host: str
) -> str | None:
    """One paragraph naming the module the task could not import, its Python and the fix."""
    failure = import_failure(tail)
    if failure is None:
        return None
    python = interpreter(argv, executable, host)
    ours = own_program(argv)
    module = failure.module
    what = f"cannot import {module}" if module else "could not import what it needs"
    if module == "tflaunch":
        fix = (
            "install tflaunch into that Python (pip install 'tflaunch[tf]'), or make "
            "program.argv start with the Python of the environment tflaunch is installed in"
        )
    elif module and module.startswith("tflaunch."):
        fix = f"tflaunch has no module {module}: check the module name in program.argv"
    elif ours:
        fix = (
            f"{ours} is one of tflaunch's own programs: install TensorFlow and what they use "
            f"into that Python: {TF_EXTRA}"
        )
    elif module:
        dist = DISTRIBUTIONS.get(module, module)
        fix = (
            f"install {dist} into that Python ({argv[0] if argv else 'python'} -m pip install "
            f"{dist}), or start program.argv with a Python that has it"
        )
    else:
        fix = "install what it names into that Python"
    return f"The task's Python {what} ({failure.line}): {python}. Fix: {fix}."


def no_ps_role_note(tail: Sequence[str], code: int) -> str | None:
    """For a PS that ended by itself: whether its program has no PS role, and what to write."""
    said = any(_NO_PS_ID.search(line) for line in tail)
    if not said and code != 0:
        return None
    why = (
        "its program has no PS role (TensorFlow: \"There is no id for task_type 'ps'\")"
        if said
        else "its program had nothing for a PS to do (it exited by itself with code 0)"
    )
    return (
        f"It looks like {why}: all-reduce programs (Keras MultiWorkerMirroredStrategy, "
        "Horovod) run workers only. Set 'roles: {ps: 0, worker: N}' in the cluster file; "
        "a file that names no ps gets one PS by default."
    )


def notes(
    name: str,
    tail: Sequence[str],
    argv: Sequence[str],
    executable: str | None,
    host: str,
    code: int,
) -> list[str]:
    """Every note for the report of task ``name`` that exited with ``code``."""
    found = []
    missing = missing_module_note(tail, argv, executable, host) if code != 0 else None
    if missing:
        found.append(missing)
    elif name.startswith("ps:"):
        no_ps = no_ps_role_note(tail, code)
        if no_ps:
            found.append(no_ps)
    return found


def is_traceback(tail: Sequence[str]) -> bool:
    """Whether the lines hold a Python traceback (the report then shows its last line only)."""
    return any(line.startswith("Traceback (most recent call last)") for line in tail)


def program_path(program: str, workdir: str, path: str) -> str | None:
    """Where ``program`` is, as the agent starts it (PATH, or relative to the workdir)."""
    import shutil

    if os.sep in program:
        full = os.path.join(workdir, program)
        return full if os.path.exists(full) else None
    return shutil.which(program, path=path)
