"""EC2 provisioning against moto's server (the EC2 API stand-in): planning, the cost table,
creation with types, tags and security group, termination on every way a run ends, the sweep.

The instances moto makes do not exist as machines; where a step must reach them over SSH these
tests point them (``TFLAUNCH_EC2_ADDRESS_MAP``) at a local listener that answers with an SSH
banner. tests/cloud/test_ssh_cloud.py runs real clusters on the namespace test hosts instead.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.cloud.fixtures import HEAD, provision_config, provision_text
from tests.helpers import gone_launcher, in_second_pid_namespace
from tflaunch.cluster.config import parse_config
from tflaunch.cluster.placement import make_plan
from tflaunch.errors import LaunchError
from tflaunch.launchers.clouds import (
    admin,
    listing,
    provider_for,
    provisioning,
    records,
    sweep,
)
from tflaunch.launchers.clouds.costs import CostLine, cost_table
from tflaunch.launchers.clouds.ec2.pricing import PRICE_LIST, resolve_prices
from tflaunch.launchers.clouds.ec2.provider import ADDRESS_MAP_ENV, Ec2Provider, port_ranges
from tflaunch.launchers.clouds.provisioning import Provisioning
from tflaunch.launchers.clouds.records import (
    TAG_CLUSTER,
    TAG_HOST,
    TAG_LAUNCHER,
    TAG_ROLE,
    TAG_RUN,
    CloudDetails,
)
from tflaunch.launchers.clouds.state import Reach
from tflaunch.launchers.ssh.section import SshSection, host_run_dir
from tflaunch.runtime.run import Run


def provider_of(config, say=print):
    return provider_for(config.section(SshSection).provision, say)


def planned_instances(config):
    return provisioning.planned_instances(provider_of(config), config)


def provisioned_run(config, run, start, say, *, down_at_end=False, fleet_ready=None, keep=None):
    """Provision as the SSH backend does, and run ``start(plan)`` on the instances."""
    reach = Reach(
        config.section(SshSection).port,
        config.section(SshSection).jump_host is not None,
        host_run_dir(config, run.id),
    )
    with Provisioning(
        provider_of(config, say), config, run, reach, down_at_end=down_at_end, keep=keep,
        watch=fleet_ready is not None,
    ) as made:  # fmt: skip
        if fleet_ready is not None:
            fleet_ready(made.fleet)
        return start(made.plan)


# ---- planning and prices (pure) ---------------------------------------------------------------


def test_dedicated_ps_get_cpu_instances_and_workers_gpu_instances(tmp_path):
    extra = "roles: {ps: 2, worker: 3}\nplacement: {ps: dedicated}\n"
    planned = planned_instances(provision_config(tmp_path, extra))
    assert [(p.name, p.role, p.instance_type, p.gpus) for p in planned] == [
        ("worker-1", "worker", "p3.2xlarge", 1),
        ("worker-2", "worker", "p3.2xlarge", 1),
        ("worker-3", "worker", "p3.2xlarge", 1),
        ("ps-1", "ps", "c5.xlarge", 0),
        ("ps-2", "ps", "c5.xlarge", 0),
    ]


def test_workers_share_a_multi_gpu_instance_and_colocated_ps_need_none(tmp_path):
    extra = "roles: {ps: 2, worker: 6}\n"
    planned = planned_instances(provision_config(tmp_path, extra, worker_type="p3.8xlarge"))
    assert [(p.name, p.instance_type, p.gpus) for p in planned] == [
        ("worker-1", "p3.8xlarge", 4),
        ("worker-2", "p3.8xlarge", 4),
    ]


def test_cost_table_matches_the_price_list(tmp_path):
    extra = "roles: {ps: 2, worker: 3}\nplacement: {ps: dedicated}\n"
    config = provision_config(tmp_path, extra)
    table = cost_table(
        Ec2Provider(config.section(SshSection).provision, print).cost_lines(
            planned_instances(config)
        )
    )
    worker, ps = PRICE_LIST["p3.2xlarge"].hourly_usd, PRICE_LIST["c5.xlarge"].hourly_usd
    lines = table.splitlines()
    assert lines[1].split() == [
        "worker", "3", "p3.2xlarge", f"{worker:.4f}", f"{3 * worker:.4f}", "price", "list"
    ]  # fmt: skip
    assert lines[2].split() == [
        "ps", "2", "c5.xlarge", f"{ps:.4f}", f"{2 * ps:.4f}", "price", "list"
    ]  # fmt: skip
    assert lines[3] == (f"estimated cost: USD {3 * worker + 2 * ps:.4f} per hour for 5 instance(s)")


def test_cluster_file_prices_override_and_the_api_comes_before_the_list(tmp_path):
    config = provision_config(tmp_path, more="    prices: {c5.xlarge: 0.2}\n")
    section = config.section(SshSection).provision
    asked = []

    def api(kind: str, region: str) -> float | None:
        asked.append((kind, region))
        return 2.5 if kind == "p3.2xlarge" else None

    prices = resolve_prices(section, ["c5.xlarge", "p3.2xlarge", "x9.huge"], ask_api=api)
    assert [(p.hourly_usd, p.source) for p in prices.values()] == [
        (0.2, "cluster file"),
        (2.5, "AWS pricing API"),
        (None, "unknown"),
    ]
    assert asked == [("p3.2xlarge", "us-east-1"), ("x9.huge", "us-east-1")]
    assert "unknown prices" in cost_table(
        [CostLine("worker", "x9.huge", 1, False, prices["x9.huge"])]
    )


def test_port_ranges_merge_neighbours():
    assert port_ranges([2231, 2220, 2221, 2230, 2222]) == [(2220, 2222), (2230, 2231)]


def test_provision_cannot_be_combined_with_listed_hosts(tmp_path):
    from tflaunch.errors import ConfigError

    with pytest.raises(ConfigError, match="cannot be combined with ssh.provision"):
        provision_config(tmp_path, "hosts: [a]\n")


# ---- against moto's server ---------------------------------------------------------------------


@pytest.fixture()
def banner_port():
    """A local listener that greets like sshd (all the provisioning wait looks for)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(b"SSH-2.0-banner-only\r\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    stop.set()
    server.close()


def ec2(endpoint: str):
    import boto3

    return boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)


def run_instances_of(endpoint: str, run_id: str, states=("pending", "running")) -> list[dict]:
    found = ec2(endpoint).describe_instances(
        Filters=[{"Name": f"tag:{TAG_RUN}", "Values": [run_id]},
                 {"Name": "instance-state-name", "Values": list(states)}]
    )  # fmt: skip
    return [i for r in found["Reservations"] for i in r["Instances"]]


def address_map(tmp_path: Path, names, monkeypatch) -> None:
    path = tmp_path / "addresses.json"
    path.write_text(
        json.dumps({n: {"connect": "127.0.0.1", "address": "127.0.0.1"} for n in names})
    )
    monkeypatch.setenv(ADDRESS_MAP_ENV, str(path))


DEDICATED = "roles: {ps: 1, worker: 2}\nplacement: {ps: dedicated}\n"


def test_up_creates_exactly_the_planned_instances(
    tmp_path, ec2_endpoint, aws_env, banner_port, monkeypatch
):
    config = provision_config(tmp_path, DEDICATED, ec2_endpoint, ssh_port=banner_port)
    address_map(tmp_path, ["worker-1", "worker-2", "ps-1"], monkeypatch)
    run = Run.create(tmp_path / "runs", "t")
    seen: dict = {}
    said: list[str] = []

    def say(message: str) -> None:
        if message.startswith("cost of the instances"):  # nothing exists yet
            seen["before"] = run_instances_of(ec2_endpoint, run.id)
        said.append(message)

    def start(plan):
        seen["instances"] = run_instances_of(ec2_endpoint, run.id, ("running",))
        seen["plan"] = plan
        return "outcome"

    assert provisioned_run(config, run, start, say) == "outcome"
    assert seen["before"] == []
    instances = seen["instances"]
    tags = [{t["Key"]: t["Value"] for t in i["Tags"]} for i in instances]
    assert sorted(
        (t[TAG_HOST], t[TAG_ROLE], i["InstanceType"]) for t, i in zip(tags, instances, strict=True)
    ) == [
        ("ps-1", "ps", "c5.xlarge"),
        ("worker-1", "worker", "p3.2xlarge"),
        ("worker-2", "worker", "p3.2xlarge"),
    ]
    assert {t[TAG_RUN] for t in tags} == {run.id}
    assert {t[TAG_CLUSTER] for t in tags} == {"tflaunch"}
    assert all(t[TAG_LAUNCHER].split(":")[1] == str(__import__("os").getpid()) for t in tags)
    (group_id,) = {g["GroupId"] for i in instances for g in i["SecurityGroups"]}
    group = ec2(ec2_endpoint).describe_security_groups(GroupIds=[group_id])["SecurityGroups"][0]
    rules = {
        (r["FromPort"], r["ToPort"]): (
            [p["GroupId"] for p in r.get("UserIdGroupPairs", [])],
            [c["CidrIp"] for c in r.get("IpRanges", [])],
        )
        for r in group["IpPermissions"]
    }
    # The cluster's ports (PS 2230, a worker 2220 on each host) from members only, SSH from
    # the launcher's address only.
    assert rules == {
        (2220, 2220): ([group_id], []),
        (2230, 2230): ([group_id], []),
        (banner_port, banner_port): ([], ["198.51.100.7/32"]),
    }
    attribute = ec2(ec2_endpoint).describe_instance_attribute(
        InstanceId=instances[0]["InstanceId"], Attribute="instanceInitiatedShutdownBehavior"
    )
    assert attribute["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    assert [h.name for h in seen["plan"].hosts] == ["worker-1", "worker-2", "ps-1"]
    # The run did not ask to terminate: the instances keep running, and 'down' terminates them.
    assert len(run_instances_of(ec2_endpoint, run.id, ("running",))) == 3
    assert "terminated 3 instance(s)" in admin.terminate_run(run, said.append)
    assert run_instances_of(ec2_endpoint, run.id, ("pending", "running", "stopped")) == []
    assert all(r["terminated"] for r in run.record().part(CloudDetails).instances)


def test_down_of_a_run_recorded_before_the_network_key_deletes_its_security_group(
    tmp_path, ec2_endpoint, aws_env, banner_port, monkeypatch
):
    """run.json written by an older tflaunch names the run's group 'security_group' where it
    now says 'network': 'down' still finds and deletes it."""
    config = provision_config(
        tmp_path, "roles: {ps: 1, worker: 1}\n", ec2_endpoint, ssh_port=banner_port
    )
    address_map(tmp_path, ["worker-1"], monkeypatch)
    run = Run.create(tmp_path / "runs", "t")
    provisioned_run(config, run, lambda plan: 0, lambda m: None)  # kept running
    meta = json.loads(run.meta_path.read_text())
    group = meta["ec2"].pop("network")
    run.meta_path.write_text(json.dumps({**meta, "ec2": {**meta["ec2"], "security_group": group}}))
    assert "terminated 1 instance(s)" in admin.terminate_run(run, lambda m: None)
    left = ec2(ec2_endpoint).describe_security_groups()["SecurityGroups"]
    assert group.startswith("sg-") and group not in {g["GroupId"] for g in left}


@pytest.mark.parametrize("ending", ["success", "failure", "ctrl-c", "error before start"])
def test_terminate_at_end_leaves_nothing_running(
    tmp_path, ec2_endpoint, aws_env, banner_port, monkeypatch, ending
):
    config = provision_config(
        tmp_path, "roles: {ps: 1, worker: 2}\n", ec2_endpoint, ssh_port=banner_port
    )
    address_map(tmp_path, ["worker-1", "worker-2"], monkeypatch)
    run = Run.create(tmp_path / "runs", "t")

    def start(plan):
        assert len(run_instances_of(ec2_endpoint, run.id, ("running",))) == 2
        if ending == "ctrl-c":
            raise KeyboardInterrupt
        if ending == "error before start":
            raise LaunchError("pre-flight failed")
        return 0 if ending == "success" else 1

    raises = {"ctrl-c": KeyboardInterrupt, "error before start": LaunchError}.get(ending)
    if raises:
        with pytest.raises(raises):
            provisioned_run(config, run, start, lambda m: None, down_at_end=True)
    else:
        provisioned_run(config, run, start, lambda m: None, down_at_end=True)
    assert run_instances_of(ec2_endpoint, run.id, ("pending", "running", "stopped")) == []


def test_unreachable_instances_are_terminated(tmp_path, ec2_endpoint, aws_env, monkeypatch):
    config = parse_config(
        HEAD + "roles: {ps: 1, worker: 1}\nssh:\n  port: 1\n  provision:\n"
        "    image: ami-12c6146b\n    region: us-east-1\n    ssh_from: 198.51.100.7/32\n"
        f"    ready_timeout: 1\n    endpoint_url: {ec2_endpoint}\n",
        source=str(tmp_path / "c.yaml"),
    )
    address_map(tmp_path, ["worker-1"], monkeypatch)
    run = Run.create(tmp_path / "runs", "t")
    with pytest.raises(LaunchError, match="did not accept SSH"):
        provisioned_run(config, run, lambda plan: 0, lambda m: None)
    assert run_instances_of(ec2_endpoint, run.id, ("pending", "running", "stopped")) == []


def test_sweep_terminates_runs_whose_launcher_is_gone_or_ended(
    tmp_path, ec2_endpoint, aws_env, banner_port, monkeypatch
):
    config = provision_config(
        tmp_path, "roles: {ps: 1, worker: 1}\n", ec2_endpoint, ssh_port=banner_port
    )
    address_map(tmp_path, ["worker-1"], monkeypatch)
    runs = [Run.create(tmp_path / "runs", f"r{i}") for i in range(3)]
    for run in runs:
        provisioned_run(config, run, lambda plan: 0, lambda m: None)  # kept running
    # runs[0]: its launcher (this process) still runs and it has not ended: kept.
    # runs[1]: ended. runs[2]: launcher gone (a pid that is not running).
    runs[1].update_meta(state="succeeded")
    client = ec2(ec2_endpoint)
    (gone,) = run_instances_of(ec2_endpoint, runs[2].id)
    client.create_tags(
        Resources=[gone["InstanceId"]],
        Tags=[{"Key": TAG_LAUNCHER, "Value": gone_launcher().tag()}],
    )
    access = Ec2Provider.from_access({"region": "us-east-1", "endpoint_url": ec2_endpoint}, print)
    verdicts = {v.run_id: v for v in sweep.sweep(access, lambda m: None, dry_run=True)}
    assert verdicts[runs[0].id].sweep is False
    assert verdicts[runs[1].id].reason == "its run succeeded"
    assert verdicts[runs[2].id].reason == "its launcher is gone"
    assert len(run_instances_of(ec2_endpoint, runs[1].id)) == 1  # dry run: nothing terminated
    sweep.sweep(access, lambda m: None)
    assert [len(run_instances_of(ec2_endpoint, r.id)) for r in runs] == [1, 0, 0]
    admin.terminate_run(runs[0], lambda m: None)


def test_gc_from_a_second_pid_namespace_keeps_a_live_runs_instances(
    tmp_path, ec2_endpoint, aws_env, banner_port, monkeypatch, second_pid_namespace
):
    """The launcher (this process) runs; gc from a container with this hostname cannot see it:
    that run is another machine's to judge, and its instances stay."""
    config = provision_config(
        tmp_path, "roles: {ps: 1, worker: 1}\n", ec2_endpoint, ssh_port=banner_port
    )
    address_map(tmp_path, ["worker-1"], monkeypatch)
    run = Run.create(tmp_path / "runs", "live")
    provisioned_run(config, run, lambda plan: 0, lambda m: None)  # kept running
    try:
        account = ["--region", "us-east-1", "--endpoint-url", ec2_endpoint]
        swept = in_second_pid_namespace("gc", *account)
        assert swept.returncode == 0, swept.stderr
        (line,) = [x for x in swept.stdout.splitlines() if x.startswith(run.id)]
        assert "1 instance(s) kept (started from pid" in line, line
        assert "another machine or container" in line and "sweep there" in line
        assert len(run_instances_of(ec2_endpoint, run.id)) == 1
        access = Ec2Provider.from_access(
            {"region": "us-east-1", "endpoint_url": ec2_endpoint}, print
        )
        here = {v.run_id: v for v in sweep.sweep(access, lambda m: None, dry_run=True)}
        assert here[run.id].reason == "its launcher is running"
    finally:
        admin.terminate_run(run, lambda m: None)


def test_a_fresh_heartbeat_is_never_broken_even_from_a_second_pid_namespace(
    tmp_path, ec2_endpoint, aws_env, second_pid_namespace
):
    from tflaunch.launchers.clouds import kept
    from tflaunch.launchers.clouds.records import LockHolder

    now = time.time()
    gone = gone_launcher()  # of this machine, and gone: still not broken within two periods
    fresh = LockHolder("run r-1", gone.tag(), now - 5, now - 5)
    assert kept.stale(fresh, now) is None
    old = LockHolder("run r-1", gone.tag(), now - 5, now - 2 * kept.HEARTBEAT_SECONDS - 1)
    assert "no longer runs on this machine" in kept.stale(old, now)
    unseen = LockHolder("run r-1", "laptop:4242:1700000000.00:other-boot/1", now, now - 200)
    assert kept.stale(unseen, now) is None  # another machine's, 200 s silent: not yet

    provider = Ec2Provider.from_access({"region": "us-east-1", "endpoint_url": ec2_endpoint}, print)
    account = ["--region", "us-east-1", "--endpoint-url", ec2_endpoint]
    with kept.in_use(provider, "busy", "run held-here", print):
        refused = in_second_pid_namespace(
            "down", "--cluster", "busy", *account, "--runs-dir", str(tmp_path / "runs")
        )
        assert refused.returncode == 2, refused.stderr
        assert "kept cluster 'busy' is in use by run held-here on " in refused.stderr
        assert "breaking" not in refused.stderr + refused.stdout
        assert provider.take_lock("busy", LockHolder("probe", "?", now, now)) is not None


def test_ctrl_c_while_waiting_for_the_instances_terminates_them(
    tmp_path, ec2_endpoint, aws_env, banner_port, monkeypatch
):
    config = provision_config(
        tmp_path, "roles: {ps: 1, worker: 2}\n", ec2_endpoint, ssh_port=banner_port
    )
    address_map(tmp_path, ["worker-1", "worker-2"], monkeypatch)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Reach, "wait_for_ssh", interrupted)
    run = Run.create(tmp_path / "runs", "t")
    with pytest.raises(provisioning.Interrupted) as err:
        provisioned_run(config, run, lambda plan: 0, lambda m: None)
    assert err.value.exit_code == 130
    assert run_instances_of(ec2_endpoint, run.id, ("pending", "running", "stopped")) == []


def test_pricing_api_answer_is_read_for_the_on_demand_hourly_price():
    from tflaunch.launchers.clouds.ec2.pricing import on_demand_usd

    # The shape of one GetProducts PriceList entry (a JSON document as a string), trimmed.
    document = {
        "product": {
            "attributes": {"instanceType": "p3.2xlarge", "location": "US East (N. Virginia)"}
        },
        "terms": {
            "OnDemand": {
                "ABC.JRTCKXETXF": {
                    "priceDimensions": {
                        "ABC.JRTCKXETXF.6YS6EN2CT7": {
                            "unit": "Hrs",
                            "pricePerUnit": {"USD": "3.0600000000"},
                        }
                    }
                }
            }
        },
    }
    assert on_demand_usd([json.dumps(document)]) == 3.06
    assert on_demand_usd([]) is None


def test_a_provisioned_up_plans_twice_and_writes_the_plan_once(
    tmp_path, ec2_endpoint, aws_env, banner_port, monkeypatch
):
    """Once on the pending hosts (which instances, which ports), once on the real ones: the
    only plan.json; the provider is built once, for the plan, and handed to the provisioning.
    The banner-only listener ends the run at the SSH connect."""
    import tflaunch.cluster.placement as placement_module
    from tflaunch import launch
    from tflaunch.launchers.base import LaunchOptions

    extra = f"runs_dir: {tmp_path / 'runs'}\n" + DEDICATED
    config = provision_config(tmp_path, extra, ec2_endpoint, ssh_port=banner_port)
    address_map(tmp_path, ["worker-1", "worker-2", "ps-1"], monkeypatch)
    calls = {"plan": 0, "write": 0}
    make_plan, write_plan = placement_module.make_plan, Run.write_plan

    def counted_plan(*args, **kwargs):
        calls["plan"] += 1
        return make_plan(*args, **kwargs)

    def counted_write(run, plan):
        calls["write"] += 1
        write_plan(run, plan)

    for module in (launch, provisioning):
        monkeypatch.setattr(module, "make_plan", counted_plan)
    monkeypatch.setattr(Run, "write_plan", counted_write)
    built, init = [], Ec2Provider.__init__

    def counted_init(provider, *args, **kwargs):
        built.append(provider)
        init(provider, *args, **kwargs)

    monkeypatch.setattr(Ec2Provider, "__init__", counted_init)
    with pytest.raises(LaunchError, match="cannot connect"):
        launch.up(config, str(tmp_path / "c.yaml"), options=LaunchOptions(down_at_end=True))
    assert calls == {"plan": 2, "write": 1}
    assert len(built) == 1
    (run_dir,) = (tmp_path / "runs").iterdir()
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["cluster"]["ps"] == ["127.0.0.1:2230"]  # the real addresses, not pending ones


def test_an_unknown_cloud_is_refused_naming_the_known_ones(tmp_path):
    from tflaunch.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown cloud 'nimbus'; choose one of ec2"):
        provision_config(tmp_path, more="    cloud: nimbus\n")


def test_status_lists_a_runs_instances_and_the_accounts_instances_with_cost(
    tmp_path, ec2_endpoint, aws_env, banner_port, monkeypatch
):
    from tflaunch.launchers.clouds.listing import cloud_table

    config = provision_config(tmp_path, DEDICATED, ec2_endpoint, ssh_port=banner_port)
    address_map(tmp_path, ["worker-1", "worker-2", "ps-1"], monkeypatch)
    run = Run.create(tmp_path / "runs", "t")
    provisioned_run(config, run, lambda plan: 0, lambda m: None)  # kept running
    lines = listing.instance_lines(run, print)
    assert lines[0] == "instances:"
    assert [line.split()[0] for line in lines[2:]] == ["worker-1", "worker-2", "ps-1"]
    assert all("running" in line for line in lines[2:])
    table = cloud_table(tmp_path / "runs", None, print)
    rows = [line.split() for line in table[1:-1]]
    assert sorted((r[1], r[2], r[3], r[4]) for r in rows) == [
        ("ps-1", "ps", "c5.xlarge", "running"),
        ("worker-1", "worker", "p3.2xlarge", "running"),
        ("worker-2", "worker", "p3.2xlarge", "running"),
    ]
    assert all(r[0] == "tflaunch" and "idle" in r for r in rows)
    assert not [line for line in listing.instance_lines(run, print, True) if "lost" in line]
    (gone,) = [
        i for i in run_instances_of(ec2_endpoint, run.id)
        if {t["Key"]: t["Value"] for t in i["Tags"]}[TAG_HOST] == "worker-2"
    ]  # fmt: skip
    ec2(ec2_endpoint).terminate_instances(InstanceIds=[gone["InstanceId"]])
    lost = listing.instance_lines(run, print, unwatched=True)[-1]
    assert lost.startswith(
        f"lost: the instance(s) of worker-2 ({gone['InstanceId']}, terminated) ended, says ec2, "
        "and nothing replaces them: a detached run's coordinator"
    ), lost
    assert f"'tflaunch down {run.id}' stops the run" in lost
    assert "lost" not in listing.instance_lines(run, print)[-1]  # attached: replaced instead
    hourly = 2 * PRICE_LIST["p3.2xlarge"].hourly_usd + PRICE_LIST["c5.xlarge"].hourly_usd
    assert table[-1] == f"3 instance(s), USD {hourly:.4f} per hour"
    admin.terminate_run(run, lambda m: None)
    assert cloud_table(tmp_path / "runs", None, print) == [
        "no tflaunch instances are running on the accounts this runs directory knows"
    ]
    assert all("terminated" in line for line in listing.instance_lines(run, print)[2:])


def test_status_cloud_shows_idle_time_from_the_instances_tags_also_when_stopped(
    tmp_path, ec2_endpoint, aws_env, banner_port, monkeypatch
):
    import time

    from tflaunch.launchers.clouds.listing import cloud_json, cloud_table

    config = provision_config(tmp_path, "roles: {ps: 1, worker: 2}\n", ec2_endpoint,
                              ssh_port=banner_port)  # fmt: skip
    address_map(tmp_path, ["worker-1", "worker-2"], monkeypatch)
    runs = tmp_path / "runs"
    run = Run.create(runs, "t")
    during = {}

    def start(plan):  # while the run trains, its instances are busy with it
        during.update(cloud_json(runs, None, print))
        return 0

    provisioned_run(config, run, start, lambda m: None)  # the instances keep running
    assert [(r["host"], r["busy_run"], r["idle_seconds"]) for r in during["instances"]] == [
        ("worker-1", run.id, None), ("worker-2", run.id, None)
    ]  # fmt: skip
    after = cloud_json(runs, None, print)["instances"]
    assert [r["busy_run"] for r in after] == [None, None]
    assert all(0 <= r["idle_seconds"] < 30 and r["autostop_seconds"] == 1800 for r in after)

    # The idle time is the cloud's, not the host's: a stopped instance (unreachable) has one,
    # and another machine's runs directory (which knows only the account) sees the same.
    ids = [r["instance"] for r in after]
    client = ec2(ec2_endpoint)
    ended = f"{time.time() - 1800:.0f}"
    client.create_tags(Resources=ids, Tags=[{"Key": records.TAG_IDLE_SINCE, "Value": ended}])
    client.stop_instances(InstanceIds=[ids[1]])
    other = tmp_path / "other-laptop"
    access = ("ec2", {"region": "us-east-1", "endpoint_url": ec2_endpoint})
    listed = cloud_json(other, access, print)["instances"]
    assert [(r["host"], r["state"]) for r in listed] == [
        ("worker-1", "running"), ("worker-2", "stopped")
    ]  # fmt: skip
    assert all(1799 <= r["idle_seconds"] < 1830 for r in listed)
    table = cloud_table(other, access, print)
    assert table[0].split()[5:8] == ["AGE", "IDLE", "AUTOSTOP"]
    from click.testing import CliRunner

    from tflaunch.cli import cli

    shown = CliRunner().invoke(cli, ["status", "--cloud", "--json", "--runs-dir", str(other),
                                     "--region", "us-east-1", "--endpoint-url", ec2_endpoint])  # fmt: skip
    assert shown.exit_code == 0, shown.output
    idle = [round(r["idle_seconds"] / 60) for r in json.loads(shown.stdout)["instances"]]
    assert idle == [30, 30]
    assert [line.split()[7:9] for line in table[1:3]] == [["30", "min"], ["30", "min"]]

    # A detached run that this runs directory knows has ended is idle since its end.
    client.delete_tags(Resources=ids, Tags=[{"Key": records.TAG_IDLE_SINCE}])
    client.create_tags(Resources=ids, Tags=[{"Key": records.TAG_BUSY, "Value": run.id}])
    assert {r["busy_run"] for r in cloud_json(runs, None, print)["instances"]} == {run.id}
    run.update_meta(state="succeeded", ended=time.time() - 120)
    listed = cloud_json(runs, None, print)["instances"]
    assert all(r["busy_run"] is None and 119 <= r["idle_seconds"] < 150 for r in listed)
    admin.terminate_run(run, lambda m: None)


def test_an_ended_instance_is_seen_and_replaced_at_its_cluster_address(
    tmp_path, ec2_endpoint, aws_env, banner_port, monkeypatch
):
    import time

    config = provision_config(
        tmp_path, "roles: {ps: 1, worker: 2}\n", ec2_endpoint, ssh_port=banner_port,
        more="    spot_workers: true\n",
    )  # fmt: skip
    address_map(tmp_path, ["worker-1", "worker-2"], monkeypatch)
    run = Run.create(tmp_path / "runs", "t")
    fleets = []

    def during_the_run(plan) -> int:  # the fleet replaces instances while the run runs
        (fleet,) = fleets
        assert fleet.ended() == {}
        (old,) = [
            i for i in run_instances_of(ec2_endpoint, run.id)
            if {t["Key"]: t["Value"] for t in i["Tags"]}[TAG_HOST] == "worker-2"
        ]  # fmt: skip
        assert old["InstanceLifecycle"] == "spot"
        ec2(ec2_endpoint).terminate_instances(InstanceIds=[old["InstanceId"]])
        assert fleet.ended() == {
            "worker-2": f"its instance {old['InstanceId']} is terminated, says ec2"
        }
        host, old_id, new_id = fleet.replace("worker-2", time.monotonic() + 20)
        assert (host.name, old_id) == ("worker-2", old["InstanceId"]) and new_id != old_id
        assert fleet.ended() == {}
        (new,) = ec2(ec2_endpoint).describe_instances(InstanceIds=[new_id])["Reservations"][0][
            "Instances"
        ]
        tags = {t["Key"]: t["Value"] for t in new["Tags"]}
        assert (tags[TAG_HOST], tags[TAG_ROLE], new["InstanceType"]) == (
            "worker-2", "worker", "p3.2xlarge"
        )  # fmt: skip
        assert new["PrivateIpAddress"] == old["PrivateIpAddress"]  # the plan's address stays true
        assert new["InstanceLifecycle"] == "spot"
        records = {r["id"]: r for r in run.record().part(CloudDetails).instances}
        assert records[old_id]["terminated"] and records[new_id]["terminated"] is None
        return 0

    provisioned_run(config, run, during_the_run, lambda m: None, fleet_ready=fleets.append)
    with pytest.raises(LaunchError, match="the run ended; worker-2 is not replaced"):
        fleets[0].replace("worker-2", time.monotonic() + 20)  # closed at the run's end
    assert len(run.record().part(CloudDetails).instances) == 3
    assert admin.terminate_run(run, lambda m: None) == f"terminated 2 instance(s) of run {run.id}"
    assert run_instances_of(ec2_endpoint, run.id, ("pending", "running", "stopped")) == []


def test_a_kept_cluster_is_reused_refused_when_it_does_not_fit_and_ended_by_name(
    tmp_path, ec2_endpoint, aws_env, banner_port, monkeypatch
):
    from tflaunch.launchers.clouds import kept

    config = provision_config(tmp_path, DEDICATED, ec2_endpoint, ssh_port=banner_port)
    address_map(tmp_path, ["worker-1", "worker-2", "ps-1"], monkeypatch)

    def up(config):
        run = Run.create(tmp_path / "runs", "t")
        said: list[str] = []
        provisioned_run(config, run, lambda plan: 0, said.append, keep="tflaunch")
        return run, said

    first, said = up(config)
    assert any(m.startswith("creating 3 instance(s)") for m in said)
    made = sorted(i["InstanceId"] for i in run_instances_of(ec2_endpoint, first.id))
    second, said = up(config)
    assert "reusing kept cluster tflaunch: 3 instance(s), none created" in said
    assert not any(m.startswith(("creating", "instances accepting SSH")) for m in said)
    assert sorted(r["id"] for r in second.record().part(CloudDetails).instances) == made
    assert "kept cluster tflaunch keeps running" in admin.terminate_run(second, print)

    bigger = provision_config(
        tmp_path, DEDICATED, ec2_endpoint, ssh_port=banner_port, worker_type="p3.8xlarge"
    )
    with pytest.raises(LaunchError) as refused:
        up(bigger)
    assert (
        "kept cluster 'tflaunch' does not fit this plan: worker-1 is p3.2xlarge, the plan needs "
        "p3.8xlarge; it has worker-2 (worker, p3.2xlarge), which the plan does not use"
        in str(refused.value)
    )
    provider = Ec2Provider.from_access({"region": "us-east-1", "endpoint_url": ec2_endpoint}, print)
    with kept.in_use(provider, "tflaunch", "run r-1", print), pytest.raises(LaunchError) as busy:
        up(config)
    assert f"kept cluster 'tflaunch' is in use by run r-1 on {socket.gethostname()} (pid" in str(
        busy.value
    )
    ended = kept.down_cluster(tmp_path / "runs", "tflaunch", print)
    assert ended == "terminated 3 instance(s) of kept cluster tflaunch"
    assert run_instances_of(ec2_endpoint, first.id, ("pending", "running", "stopped")) == []


def test_a_kept_clusters_lock_holds_across_machines_and_a_stale_one_is_broken(
    tmp_path, ec2_endpoint, aws_env, banner_port, monkeypatch
):
    import time

    from tflaunch.launchers.clouds import kept
    from tflaunch.launchers.clouds.ec2.lock import TAG_HEARTBEAT, TAG_SINCE, group_name
    from tflaunch.launchers.clouds.records import LockHolder

    monkeypatch.setattr(kept, "HEARTBEAT_SECONDS", 0.2)
    config = provision_config(tmp_path, "roles: {ps: 1, worker: 1}\n", ec2_endpoint,
                              ssh_port=banner_port)  # fmt: skip
    address_map(tmp_path, ["worker-1"], monkeypatch)
    access = {"region": "us-east-1", "endpoint_url": ec2_endpoint}
    provider = Ec2Provider.from_access(access, print)

    def lock_groups() -> list[dict]:
        return ec2(ec2_endpoint).describe_security_groups(
            Filters=[{"Name": "group-name", "Values": [group_name("tflaunch")]}]
        )["SecurityGroups"]

    seen: dict = {}

    def start(plan):  # the lock is held, and its heartbeat moves on, while the run goes
        deadline = time.monotonic() + 30  # beats every 0.2 s; the tag keeps whole seconds
        while True:
            (group,) = lock_groups()
            tags = {t["Key"]: t["Value"] for t in group["Tags"]}
            seen["beats"] = float(tags[TAG_HEARTBEAT]) - float(tags[TAG_SINCE])
            if seen["beats"] >= 1 or time.monotonic() > deadline:
                return 0
            time.sleep(0.2)

    def up(runs: Path) -> list[str]:
        said: list[str] = []
        run = Run.create(runs, "t")
        seen["run"] = run.id
        provisioned_run(config, run, start, said.append, keep="tflaunch")
        return said

    # Another laptop holds the cluster: the cloud says so to this one, naming the holder.
    now = time.time()
    other = LockHolder("run other-1", "other-laptop:4242:1700000000", now - 60, now - 10)
    assert provider.take_lock("tflaunch", other) is None
    with pytest.raises(LaunchError) as busy:
        up(tmp_path / "laptop-a")
    assert (
        "kept cluster 'tflaunch' is in use by run other-1 on other-laptop (pid 4242, since "
        in str(busy.value)
    )
    # 10 s old when taken; older by however long this machine took to get here (a loaded CI
    # machine once took 31 s): a bound on the age, not the clock's reading.
    age = re.search(r"last heartbeat (\d+) s ago\); wait until that ends", str(busy.value))
    assert age and int(age.group(1)) >= 10, str(busy.value)
    provider.drop_lock("tflaunch", other)

    # Two 'up's of two laptops (runs directories of their own) at once: the second is refused.
    first = up(tmp_path / "laptop-a")
    assert seen["beats"] >= 1, first  # (a failed renewal says so among the lines)
    assert lock_groups() == []  # released at the end
    held = kept.in_use(provider, "tflaunch", "run held-by-a", print)
    with held, pytest.raises(LaunchError, match="is in use by run held-by-a on "):
        up(tmp_path / "laptop-b")
    assert any(m.startswith("creating 1 instance(s)") for m in first)

    # A stale lock: its holder's heartbeat stopped long ago (another machine), or its process
    # on this machine is gone. Both are broken, saying so, and the 'up' goes on.
    old = LockHolder("run lost-1", "other-laptop:4242:1700000000", now - 900, now - 600)
    assert provider.take_lock("tflaunch", old) is None
    said = up(tmp_path / "laptop-b")
    assert any(
        "kept cluster 'tflaunch': breaking the stale lock of run lost-1 on other-laptop (pid 4242"
        in m
        and "no heartbeat for 6" in m
        and "(more than 300 s)" in m
        for m in said
    ), said
    assert "reusing kept cluster tflaunch: 1 instance(s), none created" in said
    assert not any("did not mark them idle" in m for m in said)
    # A run that marked the cluster in use and never idle (detached, or killed) is named.
    instance_ids = [i.id for i in kept.find(provider, "tflaunch")]
    provider.tag(instance_ids, {records.TAG_BUSY: "detached-1"})
    said = up(tmp_path / "laptop-b")
    assert (
        "kept cluster tflaunch: run detached-1 marked its instances in use and did not mark them "
        "idle (a detached run, or a launcher that was killed)" in " ".join(said)
    )
    gone = gone_launcher()
    # Its heartbeat ten periods old (younger than two, it would never be broken; the tag keeps
    # whole seconds, so a heartbeat 0.4 s old can read as 0 s) and far from STALE_SECONDS: only
    # its gone process breaks it.
    now = time.time()
    dead = LockHolder("run killed-1", gone.tag(), now - 3, now - 10 * kept.HEARTBEAT_SECONDS)
    assert provider.take_lock("tflaunch", dead) is None
    said = up(tmp_path / "laptop-a")
    assert any(
        f"breaking the stale lock of run killed-1 on {socket.gethostname()} (pid {gone.pid}" in m
        and "its process (pid" in m
        and "no longer runs on this machine" in m
        for m in said
    ), said
    assert lock_groups() == []
    assert kept.down_cluster(tmp_path / "laptop-a", "tflaunch", print) == (
        "terminated 1 instance(s) of kept cluster tflaunch"
    )


def test_down_cluster_from_another_machine_finds_the_cluster_by_its_tags(
    tmp_path, ec2_endpoint, aws_env, banner_port, monkeypatch
):
    """'up --keep' on laptop A (its runs directory and home); 'down --cluster' on laptop B,
    which has neither A's runs directory nor its .clusters record: the cluster file (or
    --region) names the account, the tags find the instances and security groups."""
    from tests.helpers import tflaunch
    from tflaunch.launchers.clouds import kept

    text = provision_text(DEDICATED, ec2_endpoint, ssh_port=banner_port)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(text)
    config = parse_config(text, source=str(cluster), base_dir=str(tmp_path))
    address_map(tmp_path, ["worker-1", "worker-2", "ps-1"], monkeypatch)
    laptop_a = tmp_path / "laptop-a"

    def up_on_a() -> str:
        run = Run.create(laptop_a, "t")
        provisioned_run(config, run, lambda plan: 0, lambda m: None, keep=config.name)
        return run.id

    def tflaunch_groups() -> list[str]:  # those of this test (the stand-in serves the module)
        groups = ec2(ec2_endpoint).describe_security_groups()["SecurityGroups"]
        names = {g["GroupName"] for g in groups if g["GroupName"].startswith("tflaunch-")}
        return sorted(names - before)

    before: set[str] = set()
    before = set(tflaunch_groups())
    first = up_on_a()
    assert kept.record_path(laptop_a, config.name).exists()
    assert len(run_instances_of(ec2_endpoint, first)) == 3
    assert tflaunch_groups() == [f"tflaunch-{first}"]

    (tmp_path / "home-b").mkdir()
    b_env = {"HOME": str(tmp_path / "home-b")}
    laptop_b = ["--runs-dir", str(tmp_path / "laptop-b")]
    # Nothing names the account: refused, saying how to name it; nothing is touched.
    refused = tflaunch("down", "--cluster", config.name, *laptop_b, env=b_env)
    assert refused.returncode == 2, refused.stderr
    assert f"no kept cluster '{config.name}' is recorded on this machine" in refused.stderr
    assert f"'tflaunch down --cluster {config.name} -f CLUSTER_FILE'" in refused.stderr
    assert "Traceback" not in refused.stderr
    # A name the account has no cluster of: refused, naming where it looked.
    region = ["--region", "us-east-1", "--endpoint-url", ec2_endpoint]
    wrong = tflaunch("down", "--cluster", "nope", *region, *laptop_b, env=b_env)
    assert wrong.returncode == 2, wrong.stderr
    assert "no kept cluster 'nope' in ec2 us-east-1: no instance and no network rules" in (
        wrong.stderr
    )
    assert len(run_instances_of(ec2_endpoint, first)) == 3
    # Laptop A named another region by mistake: refused there, and A's record of the cluster
    # (its account) stays.
    west = ["--region", "us-west-2", "--endpoint-url", ec2_endpoint, "--runs-dir", str(laptop_a)]
    elsewhere = tflaunch("down", "--cluster", config.name, *west)
    assert elsewhere.returncode == 2, elsewhere.stderr
    assert f"no kept cluster '{config.name}' in ec2 us-west-2" in elsewhere.stderr
    assert kept.record_path(laptop_a, config.name).exists()

    down = tflaunch("down", "--cluster", config.name, "-f", str(cluster), *laptop_b, env=b_env)
    assert down.returncode == 0, down.stderr
    assert f"terminated 3 instance(s) of kept cluster {config.name}" in down.stdout
    assert run_instances_of(ec2_endpoint, first, ("pending", "running", "stopped")) == []
    assert tflaunch_groups() == []
    assert not (tmp_path / "laptop-b" / ".clusters").exists()

    # The instances ended by themselves (the idle watchdog): their security group stays until
    # 'down --cluster', which finds it by its tag, here with the region alone.
    second = up_on_a()
    ec2(ec2_endpoint).terminate_instances(
        InstanceIds=[i["InstanceId"] for i in run_instances_of(ec2_endpoint, second)]
    )
    assert tflaunch_groups() == [f"tflaunch-{second}"]
    down = tflaunch("down", "--cluster", config.name, *region, *laptop_b, env=b_env)
    assert down.returncode == 0, down.stderr
    assert f"terminated 0 instance(s) of kept cluster {config.name}" in down.stdout
    assert tflaunch_groups() == []


def test_spot_workers_with_checkpoints_on_the_instances_disks_are_told_where_they_must_live(
    tmp_path,
):
    from tflaunch.launchers.clouds.provisioning import candidate_hosts, checkpoint_notice

    run_dir = "~/runs/r-1"  # the run's directory on the hosts

    def notice(spot: bool, chosen: str | None) -> str | None:
        program = "{argv: [python, train.py]" + (f", checkpoint_dir: '{chosen}'" if chosen else "")
        config = provision_config(
            tmp_path, "roles: {ps: 1, worker: 2}\n", head=f"program: {program}}}\nbackend: ssh\n",
            more="    spot_workers: true\n" if spot else "",
        )  # fmt: skip
        provider = provider_of(config)
        plan = make_plan(config, candidate_hosts(provider, config), run_dir)
        if chosen and "://" in chosen:  # a URL reaches the tasks as it is
            assert plan.program.checkpoint_dir == chosen
        planned = provisioning.planned_instances(provider, config, plan)
        return checkpoint_notice(provider, planned, config, plan, run_dir)

    assert notice(False, None) is None
    said = notice(True, None)
    assert said.startswith(
        f"checkpoints: {run_dir}/checkpoints (the default, in the run's directory on the hosts) "
        "is on each "
        "instance's own disk, and with ssh.provision.spot_workers every worker host is a spot "
        "instance (worker-1, where worker:0 writes them)."
    )
    assert "Set program.checkpoint_dir to storage every instance shares" in said
    assert "checkpoints: ./ckpt (program.checkpoint_dir) is on each" in notice(True, "ckpt")
    assert notice(True, "/mnt/efs/ckpt") is None  # an absolute path: a shared mount, trusted
    assert notice(True, "gs://bucket/ckpt") is None
