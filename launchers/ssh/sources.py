"""Where the SSH backend's hosts come from: the cluster file, a pair of IP files, or a cloud.

Every source yields plan :class:`~tflaunch.cluster.plan.Host` records in a deterministic order: the address the launcher
connects to (public) and the address the cluster uses between hosts (private), as in a cloud where
a laptop reaches instances by their public IPs and training traffic stays inside the private
network.

* inline ``hosts:`` entries, each with ``connect`` and ``address`` (and ``gpus``);
* the CSCS pair of files (``ssh.public_ips_file`` / ``ssh.private_ips_file``): line i of each is
  the same instance; blank lines, unequal lengths and duplicates are errors naming file:line;
* a cloud's host discovery (``ssh.<cloud>``): running instances the cloud
  finds (:meth:`~tflaunch.launchers.clouds.base.ProviderSpec.discover_hosts`; the cloud's
  client library is imported only when it is used).
"""

from __future__ import annotations

import os
from pathlib import Path

import tflaunch.launchers.clouds as clouds
from tflaunch.launchers.ssh.section import SshSection
from tflaunch.plugin import ClusterConfig, ConfigError, Host, gpu_ids, hosts_from_config


def resolve_hosts(config: ClusterConfig) -> list[Host]:
    """The hosts of an ssh cluster file, from whichever one source it names."""
    ssh = config.section(SshSection)
    sources = [
        name
        for name, used in (
            ("hosts", bool(config.hosts)),
            ("ssh.public_ips_file", bool(ssh.public_ips_file)),
            *((f"ssh.{name}", True) for name in ssh.discover),
        )
        if used
    ]
    discovery = " or ".join(f"'ssh.{name}'" for name in clouds.discovery_sections())
    if len(sources) > 1:
        raise ConfigError(
            f"{config.source}: hosts come from {' and '.join(sources)}; give exactly one source "
            f"(inline 'hosts:', the public/private IP files, or {discovery})."
        )
    if not sources:
        raise ConfigError(
            f"{config.where('ssh') if ('ssh',) in config.positions else config.where('backend')}"
            ": backend 'ssh' needs hosts: list them under 'hosts:' (with "
            "'connect' and 'address'), name 'ssh.public_ips_file' and 'ssh.private_ips_file', "
            f"or discover them with {discovery}."
        )
    if config.hosts:
        return hosts_from_config(config)
    for name, section in ssh.discover.items():
        spec = clouds.spec_of(name, f"ssh.{name}")
        return spec.discover_hosts(section, allow_private_connect=ssh.jump_host is not None)
    base = Path(config.base_dir)
    return read_ip_files(
        base / os.path.expanduser(ssh.public_ips_file or ""),
        base / os.path.expanduser(ssh.private_ips_file or ""),
        gpus=ssh.gpus,
    )


def _read_address_lines(path: Path) -> list[str]:
    """Non-empty address lines of one file; blank lines and duplicates are errors with file:line."""
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(
            f"{path}: cannot read the host file ({err.strerror}). Check the path, which is "
            "relative to the cluster file."
        ) from err
    addresses: list[str] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        address = raw.strip()
        if not address:
            raise ConfigError(
                f"{path}:{number}: blank line. Line i of the public and private IP files is the "
                "same instance, so a blank line would shift every host after it; remove it."
            )
        if len(address.split()) != 1:
            raise ConfigError(
                f"{path}:{number}: '{address}' is not one address; write one IP or host name "
                "per line."
            )
        if address in seen:
            raise ConfigError(
                f"{path}:{number}: {address} is listed twice (first at line {seen[address]}); "
                "every line must be a different instance."
            )
        seen[address] = number
        addresses.append(address)
    if not addresses:
        raise ConfigError(f"{path}: the host file is empty; write one address per line.")
    return addresses


def read_ip_files(public_file: Path, private_file: Path, gpus: int | None = None) -> list[Host]:
    """The CSCS pair of files: line i of the public and of the private file is one instance."""
    public = _read_address_lines(public_file)
    private = _read_address_lines(private_file)
    if len(public) != len(private):
        shorter, longer = (
            (public_file, private_file)
            if len(public) < len(private)
            else (private_file, public_file)
        )
        first_unmatched = min(len(public), len(private)) + 1
        raise ConfigError(
            f"{longer}:{first_unmatched}: {longer.name} has {max(len(public), len(private))} "
            f"addresses but {shorter} has only {min(len(public), len(private))}; line i of each "
            "file must be the same instance. Add the missing addresses or remove the extra ones."
        )
    return [
        Host(
            name=pub,
            cluster_address=priv,
            connect_address=pub,
            gpu_ids=gpu_ids(gpus or 0),
            gpu_source="ssh.gpus" if gpus is not None else "",
        )
        for pub, priv in zip(public, private, strict=True)
    ]
