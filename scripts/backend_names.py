"""Fail when a module outside a backend's folder compares a backend's name.

Usage: python scripts/backend_names.py [PATH ...] (default: the shipped code, tflaunch/ and
launchers/). What differs between backends belongs to the backend (its ``BackendSpec`` or a
``Backend`` method), so ``config.backend == "ssh"``, ``backend != "local"``,
``name in ("slurm", "ssh")`` and ``case "slurm":`` may appear only in ``launchers/<name>/``, and
there only for the folder's own name. The names are the registered ones
(:func:`tflaunch.cluster.backends.names`), so a backend added later is covered too."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROOTS = ("tflaunch", "launchers")


def _names_in(node: ast.AST, names: set[str]) -> set[str]:
    """Backend names that ``node`` spells as a string constant, alone or in a tuple/list/set."""
    if isinstance(node, ast.Constant) and node.value in names:
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {n for item in node.elts for n in _names_in(item, names)}
    return set()


def own_backend(path: Path, names: set[str]) -> str | None:
    """The backend whose folder holds ``path`` (launchers/<name>/...), if any."""
    try:
        parts = path.resolve().relative_to(ROOT).parts
    except ValueError:  # a file outside this repository
        return None
    if len(parts) > 2 and parts[0] == "launchers" and parts[1] in names:
        return parts[1]
    return None


def violations(path: Path, names: set[str]) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    allowed = {own_backend(path, names)} - {None}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            spelled = set().union(*(_names_in(n, names) for n in [node.left, *node.comparators]))
        elif isinstance(node, ast.MatchValue):
            spelled = _names_in(node.value, names)
        else:
            continue
        for name in sorted(spelled - allowed):
            found.append(f"{path}:{node.lineno}: compares the backend name '{name}'")
    return found


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    from tflaunch.cluster.backends import names as registered

    names = set(registered())
    paths = [Path(p) for p in argv] or [ROOT / r for r in ROOTS]
    files = sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("*.py")))
    found = [v for f in files for v in violations(f, names)]
    for line in found:
        print(line)
    print(
        f"{len(files)} files: {len(found)} comparison(s) of a backend's name "
        f"({', '.join(sorted(names))}) outside its folder"
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
