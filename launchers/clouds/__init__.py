"""Cloud providers: where provisioned machines come from, one folder per provider.

The registry of clouds (:class:`tflaunch.cluster.registry.Registry`, the one the backends'
(:mod:`tflaunch.cluster.backends`) is too): each cloud's
folder exports ``PROVIDER``, a :class:`~tflaunch.launchers.clouds.base.ProviderSpec` (its
name, its ``ssh.provision`` section class and checks, its features, its admin options, and
optionally host discovery). The built-ins are the sub-packages of this package that export one;
packages installed beside tflaunch add theirs through the entry-point group ``tflaunch.clouds``
(``name = "package.module:PROVIDER"``). A run records its provider's access in run.json under
the provider's name, so that ``down``, ``gc`` and ``status --cloud`` find the account again.

The cloud-neutral orchestration that uses a provider (cost table, create-or-reuse, waiting,
replacement) is :mod:`tflaunch.launchers.clouds.provisioning` and
:mod:`tflaunch.launchers.clouds.fleet`; no module outside a cloud's folder names a cloud.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tflaunch.cluster import schema
from tflaunch.cluster.registry import Registry
from tflaunch.errors import ConfigError
from tflaunch.launchers.clouds.base import ProviderSpec, ProvisionSection

if TYPE_CHECKING:
    from tflaunch.cluster.config import ClusterConfig
    from tflaunch.launchers.clouds.base import Provider, Say
    from tflaunch.runtime.run import RunRecord

GROUP = "tflaunch.clouds"
BUILTIN_PACKAGE = "tflaunch.launchers.clouds"
SPEC_NAME = "PROVIDER"  # what a cloud's folder exports
TAG = "cloud"  # the key of ssh.provision that picks the cloud


# Every known cloud by name (the built-ins, then installed packages), scanned once a process.
CLOUDS: Registry[ProviderSpec] = Registry("cloud", ProviderSpec, BUILTIN_PACKAGE, SPEC_NAME, GROUP)


def providers() -> dict[str, ProviderSpec]:
    """Every known cloud by name."""
    return CLOUDS.specs()


def names() -> list[str]:
    return CLOUDS.names()


def spec_of(name: str, where: str = "ssh.provision.cloud") -> ProviderSpec:
    """The cloud called ``name`` (or by an alias); ConfigError naming the known ones if none."""
    return CLOUDS.lookup(name, where)


def spec_for_section(section: ProvisionSection) -> ProviderSpec:
    """The cloud whose ``ssh.provision`` class ``section`` is."""
    for spec in providers().values():
        if type(section) is spec.section:
            return spec
    raise ConfigError(f"no registered cloud reads a {type(section).__name__} section.")


def provision_of(config: ClusterConfig) -> ProvisionSection | None:
    """The cluster file's ``ssh.provision`` section, if it has one. Found by its type, since no
    cloud imports a backend: the provisioning backend's section holds it as ``provision``."""
    for section in config.sections.values():
        found = getattr(section, "provision", None)
        if isinstance(found, ProvisionSection):
            return found
    return None


def provider_class(name: str, where: str = "ssh.provision.cloud") -> type[Provider]:
    """The provider class called ``name``, imported on demand (each stays optional)."""
    return spec_of(name, where).load()


def provider_for(section: ProvisionSection, say: Say) -> Provider:
    """The provider of a cluster file's ``ssh.provision`` section, with its settings."""
    return spec_for_section(section).load()(section, say)


# ---- what the SSH section reads through the registry ----------------------------------------


def provision_variants() -> dict[str, schema.Section]:
    """``ssh.provision``'s classes, by the value of its ``cloud`` key (a name or an alias)."""
    return {
        name: schema.Section(spec.section, spec.section_doc)
        for name in CLOUDS.choices()
        for spec in (spec_of(name),)
    }


def default_cloud() -> str | None:
    """The cloud an ``ssh.provision`` without a ``cloud`` key means: the one whose spec says
    ``default``, if one does."""
    spec = CLOUDS.default()
    return spec.name if spec is not None else None


PROVISION = schema.Variants(TAG, provision_variants, default=default_cloud, noun="cloud")


def discovery_sections() -> dict[str, schema.Section]:
    """``ssh.<cloud>``: host discovery of the clouds that have it."""
    return {
        name: schema.Section(s.discovery, s.discovery_doc)
        for name, s in providers().items()
        if s.discovery is not None
    }


# ---- run.json --------------------------------------------------------------------------------


def run_access(record: RunRecord) -> tuple[str, dict[str, Any]] | None:
    """(cloud, access) of the account a run made its instances in (from its run.json), or
    None."""
    from tflaunch.launchers.clouds.records import access_of

    for name in providers():
        access = access_of(record, name)
        if access:
            return name, access
    return None


def provider_of_run(record: RunRecord, say: Say) -> Provider | None:
    """The provider a run made its instances with (from its run.json), or None."""
    found = run_access(record)
    return None if found is None else provider_class(found[0]).from_access(found[1], say)
