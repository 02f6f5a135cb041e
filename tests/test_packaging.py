"""pyproject.toml's hand-kept ``[tool.setuptools] packages`` list matches the folders: every folder
of Python files under the three package roots is listed (else an install silently lacks it), and
every listed package is such a folder; and tests import no other test module."""

from __future__ import annotations

from pathlib import Path

import tomllib

from tests.helpers import ROOT, imported_modules


def setuptools_table() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def roots() -> dict[str, Path]:
    """Package name -> its folder, for the packages whose folder ``package-dir`` moves."""
    moved = setuptools_table().get("package-dir", {})
    return {"tflaunch": ROOT / "tflaunch", **{name: ROOT / path for name, path in moved.items()}}


def package_folders() -> set[str]:
    """Every folder of Python files under a package root, as the package name it installs as."""
    found: set[str] = set()
    tops = roots()
    for top, folder in tops.items():
        for path in folder.rglob("*.py"):
            parts = path.parent.relative_to(folder).parts
            if "__pycache__" in parts:
                continue
            name = ".".join((top, *parts))
            # a folder that package-dir maps elsewhere is found under its own root
            if not any(name == t or name.startswith(t + ".") for t in tops if len(t) > len(top)):
                found.add(name)
    return found


def test_every_package_folder_is_listed_and_every_listed_package_is_a_folder():
    listed = set(setuptools_table()["packages"])
    folders = package_folders()
    assert sorted(folders - listed) == [], "folders missing from [tool.setuptools] packages"
    assert sorted(listed - folders) == [], "listed packages that are no folder of Python files"


def test_the_check_sees_the_moved_roots_and_nested_folders():
    folders = package_folders()
    assert {
        "tflaunch.launchers.clouds.lab",
        "tflaunch.models.nets",
        "tflaunch.tracehook",
    } <= folders
    assert not any(name.startswith(("launchers", "models")) for name in folders)


def test_tests_import_fixtures_and_helpers_never_another_test_module():
    """Shared fakes live in tests/helpers.py, tests/hosts/ and each area's fixtures.py (re-exported
    by its conftest.py), so that running or moving one test file never depends on another."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if "data" in path.relative_to(ROOT / "tests").parts:
            continue
        found += [
            f"{path.relative_to(ROOT)}: {m}"
            for m in imported_modules(path)
            if m.rpartition(".")[2].startswith("test_")
        ]
    assert found == []
