"""Checks that what the README and docs/ name exists: repository paths, ``tflaunch.…`` modules,
``tflaunch CMD`` commands and their ``--options``, benchmark scripts' and programs' flags, cited
tests, cluster-file keys, copies of example files; that the architecture page's module tree is
the folders'; and that every exit code the pages promise is asserted by a test. Used by
tests/test_docs.py, which also feeds it broken pages to prove that it notices each kind."""

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
        for why in _option_problems(snippet, commands):
            note(pos, why)
        for why in _flag_problems(snippet, root):
            note(pos, why)
        for why in _cited_test_problems(snippet, root):
            note(pos, why)
    for m in _FENCE.finditer(text):
        if m.group(1) == "yaml":
            why = _copy_problem(m.group(2), root)
            if why:
                note(m.start(), why)
    for m in _FENCE.finditer(text):
        if not m.group(1) and m.group(2).startswith("tflaunch/"):
            for why in tree_problems(m.group(2), root):
                note(m.start(), why)
    for pos, why in _run_module_problems(text, root):
        note(pos, why)
    asserted = _asserted_codes(root)
    for pos, code in _claimed_codes(text):
        if code not in asserted:
            note(pos, f"exit code {code} is promised, but no test asserts it")
    return problems


# ---- exit codes promised and exercised ---------------------------------------------------------

_NUMBERS = r"(\d{1,3}(?:(?:,\s*|\s+or\s+|\s+and\s+)\d{1,3})*)"
_CLAIMS = (
    re.compile(r"\bexit(?:s|ing)?(?: with)?(?: code| codes| status)?\s+" + _NUMBERS + r"\b"),
    re.compile(r"\b(?:SIGINT|SIGTERM|SIGHUP|SIGKILL)\s+(\d{3})\b"),
    re.compile(r"\((\d{3}) for a SIG"),
)


def _claimed_codes(text: str) -> list[tuple[int, int]]:
    """(position, code) of every exit code a page promises ("exits 2", "exit 130, 143, 129",
    "SIGTERM 143", "(137 for a SIGKILLed worker)")."""
    return [
        (m.start(), int(n))
        for pattern in _CLAIMS
        for m in pattern.finditer(text)
        for n in re.findall(r"\d+", m.group(1))
    ]


_ASSERTED: dict[Path, set[int]] = {}


def _asserted_codes(root: Path) -> set[int]:
    """The exit codes some test asserts a command or a run ends with (``returncode == 2``,
    ``exit_code in (130, 143)``, ``outcome.code == 137``, a ``code`` parameter's values)."""
    if root not in _ASSERTED:
        codes: set[int] = set()
        for path in (root / "tests").rglob("test_*.py"):
            text = path.read_text()
            codes |= {
                int(n) for n in re.findall(r"(?:returncode|exit_code|\bcode)\s*==\s*(\d+)", text)
            }
            # a parametrized test's codes: parametrize("sig, code", [(signal.SIGHUP, 129), ...])
            for group in re.findall(
                r"parametrize\(\s*[\"'][^\"']*code[^\"']*[\"'],\s*(\[.*?\])\s*\)", text, re.S
            ):
                codes |= {int(n) for n in re.findall(r"(?<![\w.])\d+\b", group)}
            for group in re.findall(
                r"(?:returncode|exit_code|\bcode)\s+in\s+[(\[{]([^)\]}]*)", text
            ):
                codes |= {int(n) for n in re.findall(r"\b\d+\b", group)}
        _ASSERTED[root] = codes
    return _ASSERTED[root]


# ---- --options of commands ---------------------------------------------------------------------

_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9_-]*)")
# A span that is a command without 'tflaunch' (`up --detach`, `status RUN --watch`): the command,
# then only placeholders (RUN, CLUSTER_FILE) or cluster files before its first option.
_BARE_COMMAND = re.compile(r"^([a-z][a-z-]*)(?: (?:[A-Z][A-Z_]{2,}|[\w./-]+\.yaml))* --")
GLOBAL_OPTIONS = {"--debug", "--version", "--help", "-h"}


def _command_options(name: str) -> set[str]:
    from tflaunch.cli import cli

    command = cli.commands[name]
    return {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}


def _option_problems(snippet: str, commands: set[str]) -> list[str]:
    """Every ``--option`` after ``tflaunch CMD`` (or after a span that starts with ``CMD``, as
    in `up --detach`) on the same line must be one of that command's."""
    problems = []
    for line in snippet.splitlines():
        line = line.split(" # ", 1)[0]  # a shell comment says what, in words
        uses = [(m.group(1), m.end()) for m in _COMMAND.finditer(line)]
        bare = _BARE_COMMAND.match(line.strip())
        if not uses and bare and bare.group(1) in commands:
            uses = [(bare.group(1), line.index(bare.group(1)) + len(bare.group(1)))]
        for i, (command, start) in enumerate(uses):
            if command not in commands:
                continue
            end = uses[i + 1][1] if i + 1 < len(uses) else len(line)
            known = _command_options(command) | GLOBAL_OPTIONS
            for m in _OPTION.finditer(line[start:end]):
                if m.group(1) not in known:
                    problems.append(f"'tflaunch {command}' has no option {m.group(1)}")
    return problems


# ---- flags of benchmark scripts and programs ---------------------------------------------------

_SCRIPT = re.compile(r"(benchmarks/[\w]+\.py|-m tflaunch\.models\.[\w.]+)")


def _flags_of(script: str, root: Path) -> set[str] | None:
    """The ``--flags`` a benchmark script or a program under models/ defines (as string
    literals in its source); None when the script is not there (a missing path is said apart)."""
    if script.startswith("benchmarks/"):
        files = [root / script]
    else:
        module = script.split("tflaunch.models.", 1)[1]
        top = root / "models" / (module.replace(".", "/") + ".py")
        # a program's flags may come from the shared parts it builds on (cluster flags, runners)
        files = [top, *sorted((root / "models").rglob("*.py"))] if top.exists() else [top]
    if not files[0].exists():
        return None
    text = "".join(f.read_text() for f in files)
    return set(re.findall(r"[\"'](--[a-zA-Z][\w-]*)[\"'=]", text))


def _flag_problems(snippet: str, root: Path) -> list[str]:
    problems = []
    for line in snippet.splitlines():
        line = line.split(" # ", 1)[0]
        found = list(_SCRIPT.finditer(line))
        for i, m in enumerate(found):
            flags = _flags_of(m.group(1).removeprefix("-m "), root)
            if flags is None:
                continue
            end = found[i + 1].start() if i + 1 < len(found) else len(line)
            tail = re.split(r"[|;&]|\btflaunch ", line[m.end() : end])[0]
            for flag in _OPTION.findall(tail):
                if flag not in flags and flag != "--help":
                    problems.append(f"{m.group(1).removeprefix('-m ')} has no flag {flag}")
    return sorted(set(problems))


# ---- cited tests -------------------------------------------------------------------------------

_CITED = re.compile(r"(tests/[\w/]+\.py)::(\w+)|(?<![\w./:])(test_\w+)(?![\w.])")


def _test_names(root: Path) -> set[str]:
    names: set[str] = set()
    for path in (root / "tests").rglob("*.py"):
        names |= set(re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), re.M))
    return names


def _cited_test_problems(snippet: str, root: Path) -> list[str]:
    """``tests/x.py::name`` names a test of that file; a bare ``test_name`` one of any file."""
    problems = []
    for m in _CITED.finditer(snippet):
        if m.group(1):
            path = root / m.group(1)
            if not path.exists():
                continue  # said as a missing path
            defined = re.findall(r"^\s*(?:async )?def (\w+)", path.read_text(), re.M)
            if m.group(2) not in defined:
                problems.append(f"{m.group(1)} has no test '{m.group(2)}'")
        elif m.group(3) not in _test_names(root):
            problems.append(f"no test '{m.group(3)}' under tests/")
    return problems


# ---- python -m MODULE, and the list of programs ------------------------------------------------

_RUN_MODULE = re.compile(r"\bpython[\d.]* -m ([A-Za-z_][\w.]*)(?![\w.<])")
_PROGRAMS_LIST = re.compile(r"`python -m tflaunch\.models\.<name>`:(.*?)(?:;|\n\n|$)", re.S)
_BARE_NAME = re.compile(r"`([a-z_][a-z0-9_]*)`")


def _run_module_problems(text: str, root: Path) -> list[tuple[int, str]]:
    """``python -m X`` must run a module that exists (tflaunch's are located in the checkout,
    others where this Python finds them). A list of programs introduced as
    ``python -m tflaunch.models.<name>``: its bare names must be modules of models/, and every
    program there (a module that runs as ``__main__``) must be in it."""
    problems = []
    for m in _RUN_MODULE.finditer(text):
        if _run_module_missing(m.group(1), root):
            problems.append((m.start(), f"'python -m {m.group(1)}': no such module"))
    for m in _PROGRAMS_LIST.finditer(text):
        named = set(_BARE_NAME.findall(m.group(1)))
        for name in sorted(named):
            if not (root / "models" / f"{name}.py").exists():
                problems.append(
                    (
                        m.start(),
                        f"the programs list names 'tflaunch.models.{name}', which does not exist",
                    )
                )
        for program in sorted(_programs(root) - named):
            problems.append(
                (m.start(), f"the programs list leaves out 'tflaunch.models.{program}'")
            )
    return problems


def _run_module_missing(module: str, root: Path) -> bool:
    parts = module.split(".")
    if parts[0] == "tflaunch":
        folder = {"models": "models", "launchers": "launchers"}.get(
            parts[1] if len(parts) > 1 else ""
        )
        base = root / folder if folder else root / "tflaunch"
        rest = parts[2:] if folder else parts[1:]
        path = base.joinpath(*rest) if rest else base
        return not (path.with_suffix(".py").exists() or (path / "__main__.py").exists())
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def _programs(root: Path) -> set[str]:
    """The modules of models/ that run as programs (``if __name__ == "__main__"``)."""
    return {
        path.stem
        for path in (root / "models").glob("*.py")
        if 'if __name__ == "__main__"' in path.read_text()
    }


# ---- copies of example files -------------------------------------------------------------------


def _copy_problem(block: str, root: Path) -> str | None:
    """A YAML block that starts ``# examples/x.yaml`` is a copy of that file, byte for byte."""
    first, _, body = block.partition("\n")
    name = first.removeprefix("#").strip()
    if not first.startswith("# ") or not _PATHLIKE.match(name) or not name.startswith("examples/"):
        return None
    path = root / name
    if not path.exists():
        return f"a copy of a missing file: {name}"
    if body.strip() != path.read_text().strip():
        return f"the copy of {name} differs from the file"
    return None


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


# ---- the architecture page's module tree -------------------------------------------------------

DESCRIPTION_COLUMN = 8  # a line indented further continues the description above it


@dataclass
class _Entry:
    parent: str  # the folder its names are in ("tflaunch/cluster/"; "" for a top folder)
    names: list[str]  # modules (x.py) and folders (x/) in its names column
    text: str  # its description, continuation lines included
    folder: bool  # one folder on a line of its own: the lines indented below are inside it

    @property
    def path(self) -> str:
        """A folder entry's own folder."""
        return self.parent + self.names[0]


def _tree_entries(block: str) -> list[_Entry]:
    entries: list[_Entry] = []
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent > DESCRIPTION_COLUMN and entries:
            entries[-1].text += " " + line.strip()
            continue
        names, _, text = line.strip().partition("  ")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        tokens = names.split()
        folder = len(tokens) == 1 and tokens[0].endswith("/")
        entries.append(_Entry(parent, tokens, text.strip(), folder))
        if folder:
            stack.append((indent, parent + tokens[0]))
    return entries


def _modules(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}


def _packages(folder: Path) -> set[str]:
    return {p.name + "/" for p in folder.iterdir() if (p / "__init__.py").exists()}


def tree_problems(block: str, root: Path = ROOT) -> list[str]:
    """The tree must be the folders. Under ``tflaunch/`` every module and package is named in
    its folder's names column (a package named beside modules, like ``sitehook/``, stands for its
    contents); ``launchers/`` and ``models/`` name every package they hold (and ``launchers/`` its
    modules) somewhere in their lines; and every ``x.py`` or ``x/`` the tree names exists."""
    problems = []
    entries = _tree_entries(block)
    named: dict[str, set[str]] = {}
    for entry in entries:
        named.setdefault(entry.parent, set()).update(entry.names)
        for token in entry.names:
            if not (root / entry.parent / token).exists():
                problems.append(f"the tree names {entry.parent}{token}, which does not exist")
        if entry.folder and (root / entry.path).is_dir():
            for token in re.findall(r"(?<![\w/.])([a-z_0-9]+(?:\.py|/))(?=[\s,;:)]|$)", entry.text):
                if not (root / entry.path / token).exists() and not (root / token).exists():
                    problems.append(f"the tree's {entry.path} line names {token}, not in it")
    folder_entries = {e.path for e in entries if e.folder}
    core = root / "tflaunch"
    for folder in [core, *sorted(p for p in core.rglob("*") if (p / "__init__.py").exists())]:
        key = f"{folder.relative_to(root)}/"
        if key != "tflaunch/" and key not in folder_entries:
            continue  # named beside modules (it stands for its contents), or left out (below)
        listed = named.get(key, set())
        for name in sorted((_modules(folder) | _packages(folder)) - listed):
            problems.append(f"the tree leaves out {key}{name}")
    for top, with_modules in (("launchers/", True), ("models/", False)):
        text = " ".join(
            f"{e.text} {' '.join(e.names)} {e.parent}"
            for e in entries
            if e.parent.startswith(top) or (e.folder and e.path == top)
        )
        wanted = _packages(root / top) | (_modules(root / top) if with_modules else set())
        for name in sorted(wanted):
            if not re.search(rf"(?<![\w.]){re.escape(name)}", text):
                problems.append(f"the tree leaves out {top}{name}")
    return problems
