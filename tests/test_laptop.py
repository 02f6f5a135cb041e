"""Day one on a laptop without TensorFlow: a fresh venv (no system site packages) with tflaunch
and its base dependencies only, as ``pip install .`` without the ``tf`` extra leaves it.

``examples/smoke.yaml`` runs to exit 0; ``examples/local.yaml`` (MNIST) stops with one report
naming the module its tasks' Python lacks and the ``tf`` extra; ``model`` and ``placement`` say
they need TensorFlow; ``validate examples/aws.yaml`` checks the file without boto3 and says
running it needs the ``aws`` extra. The base dependencies come from the package index (or uv's or
pip's cache; uv builds the venv where the dev extra has it, as tests/plugin_venv.py says): where it
cannot be reached the tests skip, and fail under ``CI``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT, free_port_base
from tests.plugin_venv import install, new_venv

pytestmark = pytest.mark.slow
SHIPPED = ("pyproject.toml", "README.md", "tflaunch", "launchers", "models", "examples")


@pytest.fixture(scope="module")
def laptop(tmp_path_factory) -> dict:
    """A venv with tflaunch (installed from a copy of the checkout) and the base dependencies."""
    top = tmp_path_factory.mktemp("laptop")
    source = top / "src"
    for name in SHIPPED:
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy(origin, source / name)
    venv = top / "venv"
    python = new_venv(venv)  # by uv where the dev extra has it (tests/plugin_venv.py), else venv
    # The base dependencies: the installed tflaunch's requirements outside any extra.
    base = [r for r in metadata.requires("tflaunch") or [] if "extra ==" not in r]
    install_base = install(python, "-c", ROOT / "constraints.txt", *base, cwd=top)
    if install_base.returncode != 0:
        why = f"cannot install the base dependencies from pip's index: {install_base.stderr[-500:]}"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    installed = install(python, "--no-deps", source, cwd=top)
    assert installed.returncode == 0, installed.stderr
    check = subprocess.run([str(python), "-c", "import tensorflow"], capture_output=True)
    assert check.returncode != 0, "the laptop venv must not see TensorFlow"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"  # as 'activate' does
    env["VIRTUAL_ENV"] = str(venv)
    return {"bin": venv / "bin", "env": env, "examples": source / "examples", "top": top}


def run(laptop: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(laptop["bin"] / "tflaunch"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=laptop["env"],
        cwd=laptop["top"],
    )


def on_free_ports(laptop: dict, example: str) -> Path:
    """The example as it ships, moved to free ports (tests never use the defaults)."""
    data = yaml.safe_load((laptop["examples"] / example).read_text())
    base = free_port_base()
    data["ports"] = {"ps": base, "worker": base + 10}
    data["program"]["workdir"] = str(laptop["examples"])
    path = laptop["top"] / example
    path.write_text(yaml.safe_dump(data))
    return path


def test_smoke_example_runs_without_tensorflow(laptop):
    result = run(laptop, "up", str(on_free_ports(laptop, "smoke.yaml")))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    for task in ("ps:0", "worker:0", "worker:1"):
        assert f"[{task}]" in result.stdout and f"{task}: cluster from TF_CONFIG" in result.stdout
    assert "[worker:1] worker:1 done" in result.stdout and "succeeded" in result.stdout


def test_mnist_without_tensorflow_is_one_report_naming_the_module_and_the_extra(laptop):
    result = run(laptop, "up", str(on_free_ports(laptop, "local.yaml")))
    assert result.returncode not in (0, 2), result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stderr.count("tflaunch: run ") == 1, result.stderr
    assert "cannot import numpy" in result.stderr
    assert "pip install 'tflaunch[tf]'" in result.stderr
    assert str(laptop["bin"]) in result.stderr  # which Python: the venv's, where 'python3' is
    assert "Traceback" not in result.stderr


def test_commands_that_need_tensorflow_here_say_so_first(laptop):
    for args in (
        ("model", "--link", "50,1000", "--compute-img-s", "10"),
        ("placement", "--num-ps", "2"),
        ("netbench", str(on_free_ports(laptop, "smoke.yaml")), "--sizes", "1K"),
    ):
        result = run(laptop, *args)
        assert result.returncode == 2, result.stderr
        assert f"tflaunch {args[0]} " in result.stderr and "with TensorFlow" in result.stderr
        assert "pip install 'tflaunch[tf]'" in result.stderr and "Traceback" not in result.stderr


def test_aws_files_check_without_boto3_and_commands_name_the_extra(laptop):
    python = str(laptop["bin"] / "python")
    assert subprocess.run([python, "-c", "import boto3"], capture_output=True).returncode != 0
    for example in ("aws.yaml", "aws-provision.yaml"):
        result = run(laptop, "validate", str(laptop["examples"] / example))
        assert result.returncode == 0, result.stderr
        assert "file ok; planning and running it need boto3 (pip install 'tflaunch[aws]')" in (
            result.stdout
        )
    for args, command in (
        (("gc", "--region", "us-east-1"), "gc"),
        (("down", "--cluster", "c", "--region", "us-east-1"), "down --cluster"),
    ):
        result = run(laptop, *args)
        assert result.returncode == 2
        assert f"tflaunch {command} talks to the cloud through boto3" in result.stderr
        assert "pip install 'tflaunch[aws]'" in result.stderr and "ssh." not in result.stderr
    broken = laptop["top"] / "broken-aws.yaml"
    broken.write_text((laptop["examples"] / "aws.yaml").read_text() + "\nnot_a_key: 1\n")
    result = run(laptop, "validate", str(broken))
    assert result.returncode == 2 and "unknown key 'not_a_key'" in result.stderr
