"""A backend from a package outside this repository, installed beside tflaunch, runs a cluster.

The package is tests/data/backend_plugin (``tflaunch_inline``, backend ``inline`` with an
``inline:`` section and a check), registered through the ``tflaunch.backends`` entry point. The
test builds wheels of this checkout and of the package, installs both (``--no-deps``) into a
fresh venv, and runs that venv's ``tflaunch`` from a folder outside the checkout, without
PYTHONPATH, so that only the installed copies are used. The third-party dependencies (click,
PyYAML, psutil, paramiko, ...) come from this interpreter's site-packages through a ``.pth`` line:
nothing is downloaded, and the site-packages' own tflaunch (an editable install of some
checkout) stays out, because a ``.pth`` line adds a directory without running its ``.pth`` files.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, fake_cluster

pytestmark = pytest.mark.slow

PLUGIN = ROOT / "tests" / "data" / "backend_plugin"


def _copy_sources(source: Path, target: Path) -> None:
    """The files git would commit from ``source`` (tracked or new, not ignored): no venvs, run
    directories, build/ or egg-info of the checkout reach the wheel, and none is left there."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "."],
        cwd=source,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (source / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, target / name)


def _run(argv: list, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv holding wheels of this checkout and of the plugin package."""
    root = tmp_path_factory.mktemp("plugin")
    wheels = root / "wheels"
    for source in (ROOT, PLUGIN):  # built from copies: no build/ or egg-info in the checkout
        copy = root / "src" / source.name
        _copy_sources(source, copy)
        built = _run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
            + ["-w", wheels, copy],
            cwd=root,
        )
        assert built.returncode == 0, built.stderr
    made = _run([sys.executable, "-m", "venv", root / "venv"], cwd=root)
    assert made.returncode == 0, made.stderr
    python = root / "venv" / "bin" / "python"
    installed = _run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", *wheels.glob("*.whl")],
        cwd=root,
    )
    assert installed.returncode == 0, installed.stderr
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], root)
    deps = "\n".join(site.getsitepackages()) + "\n"
    (Path(purelib.stdout.strip()) / "zz_test_dependencies.pth").write_text(deps)
    return root / "venv"


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
