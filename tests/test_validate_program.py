"""``validate`` checks what a start would hit (issue 40): a Python's script that does not exist,
``program.keras: legacy`` under a Python without tf_keras, and a PS the file got by default (a
note on ``validate`` and on ``up``'s first line)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from tests.helpers import FAKE_TASK, tflaunch, write_cluster
from tflaunch.cluster.plan import TaskView
from tflaunch.runtime.programcheck import missing_script, script_of


def test_the_script_a_python_argv_runs():
    assert script_of(["python3", "-u", "train.py", "--x"]) == "train.py"
    assert script_of(["/usr/bin/python3.11", "-W", "ignore", "-X", "dev", "t.py"]) == "t.py"
    assert script_of(["python3", "-m", "tflaunch.models.smoke"]) is None
    assert script_of(["python", "-c", "print(1)", "x.py"]) is None
    assert script_of(["python3", "-mtflaunch.models.smoke"]) is None
    assert script_of(["bash", "run.sh"]) is None  # not a Python: its argument is its own
    assert script_of(["python3"]) is None


def test_a_missing_script_is_named_with_where_it_was_looked_for(tmp_path):
    view = TaskView(("python3", "train_missing.py"), {}, str(tmp_path))
    problem = missing_script("ps:0", view, "localhost")
    assert problem is not None
    assert "'train_missing.py'" in problem and str(tmp_path / "train_missing.py") in problem
    (tmp_path / "train_missing.py").write_text("")
    assert missing_script("ps:0", view, "localhost") is None


def test_validate_refuses_a_missing_script_and_offline_does_not_look(tmp_path):
    path = write_cluster(tmp_path / "c.yaml", {"argv": [sys.executable, "train_missing.py"]})
    result = tflaunch("validate", str(path))
    assert result.returncode == 2, result.stdout
    assert "the script 'train_missing.py' of program.argv does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    assert tflaunch("validate", "--offline", str(path)).returncode == 0
    (tmp_path / "train_missing.py").write_text("")
    assert tflaunch("validate", str(path)).returncode == 0


def python_without_tf_keras(folder: Path) -> str:
    """This venv's Python without its site-packages (-S): no tf_keras, as a fresh Python has."""
    path = folder / "python3"
    path.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    path.chmod(0o755)
    return str(path)


def test_validate_refuses_keras_legacy_without_tf_keras_naming_the_extra(tmp_path):
    program = {"argv": [python_without_tf_keras(tmp_path), str(FAKE_TASK)], "keras": "legacy"}
    path = write_cluster(tmp_path / "c.yaml", program)
    result = tflaunch("validate", str(path))
    assert result.returncode == 2, result.stdout
    assert "program.keras: legacy" in result.stderr and "has no tf_keras" in result.stderr
    assert "pip install 'tflaunch[keras2]'" in result.stderr
    # The same file with this Python, which has tf_keras (the dev extra), is fine.
    program["argv"][0] = sys.executable
    assert tflaunch("validate", str(write_cluster(path, program))).returncode == 0


def test_a_ps_by_default_is_noted_by_validate_and_up_first(tmp_path):
    path = write_cluster(
        tmp_path / "c.yaml",
        {"argv": [sys.executable, "-m", "tflaunch.models.smoke", "--steps", "1"]},
    )
    data = yaml.safe_load(path.read_text())
    data["roles"] = {"worker": 1}
    path.write_text(yaml.safe_dump(data))
    checked = tflaunch("validate", str(path))
    assert checked.returncode == 0, checked.stderr
    assert "note: " in checked.stdout and "names no roles.ps" in checked.stdout
    assert "write roles.ps: 0" in checked.stdout
    up = tflaunch("up", str(path))
    assert up.returncode == 0, up.stderr
    first = up.stderr.splitlines()[0]
    assert first.startswith("[tflaunch] note: ") and "names no roles.ps" in first
