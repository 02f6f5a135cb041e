"""EC2's sections of the cluster file: ``ssh.provision`` (``cloud: ec2``, the default) and
``ssh.ec2`` (hosts discovered among running instances). Read through the cloud registry
(:mod:`tflaunch.launchers.clouds`); plain dataclasses, so that reading a file imports no boto3."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tflaunch.plugin import MAX_GPUS, MAX_ITEMS, ProvisionSection, field


@dataclass(frozen=True)
class Ec2Section:
    """Discover hosts from EC2 (needs the aws extra: boto3)."""

    region: str | None = field(None, doc="AWS region (default: the usual AWS environment)")
    profile: str | None = field(None, doc="AWS profile")
    filters: Mapping[str, str] = field(factory=dict, doc="EC2 filters, e.g. {'tag:cluster': 'tf'}")
    instance_ids: tuple[str, ...] = field((), doc="instance ids", maximum=MAX_ITEMS)
    endpoint_url: str | None = field(
        None, doc="EC2 API endpoint (for tests against a local stand-in)"
    )
    gpus: int = field(0, minimum=0, maximum=MAX_GPUS, doc="GPUs per discovered instance")


@dataclass(frozen=True)
class Ec2ProvisionSection(ProvisionSection):
    """Create EC2 instances for the run (needs the aws extra: boto3). tflaunch owns them: they are
    tagged with the run and terminated by 'tflaunch down', 'up --down', the runtime limits, or
    'tflaunch gc'."""

    image: str = field(doc="AMI id; it needs Python 3 and sshd (the setup lines install the rest)")
    key_name: str | None = field(None, doc="EC2 key pair; its private key is ssh.identity_file")
    subnet: str | None = field(None, doc="subnet id (default: the default VPC's default subnet)")
    region: str | None = field(None, doc="AWS region (default: the usual AWS environment)")
    profile: str | None = field(None, doc="AWS profile")
    endpoint_url: str | None = field(
        None, doc="EC2 API endpoint (for tests against a local stand-in)"
    )
    ps_instance_type: str = field("c5.xlarge", doc="instance type of dedicated PS hosts")
    worker_instance_type: str = field(
        "p3.2xlarge", doc="instance type of worker hosts (chief, workers, evaluator, co-located PS)"
    )
    spot_workers: bool = field(False, doc="request worker hosts as spot instances")
    ssh_from: str | None = field(
        None, doc="CIDR allowed to reach port 22 (default: this machine's public address /32)"
    )
    prices: Mapping[str, str] = field(
        factory=dict, doc="USD per hour by instance type, overriding the price list"
    )
    pricing_api: bool = field(True, doc="ask AWS's pricing API first (falls back to the list)")
    tags: Mapping[str, str] = field(factory=dict, doc="extra tags on every instance")
