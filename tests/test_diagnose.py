"""Failure reports that name the cause a new user meets first: a module the task's Python lacks
(which one, which Python, the fix) and a PS whose program has no PS role (roles.ps: 0)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.helpers import ROOT, tflaunch, write_cluster
from tflaunch.cli import cli
from tflaunch.runtime import diagnose

TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "<frozen runpy>", line 198, in _run_module_as_main',
    '  File "/x/models/mnist.py", line 60, in <module>',
    "    import numpy as np",
    "ModuleNotFoundError: No module named 'numpy'",
]
MNIST = ("python3", "-m", "tflaunch.models.mnist", "--job_name", "{job_name}")


def test_a_missing_module_of_tflaunchs_own_program_names_the_tf_extra():
    (note,) = diagnose.notes("ps:0", TRACEBACK, MNIST, "/venv/bin/python3", "localhost", 1)
    assert "cannot import numpy" in note
    assert "python3 (/venv/bin/python3) on localhost" in note
    assert "pip install 'tflaunch[tf]'" in note


def test_a_missing_module_of_a_users_program_says_to_install_it_into_that_python():
    tail = [
        "Traceback (most recent call last):",
        "ModuleNotFoundError: No module named 'sklearn.svm'",
    ]
    (note,) = diagnose.notes("worker:0", tail, ("python", "train.py"), None, "node7", 1)
    assert "cannot import sklearn" in note and "python on node7" in note
    assert "install scikit-learn into that Python (python -m pip install scikit-learn)" in note
    assert "tflaunch[tf]" not in note


@pytest.mark.parametrize(
    ("line", "module", "fix"),
    [
        (
            "/usr/bin/python3: Error while finding module specification for "
            "'tflaunch.models.mnist' (ModuleNotFoundError: No module named 'tflaunch')",
            "tflaunch",
            "install tflaunch into that Python",
        ),
        (
            "/usr/bin/python3: No module named tflaunch.models.nope",
            "tflaunch.models.nope",
            "has no module",
        ),
        (
            "ImportError: cannot import name 'keras' from 'tensorflow' (/x)",
            "tensorflow",
            "tflaunch[tf]",
        ),
    ],
)
def test_other_import_failures_name_their_module(line, module, fix):
    (note,) = diagnose.notes("worker:1", ["x", line], MNIST, None, "h", 1)
    assert f"cannot import {module} " in note and fix in note


def test_no_note_for_other_failures_or_a_clean_exit():
    assert diagnose.notes("worker:0", ["ValueError: bad shape"], MNIST, None, "h", 1) == []
    assert diagnose.notes("worker:0", TRACEBACK, MNIST, None, "h", 0) == []
    long_name = "ModuleNotFoundError: No module named '" + "a" * 300 + "'"
    assert diagnose.notes("worker:0", [long_name], MNIST, None, "h", 1) == []


def test_a_ps_without_a_ps_role_is_told_to_be_zero():
    tail = ["ValueError: There is no id for task_type 'ps'"]
    (note,) = diagnose.notes("ps:0", tail, ("python", "k.py"), None, "h", 1)
    assert "roles: {ps: 0, worker: N}" in note and "There is no id for task_type 'ps'" in note
    (quiet,) = diagnose.notes("ps:0", ["done"], ("python", "k.py"), None, "h", 0)
    assert "exited by itself with code 0" in quiet and "ps: 0" in quiet
    assert diagnose.notes("ps:0", ["killed"], ("python", "k.py"), None, "h", 1) == []
    assert diagnose.notes("worker:0", tail, ("python", "k.py"), None, "h", 1) == []


def test_up_of_a_program_missing_a_module_reports_it_once_without_the_traceback(tmp_path):
    program = tmp_path / "train.py"
    program.write_text("import json\nimport no_such_module_for_tflaunch_tests\n")
    cluster = write_cluster(
        tmp_path / "c.yaml", {"argv": [sys.executable, str(program)]}, roles={"ps": 0, "worker": 2}
    )
    result = tflaunch("up", str(cluster))
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("failed:") == 1, result.stderr
    assert "cannot import no_such_module_for_tflaunch_tests" in result.stderr
    assert f"({sys.executable})" in result.stderr or sys.executable in result.stderr
    assert "install no_such_module_for_tflaunch_tests into that Python" in result.stderr
    assert "Traceback" not in result.stderr and "kept in its log" in result.stderr
    assert "No module named" in result.stdout  # the task's own output still streams


def without_ps_role(path: Path) -> Path:
    """The cluster file with its roles left out but for the workers: the PS by default."""
    data = yaml.safe_load(path.read_text())
    data["roles"] = {"worker": 2}
    path.write_text(yaml.safe_dump(data))
    return path


def test_plan_marks_a_ps_the_file_got_by_default(tmp_path):
    path = without_ps_role(write_cluster(tmp_path / "c.yaml", {"argv": ["python3", "k.py"]}))
    shown = CliRunner().invoke(cli, ["plan", str(path)])
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines()[1].startswith("ps:0* ")
    assert "* a PS by default" in shown.output and "write roles.ps: 0" in shown.output
    named = write_cluster(tmp_path / "named.yaml", {"argv": ["python3", "k.py"]})
    assert "*" not in CliRunner().invoke(cli, ["plan", str(named)]).output


@pytest.mark.slow
def test_a_keras_mwms_program_with_the_default_ps_is_told_to_write_ps_0(tmp_path):
    """TensorFlow's multi-worker Keras tutorial program, written as a TFJob user would (workers
    only): its default PS dies of "There is no id for task_type 'ps'"."""
    pytest.importorskip("tensorflow")
    pytest.importorskip("tf_keras")
    program = {
        "argv": [sys.executable, str(ROOT / "tests" / "programs" / "keras_mwms.py"), "1", "5"],
        "keras": "legacy",
    }
    path = without_ps_role(write_cluster(tmp_path / "c.yaml", program))
    result = tflaunch("up", str(path), timeout=300)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "ps:0 on localhost exited by itself" in result.stderr
    assert "There is no id for task_type 'ps'" in result.stderr
    assert "roles: {ps: 0, worker: N}" in result.stderr
