"""Hosts from running EC2 instances (the SSH backend's ``ssh.ec2`` source): instances matching
the section's filters and ids, sorted by name then id."""

from __future__ import annotations

from typing import Any

from tflaunch.launchers.clouds.ec2.client import ec2_client
from tflaunch.launchers.clouds.ec2.section import Ec2Section
from tflaunch.plugin import Host, LaunchError, gpu_ids


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
