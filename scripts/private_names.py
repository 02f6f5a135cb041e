"""Fail when a module uses another module's private names (``_name``) of this project.

Usage: python scripts/private_names.py [PATH ...] (default: the project's source, tests and
benchmarks). Flags ``from tflaunch.x import _name`` and ``module._name`` where ``module`` was
bound by importing one of the project's modules; a module's own private names are its business."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOTS = ("tflaunch", "launchers", "models", "tests", "benchmarks", "scripts")
PROJECT = ("tflaunch", "tests")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    modules: set[str] = set()  # local names bound to project modules
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PROJECT):
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{path}:{node.lineno}: imports {node.module}.{alias.name}")
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PROJECT):
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
        ):
            found.append(f"{path}:{node.lineno}: uses {node.value.id}.{node.attr}")
    return found


def main(argv: list[str]) -> int:
    paths = [Path(p) for p in argv] or [Path(r) for r in ROOTS if Path(r).is_dir()]
    files = sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("*.py")))
    found = [v for f in files for v in violations(f)]
    for line in found:
        print(line)
    print(f"{len(files)} files: {len(found)} use(s) of another module's private names")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
