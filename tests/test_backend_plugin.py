"""A backend from a package outside this repository, installed beside tflaunch, runs a cluster.

The package is tests/data/backend_plugin (``tflaunch_inline``, backend ``inline`` with an
``inline:`` section and a check), registered through the ``tflaunch.backends`` entry point and
installed beside this checkout in a fresh venv (:mod:`tests.plugin_venv`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import ROOT, fake_cluster
from tests.plugin_venv import install_venv
from tests.plugin_venv import run_in as _run

pytestmark = pytest.mark.slow

PLUGIN = ROOT / "tests" / "data" / "backend_plugin"


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv holding wheels of this checkout and of the plugin package."""
    return install_venv(tmp_path_factory.mktemp("plugin"), [PLUGIN])


def test_an_installed_backend_package_runs_a_cluster(venv, tmp_path):
    tflaunch = venv / "bin" / "tflaunch"
    where = _run(
        [venv / "bin" / "python", "-c", "import tflaunch; print(tflaunch.__file__)"], tmp_path
    )
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr  # not this checkout

    cluster = fake_cluster(
        tmp_path,
        {"WORK_SECONDS": "0.2"},
        backend="inline",
        inline={"greeting": "hello from a test"},
    )
    validated = _run([tflaunch, "validate", cluster], tmp_path)
    assert validated.returncode == 0, validated.stderr
    assert "3 tasks on 1 host(s), backend inline" in validated.stdout

    schema = json.loads(_run([tflaunch, "schema"], tmp_path).stdout)
    assert schema["properties"]["backend"]["enum"] == ["local", "slurm", "ssh", "inline"]
    assert schema["properties"]["inline"]["description"] == "Inline backend settings"
    assert {"slurm", "ssh"} <= set(schema["properties"])  # the built-ins' sections stay

    up = _run([tflaunch, "up", cluster], tmp_path)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "[inline] hello from a test" in up.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["backend"] == "inline" and meta["state"] == "succeeded" and meta["exit_code"] == 0
    assert sorted(p.name for p in run_dir.glob("*.log")) == [
        "ps-0.log",
        "worker-0.log",
        "worker-1.log",
    ]
    status = _run([tflaunch, "status", run_dir.name, "--run-dir", tmp_path / "runs"], tmp_path)
    assert status.returncode == 0 and "succeeded (backend inline" in status.stdout


def test_the_installed_backend_checks_its_section(venv, tmp_path):
    tflaunch = venv / "bin" / "tflaunch"
    cluster = fake_cluster(tmp_path, backend="inline", inline={"greeting": " "})
    result = _run([tflaunch, "validate", cluster], tmp_path)
    assert result.returncode == 2
    assert "inline.greeting: is empty; say something" in result.stderr
    assert "Traceback" not in result.stderr

    cluster = fake_cluster(tmp_path, backend="inlin")
    result = _run([tflaunch, "validate", cluster], tmp_path)
    assert result.returncode == 2
    assert (
        "backend: expected one of 'local', 'slurm', 'ssh', 'inline', got 'inlin' "
        "(did you mean 'inline'?)" in result.stderr
    )
