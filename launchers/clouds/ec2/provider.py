"""EC2 as a cloud provider: instances per role and type, a security group per run, spot workers.

The instances of a run are created in one security group of its own (the cluster's ports open
only between its members, SSH only from the launcher's address), each tagged with the run, the
cluster, its host name and role and the launcher, and with ``InstanceInitiatedShutdownBehavior=
terminate`` so that the watchdog in their user data ends them for good.

Test-only: ``TFLAUNCH_EC2_ADDRESS_MAP`` names a JSON file ``{host name: {"connect": ..,
"address": ..}}`` that replaces the addresses EC2 reports, so that instances created in a stand-in
of the EC2 API (moto) are reached at real test hosts. A run that uses it says so.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tflaunch.launchers.clouds.ec2 import lock
from tflaunch.launchers.clouds.ec2.client import aws_errors, ec2_client
from tflaunch.launchers.clouds.ec2.pricing import gpus_of, resolve_prices
from tflaunch.launchers.clouds.ec2.section import Ec2ProvisionSection
from tflaunch.plugin import (
    ALIVE_STATES,
    POLL_SECONDS,
    TAG_CLUSTER,
    TAG_HOST,
    TAG_KEEP,
    TAG_ROLE,
    TAG_RUN,
    ClusterConfig,
    Instance,
    LaunchError,
    LockHolder,
    PlannedInstance,
    Price,
    Provider,
    ProvisionSection,
    Say,
    network_name,
)

ADDRESS_MAP_ENV = "TFLAUNCH_EC2_ADDRESS_MAP"


@dataclasses.dataclass(frozen=True)
class Access:
    """How to reach the EC2 API when no cluster file is at hand (run.json, 'gc' options)."""

    region: str | None = None
    profile: str | None = None
    endpoint_url: str | None = None
    tags: Mapping[str, str] = dataclasses.field(default_factory=dict)
    subnet: str | None = None
    prices: Mapping[str, str] = dataclasses.field(default_factory=dict)
    pricing_api: bool = False  # listing prices: the packaged list, not one API call per type


def port_ranges(ports: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted ports merged into inclusive ranges: [2220, 2221, 2230] -> [(2220, 2221), (2230, 2230)]."""
    ranges: list[tuple[int, int]] = []
    for port in sorted(set(ports)):
        if ranges and port == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], port)
        else:
            ranges.append((port, port))
    return ranges


def my_public_cidr() -> str:
    """This machine's public address as a /32 (asked of checkip.amazonaws.com)."""
    try:
        with urllib.request.urlopen("https://checkip.amazonaws.com", timeout=5) as reply:
            address = reply.read().decode().strip()
        socket.inet_aton(address)
    except (OSError, ValueError) as err:
        raise LaunchError(
            f"cannot learn this machine's public address for the SSH rule ({err}); set "
            "ssh.provision.ssh_from to the CIDR you connect from, e.g. 203.0.113.7/32."
        ) from err
    return f"{address}/32"


def _address_map() -> dict[str, dict[str, str]] | None:
    path = os.environ.get(ADDRESS_MAP_ENV)
    return json.loads(Path(path).read_text()) if path else None


class Ec2Provider(Provider[Ec2ProvisionSection | Access]):
    """Create, find and terminate tflaunch's EC2 instances and security groups."""

    name = "ec2"
    spot_setting = "ssh.provision.spot_workers"

    def __init__(self, section: Ec2ProvisionSection | Access, say: Say):
        super().__init__(section, say)
        self.client = ec2_client(section, self.key)
        self._vpc: str | None = None  # where the kept clusters' locks are, once asked

    @classmethod
    def from_access(cls, access: Mapping[str, Any], say: Say) -> Ec2Provider:
        return cls(
            Access(
                access.get("region"),
                access.get("profile"),
                access.get("endpoint_url"),
                subnet=access.get("subnet"),
            ),
            say,
        )

    def access(self) -> dict[str, Any]:
        return {
            "region": self.section.region,
            "profile": self.section.profile,
            "endpoint_url": self.section.endpoint_url,
            "subnet": self.section.subnet,  # its VPC holds the kept cluster's lock
        }

    @classmethod
    def recorded_network(cls, access: Mapping[str, Any]) -> str | None:
        """The run's security group; run.json files written before the cloud-neutral
        ``network`` key called it ``security_group``."""
        legacy = access.get("security_group")
        return super().recorded_network(access) or (legacy if isinstance(legacy, str) else None)

    @classmethod
    def account(
        cls, section: ProvisionSection | None, options: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The options over the file's region, profile and endpoint, and the file's subnet
        (its VPC holds a kept cluster's lock)."""
        return {**super().account(section, options), "subnet": getattr(section, "subnet", None)}

    # ---- planning and prices ---------------------------------------------------------------

    def candidates(self, config: ClusterConfig) -> list[PlannedInstance]:
        """Worker hosts (as many as the worker tasks need at the type's GPUs), then one
        instance per dedicated PS."""
        section = self.section
        gpus = gpus_of(section.worker_instance_type)
        roles, placement = config.roles, config.placement
        slots = roles.chief + roles.worker + roles.evaluator
        per_host = placement.workers_per_host or max(
            1, gpus // max(1, placement.gpus_per_worker or 1)
        )
        workers = [
            PlannedInstance(
                f"worker-{i + 1}",
                "worker",
                section.worker_instance_type,
                gpus,
                section.spot_workers,
            )
            for i in range(math.ceil(slots / per_host))
        ]
        dedicated = roles.ps if placement.ps == "dedicated" else 0
        ps_type = section.ps_instance_type
        ps = [
            PlannedInstance(f"ps-{i + 1}", "ps", ps_type, gpus_of(ps_type), False)
            for i in range(dedicated)
        ]
        return workers + ps

    def prices(self, instance_types: Sequence[str]) -> dict[str, Price]:
        return resolve_prices(self.section, instance_types)

    # ---- making and ending instances -------------------------------------------------------

    def _vpc_of(self, subnet: str | None) -> str:
        if subnet:
            found = self.client.describe_subnets(SubnetIds=[subnet])["Subnets"]
            return found[0]["VpcId"]
        vpcs = self.client.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])
        if not vpcs["Vpcs"]:
            raise LaunchError(
                "ssh.provision: the region has no default VPC; name a subnet (ssh.provision.subnet)."
            )
        return vpcs["Vpcs"][0]["VpcId"]

    def _tags(self, run_id: str, cluster: str, **extra: str) -> list[dict[str, str]]:
        tags = {**self.section.tags, TAG_RUN: run_id, TAG_CLUSTER: cluster, **extra}
        return [{"Key": k, "Value": v} for k, v in tags.items()]

    def open_network(
        self,
        run_id: str,
        cluster: str,
        ports: Sequence[int],
        ssh_port: int,
        ssh_from: str | None,
        tags: Mapping[str, str] | None = None,
    ) -> str:
        """A security group admitting the cluster's ports from its members and SSH from
        ``ssh_from`` (else ``ssh.provision.ssh_from``, else this machine's public address)."""
        ssh_from = ssh_from or self.section.ssh_from or my_public_cidr()
        group_tags = self._tags(run_id, cluster, **(tags or {}))
        with aws_errors("creating the security group"):
            group = self.client.create_security_group(
                GroupName=network_name(run_id),
                Description=f"tflaunch run {run_id} of cluster {cluster}",
                VpcId=self._vpc_of(self.section.subnet),
                TagSpecifications=[{"ResourceType": "security-group", "Tags": group_tags}],
            )["GroupId"]
            rules = _ingress(group, ports, ssh_port, ssh_from)
            self.client.authorize_security_group_ingress(GroupId=group, IpPermissions=rules)
        return group

    def create(
        self,
        planned: Sequence[PlannedInstance],
        run_id: str,
        cluster: str,
        network: str,
        tags: Mapping[str, str],
        user_data: str,
        same_address: Mapping[str, Instance] | None = None,
    ) -> dict[str, str]:
        section = self.section
        if not isinstance(section, Ec2ProvisionSection):
            raise LaunchError("ec2: instances are created from a cluster file's ssh.provision.")
        created: dict[str, str] = {}
        for p in planned:
            instance_tags = self._tags(
                run_id, cluster, **tags, **{TAG_HOST: p.name, TAG_ROLE: p.role,
                                            "Name": f"{cluster}-{p.name}"}
            )  # fmt: skip
            old = (same_address or {}).get(p.name)
            request = _launch_request(section, p, network, user_data, instance_tags, old)
            with aws_errors(f"creating {p.name} ({p.instance_type})"):
                reply = self.client.run_instances(**request)
            created[p.name] = reply["Instances"][0]["InstanceId"]
        return created

    def describe(
        self,
        ids: Sequence[str] | None = None,
        tags: Mapping[str, str | None] | None = None,
        states: Sequence[str] = ALIVE_STATES,
    ) -> list[Instance]:
        filters: list[dict[str, Any]] = [{"Name": "instance-state-name", "Values": list(states)}]
        if ids is not None:
            if not ids:
                return []
            filters.append({"Name": "instance-id", "Values": list(ids)})
        for key, value in (tags or {}).items():
            if value is None:
                filters.append({"Name": "tag-key", "Values": [key]})
            else:
                filters.append({"Name": f"tag:{key}", "Values": [value]})
        found = []
        with aws_errors("listing instances"):
            for page in self.client.get_paginator("describe_instances").paginate(Filters=filters):
                for reservation in page["Reservations"]:
                    found.extend(_instance(i) for i in reservation["Instances"])
        return found

    def addresses(
        self, name: str, instance: Instance, via_jump: bool
    ) -> tuple[str | None, str | None]:
        mapped = _address_map()
        if mapped is None:
            return super().addresses(name, instance, via_jump)
        return mapped[name]["connect"], mapped[name]["address"]

    def hosts(self, planned, ids, found, via_jump):  # type: ignore[no-untyped-def]
        if _address_map() is not None:
            self.say(
                f"addresses come from {os.environ[ADDRESS_MAP_ENV]} ({ADDRESS_MAP_ENV}, for tests)"
            )
        return super().hosts(planned, ids, found, via_jump)

    def tag(self, ids: Sequence[str], tags: Mapping[str, str], remove: Sequence[str] = ()) -> None:
        if not ids:
            return
        with aws_errors("tagging instances"):
            if tags:
                self.client.create_tags(
                    Resources=list(ids), Tags=[{"Key": k, "Value": v} for k, v in tags.items()]
                )
            if remove:
                self.client.delete_tags(Resources=list(ids), Tags=[{"Key": k} for k in remove])

    def terminate(self, ids: Sequence[str], network: str | None = None, wait: float = 300) -> None:
        if ids:
            with aws_errors("terminating instances"):
                self.client.terminate_instances(InstanceIds=list(ids))
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                alive = self.describe(ids=ids, states=(*ALIVE_STATES, "shutting-down"))
                if not alive:
                    break
                time.sleep(POLL_SECONDS)
        if network:
            self.delete_network(network, wait)

    # ---- a kept cluster's lock: a security group of its name (see lock.py) -------------------

    def take_lock(self, name: str, holder: LockHolder) -> LockHolder | None:
        return lock.take(self.client, self._lock_vpc(), name, holder)

    def renew_lock(self, name: str, holder: LockHolder, heartbeat: float) -> LockHolder | None:
        return lock.renew(self.client, self._lock_vpc(), name, holder, heartbeat)

    def drop_lock(self, name: str, holder: LockHolder) -> None:
        lock.drop(self.client, self._lock_vpc(), name, holder)

    def _lock_vpc(self) -> str:
        if self._vpc is None:
            with aws_errors("finding the VPC"):
                self._vpc = self._vpc_of(self.section.subnet)
        return self._vpc

    def kept_networks(self, name: str) -> list[str]:
        with aws_errors("listing the kept cluster's security groups"):
            groups = self.client.describe_security_groups(
                Filters=[{"Name": f"tag:{TAG_KEEP}", "Values": [name]}]
            )["SecurityGroups"]
        return sorted(g["GroupId"] for g in groups if g["GroupName"] != lock.group_name(name))

    def where(self) -> str:
        section = self.section
        region = section.region or self.client.meta.region_name or "the default region"
        return f"ec2 {region}" + (f" (profile {section.profile})" if section.profile else "")

    def delete_network(self, network: str, wait: float) -> None:
        _delete_group(self.client, network, wait, self.say)


def _ingress(
    group: str, ports: Sequence[int], ssh_port: int, ssh_from: str
) -> list[dict[str, Any]]:
    """The run's group's rules: the cluster's ports from its members, SSH from ``ssh_from``."""
    members = [{"GroupId": group}]
    rules: list[dict[str, Any]] = [
        {"IpProtocol": "tcp", "FromPort": low, "ToPort": high, "UserIdGroupPairs": members}
        for low, high in port_ranges(ports)
    ]
    rules.append(
        {"IpProtocol": "tcp", "FromPort": ssh_port, "ToPort": ssh_port,
         "IpRanges": [{"CidrIp": ssh_from, "Description": "tflaunch launcher"}]}
    )  # fmt: skip
    return rules


def _launch_request(
    section: Ec2ProvisionSection,
    p: PlannedInstance,
    network: str,
    user_data: str,
    tags: list[dict[str, str]],
    old: Instance | None,
) -> dict[str, Any]:
    """run_instances' arguments for one planned instance; ``old``: the ended instance it
    replaces, whose cluster address it takes."""
    request: dict[str, Any] = {
        "ImageId": section.image,
        "InstanceType": p.instance_type,
        "MinCount": 1,
        "MaxCount": 1,
        "SecurityGroupIds": [network],
        "UserData": user_data,
        "InstanceInitiatedShutdownBehavior": "terminate",
        "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
    }
    if section.key_name:
        request["KeyName"] = section.key_name
    if section.subnet:
        request["SubnetId"] = section.subnet
    if old is not None and old.cluster_address:  # the replaced instance's address:
        request["PrivateIpAddress"] = old.cluster_address  # in the named subnet, else
        if not section.subnet and old.zone:  # the default one of its zone
            request["Placement"] = {"AvailabilityZone": old.zone}
    if p.spot:
        request["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time",
                            "InstanceInterruptionBehavior": "terminate"},
        }  # fmt: skip
    return request


def _delete_group(client: Any, network: str, wait: float, say: Say) -> None:
    """Delete the run's security group once no instance uses it (waiting up to ``wait``)."""
    import botocore.exceptions

    deadline = time.monotonic() + wait
    while True:
        try:
            client.delete_security_group(GroupId=network)
            return
        except botocore.exceptions.ClientError as err:
            code = err.response.get("Error", {}).get("Code", "")
            if code in ("InvalidGroup.NotFound", "InvalidGroupId.NotFound"):
                return
            if code != "DependencyViolation" or time.monotonic() > deadline:
                say(f"could not delete security group {network}: {err}")
                return
        time.sleep(POLL_SECONDS)


def _instance(raw: dict[str, Any]) -> Instance:
    launched = raw.get("LaunchTime")
    return Instance(
        id=raw["InstanceId"],
        state=raw["State"]["Name"],
        instance_type=raw.get("InstanceType", "?"),
        tags={t["Key"]: t["Value"] for t in raw.get("Tags", [])},
        launched=launched.timestamp() if launched is not None else time.time(),
        connect_address=raw.get("PublicIpAddress"),
        cluster_address=raw.get("PrivateIpAddress"),
        networks={g["GroupId"]: g.get("GroupName", "") for g in raw.get("SecurityGroups", [])},
        spot=raw.get("InstanceLifecycle") == "spot",
        zone=raw.get("Placement", {}).get("AvailabilityZone"),
    )
