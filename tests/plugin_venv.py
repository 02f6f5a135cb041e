"""Fresh venvs for the tests that install tflaunch as a user or a third party would: one holding
wheels of this checkout and of plugin packages from tests/data (tests/test_backend_plugin.py,
tests/test_pbs_plugin.py), and the builders they and tests/test_laptop.py share.

pip is not the subject of these tests; the venv it leaves is. So they build with uv where the dev
extra's uv is importable (:func:`new_venv`, :func:`install`, :func:`build_wheel`): ``python -m
venv`` alone costs 3-4 s of CPU (ensurepip unpacks pip into each venv), uv links wheels from its
cache in a fraction of pip's time. pip is the fallback where uv is missing or fails.

The wheels are built from copies of what git would commit, installed ``--no-deps`` into a venv
made without the system site-packages, and the third-party dependencies (click, PyYAML, psutil,
paramiko, ...) come from this interpreter's site-packages through a ``.pth`` line: nothing is
downloaded, and the site-packages' own tflaunch (an editable install of some checkout) stays
out, because a ``.pth`` line adds a directory without running its ``.pth`` files. Commands run
from a folder outside the checkout, without PYTHONPATH, so only the installed copies are used.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import site
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.helpers import ROOT


def copy_sources(source: Path, target: Path) -> None:
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


def run_in(
    argv: Sequence, cwd: Path, timeout: float = 300, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``argv`` to its end, without PYTHONPATH or the caller's venv, with ``env`` added."""
    return subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=clean_env(env),
        text=True,
        capture_output=True,
        timeout=timeout,
    )


def clean_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**base, **(env or {})}


@functools.cache
def uv() -> tuple[str, ...] | None:
    """``python -m uv`` where the dev extra installed it, else None (pip does the work)."""
    return (sys.executable, "-m", "uv") if importlib.util.find_spec("uv") else None


def new_venv(path: Path) -> Path:
    """A venv at ``path`` without the system site-packages (and, made by uv, without pip); its
    interpreter."""
    made = run_in(
        [*uv(), "venv", "-q", "--python", sys.executable, path]
        if uv()
        else [sys.executable, "-m", "venv", path],
        cwd=path.parent,
    )
    assert made.returncode == 0, made.stderr
    return path / "bin" / "python"


def install(python: Path, *args, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``pip install -q *args`` into ``python``'s venv: by uv from its cache alone, then by uv,
    then by that venv's pip (made by :func:`new_venv` with pip in it only where uv is missing)
    until one succeeds; the last attempt's result."""
    tries = []
    if uv():
        # Compiled as pip compiles: else every CLI call the test makes compiles what it imports
        # where PYTHONDONTWRITEBYTECODE is set (a third more CPU in tests/test_pbs_plugin.py).
        uv_pip = [*uv(), "pip", "install", "-q", "--compile-bytecode", "--python", python]
        tries += [[*uv_pip, "--offline", *args], [*uv_pip, *args]]
    if not tries or (python.parent / "pip").exists():
        tries.append([python, "-m", "pip", "install", "-q", *args])
    for argv in tries:
        result = run_in(argv, cwd, timeout)
        if result.returncode == 0:
            break
    return result


def build_wheel(source: Path, wheels: Path, cwd: Path) -> None:
    """A wheel of ``source`` into ``wheels``, built by this interpreter's setuptools (no build
    isolation: nothing is downloaded)."""
    built = run_in(
        [*uv(), "build", "-q", "--wheel", "--no-build-isolation", "--python", sys.executable]
        + ["-o", wheels, source]
        if uv()
        else [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["-w", wheels, source],
        cwd=cwd,
    )
    assert built.returncode == 0, built.stderr


def install_venv(root: Path, packages: Sequence[Path]) -> Path:
    """A venv under ``root`` with this checkout and ``packages`` installed; its directory."""
    wheels = root / "wheels"
    for source in (ROOT, *packages):  # built from copies: no build/ or egg-info in the checkout
        copy = root / "src" / source.name
        copy_sources(source, copy)
        build_wheel(copy, wheels, cwd=root)
    python = new_venv(root / "venv")
    installed = install(python, "--no-deps", "--no-index", *wheels.glob("*.whl"), cwd=root)
    assert installed.returncode == 0, installed.stderr
    purelib = run_in([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], root)
    deps = "\n".join(site.getsitepackages()) + "\n"
    (Path(purelib.stdout.strip()) / "zz_test_dependencies.pth").write_text(deps)
    return root / "venv"
