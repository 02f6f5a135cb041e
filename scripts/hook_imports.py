"""Fail when the trace hook (``tflaunch/tracehook/``, which runs inside users' programs) imports
anything but the standard library: nothing of tflaunch, no third-party package (it never imports
TensorFlow itself; it waits for the program to). import-linter's contract covers tflaunch's
modules; this covers the rest, and imports made with ``importlib`` by a literal name.

Usage: python scripts/hook_imports.py [FOLDER] (default: tflaunch/tracehook)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

FOLDER = Path(__file__).resolve().parent.parent / "tflaunch" / "tracehook"


def _top(name: str) -> str:
    return name.split(".")[0]


def imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import, ``importlib.import_module("x")`` included."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # a relative import: the hook's own folder
                out.append((node.lineno, "tflaunch.tracehook"))
            elif node.module:
                out.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.append((node.lineno, node.args[0].value))
    return out


def violations(folder: Path) -> list[str]:
    found = []
    for path in sorted(folder.glob("*.py")):
        for line, module in imported(ast.parse(path.read_text(), str(path))):
            if _top(module) not in sys.stdlib_module_names or _top(module) == "tflaunch":
                found.append(f"{path}:{line}: imports {module} (only the standard library)")
    return found


def main(argv: list[str]) -> int:
    found = violations(Path(argv[0]) if argv else FOLDER)
    for line in found:
        print(line)
    if found:
        print("the trace hook runs inside users' programs: the standard library only")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
