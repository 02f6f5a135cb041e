"""One registry for every kind of plug-in: the backends (:mod:`tflaunch.cluster.backends`) and
the clouds (:mod:`tflaunch.launchers.clouds`), as SkyPilot's ``sky/utils/registry.py`` serves its
clouds, backends and recovery strategies.

A kind's specs are found twice over: in the folders of one package that export a spec under one
name (the built-ins, so that a checkout runs without being installed), and in an entry-point group
(``name = "package.module:SPEC"``, packages installed beside tflaunch). The scan runs once a
process. A registry looks a name or an alias up, gives the default (the one spec that says so),
and says what is wrong in one paragraph (exit code 2): an unknown name, listing the known ones;
two packages claiming one name or alias; an entry point that cannot be loaded, or that names a
spec of another name or type. An entry point naming one of the built-ins' own modules (an
installed tflaunch declaring them) is the built-in, not a second claim.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, Protocol, TypeVar

from tflaunch.errors import ConfigError


def load_attribute(path: str, what: str) -> Any:
    """``"module:attribute"``, imported on demand (so each plug-in stays optional); ConfigError
    saying ``what`` is not available when its module (not one it imports) is missing."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            raise ConfigError(f"{what} is not available in this installation.") from None
        raise
    return getattr(module, attr)


class Spec(Protocol):
    """What the registry reads of a spec: its name, other names it answers to, and whether it
    is what its kind means when none is named."""

    @property
    def name(self) -> str: ...
    @property
    def aliases(self) -> tuple[str, ...]: ...
    @property
    def default(self) -> bool: ...


SpecT = TypeVar("SpecT", bound=Spec)


class Registry(Generic[SpecT]):
    """The specs of one kind (``kind``: "backend", "cloud"), of class ``spec_type``: the
    sub-packages of ``package`` that export one as ``export``, then the entry points of
    ``group``."""

    def __init__(
        self, kind: str, spec_type: type[SpecT], package: str, export: str, group: str
    ) -> None:
        self.kind, self.spec_type = kind, spec_type
        self.package, self.export, self.group = package, export, group
        self._found: dict[str, SpecT] | None = None

    def specs(self) -> dict[str, SpecT]:
        """Every spec by name: the built-ins (in folder order), then installed packages'."""
        if self._found is None:
            self._found = self.scan()
        return dict(self._found)

    def clear(self) -> None:
        """Forget the scan (the installed packages changed: tests that stand some in)."""
        self._found = None

    def names(self) -> list[str]:
        return list(self.specs())

    def choices(self) -> list[str]:
        """What a cluster file may name: every spec's name, then the aliases."""
        specs = self.specs().values()
        return [s.name for s in specs] + [a for s in specs for a in s.aliases]

    def lookup(self, name: str, where: str = "") -> SpecT:
        """The spec called ``name`` (or by that alias); ConfigError naming the known ones if
        none. ``where``: what gave the name (a key of the file, an option), for the message."""
        specs = self.specs()
        if name in specs:
            return specs[name]
        for spec in specs.values():
            if name in spec.aliases:
                return spec
        raise ConfigError(
            f"{where + ': ' if where else ''}unknown {self.kind} '{name}'; choose one of "
            f"{', '.join(specs)}."
        )

    def default(self) -> SpecT | None:
        """The spec whose ``default`` says it is meant when none is named, if one does."""
        chosen = [spec for spec in self.specs().values() if spec.default]
        if len(chosen) > 1:
            raise ConfigError(
                f"{self.kind}s {', '.join(s.name for s in chosen)} each claim to be the default "
                f"{self.kind}; uninstall all but one of the packages that provide them."
            )
        return chosen[0] if chosen else None

    def scan(self) -> dict[str, SpecT]:
        """The scan itself, uncached: it imports the built-in folders and reads every installed
        package's metadata."""
        found: dict[str, SpecT] = {}
        sources: dict[str, str] = {}  # name or alias -> where it was registered
        for spec in self._builtins():
            self._add(found, sources, spec, f"{self.package}.")
        builtin = {name: f"{self.package}." for name in found}
        for entry in sorted(entry_points(group=self.group), key=lambda e: (e.name, e.value)):
            if entry.value.startswith(builtin.get(entry.name, "\0")):
                continue  # an installed tflaunch declaring its own built-ins
            if sources.get(entry.name) == entry.value:
                continue  # the same entry point twice (installed twice over)
            if entry.name in sources:  # refused before its package is imported
                raise self._collision(entry.name, sources[entry.name], entry.value)
            self._add(found, sources, self._load(entry), entry.value)
        return found

    def _builtins(self) -> Iterator[SpecT]:
        package = importlib.import_module(self.package)
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
            if info.ispkg:
                module = importlib.import_module(f"{self.package}.{info.name}")
                spec = getattr(module, self.export, None)
                if isinstance(spec, self.spec_type):
                    yield spec

    def _add(
        self, found: dict[str, SpecT], sources: dict[str, str], spec: SpecT, source: str
    ) -> None:
        for claimed in (spec.name, *spec.aliases):
            if claimed in sources:
                raise self._collision(claimed, sources[claimed], source)
            sources[claimed] = source
        found[spec.name] = spec

    def _collision(self, name: str, first: str, second: str) -> ConfigError:
        return ConfigError(
            f"two installed packages register a {self.kind} called '{name}' (entry points "
            f"{first!r} and {second!r}, group {self.group}); uninstall one of them."
        )

    def _load(self, entry: EntryPoint) -> SpecT:
        where = f"entry point '{entry.name} = {entry.value}' (group {self.group})"
        try:
            spec = entry.load()
        except KeyboardInterrupt:
            raise
        except BaseException as err:  # SystemExit too: a plugin exiting at import ends no command
            raise ConfigError(
                f"the {self.kind} '{entry.name}' of an installed package cannot be loaded from "
                f"its {where}: {type(err).__name__}: {err}. Fix or uninstall that package."
            ) from None
        if not isinstance(spec, self.spec_type) or spec.name != entry.name:
            raise ConfigError(
                f"the {where} does not name a tflaunch {self.spec_type.__name__} called "
                f"'{entry.name}'; fix or uninstall the package that declares it."
            )
        return spec
