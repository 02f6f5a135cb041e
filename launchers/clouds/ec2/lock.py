"""A kept cluster's lock on EC2: a security group of its own, ``tflaunch-lock-<cluster>``.

EC2 refuses a second security group of the same name in one VPC (``InvalidGroup.Duplicate``), so
creating the group is an atomic test-and-set that every machine with the account sees, whether
or not the cluster's instances exist or answer. The group admits nothing and no instance uses
it; its tags say who holds the lock (:class:`~tflaunch.launchers.clouds.records.LockHolder`), and
the holder moves the heartbeat tag on while it runs. Releasing is deleting the group.
"""

from __future__ import annotations

import hashlib
from typing import Any

from tflaunch.launchers.clouds.ec2.client import aws_errors
from tflaunch.plugin import TAG_KEEP, LockHolder

TAG_WHAT, TAG_LAUNCHER = "tflaunch:lock-holder", "tflaunch:lock-launcher"
TAG_SINCE, TAG_HEARTBEAT = "tflaunch:lock-since", "tflaunch:lock-heartbeat"


def group_name(cluster: str) -> str:
    """The lock's security-group name (the cluster name in the characters EC2 allows; a name
    that had to change gets a short hash, so that two names never share a lock)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in cluster)
    if safe != cluster:
        safe += "-" + hashlib.sha256(cluster.encode()).hexdigest()[:8]
    return f"tflaunch-lock-{safe}"[:255]


def _tags(cluster: str, holder: LockHolder) -> list[dict[str, str]]:
    tags = {
        TAG_KEEP: cluster,
        TAG_WHAT: holder.what,
        TAG_LAUNCHER: holder.launcher,
        TAG_SINCE: f"{holder.since:.0f}",
        TAG_HEARTBEAT: f"{holder.heartbeat:.0f}",
    }
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def _holder(group: dict[str, Any]) -> LockHolder:
    tags = {t["Key"]: t["Value"] for t in group.get("Tags", [])}
    since = float(tags.get(TAG_SINCE) or 0)
    return LockHolder(
        tags.get(TAG_WHAT, "another tflaunch command"),
        tags.get(TAG_LAUNCHER, "?"),
        since,
        float(tags.get(TAG_HEARTBEAT) or since),
    )


def _same(a: LockHolder, b: LockHolder) -> bool:
    """The same holder as the tags keep it (times in whole seconds)."""
    return (a.what, a.launcher, round(a.since)) == (b.what, b.launcher, round(b.since))


def _find(client: Any, vpc: str, cluster: str) -> dict[str, Any] | None:
    with aws_errors("reading the kept cluster's lock"):
        groups = client.describe_security_groups(
            Filters=[
                {"Name": "group-name", "Values": [group_name(cluster)]},
                {"Name": "vpc-id", "Values": [vpc]},
            ]
        )["SecurityGroups"]
    return groups[0] if groups else None


def take(client: Any, vpc: str, cluster: str, holder: LockHolder) -> LockHolder | None:
    import botocore.exceptions

    for _ in range(3):  # a lock released between the create and the read: try again
        try:
            client.create_security_group(
                GroupName=group_name(cluster),
                Description=f"tflaunch: the lock of kept cluster {cluster} (admits nothing)",
                VpcId=vpc,
                TagSpecifications=[
                    {"ResourceType": "security-group", "Tags": _tags(cluster, holder)}
                ],
            )
            return None
        except botocore.exceptions.ClientError as err:
            if err.response.get("Error", {}).get("Code") != "InvalidGroup.Duplicate":
                with aws_errors("taking the kept cluster's lock"):
                    raise
        group = _find(client, vpc, cluster)
        if group is not None:
            return _holder(group)
    return LockHolder("another tflaunch command (the lock changes hands as we look)", "?", 0, 0)


def renew(
    client: Any, vpc: str, cluster: str, holder: LockHolder, heartbeat: float
) -> LockHolder | None:
    group = _find(client, vpc, cluster)
    if group is None:
        return LockHolder("nobody (the lock was removed)", "?", 0.0, 0.0)
    now_held = _holder(group)
    if not _same(now_held, holder):
        return now_held
    with aws_errors("renewing the kept cluster's lock"):
        client.create_tags(
            Resources=[group["GroupId"]], Tags=[{"Key": TAG_HEARTBEAT, "Value": f"{heartbeat:.0f}"}]
        )
    return None


def drop(client: Any, vpc: str, cluster: str, holder: LockHolder) -> None:
    import botocore.exceptions

    group = _find(client, vpc, cluster)
    if group is None or not _same(_holder(group), holder):
        return
    try:
        client.delete_security_group(GroupId=group["GroupId"])
    except botocore.exceptions.ClientError as err:
        if err.response.get("Error", {}).get("Code") not in (
            "InvalidGroup.NotFound",
            "InvalidGroupId.NotFound",
        ):
            with aws_errors("releasing the kept cluster's lock"):
                raise
