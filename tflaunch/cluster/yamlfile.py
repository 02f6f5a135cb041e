"""Reading a cluster file's YAML with bounds: size, nesting, aliases, merge keys, duplicate keys.

``yaml.safe_load`` alone is not safe against a hostile or unlucky file: an alias bomb ("billion
laughs") grows exponentially once anything walks it per path, deep nesting ends in RecursionError,
merge keys (``<<``) double a mapping per level, and a duplicate key silently replaces the first.
:func:`load` refuses all of these with a message naming the line, keeps the source text of every
number (so a string field can tell the user that ``1:00:00`` was read as 3600), and records the
line of every key path without expanding aliases, so its cost is linear in the file.

The bounds are this module's own checks on the composed nodes, made before PyYAML constructs
anything, so every supported PyYAML refuses the same file with the same message (PyYAML 6.0.4
changed how merge keys are flattened, which changed which of PyYAML's steps met a bomb first).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

MAX_FILE_BYTES = 1 << 20  # a cluster file is a few KiB; 1 MiB is far beyond any real one
MAX_DEPTH = 32  # the format nests 4 levels; deeper is never a cluster file
MAX_ALIASES = 100  # alias uses (*name) per file
MAX_MAPPING_KEYS = 10_000  # keys of one mapping after merge keys (<<) are applied
MAX_NUMBER_CHARS = 32  # digits of one number: far beyond any count, port or duration
# Values once every alias is written out. A 1 MiB file holds at most about 500,000 written out
# (``[a,a,...``), so only aliases reach this; no value of the format is a list of lists.
MAX_EXPANDED_VALUES = 1_000_000

# Characters YAML allows in a stream (the YAML 1.1 printable set), as PyYAML checks them.
_NOT_PRINTABLE = re.compile(
    "[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"
)
_MERGE_TAG = "tag:yaml.org,2002:merge"
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"


class _Written:
    """A number from the file that remembers how it was written (``yaml_text``)."""

    yaml_text: str

    def __new__(cls, value: float, text: str):
        obj = super().__new__(cls, value)  # int's or float's
        obj.yaml_text = text
        return obj


class YamlInt(_Written, int):
    """An integer from the file that remembers how it was written (``0123`` was read as 83)."""


class YamlFloat(_Written, float):
    """A number with a fraction or a base-60 time (``1:00:00`` was read as 3600) and its text."""


class YamlFileError(Exception):
    """The text is not a cluster file this reader accepts; ``line`` is 1-based, or None."""

    def __init__(self, line: int | None, message: str):
        super().__init__(message)
        self.line = line
        self.message = message


class _Refused(yaml.MarkedYAMLError):
    def __init__(self, mark: yaml.Mark | None, problem: str):
        super().__init__(problem=problem, problem_mark=mark)


if yaml.__with_libyaml__:
    from yaml.cyaml import CParser

    class _Loader(
        yaml.composer.Composer, CParser, yaml.constructor.SafeConstructor, yaml.resolver.Resolver
    ):
        """LibYAML's scanner and parser under PyYAML's own composer, so that the composer's
        checks below still see every node: a cluster file listing 4,096 hosts loads in a
        fraction of the pure-Python parser's time (benchmarks/plan_scale.py)."""

        def __init__(self, text: str):
            CParser.__init__(self, text)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            yaml.composer.Composer.__init__(self)

else:  # a PyYAML built without LibYAML
    _Loader = yaml.SafeLoader  # type: ignore[misc]


class _BoundedLoader(_Loader):
    """The loader with two checks that must run while composing (PyYAML's composer recurses, so
    deep nesting must stop before it ends in RecursionError, and the alias count names the line of
    the alias itself), and numbers that remember their text. Every other bound is :class:`_Bounds`,
    run on the composed nodes before anything is constructed."""

    def __init__(self, text: str):
        super().__init__(text)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _Refused(
                    self.peek_event().start_mark,
                    f"more than {MAX_ALIASES} aliases (*name); write the values out",
                )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(
                    self.peek_event().start_mark,
                    f"nested more than {MAX_DEPTH} levels deep; a cluster file needs 4",
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: yaml.ScalarNode) -> Any:
        return YamlInt(super().construct_yaml_int(node), node.value)

    def construct_yaml_float(self, node: yaml.ScalarNode) -> Any:
        return YamlFloat(super().construct_yaml_float(node), node.value)


_BoundedLoader.add_constructor(_INT_TAG, _BoundedLoader.construct_yaml_int)
_BoundedLoader.add_constructor(_FLOAT_TAG, _BoundedLoader.construct_yaml_float)


class _Bounds:
    """One walk of the composed node graph, in document order, that refuses what the reader does
    not accept before PyYAML constructs anything: so which check fires, and when, does not depend
    on PyYAML's composer or constructor (PyYAML 6.0.4 changed how merge keys are flattened, and
    with it which of its checks came first).

    An anchored node is walked once however many aliases use it: each node's expanded size, depth
    and merged key count are kept and reused, so the walk is linear in the file while the bounds
    hold for the data as if every alias were written out."""

    def __init__(self, loader: _BoundedLoader):
        self._loader = loader
        self._done: dict[int, tuple[int, int, int]] = {}  # id -> (height, size, merged keys)
        self._open: set[int] = set()  # nodes on the path from the root

    def check(self, root: yaml.Node) -> None:
        self._visit(root, 1)

    def _visit(self, node: yaml.Node, level: int) -> tuple[int, int, int]:
        done = self._done.get(id(node))
        if done is not None:
            if level - 1 + done[0] > MAX_DEPTH:
                raise _Refused(
                    node.start_mark,
                    f"aliases (*name) nest this value more than {MAX_DEPTH} levels deep; a "
                    "cluster file needs 4",
                )
            return done
        if id(node) in self._open:
            raise _Refused(
                node.start_mark,
                "this value contains itself through an alias (*name); a cluster file has no "
                "recursive values",
            )
        if level > MAX_DEPTH:  # only through an alias: the composer refused deeper text
            raise _Refused(
                node.start_mark,
                f"aliases (*name) nest this value more than {MAX_DEPTH} levels deep; a cluster "
                "file needs 4",
            )
        self._open.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            _refuse_long_number(node)
            result = (1, 1, 0)
        elif isinstance(node, yaml.SequenceNode):
            result = self._sequence(node, level)
        else:
            result = self._mapping(node, level)
        self._open.discard(id(node))
        if result[1] > MAX_EXPANDED_VALUES:
            raise _Refused(
                node.start_mark,
                f"aliases (*name) make this value expand to more than {MAX_EXPANDED_VALUES:,} "
                "values; write the values out",
            )
        self._done[id(node)] = result
        return result

    def _sequence(self, node: yaml.SequenceNode, level: int) -> tuple[int, int, int]:
        height, size = 0, 1
        for item in node.value:
            item_height, item_size, _ = self._visit(item, level + 1)
            height, size = max(height, item_height), _capped(size + item_size)
        return height + 1, size, 0

    def _mapping(self, node: yaml.MappingNode, level: int) -> tuple[int, int, int]:
        self._refuse_duplicates(node)
        height, size, keys = 0, 1, 0
        for key_node, value_node in node.value:
            key_height, key_size, _ = self._visit(key_node, level + 1)
            value_height, value_size, _ = self._visit(value_node, level + 1)
            height = max(height, key_height, value_height)
            size = _capped(size + key_size + value_size)
            if key_node.tag != _MERGE_TAG:
                keys += 1
                continue
            # Merged keys are counted with repeats: the bound holds whether a PyYAML release
            # keeps a key merged twice once (6.0.4) or twice (6.0.3), and however it orders them.
            merged = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for source in merged:
                if isinstance(source, yaml.MappingNode):
                    keys = _capped(keys + self._done[id(source)][2])
        if keys > MAX_MAPPING_KEYS:
            raise _Refused(
                node.start_mark,
                f"merge keys (<<) make this mapping hold more than {MAX_MAPPING_KEYS:,} keys "
                "(each merge counted); write the keys out",
            )
        return height + 1, size, keys

    def _refuse_duplicates(self, node: yaml.MappingNode) -> None:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                continue  # merged keys may be overridden; a non-scalar key fails construction
            _refuse_long_number(key_node)
            key = self._loader.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _Refused(
                    key_node.start_mark,
                    f"the key '{key}' is given twice (first at line {seen[key]}); keep one",
                )
            seen[key] = line


def _capped(count: int) -> int:
    """Counts stop growing past every bound, so an alias bomb never makes huge integers."""
    return min(count, MAX_EXPANDED_VALUES + 1)


def _refuse_long_number(node: yaml.ScalarNode) -> None:
    """No setting needs a long number; a 5,000-digit one cannot even be printed back."""
    if node.tag in (_INT_TAG, _FLOAT_TAG) and len(node.value) > MAX_NUMBER_CHARS:
        raise _Refused(
            node.start_mark,
            f"a number of {len(node.value):,} characters; no setting takes more than "
            f"{MAX_NUMBER_CHARS} (quote it if it is meant as text)",
        )


def decode(raw: bytes) -> str:
    """The file's bytes as text: UTF-8 only, and only characters YAML allows."""
    if len(raw) > MAX_FILE_BYTES:
        raise YamlFileError(
            None,
            f"the file is larger than {MAX_FILE_BYTES // 1024} KiB; a cluster file is a few KiB "
            "(is this the right file?)",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise YamlFileError(
            line,
            f"byte 0x{raw[err.start]:02x} at column {column} is not UTF-8; save the file as UTF-8",
        ) from None
    return text


def _check_printable(text: str) -> None:
    bad = _NOT_PRINTABLE.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        column = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
        raise YamlFileError(
            line,
            f"the control character U+{ord(bad.group()):04X} at column {column} is not allowed in "
            'YAML; remove it, or write it as an escape inside double quotes ("\\t")',
        )


def load(text: str) -> tuple[Any, dict[tuple, int]]:
    """Parse one YAML document; returns the data and the 1-based line of every key path."""
    if len(text) > MAX_FILE_BYTES:
        raise YamlFileError(None, f"the file is larger than {MAX_FILE_BYTES // 1024} KiB")
    _check_printable(text)
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _Bounds(loader).check(node)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        problem = getattr(err, "problem", None) or str(err)
        problem = " ".join(str(problem).split())
        if isinstance(err, _Refused):
            raise YamlFileError(mark.line + 1 if mark else None, problem) from None
        if mark is not None and "\t" in _indentation(text, mark.line):
            raise YamlFileError(
                mark.line + 1,
                "a tab in the indentation: YAML indents with spaces only; replace the tab "
                "with spaces",
            ) from None
        raise YamlFileError(
            mark.line + 1 if mark else None,
            f"the cluster file is not valid YAML ({problem}); check indentation and quoting "
            "around that line",
        ) from None
    finally:
        loader.dispose()
    positions: dict[tuple, int] = {}
    if node is not None:
        _record_positions(node, positions)
    return data, positions


def _indentation(text: str, line: int) -> str:
    """The leading whitespace of ``text``'s line ``line`` (0-based)."""
    lines = text.splitlines()
    if not 0 <= line < len(lines):
        return ""
    content = lines[line]
    return content[: len(content) - len(content.lstrip())]


def _record_positions(root: yaml.Node, out: dict[tuple, int]) -> None:
    """Line of every key path; an aliased node is entered once (its first path), so this is
    linear in the file however often an anchor is used. Iterative: depth is bounded anyway."""
    entered: set[int] = set()
    stack: list[tuple[yaml.Node, tuple]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        out.setdefault(path, node.start_mark.line + 1)
        if id(node) in entered:
            continue
        entered.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = path + (key_node.value,)
                out.setdefault(key, key_node.start_mark.line + 1)
                stack.append((value_node, key))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                stack.append((item, path + (i,)))
