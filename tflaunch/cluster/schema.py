"""Typed reading of plain YAML data into frozen dataclasses, and JSON Schema from the same classes.

The cluster file format is defined once, as dataclasses in ``tflaunch.cluster.config``. This module turns
the parsed YAML into those classes in one validation pass — unknown keys are errors, with the
nearest valid key suggested — and derives the JSON Schema that ``tflaunch schema`` publishes, so
the two can never disagree.

Supported field types: str, int, float, bool, ``Literal[...]``, ``X | None``, ``tuple[X, ...]``,
``dict[str, str]`` and nested dataclasses. A field's ``metadata`` may hold ``doc`` (a description),
``minimum`` and ``maximum`` (for numbers; for lists, ``maximum`` bounds the length), ``line``
(a string or list of strings that must fit on one line: no CR or LF), ``check`` (a function
returning an error message or None), ``coerce`` (a function applied to the raw value first,
e.g. to accept a bare string where a mapping is expected) and ``choices`` (a function returning the
values a string may take, for a set known only at run time: the backends registered).

A dataclass may also take *sections*: keys whose classes are supplied at run time (each
backend's own ``slurm:`` or ``ssh:`` at the top level; each cloud's host discovery, ``ssh.<cloud>:``,
in the SSH section), read into the dataclass's field marked ``sections`` and listed in the JSON
Schema after its own fields. A top-level section left out gets its defaults; a nested one
(``sections_of`` in the field's metadata names where they come from) is simply absent.

A field may be a *tagged* mapping (``variants``, a :class:`Variants`): one of its keys picks the
class that reads the rest, e.g. ``ssh.provision: {cloud: NAME, ...}``, where each registered cloud
brings its own section class. The key's value gets the same did-you-mean as any other choice.

Every count and duration has a maximum, so that no file can make the launcher build huge lists.
Numbers are finite (``.inf`` and ``.nan`` are refused) and strings hold no NUL character (no
argument, environment value or path can carry one). Where a string is meant, a YAML number is
accepted only when it reads back as written: ``1:00:00`` (YAML 1.1 reads 3600) or ``0123`` (83)
is an error that says to quote it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin

# Position lookup: key path (tuple of str/int) -> 1-based line number in the source file.
Positions = Mapping[tuple, int]


class SchemaError(Exception):
    """One invalid value: where it is (path) and what is wrong (message)."""

    def __init__(self, path: tuple, message: str):
        super().__init__(message)
        self.path = path
        self.message = message


def format_path(path: tuple) -> str:
    """``("hosts", 1, "gpus")`` -> ``hosts[1].gpus``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def field(
    default: Any = dataclasses.MISSING,
    *,
    doc: str = "",
    minimum: float | None = None,
    maximum: float | None = None,
    line: bool = False,
    check: Callable[[Any], str | None] | None = None,
    coerce: Callable[[Any], Any] | None = None,
    choices: Callable[[], Sequence[str]] | None = None,
    unknown_choice: str = "",
    factory: Callable[[], Any] | None = None,
    variants: Variants | None = None,
):
    """A dataclass field carrying the documentation and checks the reader and schema use.
    ``unknown_choice``: what to add to the error for a value not among ``choices`` (where the
    choices come from)."""
    meta = {
        "doc": doc,
        "minimum": minimum,
        "maximum": maximum,
        "line": line,
        "check": check,
        "coerce": coerce,
        "choices": choices,
        "unknown_choice": unknown_choice,
        "variants": variants,
    }
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Section:
    """A top-level key owned by another part of the program (a backend's ``slurm:``): read into
    ``cls`` (missing or null: its defaults) and described as ``doc`` in the JSON Schema."""

    cls: type
    doc: str


@dataclasses.dataclass(frozen=True)
class Variants:
    """A mapping whose class is picked by one of its keys (``tag``): ``options()`` gives each
    value's :class:`Section`; ``default()`` is the tag's value when the key is left out (None:
    it is required); ``noun`` names the choice in messages ("unknown cloud 'x'"). The class reads
    the mapping without the tag key."""

    tag: str
    options: Callable[[], Mapping[str, Section]]
    default: Callable[[], str | None] = lambda: None
    noun: str = "kind"


@functools.cache
def sections_field(cls: type) -> str | None:
    """The name of ``cls``'s field that holds its sections, if it takes any."""
    for f in dataclasses.fields(cls):
        if f.metadata.get("sections"):
            return f.name
    return None


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if tp is type(None):
        return "null"
    if origin is Literal:
        return " or ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin is tuple:
        return f"a list of {_type_name(get_args(tp)[0])}"
    if origin in (dict, Mapping):
        return "a mapping of names to strings"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(
        tp, str(tp)
    )


def read(
    cls: type, data: Any, path: tuple = (), sections: Mapping[str, Section] | None = None
) -> Any:
    """Build dataclass ``cls`` from plain data, or raise SchemaError at the first bad value.
    ``sections``: the keys ``cls`` takes beside its fields (see :class:`Section`)."""
    if sections is None:
        return _read_value(cls, data, path)
    return _read_dataclass(cls, data, path, sections)


def _read_dataclass(
    cls: type,
    data: Any,
    path: tuple,
    sections: Mapping[str, Section] | None = None,
    also: Sequence[str] = (),
) -> Any:
    """``also``: keys read elsewhere (a :class:`Variants` tag), accepted and not passed on."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SchemaError(path, f"expected a mapping, got {_describe(data)}")
    hints, fields = _class_fields(cls)
    nested = sections is None and _nested_sections(cls)
    if nested:
        sections = nested
    sections = sections or {}
    for key in data:
        if key not in fields and key not in sections and key not in also:
            valid = [*fields, *sections, *also]
            raise SchemaError(path + (key,), _unknown_key_message(key, valid))
    values = {}
    for name, f in fields.items():
        if name in data:
            raw = data[name]
            coerce = f.metadata.get("coerce")
            if coerce is not None:
                raw = coerce(raw)
            choices = f.metadata.get("choices")
            if choices is not None and raw not in choices():
                message = _choice_message(raw, choices())
                more = f.metadata.get("unknown_choice")
                if more and "(did you mean" not in message:  # a typo needs no more than that
                    message += f"; {more}"
                raise SchemaError(path + (name,), message)
            variants = f.metadata.get("variants")
            if variants is not None:
                values[name] = _read_variant(variants, raw, path + (name,))
            else:
                values[name] = _read_value(hints[name], raw, path + (name,))
            _check_field(f, values[name], path + (name,))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise SchemaError(path + (name,), f"is required ({f.metadata.get('doc', '')})")
    if nested:  # absent unless written
        read = {
            k: _read_value(s.cls, data[k], path + (k,))
            for k, s in sections.items()
            if data.get(k) is not None
        }
        values[sections_field(cls)] = types.MappingProxyType(read)
    elif sections:
        read = {k: _read_value(s.cls, data.get(k), path + (k,)) for k, s in sections.items()}
        values[sections_field(cls)] = types.MappingProxyType(read)
    return cls(**values)


def _nested_sections(cls: type) -> Mapping[str, Section]:
    """The sections a nested dataclass takes (its sections field's ``sections_of()``)."""
    name = sections_field(cls)
    if name is None:
        return {}
    (f,) = (f for f in dataclasses.fields(cls) if f.name == name)
    supply = f.metadata.get("sections_of")
    return supply() if supply is not None else {}


def _read_variant(variants: Variants, value: Any, path: tuple) -> Any:
    """A tagged mapping: its tag picks the class that reads the rest."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise SchemaError(path, f"expected a mapping, got {_describe(value)}")
    options = variants.options()
    tag = value.get(variants.tag, variants.default())
    if tag is None:
        raise SchemaError(
            path + (variants.tag,), f"is required: one of {', '.join(map(repr, options))}"
        )
    if tag not in options:
        close = difflib.get_close_matches(str(tag), list(options), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise SchemaError(
            path + (variants.tag,),
            f"unknown {variants.noun} '{tag}'; choose one of {', '.join(options)}{hint}",
        )
    rest = {k: v for k, v in value.items() if k != variants.tag}
    return _read_dataclass(options[tag].cls, rest, path, also=(variants.tag,))


def _choice_message(value: Any, choices: Sequence[Any]) -> str:
    listed = ", ".join(repr(a) for a in choices)
    close = difflib.get_close_matches(str(value), [str(a) for a in choices], n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"expected one of {listed}, got {value!r}{hint}"


def _check_field(f: dataclasses.Field, value: Any, path: tuple) -> None:
    """The field's own bounds: minimum, maximum (a list's length), one line, its check."""
    if value is None:
        return
    minimum, maximum = f.metadata.get("minimum"), f.metadata.get("maximum")
    if isinstance(value, tuple):
        if maximum is not None and len(value) > maximum:
            raise SchemaError(path, f"has {len(value)} items; at most {_number(maximum)} allowed")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if minimum is not None and value < minimum:
            raise SchemaError(path, f"must be at least {_number(minimum)}, got {value}")
        if maximum is not None and value > maximum:
            raise SchemaError(path, f"must be at most {_number(maximum)}, got {value}")
    if f.metadata.get("line"):
        items = value if isinstance(value, tuple) else (value,)
        for i, item in enumerate(items):
            if isinstance(item, str) and ("\n" in item or "\r" in item):
                where = path + (i,) if isinstance(value, tuple) else path
                raise SchemaError(
                    where, f"must fit on one line, but {item!r} holds a line break; remove it"
                )
    check = f.metadata.get("check")
    if check is not None:
        problem = check(value)
        if problem:
            raise SchemaError(path, problem)


def _number(value: float) -> str:
    """``65535`` as ``65,535``: bounds read at a glance."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


@functools.cache
def _class_fields(cls: type) -> tuple[dict[str, Any], dict[str, dataclasses.Field]]:
    """Type hints and public fields of a dataclass, worked out once per class (a cluster file
    may hold thousands of host entries)."""
    return typing.get_type_hints(cls), _public_fields(cls)


def _public_fields(cls: type) -> dict[str, dataclasses.Field]:
    """The fields a file may set (not those the loader fills in, marked ``internal``)."""
    return {f.name: f for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal")}


def _unknown_key_message(key: Any, fields: Sequence[str] | Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"unknown key '{key}': {hint}valid keys here are {', '.join(sorted(fields))}"


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    kind = {dict: "a mapping", list: "a list", str: "the string", bool: "the boolean"}.get(
        type(value), type(value).__name__
    )
    return f"{kind} {value!r}" if isinstance(value, (str, bool, int, float)) else kind


def _read_value(tp: Any, value: Any, path: tuple) -> Any:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _read_dataclass(tp, value, path)
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _read_value(option, value, path)
            except SchemaError as err:
                errors.append(err)
        if len(errors) == 1:
            raise errors[0]
        raise SchemaError(path, f"expected {_type_name(tp)}, got {_describe(value)}")
    if origin is Literal:
        if value not in get_args(tp):
            raise SchemaError(path, _choice_message(value, get_args(tp)))
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise SchemaError(path, f"expected a list, got {_describe(value)}")
        item_type = get_args(tp)[0]
        return tuple(_read_value(item_type, item, path + (i,)) for i, item in enumerate(value))
    if origin in (dict, Mapping):
        if not isinstance(value, dict):
            raise SchemaError(path, f"expected a mapping, got {_describe(value)}")
        out = {}
        for key, item in value.items():
            if not isinstance(item, (str, int, float, bool)):
                raise SchemaError(path + (str(key),), f"expected a string, got {_describe(item)}")
            text = _scalar_text(item) if isinstance(item, bool) else item
            out[str(key)] = _read_scalar(str, text, path + (str(key),))
        return types.MappingProxyType(out)
    return _read_scalar(tp, value, path)


def _scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _number_as_text(value: int | float, path: tuple) -> str:
    """A YAML number where a string is meant: its text, if reading it did not change it."""
    text = getattr(value, "yaml_text", None)
    if text is None or text == str(value):
        return str(value)
    raise SchemaError(
        path,
        f"expected a string, but YAML 1.1 reads {text} as the number {value}; quote it: '{text}'",
    )


def _read_scalar(tp: Any, value: Any, path: tuple) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:
                number = math.inf
            if not math.isfinite(number):
                raise SchemaError(path, f"must be a finite number, got {number}")
            return number
    elif tp is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = _number_as_text(value, path)
        if isinstance(value, str):
            if "\0" in value:
                raise SchemaError(
                    path,
                    f"{value!r} holds a NUL character, which no argument, environment value or "
                    "path can carry; remove it",
                )
            return value
    else:
        raise TypeError(f"unsupported schema type {tp!r}")
    raise SchemaError(path, f"expected {_type_name(tp)}, got {_describe(value)}")


def json_schema(
    cls: type, title: str | None = None, sections: Mapping[str, Section] | None = None
) -> dict:
    """JSON Schema (draft 2020-12) of dataclass ``cls`` and its ``sections``, for editors."""
    schema = _schema_of(cls)
    for name, section in (sections or {}).items():
        schema["properties"][name] = {**_schema_of(section.cls), "description": section.doc}
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    if title:
        schema["title"] = title
    return schema


def description(cls: type) -> str:
    """A class's docstring on one line: how the schema describes it."""
    return " ".join((cls.__doc__ or "").split())


def _schema_of(tp: Any) -> dict:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        props, required = {}, []
        for f in _public_fields(tp).values():
            choices, variants = f.metadata.get("choices"), f.metadata.get("variants")
            if variants is not None:
                prop = _variants_schema(variants, nullable=f.default is None)
            else:
                prop = {"enum": list(choices())} if choices else _schema_of(hints[f.name])
            if f.metadata.get("doc"):
                prop["description"] = f.metadata["doc"]
            minimum, maximum = f.metadata.get("minimum"), f.metadata.get("maximum")
            array = prop.get("type") == "array"
            if minimum is not None:
                prop["minimum"] = minimum
            if maximum is not None:
                prop["maxItems" if array else "maximum"] = maximum
            if f.metadata.get("coerce") is not None and dataclasses.is_dataclass(hints[f.name]):
                prop = {
                    "anyOf": [prop, {"type": "string"}],
                    "description": prop.get("description", ""),
                }
            if f.default is not dataclasses.MISSING and isinstance(
                f.default, (str, int, float, bool)
            ):
                prop["default"] = f.default
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                required.append(f.name)
            props[f.name] = prop
        for name, section in _nested_sections(tp).items():
            props[name] = {
                "anyOf": [_schema_of(section.cls), {"type": "null"}],
                "description": section.doc,
            }
        out = {"type": "object", "properties": props, "additionalProperties": False}
        if tp.__doc__:
            out["description"] = description(tp)
        if required:
            out["required"] = required
        return out
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema_of(a) for a in get_args(tp)]}
    if origin is Literal:
        return {"enum": list(get_args(tp))}
    if tp is Any:
        return {}
    if origin is tuple:
        item = get_args(tp)[0]
        if dataclasses.is_dataclass(item):
            return {"type": "array", "items": {"anyOf": [_schema_of(item), {"type": "string"}]}}
        return {"type": "array", "items": _schema_of(item)}
    if origin in (dict, Mapping):
        return {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}}
    if tp is type(None):
        return {"type": "null"}
    return {"type": {str: "string", int: "integer", float: "number", bool: "boolean"}[tp]}


def _variants_schema(variants: Variants, nullable: bool) -> dict:
    """One object schema per option, each with the tag fixed to its value."""
    options, default = [], variants.default()
    for value, section in variants.options().items():
        schema = _schema_of(section.cls)
        tag = {"const": value, "description": f"{variants.noun}: {section.doc}"}
        schema["properties"] = {variants.tag: tag, **schema["properties"]}
        if value != default:
            schema["required"] = [variants.tag, *schema.get("required", [])]
        options.append(schema)
    if nullable:
        options.append({"type": "null"})
    return {"anyOf": options}
