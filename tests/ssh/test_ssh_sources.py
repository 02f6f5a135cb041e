"""Where SSH hosts come from: inline entries, the CSCS pair of IP files, EC2 (moto server mode)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tflaunch.cluster.config import parse_config
from tflaunch.cluster.plan import Host
from tflaunch.cluster.render import render_task
from tflaunch.errors import ConfigError, LaunchError
from tflaunch.launchers.clouds.ec2.discover import discover_ec2
from tflaunch.launchers.clouds.ec2.section import Ec2Section
from tflaunch.launchers.ssh.backend import SshBackend
from tflaunch.launchers.ssh.section import SshSection
from tflaunch.launchers.ssh.sources import read_ip_files, resolve_hosts

SSH_HEAD = "program: [python, train.py]\nbackend: ssh\n"


def config(tmp_path: Path, text: str):
    return parse_config(SSH_HEAD + text, source=str(tmp_path / "c.yaml"), base_dir=str(tmp_path))


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_inline_hosts_keep_connect_and_cluster_addresses(tmp_path):
    cfg = config(
        tmp_path,
        "hosts:\n"
        "  - {name: a, connect: 203.0.113.1, address: 10.0.0.1, gpus: 2}\n"
        "  - {name: b, address: 10.0.0.2}\n",
    )
    assert resolve_hosts(cfg) == [
        Host("a", "10.0.0.1", "203.0.113.1", ("0", "1")),
        Host("b", "10.0.0.2", "10.0.0.2", ()),
    ]
    hosts = SshBackend().hosts(cfg)
    assert [(h.connect_address, h.cluster_address, h.gpu_ids) for h in hosts] == [
        ("203.0.113.1", "10.0.0.1", ("0", "1")),
        ("10.0.0.2", "10.0.0.2", ()),
    ]


def test_ip_files_pair_line_by_line(tmp_path):
    write(tmp_path / "public.txt", "198.51.100.1\n198.51.100.2\n")
    write(tmp_path / "private.txt", "  10.0.0.1\n10.0.0.2  \n")
    cfg = config(
        tmp_path,
        "ssh: {public_ips_file: public.txt, private_ips_file: private.txt, gpus: 1}\n",
    )
    assert resolve_hosts(cfg) == [
        Host("198.51.100.1", "10.0.0.1", "198.51.100.1", ("0",)),
        Host("198.51.100.2", "10.0.0.2", "198.51.100.2", ("0",)),
    ]


@pytest.mark.parametrize(
    ("public", "private", "where", "what"),
    [
        ("1.1.1.1\n\n1.1.1.2\n", "10.0.0.1\n10.0.0.2\n", "public.txt:2", "blank line"),
        ("1.1.1.1\n1.1.1.2\n", "10.0.0.1\n", "public.txt:2", "only 1"),
        ("1.1.1.1\n", "10.0.0.1\n10.0.0.2\n10.0.0.3\n", "private.txt:2", "has 3 addresses"),
        ("1.1.1.1\n1.1.1.2\n", "10.0.0.1\n10.0.0.1\n", "private.txt:2", "first at line 1"),
        ("1.1.1.1 1.1.1.2\n", "10.0.0.1\n", "public.txt:1", "not one address"),
        ("", "", "public.txt", "empty"),
    ],
)
def test_ip_file_mistakes_name_file_and_line(tmp_path, public, private, where, what):
    pub, priv = write(tmp_path / "public.txt", public), write(tmp_path / "private.txt", private)
    with pytest.raises(ConfigError) as err:
        read_ip_files(pub, priv)
    assert f"{tmp_path}/{where}" in str(err.value)
    assert what in str(err.value)


def test_missing_ip_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the host file"):
        read_ip_files(tmp_path / "nope.txt", tmp_path / "nope2.txt")


def test_exactly_one_host_source(tmp_path):
    write(tmp_path / "p.txt", "1.1.1.1\n")
    both = config(
        tmp_path,
        "hosts: [a]\nssh: {public_ips_file: p.txt, private_ips_file: p.txt}\n",
    )
    with pytest.raises(ConfigError, match="exactly one source"):
        resolve_hosts(both)
    with pytest.raises(ConfigError, match="needs hosts"):
        resolve_hosts(config(tmp_path, ""))


# ---- EC2, against moto's server mode standing in for the AWS API ------------------------------


@pytest.fixture()
def aws_env(aws_credentials, monkeypatch):
    """The stand-in's credentials, and no region from this machine's environment."""
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)


def launch_instances(endpoint: str, region: str, count: int, tags: dict[str, str]) -> list[dict]:
    import boto3

    client = boto3.client("ec2", region_name=region, endpoint_url=endpoint)
    tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
    reply = client.run_instances(
        ImageId="ami-12345678",
        MinCount=count,
        MaxCount=count,
        InstanceType="p2.xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": tag_list}],
    )
    return reply["Instances"]


def test_ec2_discovery_running_instances_by_tag(ec2_endpoint, aws_env):
    import boto3

    region = "eu-west-1"
    ours = launch_instances(ec2_endpoint, region, 3, {"cluster": "tf-a", "Name": "gpu"})
    launch_instances(ec2_endpoint, region, 2, {"cluster": "other"})
    stopped = ours[2]["InstanceId"]
    boto3.client("ec2", region_name=region, endpoint_url=ec2_endpoint).stop_instances(
        InstanceIds=[stopped]
    )
    section = Ec2Section(
        region=region, filters={"tag:cluster": "tf-a"}, endpoint_url=ec2_endpoint, gpus=1
    )
    hosts = discover_ec2(section)
    expected = sorted(ours[:2], key=lambda i: i["InstanceId"])
    assert [h.name for h in hosts] == [f"gpu-{i['InstanceId']}" for i in expected]
    assert [(h.connect_address, h.cluster_address) for h in hosts] == [
        (i["PublicIpAddress"], i["PrivateIpAddress"]) for i in expected
    ]
    assert all(h.gpu_ids == ("0",) for h in hosts)


def test_ec2_discovery_by_instance_ids_and_region_from_env(ec2_endpoint, aws_env, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    instances = launch_instances(ec2_endpoint, "us-west-2", 3, {"cluster": "ids"})
    wanted = sorted(i["InstanceId"] for i in instances[:2])
    hosts = discover_ec2(Ec2Section(instance_ids=tuple(wanted), endpoint_url=ec2_endpoint))
    assert [h.name for h in hosts] == wanted


def test_ec2_discovery_from_a_cluster_file(ec2_endpoint, aws_env, tmp_path):
    instances = launch_instances(ec2_endpoint, "ap-south-1", 2, {"cluster": "file"})
    cfg = config(
        tmp_path,
        "ssh:\n  ec2:\n    region: ap-south-1\n"
        f"    endpoint_url: {ec2_endpoint}\n    filters: {{tag:cluster: file}}\n",
    )
    hosts = SshBackend().hosts(cfg)
    assert sorted(h.cluster_address for h in hosts) == sorted(
        i["PrivateIpAddress"] for i in instances
    )


def test_ec2_no_match_and_no_region_are_clear_errors(ec2_endpoint, aws_env):
    with pytest.raises(LaunchError, match="no instance matches tag:cluster=none"):
        discover_ec2(
            Ec2Section(
                region="eu-west-1", filters={"tag:cluster": "none"}, endpoint_url=ec2_endpoint
            )
        )
    with pytest.raises(ConfigError, match="no AWS region"):
        discover_ec2(Ec2Section(endpoint_url=ec2_endpoint))


def test_ec2_unknown_profile_is_a_config_error(aws_env):
    with pytest.raises(ConfigError, match="ssh.ec2.profile: .*no-such-profile"):
        discover_ec2(Ec2Section(region="eu-west-1", profile="no-such-profile"))


def test_ec2_without_boto3_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)  # what an installation without the extra sees
    with pytest.raises(ConfigError, match=r"pip install 'tflaunch\[aws\]'"):
        discover_ec2(Ec2Section(region="eu-west-1"))


def test_launchers_import_without_boto3_or_tensorflow():
    import subprocess

    code = (
        "import sys, tflaunch.launchers.ssh.backend, tflaunch.launchers.ssh.sources, tflaunch.launchers.ssh.preflight; "
        "bad = [m for m in ('boto3', 'tensorflow') if m in sys.modules]; "
        "sys.exit(f'imported {bad}' if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_aws_example_plans_one_gpu_workers_and_gpu_less_colocated_ps(ec2_endpoint, aws_env):
    import dataclasses

    from tflaunch.cluster.config import load_config
    from tflaunch.cluster.placement import make_plan

    example = ROOT / "examples" / "aws.yaml"
    cfg = load_config(example)
    section = cfg.section(SshSection).discover["ec2"]
    launch_instances(ec2_endpoint, section.region, 4, {"cluster": "tf-bench"})
    ec2 = dataclasses.replace(section, endpoint_url=ec2_endpoint)
    cfg = cfg.with_section(
        "ssh", dataclasses.replace(cfg.section(SshSection), discover={"ec2": ec2})
    )
    hosts = SshBackend().hosts(cfg)
    plan = make_plan(cfg, hosts)
    assert len(hosts) == 4
    for i, host in enumerate(hosts):
        ps, worker = plan.task(f"ps:{i}"), plan.task(f"worker:{i}")
        assert ps.host == worker.host == host.name  # PS i co-located on worker host i
        assert render_task(plan, ps).env["CUDA_VISIBLE_DEVICES"] == ""  # the PS never sees it
        assert render_task(plan, worker).env["CUDA_VISIBLE_DEVICES"] == "0"
        assert worker.cluster_address == host.cluster_address != host.connect_address
    files = dataclasses.replace(
        cfg.section(SshSection),
        discover={},
        public_ips_file="hosts/public_ips.txt",
        private_ips_file="hosts/private_ips.txt",
        gpus=1,
    )
    from_files = make_plan(
        cfg.with_section("ssh", files), SshBackend().hosts(cfg.with_section("ssh", files))
    )
    assert from_files.cluster["ps"][0] == "172.31.5.11:2230"


def test_ssh_workdir_is_a_path_on_the_hosts(tmp_path):
    from tflaunch.launchers.ssh.session import remote_path

    cfg = config(tmp_path, "hosts: [a]\n")
    assert cfg.workdir == "."  # not resolved against this machine's folders
    home_relative = parse_config(
        "program: {argv: [python3, t.py], workdir: ~/proj/../run}\nbackend: ssh\nhosts: [a]\n"
    )
    assert home_relative.workdir == "~/run"
    assert remote_path("/home/ubuntu", cfg.workdir) == "/home/ubuntu"
    assert remote_path("/home/ubuntu", home_relative.workdir) == "/home/ubuntu/run"
    assert remote_path("/home/ubuntu", "/data/x/") == "/data/x"
    assert remote_path("/home/ubuntu", "~") == "/home/ubuntu"
