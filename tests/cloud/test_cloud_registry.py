"""The cloud registry: ssh.provision typed by its 'cloud' key, declared features refused with one
message, and the admin options of the cloud-admin commands."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tflaunch.cli import cli
from tflaunch.cluster.config import config_schema, parse_config
from tflaunch.errors import ConfigError
from tflaunch.launchers import clouds
from tflaunch.launchers.clouds.base import Feature, ProviderSpec, ProvisionSection, Unsupported
from tflaunch.launchers.ssh.section import SshSection

HEAD = "program: [p]\nbackend: ssh\n"


def test_the_cloud_key_picks_the_section_class_and_typos_are_located():
    config = parse_config(HEAD + "ssh:\n  provision: {cloud: ec2, image: ami-1}\n")
    assert clouds.spec_for_section(config.section(SshSection).provision).name == "ec2"
    without = parse_config(HEAD + "ssh:\n  provision: {image: ami-1}\n")  # the default cloud
    assert type(without.section(SshSection).provision) is type(config.section(SshSection).provision)
    with pytest.raises(ConfigError, match=r"<string>:6: ssh.provision.cloud: unknown cloud 'ec3'; "
                       r"choose one of .*\(did you mean 'ec2'\?\)"):  # fmt: skip
        parse_config(HEAD + "ssh:\n  provision:\n    image: x\n    cloud: ec3\n")
    with pytest.raises(ConfigError, match="ssh.provision.imag: unknown key 'imag': did you mean"):
        parse_config(HEAD + "ssh:\n  provision: {imag: x}\n")


def test_the_schema_gives_each_clouds_section_with_its_key():
    provision = config_schema()["properties"]["ssh"]["properties"]["provision"]
    options = [o for o in provision["anyOf"] if o.get("type") == "object"]
    assert {o["properties"]["cloud"]["const"] for o in options} == set(clouds.names())
    assert "ec2" in config_schema()["properties"]["ssh"]["properties"]  # discovery: ssh.ec2


def test_an_ability_the_cloud_does_not_declare_is_one_refusal():
    spec = ProviderSpec(name="toy", provider="nowhere:Toy", section=ProvisionSection)
    with pytest.raises(
        Unsupported, match="up --keep: kept clusters .* not supported by cloud 'toy'"
    ):
        spec.require(Feature.KEEP, "up --keep")
    assert Unsupported("x").exit_code == 2
    assert clouds.spec_of("ec2").supports(Feature.KEEP)


def test_admin_options_come_from_the_clouds_and_belong_to_the_cloud_named(tmp_path):
    shown = CliRunner().invoke(cli, ["gc", "--help"])
    assert "--cloud" in shown.output and "--region" in shown.output
    wrong = CliRunner().invoke(cli, ["down", "--region", "us-east-1", "RUN"])
    assert wrong.exit_code == 2 and "go with --cluster NAME" in wrong.output
    unknown = CliRunner().invoke(cli, ["gc", "--cloud", "nimbus", "--dry-run"])
    assert unknown.exit_code == 2 and "--cloud: unknown cloud 'nimbus'" in unknown.output
