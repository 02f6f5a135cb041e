"""Where the SSH backend's hosts come from: the cluster file, a pair of IP files, or EC2.

Every source yields plan :class:`~tflaunch.cluster.plan.Host` records in a deterministic order: the address the launcher
connects to (public) and the address the cluster uses between hosts (private), as on EC2 where a
laptop reaches instances by their public IPs and training traffic stays inside the VPC.

* inline ``hosts:`` entries, each with ``connect`` and ``address`` (and ``gpus``);
* the CSCS pair of files (``ssh.public_ips_file`` / ``ssh.private_ips_file``): line i of each is
  the same instance; blank lines, unequal lengths and duplicates are errors naming file:line;
* EC2 discovery (``ssh.ec2``) with boto3, imported only here and only when used (the ``aws``
  extra): running instances matching the filters / instance ids.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tflaunch.cluster.config import ClusterConfig, Ec2Section
from tflaunch.cluster.plan import Host, gpu_ids, hosts_from_config
from tflaunch.errors import ConfigError, LaunchError


def resolve_hosts(config: ClusterConfig) -> list[Host]:
    """The hosts of an ssh cluster file, from whichever one source it names."""
    ssh = config.ssh
    sources = [
        name
        for name, used in (
            ("hosts", bool(config.hosts)),
            ("ssh.public_ips_file", bool(ssh.public_ips_file)),
            ("ssh.ec2", ssh.ec2 is not None),
        )
        if used
    ]
    if len(sources) > 1:
        raise ConfigError(
            f"{config.source}: hosts come from {' and '.join(sources)}; give exactly one source "
            "(inline 'hosts:', the public/private IP files, or 'ssh.ec2')."
        )
    if not sources:
        raise ConfigError(
            f"{config.source}: backend 'ssh' needs hosts: list them under 'hosts:' (with "
            "'connect' and 'address'), name 'ssh.public_ips_file' and 'ssh.private_ips_file', "
            "or discover them with 'ssh.ec2'."
        )
    if config.hosts:
        return hosts_from_config(config)
    if ssh.ec2 is not None:
        return discover_ec2(ssh.ec2, allow_private_connect=ssh.jump_host is not None)
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


def ec2_client(section: Any, key: str = "ssh.ec2") -> Any:
    """A boto3 EC2 client for a cluster-file section with region, profile and endpoint_url
    (``ssh.ec2`` or ``ssh.provision``, named by ``key`` in the errors). boto3 is the optional
    'aws' extra, imported only here and only when EC2 is asked for."""
    try:
        import boto3
        import botocore.exceptions
    except ImportError as err:
        raise ConfigError(
            f"{key} needs boto3, which is not installed: pip install 'tflaunch[aws]'."
        ) from err
    try:
        session = boto3.Session(profile_name=section.profile, region_name=section.region)
        return session.client("ec2", endpoint_url=section.endpoint_url)
    except botocore.exceptions.ProfileNotFound as err:
        raise ConfigError(
            f"{key}.profile: {err}. Name a profile from ~/.aws/config or drop 'profile' to use "
            "the AWS environment."
        ) from err
    except botocore.exceptions.NoRegionError as err:
        raise ConfigError(
            f"{key}: no AWS region: set '{key}.region', AWS_DEFAULT_REGION, or a region in "
            "your AWS profile."
        ) from err


def _ec2_filters(section: Ec2Section) -> list[dict[str, Any]]:
    filters = [{"Name": key, "Values": [value]} for key, value in sorted(section.filters.items())]
    # Only running instances: stopped ones keep their private address but cannot train.
    filters.append({"Name": "instance-state-name", "Values": ["running"]})
    return filters


def _describe_instances(section: Ec2Section) -> list[dict[str, Any]]:
    client = ec2_client(section)  # imports boto3, or says how to install it
    import botocore.exceptions  # installed with boto3

    kwargs: dict[str, Any] = {"Filters": _ec2_filters(section)}
    if section.instance_ids:
        kwargs["InstanceIds"] = list(section.instance_ids)
    instances: list[dict[str, Any]] = []
    try:
        for page in client.get_paginator("describe_instances").paginate(**kwargs):
            for reservation in page.get("Reservations", []):
                instances.extend(reservation.get("Instances", []))
    except botocore.exceptions.NoCredentialsError as err:
        raise LaunchError(
            "ssh.ec2: no AWS credentials found. Set 'ssh.ec2.profile', or AWS_PROFILE / "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, as for the aws CLI."
        ) from err
    except botocore.exceptions.ClientError as err:
        raise LaunchError(
            f"ssh.ec2: EC2 refused to list instances ({err}). Check the instance ids, the "
            "filters, the region and that your credentials allow ec2:DescribeInstances."
        ) from err
    except botocore.exceptions.EndpointConnectionError as err:
        raise LaunchError(
            f"ssh.ec2: cannot reach the EC2 API ({err}). Check the region, endpoint_url and "
            "your network."
        ) from err
    return instances


def _instance_name(instance: dict[str, Any]) -> str:
    for tag in instance.get("Tags", []):
        if tag.get("Key") == "Name" and tag.get("Value"):
            return f"{tag['Value']}-{instance['InstanceId']}"
    return str(instance["InstanceId"])


def discover_ec2(section: Ec2Section, allow_private_connect: bool = False) -> list[Host]:
    """Running EC2 instances matching the section's filters and ids, sorted by name then id.

    The public address is the connect address; without one the instance is reachable only
    through a jump host (``allow_private_connect``), else it is an error.
    """
    instances = _describe_instances(section)
    if not instances:
        wanted = ", ".join(f"{f['Name']}={f['Values'][0]}" for f in _ec2_filters(section))
        ids = f" and ids {', '.join(section.instance_ids)}" if section.instance_ids else ""
        raise LaunchError(
            f"ssh.ec2: no instance matches {wanted}{ids}. Start the instances, or check the "
            "filters and the region."
        )
    hosts = []
    for instance in sorted(instances, key=lambda i: (_instance_name(i), i["InstanceId"])):
        private = instance.get("PrivateIpAddress")
        public = instance.get("PublicIpAddress")
        name = _instance_name(instance)
        if not private:
            raise LaunchError(f"ssh.ec2: instance {name} has no private address.")
        if not public and not allow_private_connect:
            raise LaunchError(
                f"ssh.ec2: instance {name} has no public address, so the launcher cannot "
                "reach it. Give it one, or set 'ssh.jump_host' to a host inside the VPC."
            )
        hosts.append(
            Host(
                name=name,
                cluster_address=private,
                connect_address=public or private,
                gpu_ids=gpu_ids(section.gpus),
                gpu_source="ssh.ec2.gpus" if section.gpus else "",
            )
        )
    return hosts
