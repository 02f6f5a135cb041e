"""EC2 instances made for a run, owned from creation to termination (``ssh.provision``).

The plan decides how many instances each role needs (:func:`planned_instances`); the cost table
is shown before any is created; then a security group (the cluster's ports open only between its
members, SSH only from the launcher's address) and one instance per planned host are created,
tagged with the run, the cluster and the launcher. The run waits until every instance runs and
accepts SSH, and goes on to the SSH backend's usual sync, setup, pre-flight and launch.

Instances are terminated (never stopped) when:

* anything fails before the cluster started (creation, waiting, setup, pre-flight) or the
  launcher is interrupted then: nothing useful runs on them;
* the run ends and ``up --down`` or ``ssh.provision.terminate_at_end`` asked for it (success,
  failure or Ctrl-C alike);
* ``tflaunch down RUN`` is given;
* ``tflaunch gc`` finds them belonging to a run that ended or whose launcher is gone;
* the host itself decides so: its user data starts a watchdog that powers the instance off at
  ``supervision.max_runtime`` and after ``ssh.provision.idle_timeout`` seconds without a tflaunch
  process or SSH session, and ``InstanceInitiatedShutdownBehavior=terminate`` turns the power-off
  into termination. So a forgotten run ends even if the laptop that started it is gone.

Test-only: ``TFLAUNCH_EC2_ADDRESS_MAP`` names a JSON file ``{host name: {"connect": ..,
"address": ..}}`` that replaces the addresses EC2 reports, so that instances created in a stand-in
of the EC2 API (moto) are reached at real test hosts. A run that uses it says so.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tflaunch.cluster.config import ClusterConfig, Ec2ProvisionSection
from tflaunch.cluster.plan import Host, Plan, make_plan
from tflaunch.errors import ConfigError, LaunchError, TflaunchError
from tflaunch.launchers.ssh.pricing import CostLine, Price, cost_table, gpus_of, resolve_prices
from tflaunch.launchers.ssh.sources import ec2_client
from tflaunch.runtime.run import Run

ADDRESS_MAP_ENV = "TFLAUNCH_EC2_ADDRESS_MAP"
TAG_RUN, TAG_CLUSTER, TAG_HOST = "tflaunch:run", "tflaunch:cluster", "tflaunch:host"
TAG_ROLE, TAG_LAUNCHER, TAG_RUN_DIR = "tflaunch:role", "tflaunch:launcher", "tflaunch:run-dir"
ALIVE_STATES = ["pending", "running", "stopping", "stopped"]
Say = Callable[[str], None]
POLL_SECONDS = 2.0  # between EC2 state queries and SSH probes


class Interrupted(TflaunchError):
    """Ctrl-C, SIGTERM or SIGHUP while instances were being made (exit code as for SIGINT)."""

    exit_code = 130


@dataclasses.dataclass(frozen=True)
class PlannedInstance:
    """One instance the run needs: its host name in the plan, role and type."""

    name: str
    role: str  # "worker" (chief, workers, evaluator and co-located PS) or "ps" (dedicated)
    instance_type: str
    gpus: int
    spot: bool


def planned_instances(config: ClusterConfig) -> list[PlannedInstance]:
    """The instances the plan places tasks on: worker hosts, then one per dedicated PS."""
    section = _section(config)
    gpus = gpus_of(section.worker_instance_type)
    roles, placement = config.roles, config.placement
    slots = roles.chief + roles.worker + roles.evaluator
    per_host = placement.workers_per_host or max(1, gpus // max(1, placement.gpus_per_worker or 1))
    workers = [
        PlannedInstance(
            f"worker-{i + 1}", "worker", section.worker_instance_type, gpus, section.spot_workers
        )
        for i in range(math.ceil(slots / per_host))
    ]
    dedicated = roles.ps if placement.ps == "dedicated" else 0
    ps_type = section.ps_instance_type
    ps = [
        PlannedInstance(f"ps-{i + 1}", "ps", ps_type, gpus_of(ps_type), False)
        for i in range(dedicated)
    ]
    planned = workers + ps
    used = {h.name for h in make_plan(config, pending_hosts(planned)).hosts_with_tasks()}
    return [p for p in planned if p.name in used]


def pending_hosts(planned: Sequence[PlannedInstance]) -> list[Host]:
    """Hosts for planning before the instances exist: their addresses are not known yet."""
    return [
        Host(p.name, f"{p.name}.pending", f"{p.name}.pending", tuple(map(str, range(p.gpus))))
        for p in planned
    ]


def cost_lines(config: ClusterConfig, planned: Sequence[PlannedInstance]) -> list[CostLine]:
    """One line per (role, type, spot) with its count and price, in the planned order."""
    prices = resolve_prices(_section(config), [p.instance_type for p in planned])
    groups: dict[tuple[str, str, bool], int] = {}
    for p in planned:
        key = (p.role, p.instance_type, p.spot)
        groups[key] = groups.get(key, 0) + 1
    return [
        CostLine(role, kind, count, spot, prices[kind])
        for (role, kind, spot), count in groups.items()
    ]


def _section(config: ClusterConfig) -> Ec2ProvisionSection:
    if config.ssh.provision is None:
        raise ConfigError(f"{config.source}: the cluster file has no ssh.provision section.")
    return config.ssh.provision


# ---- the host-side watchdog ------------------------------------------------------------------

# Processes that count as activity: an agent or coordinator of tflaunch, or an SSH session.
ACTIVITY = r"[t]flaunch[.](agent|launchers)|^sshd: [^ ]+@"

WATCHDOG = """\
start=$(date +%s); last=$start
while :; do
  now=$(date +%s)
  if ps -eo args= | grep -Eq "$ACTIVITY"; then last=$now; fi
  if [ "$MAX_RUNTIME" -gt 0 ] && [ $((now - start)) -ge "$MAX_RUNTIME" ]; then
    why="reached supervision.max_runtime ($MAX_RUNTIME s)"; break
  fi
  if [ $((now - last)) -ge "$IDLE_TIMEOUT" ]; then
    why="idle for $IDLE_TIMEOUT s (ssh.provision.idle_timeout)"; break
  fi
  sleep "$STEP"
done
echo "tflaunch watchdog: $why; powering off"
shutdown -h now
"""


def watchdog_script(
    max_runtime: float | None, idle_timeout: float, step: float = 30, activity: str = ACTIVITY
) -> str:
    """The watchdog loop (POSIX sh) with its settings; it powers the machine off when done."""
    settings = (
        f"MAX_RUNTIME={int(max_runtime or 0)}\nIDLE_TIMEOUT={int(idle_timeout)}\n"
        f"STEP={max(1, int(step))}\nACTIVITY='{activity}'\n"
    )
    return settings + WATCHDOG


def user_data(max_runtime: float | None, idle_timeout: float) -> str:
    """Instance user data: install the watchdog and start it in the background at boot."""
    script = watchdog_script(max_runtime, idle_timeout)
    return (
        "#!/bin/sh\n# tflaunch: terminate this instance at its runtime limit or when idle\n"
        "cat > /var/run/tflaunch-watchdog.sh <<'TFLAUNCH_EOF'\n"
        f"{script}TFLAUNCH_EOF\n"
        "nohup sh /var/run/tflaunch-watchdog.sh >/var/log/tflaunch-watchdog.log 2>&1 &\n"
    )


# ---- EC2 -------------------------------------------------------------------------------------


@contextmanager
def aws_errors(doing: str) -> Iterator[None]:
    """AWS client errors as LaunchErrors that say what was being done."""
    import botocore.exceptions

    try:
        yield
    except botocore.exceptions.NoCredentialsError as err:
        raise LaunchError(
            f"{doing}: no AWS credentials. Set ssh.provision.profile, or AWS_PROFILE / "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, as for the aws CLI."
        ) from err
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as err:
        raise LaunchError(f"{doing}: AWS refused ({err}).") from err


def launcher_tag() -> str:
    """``host:pid:start time`` of this process, so a sweep can tell whether it is still alive."""
    import psutil

    me = psutil.Process()
    return f"{socket.gethostname()}:{me.pid}:{int(me.create_time())}"


def launcher_alive(tag: str) -> bool | None:
    """Whether the launcher named by a tag still runs; None when it ran on another machine."""
    import psutil

    host, _, rest = tag.partition(":")
    pid_text, _, started = rest.partition(":")
    if host != socket.gethostname():
        return None
    try:
        process = psutil.Process(int(pid_text))
        return int(process.create_time()) == int(started)
    except (psutil.NoSuchProcess, ValueError):
        return False


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


def port_ranges(ports: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted ports merged into inclusive ranges: [2220, 2221, 2230] -> [(2220, 2221), (2230, 2230)]."""
    ranges: list[tuple[int, int]] = []
    for port in sorted(set(ports)):
        if ranges and port == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], port)
        else:
            ranges.append((port, port))
    return ranges


class Provisioner:
    """Create, find and terminate one run's instances and security group."""

    def __init__(self, section: Any, run_id: str, say: Say):
        self.section = section
        self.run_id = run_id
        self.say = say
        self.client = ec2_client(section, "ssh.provision")

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

    def security_group(
        self, cluster: str, ports: Sequence[int], ssh_port: int, ssh_from: str
    ) -> str:
        """A group admitting the cluster's ports from its members and SSH from ``ssh_from``."""
        with aws_errors("creating the security group"):
            group = self.client.create_security_group(
                GroupName=f"tflaunch-{self.run_id}",
                Description=f"tflaunch run {self.run_id} of cluster {cluster}",
                VpcId=self._vpc_of(self.section.subnet),
                TagSpecifications=[{"ResourceType": "security-group", "Tags": self._tags(cluster)}],
            )["GroupId"]
            members = [{"GroupId": group}]
            rules = [
                {"IpProtocol": "tcp", "FromPort": low, "ToPort": high, "UserIdGroupPairs": members}
                for low, high in port_ranges(ports)
            ]
            rules.append(
                {"IpProtocol": "tcp", "FromPort": ssh_port, "ToPort": ssh_port,
                 "IpRanges": [{"CidrIp": ssh_from, "Description": "tflaunch launcher"}]}
            )  # fmt: skip
            self.client.authorize_security_group_ingress(GroupId=group, IpPermissions=rules)
        return group

    def _tags(self, cluster: str, **extra: str) -> list[dict[str, str]]:
        tags = {**self.section.tags, TAG_RUN: self.run_id, TAG_CLUSTER: cluster, **extra}
        return [{"Key": k, "Value": v} for k, v in tags.items()]

    def create(
        self,
        planned: Sequence[PlannedInstance],
        cluster: str,
        group: str,
        extra_tags: dict,
        data: str,
    ) -> dict[str, str]:
        """One instance per planned host; returns host name -> instance id."""
        created: dict[str, str] = {}
        for p in planned:
            tags = self._tags(
                cluster,
                **extra_tags,
                **{TAG_HOST: p.name, TAG_ROLE: p.role, "Name": f"{cluster}-{p.name}"},
            )
            kwargs: dict[str, Any] = {
                "ImageId": self.section.image,
                "InstanceType": p.instance_type,
                "MinCount": 1,
                "MaxCount": 1,
                "SecurityGroupIds": [group],
                "UserData": data,
                "InstanceInitiatedShutdownBehavior": "terminate",
                "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
            }
            if self.section.key_name:
                kwargs["KeyName"] = self.section.key_name
            if self.section.subnet:
                kwargs["SubnetId"] = self.section.subnet
            if p.spot:
                kwargs["InstanceMarketOptions"] = {
                    "MarketType": "spot",
                    "SpotOptions": {"SpotInstanceType": "one-time",
                                    "InstanceInterruptionBehavior": "terminate"},
                }  # fmt: skip
            with aws_errors(f"creating {p.name} ({p.instance_type})"):
                reply = self.client.run_instances(**kwargs)
            created[p.name] = reply["Instances"][0]["InstanceId"]
        return created

    def describe(self, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        found = []
        with aws_errors("listing instances"):
            for page in self.client.get_paginator("describe_instances").paginate(Filters=filters):
                for reservation in page["Reservations"]:
                    found.extend(reservation["Instances"])
        return found

    def wait_running(self, ids: Sequence[str], timeout: float) -> list[dict[str, Any]]:
        """Poll until every instance runs, saying how many do whenever that changes."""
        deadline, started, shown = time.monotonic() + timeout, time.monotonic(), -1
        while True:
            found = self.describe([{"Name": "instance-id", "Values": list(ids)}])
            states = [i["State"]["Name"] for i in found]
            running = states.count("running")
            if running != shown:
                self.say(
                    f"instances running: {running}/{len(ids)} ({time.monotonic() - started:.0f} s)"
                )
                shown = running
            if running == len(ids):
                return found
            gone = [
                i["InstanceId"]
                for i in found
                if i["State"]["Name"] in ("shutting-down", "terminated")
            ]
            if gone:
                raise LaunchError(
                    f"instance(s) {', '.join(gone)} ended while starting (spot reclaimed, or capacity)."
                )
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"only {running} of {len(ids)} instances ran within {timeout:g} s "
                    "(ssh.provision.ready_timeout)."
                )
            time.sleep(POLL_SECONDS)

    def terminate(self, ids: Sequence[str], group: str | None = None, wait: float = 300) -> None:
        """Terminate the instances, wait until EC2 says so, then delete the security group."""
        if ids:
            with aws_errors("terminating instances"):
                self.client.terminate_instances(InstanceIds=list(ids))
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                found = self.describe([{"Name": "instance-id", "Values": list(ids)}])
                if all(i["State"]["Name"] == "terminated" for i in found):
                    break
                time.sleep(POLL_SECONDS)
        if group:
            self.delete_group(group, wait)

    def delete_group(self, group: str, wait: float) -> None:
        import botocore.exceptions

        deadline = time.monotonic() + wait
        while True:
            try:
                self.client.delete_security_group(GroupId=group)
                return
            except botocore.exceptions.ClientError as err:
                code = err.response.get("Error", {}).get("Code", "")
                if code in ("InvalidGroup.NotFound", "InvalidGroupId.NotFound"):
                    return
                if code != "DependencyViolation" or time.monotonic() > deadline:
                    self.say(f"could not delete security group {group}: {err}")
                    return
            time.sleep(POLL_SECONDS)


def wait_for_ssh(hosts: Sequence[Host], port: int, timeout: float, say: Say) -> None:
    """Wait until every host's sshd sends its banner, saying how many do as that changes."""
    deadline, started, ready, shown = time.monotonic() + timeout, time.monotonic(), set(), -1
    while True:
        for host in hosts:
            if host.name not in ready and _ssh_banner(host.connect_address, port):
                ready.add(host.name)
        if len(ready) != shown:
            say(
                f"instances accepting SSH: {len(ready)}/{len(hosts)} ({time.monotonic() - started:.0f} s)"
            )
            shown = len(ready)
        if len(ready) == len(hosts):
            return
        if time.monotonic() > deadline:
            missing = ", ".join(h.name for h in hosts if h.name not in ready)
            raise LaunchError(
                f"{missing} did not accept SSH on port {port} within {timeout:g} s "
                "(ssh.provision.ready_timeout); check the image runs sshd and ssh_from covers you."
            )
        time.sleep(POLL_SECONDS)


def _ssh_banner(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=3) as sock:
            sock.settimeout(3)
            return sock.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def _address_map() -> dict[str, dict[str, str]] | None:
    path = os.environ.get(ADDRESS_MAP_ENV)
    return json.loads(Path(path).read_text()) if path else None


def hosts_of(
    planned: Sequence[PlannedInstance],
    ids: dict[str, str],
    found: list[dict],
    via_jump: bool,
    say: Say,
) -> list[Host]:
    """Plan hosts with the addresses EC2 gave each instance (or the test-only address map's)."""
    by_id = {i["InstanceId"]: i for i in found}
    mapped = _address_map()
    if mapped is not None:
        say(f"addresses come from {os.environ[ADDRESS_MAP_ENV]} ({ADDRESS_MAP_ENV}, for tests)")
    hosts = []
    for p in planned:
        instance = by_id[ids[p.name]]
        cluster = instance.get("PrivateIpAddress")
        connect = instance.get("PublicIpAddress") or (cluster if via_jump else None)
        if mapped is not None:
            connect, cluster = mapped[p.name]["connect"], mapped[p.name]["address"]
        if not cluster or not connect:
            raise LaunchError(
                f"{p.name} ({ids[p.name]}) has no public address; use a subnet that assigns "
                "public addresses, or set ssh.jump_host to a host inside the VPC."
            )
        hosts.append(Host(p.name, cluster, connect, tuple(map(str, range(p.gpus)))))
    return hosts


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt while instances are being made, so that the
    cleanup below runs for them as for Ctrl-C."""

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def on_instances(config: ClusterConfig, run: Run) -> ClusterConfig:
    """The cluster file as the SSH backend uses it on the instances once they exist.

    Their host keys are new, and EC2 hands a terminated instance's public address to the next
    one, so the keys go into a known_hosts file of the run's own, recorded on first contact
    (accept-new); a key that changes within the run is still refused."""
    ssh = dataclasses.replace(
        config.ssh,
        provision=None,
        known_hosts=str(run.dir / "known_hosts"),
        host_key_policy="accept-new",
    )
    return config.with_section("ssh", ssh)


def provisioned_run(
    config: ClusterConfig,
    run: Run,
    start: Callable[[Plan], Any],
    say: Say,
    detach: bool = False,
    down_at_end: bool = False,
) -> Any:
    """Show the cost, create the instances, run ``start(plan)`` on them, and terminate them
    when asked (``down_at_end``: ``up --down``, or ``terminate_at_end``), or whenever the cluster
    never started. A detached run (``detach``) keeps its
    instances once started: they terminate when 'down' or 'gc' says so, or by themselves when
    idle after the run ended."""
    section = _section(config)
    planned = planned_instances(config)
    say("cost of the instances this run creates:\n" + cost_table(cost_lines(config, planned)))
    prices = {line.instance_type: line.price for line in cost_lines(config, planned)}
    prov = Provisioner(section, run.id, say)
    ids: dict[str, str] = {}
    group = None
    started = False
    try:
        with _signals_interrupt():
            ports = [t.port for t in make_plan(config, pending_hosts(planned)).tasks if t.port]
            group = prov.security_group(
                config.name, ports, config.ssh.port, section.ssh_from or my_public_cidr()
            )
            run.update_meta(ec2=_access(section, group))
            extra = {TAG_LAUNCHER: launcher_tag(), TAG_RUN_DIR: str(run.dir)}
            data = user_data(config.supervision.max_runtime, section.idle_timeout)
            say(f"creating {len(planned)} instance(s) in security group {group}")
            ids = prov.create(planned, config.name, group, extra, data)
            _record(run, planned, ids, prices)
            found = prov.wait_running(list(ids.values()), section.ready_timeout)
            hosts = hosts_of(planned, ids, found, config.ssh.jump_host is not None, say)
            if config.ssh.jump_host is None:  # behind a jump host sshd is not reachable from here
                wait_for_ssh(hosts, config.ssh.port, section.ready_timeout, say)
            plan = make_plan(config, hosts, run.dir)  # the run's own checkpoint directory
            run.write_plan(plan)
        started = True
        return start(plan)
    except KeyboardInterrupt as err:
        if started:
            raise
        raise Interrupted(
            f"interrupted ({err or 'SIGINT'}) while the instances were being made; those made "
            "so far are terminated below"
        ) from None
    finally:
        asked = section.terminate_at_end or down_at_end
        keep = started and (detach or not asked)
        if keep:
            say(
                f"the instances keep running: 'tflaunch down {run.id}' terminates them (they "
                f"terminate themselves after {section.idle_timeout:g} s idle)"
            )
        elif ids or group:
            say(f"terminating {len(ids)} instance(s)")
            prov.terminate(list(ids.values()), group)
            mark_terminated(run)


def _access(section: Ec2ProvisionSection, group: str) -> dict[str, Any]:
    return {
        "region": section.region,
        "profile": section.profile,
        "endpoint_url": section.endpoint_url,
        "security_group": group,
    }


def _record(
    run: Run, planned: Sequence[PlannedInstance], ids: dict[str, str], prices: dict[str, Price]
) -> None:
    now = time.time()
    run.update_meta(
        instances=[
            {"id": ids[p.name], "name": p.name, "type": p.instance_type, "role": p.role,
             "spot": p.spot, "hourly_usd": prices[p.instance_type].hourly_usd,
             "launched": now, "terminated": None}
            for p in planned if p.name in ids
        ]
    )  # fmt: skip


def mark_terminated(run: Run) -> None:
    now = time.time()
    records = run.read_meta().get("instances") or []
    run.update_meta(instances=[{**r, "terminated": r.get("terminated") or now} for r in records])


@dataclasses.dataclass(frozen=True)
class Access:
    """How to reach the EC2 API (from run.json or a cluster file)."""

    region: str | None = None
    profile: str | None = None
    endpoint_url: str | None = None
    tags: Any = dataclasses.field(default_factory=dict)
    subnet: str | None = None


def terminate_run(run: Run, say: Say) -> str:
    """``tflaunch down``: terminate the instances a run created; what was done, in words."""
    meta = run.read_meta()
    access = meta.get("ec2")
    if not access:
        return ""
    prov = Provisioner(
        Access(access["region"], access["profile"], access["endpoint_url"]), run.id, say
    )
    alive = prov.describe(
        [{"Name": f"tag:{TAG_RUN}", "Values": [run.id]},
         {"Name": "instance-state-name", "Values": ALIVE_STATES}]
    )  # fmt: skip
    prov.terminate([i["InstanceId"] for i in alive], access.get("security_group"))
    mark_terminated(run)
    return f"terminated {len(alive)} instance(s) of run {run.id}"
