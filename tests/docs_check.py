"""Checks that what the README and docs/ name exists: repository paths, ``tflaunch.…`` modules,
``tflaunch CMD`` commands and cluster-file keys. Used by tests/test_docs.py, which also feeds it
broken pages to prove that it notices."""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TOP_FOLDERS = (
    "tflaunch/",
    "launchers/",
    "models/",
    "examples/",
    "tests/",
    "scripts/",
    "benchmarks/",
    "docs/",
    ".ci/",
)
TOP_FILES = ("pyproject.toml", "README.md", ".gitignore", "constraints.txt")

_CODE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_MODULE = re.compile(r"\btflaunch(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_COMMAND = re.compile(r"(?:^|[\s`(])tflaunch ([a-z][a-z-]*)\b")
_PATHLIKE = re.compile(r"^[\w./-]+$")


@dataclass(frozen=True)
class Problem:
    """One thing a page names that does not exist."""

    page: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.what}"


def pages(root: Path = ROOT) -> list[Path]:
    """The README and every page under docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def check_pages(paths: Iterable[Path], root: Path = ROOT) -> list[Problem]:
    """Every problem on the given pages."""
    problems: list[Problem] = []
    for path in paths:
        problems += check_text(path.read_text(), path, root)
    return problems


def check_text(text: str, page: Path, root: Path = ROOT) -> list[Problem]:
    """Every problem in one page's text (``page`` places relative links)."""
    name = page.name if page.parent == root else str(page.relative_to(root))
    problems: list[Problem] = []

    def note(pos: int, what: str) -> None:
        problems.append(Problem(name, text.count("\n", 0, pos) + 1, what))

    for m in _LINK.finditer(text):
        target = m.group(1)
        if "://" in target or target.startswith("mailto:"):
            continue
        if not (page.parent / target).exists():
            note(m.start(), f"link to a missing file: {target}")
    for m in _CODE.finditer(text):
        _check_code_span(m.group(1), m.start(), root, note)
    groups = _entry_point_groups(root)
    for m in _MODULE.finditer(text):
        if m.group(0).rstrip(".") in groups:
            continue  # an entry-point group others register under, not a module
        why = _module_problem(m.group(0).rstrip("."))
        if why:
            note(m.start(), why)
    commands = _commands()
    code = [(m.start(), m.group(1)) for m in _CODE.finditer(text)]
    for m in _FENCE.finditer(text):
        if m.group(1) == "yaml":
            for why in _yaml_problems(m.group(2)):
                note(m.start(), why)
        else:
            code.append((m.start(), m.group(2)))
    for pos, snippet in code:
        for m in _COMMAND.finditer(snippet):
            if m.group(1) not in commands:
                note(pos, f"no command 'tflaunch {m.group(1)}'")
    return problems


def _check_code_span(span: str, pos: int, root: Path, note: Callable[[int, str], None]) -> None:
    """A code span that looks like a repository path must exist; a dotted cluster-file key
    (``supervision.restart``) must be in the schema."""
    word = span.strip()
    if _PATHLIKE.match(word) and (word.startswith(TOP_FOLDERS) or word in TOP_FILES):
        if not (root / word.rstrip("/")).exists():
            note(pos, f"missing path: {word}")
        return
    key = re.fullmatch(r"([a-z_]+(?:\.[a-z_0-9]+)+)(?::.*)?", word)
    if (
        key
        and key.group(1).split(".")[0] in _schema()["properties"]
        and not _key_in_schema(key.group(1).split("."))
    ):
        note(pos, f"no cluster-file key '{key.group(1)}' in the schema")


def _module_problem(dotted: str) -> str | None:
    """Why a ``tflaunch.a.b`` name does not resolve, or None. The longest importable prefix must
    be a module and whatever follows an attribute of it (modules under tflaunch.models are only
    located, not imported: they may import TensorFlow)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        rest = parts[n:]
        if not rest:
            return None
        if name.startswith("tflaunch.models"):
            return f"'{dotted}': '{rest[0]}' is not a module of {name}"
        obj = importlib.import_module(name)
        for attr in rest:
            if not hasattr(obj, attr):
                return f"'{dotted}': {name} has no '{attr}'"
            obj = getattr(obj, attr)
        return None
    return f"no module '{dotted}'"


def _entry_point_groups(root: Path) -> set[str]:
    """The entry-point groups pyproject.toml declares (``tflaunch.backends``, …)."""
    import tomllib

    if not (root / "pyproject.toml").exists():
        return set()
    with (root / "pyproject.toml").open("rb") as f:
        return set(tomllib.load(f)["project"].get("entry-points", {}))


def _commands() -> set[str]:
    from tflaunch.cli import cli

    return set(cli.commands)


_SCHEMA: dict | None = None


def _schema() -> dict:
    global _SCHEMA
    if _SCHEMA is None:
        from tflaunch.cluster.config import config_schema

        _SCHEMA = config_schema()
    return _SCHEMA


def _sub_schemas(node: dict) -> list[dict]:
    """The object schemas a value of ``node`` may be (through anyOf/oneOf and list items)."""
    found = []
    for alt in node.get("anyOf", []) + node.get("oneOf", []) + [node]:
        if "items" in alt and isinstance(alt["items"], dict):
            found += _sub_schemas(alt["items"])
        if "properties" in alt or "additionalProperties" in alt:
            found.append(alt)
    return found


def _key_in_schema(path: list[str], node: dict | None = None) -> bool:
    node = node if node is not None else _schema()
    if not path:
        return True
    for sub in _sub_schemas(node):
        props = sub.get("properties", {})
        if path[0] in props:
            return _key_in_schema(path[1:], props[path[0]])
        extra = sub.get("additionalProperties")
        if isinstance(extra, dict):
            return _key_in_schema(path[1:], extra)
        if extra is True:
            return True
    return False


def _yaml_problems(block: str) -> list[str]:
    """Unknown keys in a YAML block that is a cluster file (or a fragment of one)."""
    try:
        data = yaml.safe_load(block)
    except yaml.YAMLError:
        return []
    if not isinstance(data, dict) or not set(data) & set(_schema()["properties"]):
        return []
    return [f"no cluster-file key '{'.'.join(p)}' in the schema" for p in _unknown(data, [])]


def _unknown(value: object, path: list[str], node: dict | None = None) -> list[list[str]]:
    node = node if node is not None else _schema()
    bad: list[list[str]] = []
    if isinstance(value, dict):
        for key, sub in value.items():
            if not _key_in_schema([str(key)], node):
                bad.append([*path, str(key)])
                continue
            child = _child(node, str(key))
            if child is not None:
                bad += _unknown(sub, [*path, str(key)], child)
    elif isinstance(value, list):
        for item in value:
            for sub in _sub_schemas(node):
                if "items" not in node and sub is node:
                    continue
                bad += _unknown(item, path, sub)
                break
    return bad


def _child(node: dict, key: str) -> dict | None:
    for sub in _sub_schemas(node):
        if key in sub.get("properties", {}):
            return sub["properties"][key]
        if isinstance(sub.get("additionalProperties"), dict):
            return sub["additionalProperties"]
    return None
