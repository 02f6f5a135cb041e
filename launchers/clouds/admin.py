"""The cloud-admin commands, for any registered cloud: ``tflaunch gc``, ``tflaunch down --cluster
NAME`` and ``tflaunch status --cloud``; and ``tflaunch down RUN``'s end of a run's instances
(:func:`terminate_run`).

Each names an account the same way: a cluster file's ``ssh.provision`` (``-f``), and/or
``--cloud NAME`` with the options that cloud declares (:attr:`ProviderSpec.admin_options`, EC2's
``--region`` and ``--profile``), which win over the file's settings of the same name
(:meth:`Provider.account`). Without ``--cloud`` the file's cloud is meant, else the default cloud
(the one whose spec says ``default``), else the only one registered.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tflaunch.cluster.config import ClusterConfig
from tflaunch.errors import ConfigError, MissingExtra
from tflaunch.launchers import clouds
from tflaunch.launchers.clouds import kept
from tflaunch.launchers.clouds.base import AdminOption, Feature, ProviderSpec, Say
from tflaunch.launchers.clouds.listing import cloud_json, cloud_table
from tflaunch.launchers.clouds.records import TAG_RUN, CloudDetails, access_of, mark_terminated
from tflaunch.launchers.clouds.sweep import format_verdicts, sweep
from tflaunch.runtime.run import Run


def admin_options() -> list[AdminOption]:
    """Every registered cloud's admin options, each name once (the first cloud's help)."""
    found: dict[str, AdminOption] = {}
    for spec in clouds.providers().values():
        for option in spec.admin_options:
            found.setdefault(option.name, option)
    return list(found.values())


def chosen_cloud(config: ClusterConfig | None, cloud: str | None) -> ProviderSpec:
    """The cloud a command means: ``--cloud``, else the file's, else the default one."""
    section = clouds.provision_of(config) if config is not None else None
    if section is not None:
        spec = clouds.spec_for_section(section)
        if cloud and cloud != spec.name:
            raise ConfigError(
                f"--cloud {cloud}, but {config.source}'s ssh.provision is cloud '{spec.name}'; "
                "give one of the two."
            )
        return spec
    if cloud:
        return clouds.spec_of(cloud, "--cloud")
    known = clouds.names()
    default = clouds.default_cloud() or (known[0] if len(known) == 1 else None)
    if default is None:
        raise ConfigError(f"name the cloud: --cloud {' or --cloud '.join(known)}.")
    return clouds.spec_of(default, "--cloud")


def account(
    config: ClusterConfig | None,
    cloud: str | None,
    options: Mapping[str, Any],
    what: str,
) -> tuple[ProviderSpec, dict[str, Any]]:
    """(cloud, access) of the account the command line names: the options given over the
    cluster file's ``ssh.provision`` (``config``). ``options`` may hold every cloud's admin
    options; one given that the chosen cloud does not declare is an error."""
    if config is not None and clouds.provision_of(config) is None:
        raise ConfigError(
            f"{config.source}: the cluster file has no ssh.provision section to name the "
            f"account of {what}."
        )
    spec = chosen_cloud(config, cloud)
    own = {o.name for o in spec.admin_options}
    foreign = sorted(name for name, value in options.items() if value and name not in own)
    if foreign:
        flags = ", ".join("--" + name.replace("_", "-") for name in foreign)
        raise ConfigError(f"{flags}: not an option of cloud '{spec.name}'.")
    given = {name: options.get(name) for name in own}
    section = clouds.provision_of(config) if config is not None else None
    return spec, spec.load().account(section, given)


def gc(
    config: ClusterConfig | None,
    cloud: str | None,
    options: Mapping[str, Any],
    dry_run: bool,
    say: Say,
) -> list[str]:
    """``tflaunch gc``: terminate leaked tflaunch instances of the account; one line per run
    found."""
    with _extra_named("gc", config):
        spec, access = account(config, cloud, options, "the instances to sweep")
        provider = spec.load().from_access(access, say)
        return format_verdicts(sweep(provider, say, dry_run), dry_run)


def down_cluster(
    name: str,
    runs_dir: str | None,
    say: Say,
    config: ClusterConfig | None = None,
    cloud: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> str:
    """``tflaunch down --cluster NAME``: terminate a kept cluster. Its account comes from the
    command line (:func:`account`) when it names one, else from this machine's record of the
    cluster (under ``runs_dir``, else the file's runs_dir, where its 'up' recorded it, else
    ``runs``)."""
    runs_root = Path(runs_dir or (config.runs_dir if config is not None else "runs"))
    options = options or {}
    named = None
    with _extra_named("down --cluster", config):
        if config is not None or cloud or any(options.values()):
            spec, access = account(config, cloud, options, f"kept cluster '{name}'")
            spec.require(Feature.KEEP, "down --cluster")
            named = (spec.name, access)
        return kept.down_cluster(runs_root, name, say, named)


def terminate_run(run: Run, say: Say) -> str:
    """``tflaunch down RUN``: terminate the instances a run created; what was done, in words."""
    record = run.record()
    provider = clouds.provider_of_run(record, say)
    if provider is None:
        return ""
    keep = record.part(CloudDetails).keep_cluster
    if keep:
        return f"kept cluster {keep} keeps running: 'tflaunch down --cluster {keep}' ends it"
    alive = provider.describe(tags={TAG_RUN: run.id})
    access = access_of(record, provider.name) or {}
    provider.terminate([i.id for i in alive], provider.recorded_network(access))
    mark_terminated(run)
    return f"terminated {len(alive)} instance(s) of run {run.id}"


def cloud_status(
    runs_dir: str,
    cloud: str | None,
    options: Mapping[str, Any],
    say: Say,
    as_json: bool = False,
) -> list[str]:
    """``tflaunch status --cloud [NAME]``: the tflaunch instances of every account the runs
    directory knows (and the one the command line names), one row each, with their idle time
    and cost (with ``as_json``: one JSON document)."""
    extra = None
    with _extra_named("status --cloud", None):
        if cloud or any(options.values()):
            spec, access = account(None, cloud, options, "the instances to list")
            extra = (spec.name, access)
        if as_json:
            return [json.dumps(cloud_json(Path(runs_dir), extra, say), indent=2)]
        return cloud_table(Path(runs_dir), extra, say)


@contextlib.contextmanager
def _extra_named(command: str, config: ClusterConfig | None) -> Iterator[None]:
    """A cloud SDK missing where no cluster file is involved: say which command needs it and
    the extra to install, not a file's section the user never wrote."""
    try:
        yield
    except MissingExtra as err:
        if config is not None:
            raise
        raise MissingExtra(
            f"tflaunch {command} talks to the cloud through {err.package}, which is not "
            f"installed here: pip install 'tflaunch[{err.extra}]'.",
            err.package,
            err.extra,
        ) from None
