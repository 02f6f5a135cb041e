"""Fail when a class is over 250 lines (300 until issue 41), unless it is a known one that does
not grow.

Usage: python scripts/class_sizes.py [PATH ...] (default: the project's source, tests, benchmarks
and scripts). A class's size is its lines from ``class`` to its last statement, docstring and
comments included. ``KNOWN`` lists the classes over the limit when this check came, each with the
size it may not exceed and who shrinks it; an entry whose class is back under the limit (or gone)
fails too, so that the list only gets shorter.

It also fails when a module of the project's code (not ``tests/``) is over 600 lines: split it
along its jobs (issue 41)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROOTS = ("tflaunch", "launchers", "models", "tests", "benchmarks", "scripts")
MAX_LINES = 250
MAX_MODULE_LINES = 600
MODULE_ROOTS = ("tflaunch", "launchers", "models", "benchmarks", "scripts")  # not tests/

# "path:Class": (lines it may not exceed, why it is here)
KNOWN: dict[str, tuple[int, str]] = {}  # Coordinator (569 lines) left it with the split


def class_sizes(path: Path) -> dict[str, int]:
    """``path:Class`` -> lines, for every class in the file (nested ones as Outer.Inner)."""
    tree = ast.parse(path.read_text(), str(path))
    try:
        where = path.resolve().relative_to(ROOT).as_posix()
    except ValueError:  # a file outside this repository
        where = str(path)
    sizes: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = f"{prefix}{child.name}"
                sizes[f"{where}:{name}"] = child.end_lineno - child.lineno + 1
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return sizes


def problems(sizes: dict[str, int], complete: bool) -> list[str]:
    """What is wrong: a class over the limit not in KNOWN, a known one grown, and (when
    ``complete``, i.e. every file was read) a known entry that is no longer needed."""
    found = []
    for name, lines in sorted(sizes.items()):
        if lines <= MAX_LINES:
            continue
        if name not in KNOWN:
            found.append(f"{name}: {lines} lines; a class has at most {MAX_LINES}: split it")
        elif lines > KNOWN[name][0]:
            found.append(f"{name}: {lines} lines, more than its known {KNOWN[name][0]}")
    if complete:
        for name in KNOWN:
            if sizes.get(name, 0) <= MAX_LINES:
                found.append(
                    f"{name}: now within {MAX_LINES} lines (or gone); remove it from KNOWN"
                )
    return found


def module_problems(files: list[Path]) -> list[str]:
    """A line for each of ``files`` over :data:`MAX_MODULE_LINES` lines."""
    found = []
    for path in files:
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(
                f"{path}: {lines} lines; a module has at most {MAX_MODULE_LINES}: split it "
                "along its jobs"
            )
    return found


def main(argv: list[str]) -> int:
    paths = [Path(p) for p in argv] or [ROOT / r for r in ROOTS]
    files = sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("*.py")))
    sizes = {k: v for f in files for k, v in class_sizes(f).items()}
    modules = files if argv else [f for f in files if f.relative_to(ROOT).parts[0] in MODULE_ROOTS]
    found = problems(sizes, complete=not argv) + module_problems(modules)
    for line in found:
        print(line)
    largest = max(sizes.items(), key=lambda kv: kv[1], default=("-", 0))
    lengths = {f: len(f.read_text().splitlines()) for f in modules}
    longest = max(lengths.items(), key=lambda kv: kv[1], default=(Path("-"), 0))
    print(
        f"{len(sizes)} classes in {len(files)} files: {len(found)} problem(s); largest "
        f"{largest[0]} ({largest[1]} lines), {len(KNOWN)} known over {MAX_LINES}; longest "
        f"module {longest[0].name} ({longest[1]} lines, at most {MAX_MODULE_LINES})"
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
