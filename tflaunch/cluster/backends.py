"""The registry of backends: which names ``backend:`` may take, and what each brings to the file.

A backend is one folder (``launchers/slurm/``) that exports a :class:`BackendSpec`: its name, its
section of the cluster file (``slurm:``) with that section's checks, the rules it sets for the
rest of the file, and where its :class:`~tflaunch.launchers.base.Backend` class lives. The core
asks this registry; it never compares a backend's name.

Backends are found through the entry-point group ``tflaunch.backends`` (``name =
"package.module:SPEC"``), so a package installed beside tflaunch adds one without touching this
repository. The built-in backends are also found by looking into ``tflaunch.launchers`` for
folders that export ``BACKEND``, so that a checkout runs without being installed. Two packages
claiming one name (or one claiming a built-in's), and an entry point that cannot be loaded, are
errors that name the entry points.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from tflaunch.cluster import schema
from tflaunch.errors import ConfigError

GROUP = "tflaunch.backends"
BUILTIN_PACKAGE = "tflaunch.launchers"
SPEC_NAME = "BACKEND"  # what a built-in backend's folder exports

# fail(key path, message) raises the located ConfigError ("file:line: key: message.")
Fail = Callable[[tuple, str], None]


@dataclass(frozen=True)
class BackendSpec:
    """What the core knows of a backend before anything runs."""

    name: str
    # "module:Class" of the backend's Backend subclass, imported only when it is used
    backend: str
    # the dataclass of the backend's own top-level section (e.g. ``slurm:``), named as the backend
    section: type | None = None
    section_doc: str = ""
    # check(config, fail): rules on its section (checked in every file, as every file may hold
    # every section) and on files that choose this backend; calls fail for the first problem.
    # (config is a ClusterConfig, which sits above this registry and is not imported here.)
    check: Callable[[Any, Fail], None] | None = None
    # the program's workdir is a path on the hosts, resolved there (not against the file's folder)
    workdir_on_hosts: bool = False

    def load(self) -> Any:
        """The backend's ``Backend`` class (imported on demand, so each stays optional)."""
        module_name, _, attr = self.backend.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and module_name.startswith(err.name):
                raise ConfigError(
                    f"the '{self.name}' backend is not available in this installation."
                ) from None
            raise
        return getattr(module, attr)


@functools.cache
def registry() -> dict[str, BackendSpec]:
    """Every backend by name: the built-ins first (in folder order), then installed packages."""
    found: dict[str, BackendSpec] = {}
    for spec in _builtin_specs():
        found[spec.name] = spec
    values = {name: f"{BUILTIN_PACKAGE}." for name in found}
    for entry in sorted(entry_points(group=GROUP), key=lambda e: (e.name, e.value)):
        if entry.value.startswith(values.get(entry.name, "\0")):
            continue  # an installed tflaunch declaring its own built-ins, or the same twice
        if entry.name in found:
            raise ConfigError(
                f"two installed packages register a backend called '{entry.name}' (entry "
                f"points {values[entry.name]!r} and {entry.value!r}, group {GROUP}); uninstall "
                "one of them."
            )
        found[entry.name] = _load_entry(entry)
        values[entry.name] = entry.value
    return found


def _builtin_specs() -> list[BackendSpec]:
    package = importlib.import_module(BUILTIN_PACKAGE)
    specs = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if not info.ispkg:
            continue
        module = importlib.import_module(f"{BUILTIN_PACKAGE}.{info.name}")
        spec = getattr(module, SPEC_NAME, None)
        if isinstance(spec, BackendSpec):
            specs.append(spec)
    return specs


def _load_entry(entry: Any) -> BackendSpec:
    where = f"entry point '{entry.name} = {entry.value}' (group {GROUP})"
    try:
        spec = entry.load()
    except Exception as err:
        raise ConfigError(
            f"the backend '{entry.name}' of an installed package cannot be loaded from its "
            f"{where}: {type(err).__name__}: {err}. Fix or uninstall that package."
        ) from None
    if not isinstance(spec, BackendSpec) or spec.name != entry.name:
        raise ConfigError(
            f"the {where} does not name a tflaunch BackendSpec called '{entry.name}'; fix or "
            "uninstall the package that declares it."
        )
    return spec


def names() -> list[str]:
    """The names ``backend:`` may take."""
    return list(registry())


def spec_of(name: str) -> BackendSpec:
    """The registered backend called ``name``; ConfigError listing the registered ones if none."""
    try:
        return registry()[name]
    except KeyError:
        raise ConfigError(
            f"unknown backend '{name}'; choose one of {', '.join(names())}."
        ) from None


def sections() -> dict[str, schema.Section]:
    """The top-level sections the backends add to the cluster file, by key."""
    return {
        spec.name: schema.Section(spec.section, spec.section_doc)
        for spec in registry().values()
        if spec.section is not None
    }


def default_sections() -> dict[str, Any]:
    """Every backend's section with its defaults (a file that leaves it out)."""
    return {name: section.cls() for name, section in sections().items()}
