"""The registry of backends: which names ``backend:`` may take, and what each brings to the file.

A backend is one folder (``launchers/slurm/``) that exports a :class:`BackendSpec`: its name, its
section of the cluster file (``slurm:``) with that section's checks, the rules it sets for the
rest of the file, and where its :class:`~tflaunch.launchers.base.Backend` class lives. The core
asks this registry; it never compares a backend's name.

Backends are found through the entry-point group ``tflaunch.backends`` (``name =
"package.module:SPEC"``), so a package installed beside tflaunch adds one without touching this
repository. The built-in backends are also found by looking into ``tflaunch.launchers`` for
folders that export ``BACKEND``, so that a checkout runs without being installed. The registry
itself is the one every kind of plug-in uses (:class:`tflaunch.cluster.registry.Registry`): two
packages claiming one name (or one claiming a built-in's), and an entry point that cannot be
loaded, are errors that name the entry points.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tflaunch.cluster import schema
from tflaunch.cluster.registry import Registry, load_attribute
from tflaunch.errors import LaunchError

GROUP = "tflaunch.backends"
BUILTIN_PACKAGE = "tflaunch.launchers"
SPEC_NAME = "BACKEND"  # what a built-in backend's folder exports

# fail(key path, message) raises the located ConfigError ("file:line: key: message.")
Fail = Callable[[tuple, str], None]


class BackendFeature(enum.Enum):
    """An optional ability a backend declares in its spec, as a cloud declares its own
    (:class:`tflaunch.launchers.clouds.base.Feature`): ``up`` refuses a request for one the
    file's backend lacks, once, in one paragraph (exit code 2), naming the backends that have
    it. The value is that refusal, after the option asked (``{name}``: the file's backend,
    ``{having}``: those that declare it)."""

    TERMINALS = (
        "works with the {having} backend only; this cluster file uses '{name}'. Follow the "
        "tasks with 'tflaunch logs RUN -f' instead."
    )
    KEEP = (
        "keeps the machines tflaunch makes for a run, and backend '{name}' makes none (the "
        "{having} backend does, where its section says to make them)."
    )


@dataclass(frozen=True)
class BackendSpec:
    """What the core knows of a backend before anything runs."""

    name: str
    # "module:Class" of the backend's Backend subclass, imported only when it is used
    backend: str
    # the dataclass of the backend's own top-level section (e.g. ``slurm:``), named as the backend
    section: type | None = None
    section_doc: str = ""  # its description in the schema; default: the section's docstring
    # check(config, fail): rules on its section (checked in every file, as every file may hold
    # every section) and on files that choose this backend; calls fail for the first problem.
    # (config is a ClusterConfig, which sits above this registry and is not imported here.)
    check: Callable[[Any, Fail], None] | None = None
    # the program's workdir is a path on the hosts, resolved there (not against the file's folder)
    workdir_on_hosts: bool = False
    aliases: tuple[str, ...] = ()  # other names ``backend:`` may give it
    # what a file without ``backend:`` means (one backend at most: the built-in 'local')
    default: bool = False
    features: frozenset[BackendFeature] = frozenset()  # the optional abilities it has

    def load(self) -> Any:
        """The backend's ``Backend`` class (imported on demand, so each stays optional)."""
        return load_attribute(self.backend, f"the '{self.name}' backend")

    def require(self, feature: BackendFeature, asked: str) -> None:
        """Refuse ``asked`` (the option, e.g. ``--terminals``) unless this backend declares
        ``feature``: one paragraph naming the backends that do (LaunchError, exit code 2)."""
        if feature in self.features:
            return
        having = [s.name for s in BACKENDS.specs().values() if feature in s.features]
        raise LaunchError(
            f"{asked} " + feature.value.format(name=self.name, having=" or ".join(having) or "no")
        )


# Every backend by name: the built-ins first (in folder order), then installed packages.
BACKENDS: Registry[BackendSpec] = Registry(
    "backend", BackendSpec, BUILTIN_PACKAGE, SPEC_NAME, GROUP
)


def names() -> list[str]:
    """The names ``backend:`` may take."""
    return BACKENDS.names()


def spec_of(name: str) -> BackendSpec:
    """The registered backend called ``name``; ConfigError listing the registered ones if none."""
    return BACKENDS.lookup(name)


def sections() -> dict[str, schema.Section]:
    """The top-level sections the backends add to the cluster file, by key."""
    return {
        spec.name: schema.Section(
            spec.section, spec.section_doc or schema.description(spec.section)
        )
        for spec in BACKENDS.specs().values()
        if spec.section is not None
    }


def default_sections() -> dict[str, Any]:
    """Every backend's section with its defaults (a file that leaves it out)."""
    return {name: section.cls() for name, section in sections().items()}
