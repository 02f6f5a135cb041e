"""What a failure report can say beyond "it exited": the causes a new user meets first, read from
the task's last lines and its program, each turned into the one thing to do.

- A Python task that died of ``ModuleNotFoundError``/``ImportError``: which module, which Python
  (the interpreter the task ran, as its agent found it on the host), and the fix — the ``tf``
  extra for tflaunch's own programs (``python -m tflaunch.models...``), else installing the module
  into that Python.
- ``tf_keras`` missing under ``program.keras: legacy`` (TensorFlow's "TF_USE_LEGACY_KERAS set to
  True, but you do not have the tf_keras package"): the ``keras2`` extra.
- A Python's script that does not exist ("can't open file"): program.argv or program.workdir.
- Keras 3's ``fit`` under a multi-worker strategy ("Attempt to convert a value (PerReplica:"):
  ``program.keras: legacy``.
- A port another process holds ("Address already in use", gRPC's "Could not start gRPC server"):
  the holder, with its pid and command where the report can see it.
- A PS whose program has no PS role (an all-reduce program: Keras ``MultiWorkerMirroredStrategy``,
  Horovod): TensorFlow's "There is no id for task_type 'ps'", or a PS that exited by itself with
  code 0: the file wants ``roles.ps: 0``.

Each note is one paragraph that starts with the cause and ends with its fix; the failure report
puts it first. :class:`OutputTail` keeps a task's last lines and the lines around its last error
line, so that an error followed by a long dump (a tensor's values) is still what the report
shows and reads.

Pure functions of text, so that the coordinator (on the laptop or inside a Slurm job) and tests
call them alike.
"""

from __future__ import annotations

import collections
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from tflaunch.cluster.config import LEGACY_KERAS_ENV

OWN_PROGRAMS = "tflaunch.models"
TF_EXTRA = "pip install 'tflaunch[tf]'"
KERAS2_EXTRA = "pip install 'tflaunch[keras2]'"
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
_NO_TF_KERAS = re.compile(
    r"TF_USE_LEGACY_KERAS set to True, but you do not have the tf_keras|"
    r"No module named 'tf_keras'"
)
_KERAS_NOT_IMPORTED = re.compile(r"ImportError: Keras cannot be imported")
_NO_SCRIPT = re.compile(r"can't open file '([^']+)': \[Errno 2\]")
# Keras 3 where a program wants Keras 2 (tf.keras): fit() under a multi-worker strategy, and its
# refusal of Keras 2's APIs (tf.keras.optimizers.legacy).
_KERAS3 = re.compile(r"Attempt to convert a value \(PerReplica:|is not supported in Keras 3")
_PORT_TAKEN = re.compile(r"Address already in use|Could not start gRPC server|Failed to add port")
# A line that states an error: an exception's (``ValueError: ...``, ``a.b.InternalError: ...``)
# or a Python that could not start its script or module.
_ERROR_LINE = re.compile(
    r"^(?:[\w.]*(?:Error|Exception|Exit)(?::|$)|\S*python[\d.]*: (?:can't open file|No module))"
)
MAX_NAME = 200  # a module name longer than this is not one
MAX_PATH = 4096  # nor a path longer than this


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


def tf_keras_note(
    tail: Sequence[str], argv: Sequence[str], executable: str | None, host: str, legacy: bool
) -> str | None:
    """Under ``program.keras: legacy``: the task's Python has no tf_keras."""
    said = any(_NO_TF_KERAS.search(line) for line in tail)
    if not said and not (legacy and any(_KERAS_NOT_IMPORTED.search(line) for line in tail)):
        return None
    python = interpreter(argv, executable, host)
    return (
        "The task's Python has no tf_keras, the Keras 2 that program.keras: legacy "
        f"(TF_USE_LEGACY_KERAS=1) makes tf.keras: {python}. Fix: install it into that Python "
        f"({KERAS2_EXTRA}; tf_keras must match TensorFlow's version), or start program.argv "
        "with a Python that has it."
    )


def missing_script_note(tail: Sequence[str]) -> str | None:
    """A Python that could not open its script."""
    for line in reversed(list(tail)):
        match = _NO_SCRIPT.search(line)
        if match and len(match.group(1)) <= MAX_PATH:
            return (
                f"The task's script {match.group(1)} does not exist ({line.strip()}). Fix: "
                "program.argv or program.workdir (a relative script is the workdir's); "
                "'tflaunch validate' checks this before a start."
            )
    return None


def keras3_note(tail: Sequence[str], legacy: bool) -> str | None:
    """Keras 3 where the program wants Keras 2: TensorFlow's distributed Keras tutorials do."""
    line = next((line for line in tail if _KERAS3.search(line)), None)
    if legacy or line is None:
        return None
    said = (
        'fit() across workers ("ValueError: Attempt to convert a value (PerReplica:...)")'
        if "PerReplica" in line
        else f"Keras 2's API ({line.strip()[:160]})"
    )
    return (
        f"Keras 3 cannot run this program's {said}: TensorFlow's multi-worker Keras and "
        "ParameterServerStrategy tutorials are written for Keras 2 (tf.keras). Fix: set "
        "program.keras: legacy in the cluster file (tf.keras is then the tf_keras package: "
        f"{KERAS2_EXTRA})."
    )


def port_taken_note(tail: Sequence[str], address: str | None, holder: str | None) -> str | None:
    """A task whose port another process holds; ``holder``: who, where the report can see it."""
    line = next((line for line in reversed(list(tail)) if _PORT_TAKEN.search(line)), None)
    if line is None:
        return None
    port = f"its port {address}" if address else "its port"
    who = f"{holder} holds it" if holder else "another process holds it"
    return (
        f"The task could not listen on {port}: {who} ({line.strip()}). Fix: stop that process "
        "(a leftover run? 'tflaunch status' lists this runs dir's), or leave ports: out of a "
        "local cluster file so that free ones are picked."
    )


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
    env: Mapping[str, str] | None = None,
    address: str | None = None,
    holder: str | None = None,
) -> list[str]:
    """Every note for the report of task ``name`` that exited with ``code``, its cause first.
    ``env``: the program's environment (``program.keras: legacy`` sets TF_USE_LEGACY_KERAS);
    ``address``: the task's cluster address; ``holder``: who holds its port, where known."""
    legacy = (env or {}).get(LEGACY_KERAS_ENV) == "1"
    if code != 0:
        cause = (
            tf_keras_note(tail, argv, executable, host, legacy)
            or keras3_note(tail, legacy)
            or missing_module_note(tail, argv, executable, host)
            or missing_script_note(tail)
            or port_taken_note(tail, address, holder)
        )
        if cause:
            return [cause]
    if name.startswith("ps:"):
        no_ps = no_ps_role_note(tail, code)
        if no_ps:
            return [no_ps]
    return []


class OutputTail:
    """A task's last ``size`` lines, and the lines around the last error line it printed
    (``before`` lines before it, ``after`` after): what a failure report shows and reads when
    the error scrolled out of the last lines (a dump of a tensor's values follows it)."""

    def __init__(self, size: int = 20, before: int = 5, after: int = 14):
        self.lines: collections.deque[str] = collections.deque(maxlen=size)
        self.before, self.after = before, after
        self.window: list[str] = []  # the last error line with the lines around it
        self._left = 0  # lines still to add to the window after its error line
        self._since_error: int | None = None  # lines printed since the last error line

    def append(self, line: str) -> None:
        if _ERROR_LINE.match(line):
            self.window = [*list(self.lines)[max(0, len(self.lines) - self.before) :], line]
            self._left, self._since_error = self.after, 0
        elif self._since_error is not None:
            self._since_error += 1
            if self._left:
                self.window.append(line)
                self._left -= 1
        self.lines.append(line)

    def __iter__(self) -> Iterator[str]:
        return iter(self.lines)

    def __len__(self) -> int:
        return len(self.lines)

    def clear(self) -> None:
        self.lines.clear()
        self.window, self._left, self._since_error = [], 0, None

    @property
    def hidden_after_window(self) -> int:
        """Lines printed after the last error line that its window does not hold."""
        return (self._since_error or 0) - (self.after - self._left)

    @property
    def error_scrolled_out(self) -> bool:
        """Whether the last error line is no longer among the last lines."""
        return self._since_error is not None and self._since_error >= len(self.lines)

    def context(self) -> list[str]:
        """The lines a report reads and shows: those around the error when it scrolled out of
        the last lines, else the last lines."""
        return list(self.window) if self.error_scrolled_out else list(self.lines)


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
