"""A fresh venv holding wheels of this checkout and of plugin packages from tests/data, for the
tests that install a backend as a third party would (tests/test_backend_plugin.py,
tests/test_pbs_plugin.py).

The wheels are built from copies of what git would commit, installed ``--no-deps`` into a venv
made without the system site-packages, and the third-party dependencies (click, PyYAML, psutil,
paramiko, ...) come from this interpreter's site-packages through a ``.pth`` line: nothing is
downloaded, and the site-packages' own tflaunch (an editable install of some checkout) stays
out, because a ``.pth`` line adds a directory without running its ``.pth`` files. Commands run
from a folder outside the checkout, without PYTHONPATH, so only the installed copies are used.
"""

from __future__ import annotations

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


def install_venv(root: Path, packages: Sequence[Path]) -> Path:
    """A venv under ``root`` with this checkout and ``packages`` installed; its directory."""
    wheels = root / "wheels"
    for source in (ROOT, *packages):  # built from copies: no build/ or egg-info in the checkout
        copy = root / "src" / source.name
        copy_sources(source, copy)
        built = run_in(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
            + ["-w", wheels, copy],
            cwd=root,
        )
        assert built.returncode == 0, built.stderr
    made = run_in([sys.executable, "-m", "venv", root / "venv"], cwd=root)
    assert made.returncode == 0, made.stderr
    python = root / "venv" / "bin" / "python"
    installed = run_in(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", *wheels.glob("*.whl")],
        cwd=root,
    )
    assert installed.returncode == 0, installed.stderr
    purelib = run_in([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], root)
    deps = "\n".join(site.getsitepackages()) + "\n"
    (Path(purelib.stdout.strip()) / "zz_test_dependencies.pth").write_text(deps)
    return root / "venv"
