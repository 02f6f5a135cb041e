"""What ``validate`` can tell about a task's program before anything starts, beyond "it is on
PATH": the script a Python is given exists (relative to the workdir), and under
``program.keras: legacy`` the task's Python has ``tf_keras``. Each is a start that would fail
at once, found here instead of in a failure report after every task started.

Both look at the program as a task runs it (argv with its placeholders filled, the task's
environment): the local backend's ``check_here`` calls them for this machine's tasks.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Sequence

from tflaunch.cluster.plan import TaskView
from tflaunch.runtime.diagnose import KERAS2_EXTRA, program_path

_PYTHON = re.compile(r"^python[\d.]*$")
# Python options that take the next argument as their value.
_WITH_VALUE = ("-W", "-X", "-Q")
# The probe a task's Python runs: exit 3 when tf_keras is not importable.
_TF_KERAS_PROBE = (
    "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('tf_keras') else 3)"
)
PROBE_TIMEOUT_S = 60.0


def is_python(program: str) -> bool:
    """Whether ``program`` names a Python interpreter (python, python3, /usr/bin/python3.11)."""
    return bool(_PYTHON.match(os.path.basename(program)))


def script_of(argv: Sequence[str]) -> str | None:
    """The script a Python argv runs (``python3 -u train.py``: train.py); None for ``-m``,
    ``-c``, stdin, or a program that is not Python."""
    if not argv or not is_python(argv[0]):
        return None
    args = iter(argv[1:])
    for arg in args:
        if arg in ("-", "--") or arg.startswith(("-c", "-m")):
            return None
        if arg in _WITH_VALUE:
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None


def missing_script(name: str, view: TaskView, host: str) -> str | None:
    """One sentence when the script ``view`` gives its Python does not exist."""
    script = script_of(view.argv)
    if script is None:
        return None
    full = os.path.join(view.workdir, os.path.expanduser(script))
    if os.path.exists(full):
        return None
    return (
        f"{name}: the script {script!r} of program.argv does not exist on {host} ({full}; "
        "relative paths are the workdir's). Fix program.argv or program.workdir."
    )


def missing_tf_keras(views: Iterable[TaskView]) -> str | None:
    """Under ``program.keras: legacy``: one sentence when a task's Python (each distinct one
    asked once, in its task's environment) cannot import ``tf_keras``."""
    asked: set[tuple[str, str]] = set()
    for view in views:
        if not view.argv or not is_python(view.argv[0]):
            continue
        path = view.env.get("PATH", os.environ.get("PATH", ""))
        python = program_path(view.argv[0], view.workdir, path)
        if python is None or (python, path) in asked:
            continue
        asked.add((python, path))
        if not _lacks_tf_keras(python, view):
            continue
        shown = view.argv[0] if python == view.argv[0] else f"{view.argv[0]} ({python})"
        return (
            "program.keras: legacy makes tf.keras the tf_keras package (Keras 2), but the "
            f"tasks' Python {shown} has no tf_keras: install it into that Python "
            f"({KERAS2_EXTRA}, or {view.argv[0]} -m pip install tf_keras matching TensorFlow's "
            "version), or start program.argv with a Python that has it"
        )
    return None


def _lacks_tf_keras(python: str, view: TaskView) -> bool:
    try:
        probe = subprocess.run(
            [python, "-c", _TF_KERAS_PROBE],
            env={**os.environ, **view.env},
            cwd=view.workdir if os.path.isdir(view.workdir) else None,
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False  # a Python that cannot be asked is the program check's to report
    return probe.returncode == 3
