"""The SSH connection layer: quoting at one boundary, host-key policy, errors, jump host.

The quoting tests run anywhere; the rest talk to real sshd in the test-host namespaces.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.hosts import ssh_hosts
from tflaunch.errors import LaunchError
from tflaunch.launchers.ssh.connect import (
    SshOptions,
    close_all,
    connect,
    connect_all,
    parse_jump,
    remote_command,
)

HOSTILE = 'a\'; touch /tmp/pwned-{}; echo "$(id)" `id` \\ \n*'

# ---- quoting: one function, every value quoted ---------------------------------------------


def test_remote_command_quotes_every_value():
    argv = ["python", "-m", "tflaunch.runtime.agent", "--host", "a'; rm -rf /", "--x", "$(id)"]
    command = remote_command(argv, cwd="/w d/'x'")
    assert shlex.split(command) == ["cd", "--", "/w d/'x'", "||", "exit", "97;", "exec", *argv]


def test_remote_command_home_relative_paths_expand_remotely_but_stay_quoted():
    assert remote_command(["ls"], cwd="~/a b").startswith("cd -- ~/'a b' ||")
    assert remote_command(["ls"], cwd="~").startswith("cd -- ~ ||")
    assert remote_command(["ls"], cwd="~user/x").startswith("cd -- '~user/x' ||")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.text(min_size=0, max_size=12).filter(lambda s: "\0" not in s), min_size=1, max_size=4
    )
)
def test_remote_command_runs_exactly_argv_in_a_real_shell(tmp_path_factory, argv):
    """Whatever the values, sh runs exactly the argv given: nothing more, nothing less."""
    marker = tmp_path_factory.mktemp("q")
    command = remote_command(["printf", "%s\\0", *argv], cwd=str(marker))
    result = subprocess.run(["sh", "-c", command], capture_output=True, timeout=30)
    assert result.stdout.split(b"\0")[:-1] == [a.encode() for a in argv]
    assert list(marker.iterdir()) == []


def test_hostile_values_in_a_real_shell_start_nothing(tmp_path):
    tag = uuid.uuid4().hex
    hostile = HOSTILE.format(tag)
    command = remote_command(["printf", "%s", hostile], cwd=str(tmp_path), env={"X": hostile})
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    assert result.stdout == hostile
    assert not Path(f"/tmp/pwned-{tag}").exists()
    missing = remote_command(["true"], cwd=hostile)
    assert subprocess.run(["sh", "-c", missing], capture_output=True).returncode == 97
    assert not Path(f"/tmp/pwned-{tag}").exists()


def test_background_command_reports_its_pid(tmp_path):
    out = tmp_path / "o ut'.txt"
    command = remote_command(["sh", "-c", "echo hi"], background_output=str(out))
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    assert result.stdout.strip().isdigit()
    deadline = time.monotonic() + 5
    while not (out.exists() and out.read_text() == "hi\n"):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_jump_host_spec():
    assert parse_jump("bastion", "me") == ("me", "bastion", 22)
    assert parse_jump("ops@10.0.0.1:2222", "me") == ("ops", "10.0.0.1", 2222)
    with pytest.raises(LaunchError, match="not a number"):
        parse_jump("h:ssh", "me")


# ---- against real sshd ----------------------------------------------------------------------


def options(hosts, tmp_path: Path, **changes) -> SshOptions:
    known = tmp_path / "known_hosts"
    if not known.exists():
        shutil.copy(hosts.known_hosts, known)
    base = SshOptions(
        user="root",
        identity_file=str(hosts.client_key),
        known_hosts=str(known),
        connect_timeout=3.0,
    )
    return SshOptions(**{**base.__dict__, **changes})


@pytest.mark.slow
@pytest.mark.ssh
def test_parallel_connect_and_run(ssh_test_hosts, tmp_path):
    hosts = ssh_test_hosts.hosts
    conns = connect_all(
        [(h.name, h.public_address) for h in hosts], options(ssh_test_hosts, tmp_path)
    )
    try:
        for host in hosts:
            result = conns[host.name].run(remote_command(["ip", "-4", "-o", "addr", "show"]))
            assert host.private_address in result.stdout  # each runs in its own namespace
    finally:
        close_all(conns.values())


@pytest.mark.slow
@pytest.mark.ssh
def test_unknown_host_key_is_refused_with_how_to_accept(ssh_test_hosts, tmp_path):
    host = ssh_test_hosts.host(1)
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with pytest.raises(LaunchError) as err:
        connect(
            host.name,
            host.public_address,
            options(ssh_test_hosts, tmp_path, known_hosts=str(empty)),
        )
    message = str(err.value)
    assert "host key unknown" in message and "SHA256:" in message
    assert f"ssh-keyscan -p 22 {host.public_address} >> {empty}" in message
    assert "accept-new" in message
    assert empty.read_text() == ""


@pytest.mark.slow
@pytest.mark.ssh
def test_accept_new_records_then_strict_accepts(ssh_test_hosts, tmp_path):
    host = ssh_test_hosts.host(2)
    known = tmp_path / "new" / "known_hosts"  # not there yet: created
    accept = options(ssh_test_hosts, tmp_path, known_hosts=str(known), host_key_policy="accept-new")
    conn = connect(host.name, host.public_address, accept)
    assert any("recorded the new host key" in note for note in conn.notes)
    conn.close()
    key_type, key = Path(f"{host.host_key}.pub").read_text().split()[:2]
    assert known.read_text() == f"{host.public_address} {key_type} {key}\n"
    strict = options(ssh_test_hosts, tmp_path, known_hosts=str(known))
    connect(host.name, host.public_address, strict).close()
    assert len(known.read_text().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.ssh
def test_changed_host_key_is_refused_even_with_accept_new(ssh_test_hosts, tmp_path):
    host = ssh_test_hosts.host(3)
    known = tmp_path / "known_hosts"
    shutil.copy(ssh_test_hosts.known_hosts, known)
    before = known.read_text()
    ssh_hosts.regenerate_host_key(host)
    try:
        for policy in ("strict", "accept-new"):
            opts = options(ssh_test_hosts, tmp_path, known_hosts=str(known), host_key_policy=policy)
            with pytest.raises(LaunchError) as err:
                connect(host.name, host.public_address, opts)
            assert "HOST KEY CHANGED" in str(err.value)
            assert f"ssh-keygen -R {host.public_address}" in str(err.value)
        assert known.read_text() == before
    finally:
        ssh_hosts.write_known_hosts(ssh_test_hosts.hosts, ssh_test_hosts.known_hosts)


@pytest.mark.slow
@pytest.mark.ssh
def test_wrong_key_unreachable_and_refused_hosts(ssh_test_hosts, tmp_path):
    host = ssh_test_hosts.host(1)
    other_key = tmp_path / "other_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True
    )
    with pytest.raises(LaunchError, match="the host refused .*other_key for user 'root'"):
        connect(
            host.name,
            host.public_address,
            options(ssh_test_hosts, tmp_path, identity_file=str(other_key)),
        )
    fast = options(ssh_test_hosts, tmp_path, connect_timeout=1.0)
    with pytest.raises(LaunchError, match="no answer within 1 s"):
        connect("ghost", ssh_test_hosts.ghost.public_address, fast)  # nobody has it
    with pytest.raises(LaunchError, match="unreachable .*public"):
        connect(host.name, host.private_address, fast)  # the launcher has no route there
    with pytest.raises(LaunchError, match="connection refused"):
        connect(host.name, host.public_address, options(ssh_test_hosts, tmp_path, port=2))


@pytest.mark.slow
@pytest.mark.ssh
def test_connect_all_names_every_failing_host(ssh_test_hosts, tmp_path):
    ghost = ssh_test_hosts.ghost.public_address
    hosts = [(h.name, h.public_address) for h in ssh_test_hosts.hosts] + [("ghost", ghost)]
    with pytest.raises(LaunchError) as err:
        connect_all(hosts, options(ssh_test_hosts, tmp_path, connect_timeout=1.0))
    assert "cannot connect to 1 of 4 hosts; nothing was started" in str(err.value)
    assert f"ghost ({ghost}:22)" in str(err.value)


@pytest.mark.slow
@pytest.mark.ssh
def test_hostile_host_value_starts_nothing(ssh_test_hosts, tmp_path):
    tag = uuid.uuid4().hex
    opts = options(ssh_test_hosts, tmp_path, connect_timeout=1.0)
    for value in (HOSTILE.format(tag), f"a'; touch /tmp/pwned-{tag}"):
        with pytest.raises(LaunchError, match="not a valid host name|cannot resolve"):
            connect("evil", value, opts)
    assert not Path(f"/tmp/pwned-{tag}").exists()


@pytest.mark.slow
@pytest.mark.ssh
def test_jump_host_reaches_private_addresses(ssh_test_hosts, tmp_path):
    """The launcher has no route to the private /24; through host 1 it reaches host 2 there."""
    jump = ssh_test_hosts.host(1)
    target = ssh_test_hosts.host(2)
    opts = options(ssh_test_hosts, tmp_path, jump_host=f"root@{jump.public_address}:22")
    conns = connect_all([(target.name, target.private_address)], opts)
    try:
        conn = conns[target.name]
        assert conn.via is not None and conn.via.address == jump.public_address
        result = conn.run(remote_command(["ip", "-4", "-o", "addr", "show", "eth1"]))
        assert target.private_address in result.stdout
    finally:
        close_all(conns.values())


@pytest.mark.parametrize("name", ["--split-string=sh -c id", "A=B", "X; touch pwned #", "1A", ""])
def test_remote_command_refuses_env_names_that_are_not_posix(name):
    """GNU env reads a NAME beginning with -S/--split-string= as an option: it would run."""
    with pytest.raises(ValueError, match="is not a valid environment variable name"):
        remote_command(["true"], env={name: "x"})


def test_remote_command_passes_env_values_quoted():
    command = remote_command(["printenv", "A_1"], env={"A_1": HOSTILE})
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    assert result.stdout == HOSTILE + "\n"
