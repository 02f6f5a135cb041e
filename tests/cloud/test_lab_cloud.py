"""The ``lab`` cloud: namespace hosts on this machine as a second provider.

The state directory is untrusted input (unit tests, no root); the provider makes and ends real
namespace hosts with their sshd (root), and ``tflaunch up`` of examples/lab.yaml (its program
the TensorFlow-free stand-in) runs on four of them at 1 Gb/s, lists them in ``status --cloud``
and leaves no namespace, link or sshd behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import FAKE_TASK, ROOT, checkout_python, gone_launcher, tflaunch
from tests.hosts import hostlock
from tflaunch.cluster.config import parse_config
from tflaunch.errors import ConfigError, LaunchError
from tflaunch.launchers.clouds.lab import hosts
from tflaunch.launchers.clouds.lab.provider import LabProvider, authorized_keys
from tflaunch.launchers.clouds.lab.section import LabProvisionSection
from tflaunch.launchers.clouds.lab.state import MACHINE_LOCK, LabInstance, State
from tflaunch.launchers.clouds.records import TAG_RUN, PlannedInstance
from tflaunch.launchers.ssh.section import SshSection

GOOD = {
    "id": "lab-3-0123abcd",
    "index": 3,
    "network": "labnet-1-89abcdef",
    "type": "netns",
    "state": "running",
    "tags": {"tflaunch:run": "r1"},
    "launched": 1.0e9,
    "terminated": None,
    "rate": "1gbit",
}


def state_with(tmp_path: Path, files: dict[str, object]) -> tuple[State, list[str]]:
    said: list[str] = []
    state = State(tmp_path / "state", said.append)
    with state.locked():
        pass
    for name, content in files.items():
        path = state.root / "instances" / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(json.dumps(content))
    return state, said


# ---- the state directory is untrusted input ---------------------------------------------------


def test_a_good_record_is_read(tmp_path):
    state, said = state_with(tmp_path, {"lab-3-0123abcd.json": GOOD})
    (record,) = state.instances()
    assert (record.id, record.index, record.state, record.rate) == (
        "lab-3-0123abcd",
        3,
        "running",
        "1000000000bit",  # an earlier version's spelling, read in the normal form
    )
    assert said == [] and not record.damaged


@pytest.mark.parametrize(
    ("name", "content", "why"),
    [
        ("lab-3-0123abcd.json", b"{not json", "not JSON"),
        ("lab-3-0123abcd.json", [1, 2], "not a JSON object"),
        ("lab-3-0123abcd.json", b" " * (64 * 1024 + 1), "larger than"),
        ("evil.json", GOOD, "not the file's name"),
    ],
)
def test_an_unreadable_record_is_skipped_with_a_warning(tmp_path, name, content, why):
    state, said = state_with(tmp_path, {name: content})
    assert state.instances() == []
    assert len(said) == 1 and why in said[0], said


@pytest.mark.parametrize(
    ("name", "content", "why"),
    [
        ("lab-4-0123abcd.json", GOOD, "not the file's name"),
        ("lab-3-0123abcd.json", {**GOOD, "index": 7}, "does not match the id"),
        ("lab-3-0123abcd.json", {**GOOD, "id": "../../etc", "index": 3}, "not a lab instance id"),
        ("lab-3-0123abcd.json", {**GOOD, "network": "x; rm -rf /"}, "not a lab network id"),
        ("lab-3-0123abcd.json", {**GOOD, "state": "exploded"}, "not one of"),
        ("lab-3-0123abcd.json", {**GOOD, "tags": {"k": 1}}, "is not a string"),
        ("lab-3-0123abcd.json", {**GOOD, "tags": {f"k{i}": "v" for i in range(51)}}, "at most 50"),
        ("lab-3-0123abcd.json", {**GOOD, "launched": "yesterday"}, "not a time"),
        ("lab-3-0123abcd.json", {**GOOD, "rate": "1gbit; reboot"}, "not a link rate"),
    ],
)
def test_a_bad_record_named_by_an_instance_id_is_kept_for_down_and_gc(tmp_path, name, content, why):
    """Skipping it would hide a host that may be live (issue 39: a rate spelt '1Gbit' left a
    root sshd nobody could list or end): what passes its own check is read, the rest is a
    neutral value, and the warning says why and that the host is still listed."""
    state, said = state_with(tmp_path, {name: content})
    (record,) = state.instances()
    assert record.damaged and record.id == name[: -len(".json")]
    assert record.index == int(name.split("-")[1])
    assert record.network == (content["network"] if "labnet" in content["network"] else "")
    assert record.tags == ({} if content["tags"] != GOOD["tags"] else GOOD["tags"])
    assert len(said) == 1 and why in said[0] and "still listed" in said[0], said


def test_a_record_through_a_link_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps(GOOD))
    state, said = state_with(tmp_path, {})
    (state.root / "instances" / "lab-3-0123abcd.json").symlink_to(target)
    assert state.instances() == []
    assert "skipping" in said[0]


def test_a_state_directory_others_may_write_is_refused(tmp_path):
    state, _ = state_with(tmp_path, {})
    state.root.chmod(0o777)
    with pytest.raises(LaunchError, match="may be written by others"):
        state.instances()


def test_host_numbers_are_taken_once(tmp_path):
    state, _ = state_with(tmp_path, {"lab-3-0123abcd.json": GOOD})
    with state.locked():  # the machine's numbers stay as they are meanwhile
        # the lowest number that neither the record (3) nor a host on this machine holds
        free = min(set(range(1, hosts.MAX_HOSTS + 1)) - {3} - hosts.numbers_in_use()[0])
        new_id, index = state.new_instance_id()
        assert index == free and new_id.startswith(f"lab-{free}-")
        with pytest.raises(LaunchError, match="in use"):
            state.new_instance_id(wanted=3)


def test_authorized_key_must_be_a_public_key(tmp_path):
    private = tmp_path / "id"
    private.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn...\n")
    with pytest.raises(ConfigError, match="not an OpenSSH public key"):
        authorized_keys(str(private))
    with pytest.raises(ConfigError, match="no public key found"):
        authorized_keys(str(tmp_path / "missing.pub"))
    public = tmp_path / "id.pub"
    public.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA me@laptop\n")
    assert authorized_keys(str(public)) == "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA me@laptop\n"


ACCEPTED_RATES = ["1gbit", "1Gbit", " 1gbit", "1GBIT", "1000mbit", "1000000 kbit", "1.0gbit"]


@pytest.mark.parametrize("spelling", ACCEPTED_RATES)
def test_every_accepted_rate_round_trips_through_the_record(tmp_path, spelling):
    """What validate accepts is kept in one form, and the record holds and reads back exactly
    that form: no spelling makes a record every later read refuses."""
    text = yaml.safe_dump(
        {
            "name": "r", "backend": "ssh", "program": {"argv": ["python3", "t.py"]},
            "roles": {"ps": 1, "worker": 1}, "ssh": {"provision": {"cloud": "lab", "rate": spelling}},
        }
    )  # fmt: skip
    section = parse_config(text).section(SshSection).provision
    assert section.rate == "1000000000bit"
    state, said = state_with(tmp_path, {})
    record = LabInstance(**{**GOOD, "rate": section.rate})
    with state.locked():
        state.save_instance(record)
    assert state.instances() == [record] and said == []


def test_a_rate_validate_refuses_is_named():
    with pytest.raises(ConfigError, match="not a link rate|a link rate is a number"):
        parse_config(
            yaml.safe_dump(
                {
                    "name": "r", "backend": "ssh", "program": {"argv": ["python3", "t.py"]},
                    "roles": {"ps": 1, "worker": 1},
                    "ssh": {"provision": {"cloud": "lab", "rate": "1gbit; reboot"}},
                }
            )
        )  # fmt: skip


def test_rates_read_as_tc_writes_them():
    assert hosts.parse_rate("1gbit") == 10**9
    assert hosts.parse_rate("500mbit") == 5 * 10**8
    with pytest.raises(ValueError, match="a number and a unit"):
        hosts.parse_rate("fast")


# ---- real namespace hosts (root) --------------------------------------------------------------


def lab_leftovers(ids: set[str]) -> list[str]:
    """Namespaces, links and sshd processes of the lab instances ``ids`` that still exist, from
    ``ip netns``, ``ip link`` and the process table. Host numbers are the machine's and reused
    once freed: a number whose public link names another instance (another test's, another
    session's) is that one's, not a leftover. Read under the lab's lock, which numbers are taken
    and hosts built under, so that no host is half made meanwhile."""
    with hostlock.exclusive(MACHINE_LOCK, "the lab's numbers", 600):
        aliases = hosts.link_aliases()
        numbers = {
            n for n in {int(i.split("-")[1]) for i in ids}
            if aliases.get(hosts.LAB.public_veth.format(n=n), "") in ("", *ids)
        }  # fmt: skip
        names = {f"tfl-lab{n}" for n in numbers}
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    left = [
        f"namespace {line.split()[0]}" for line in netns.splitlines() if line.split()[0] in names
    ]
    for line in links.splitlines():
        link = line.split(":")[1].strip().split("@")[0]
        if any(link in (f"tfl-lp{n}", f"tfl-lv{n}") for n in numbers):
            left.append(f"link {link}")
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "sshd" in cmdline and any(f"/hosts/{i}/" in cmdline for i in ids):
                left.append(f"process {pid} {cmdline.strip()}")
    return left


@pytest.fixture()
def lab_root():
    """Root with ip, tc and sshd, or a skip (a failure under CI)."""
    from tests.conftest import skip_or_fail

    problem = hosts.missing_requirements()
    if problem:
        skip_or_fail(problem)


def client_key(tmp_path: Path) -> Path:
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def ssh(key: Path, address: str, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-i", str(key), "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5", f"root@{address}",
         command],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


@pytest.mark.ssh
def test_provider_makes_shaped_hosts_and_ends_them(lab_root, tmp_path):
    key = client_key(tmp_path)
    section = LabProvisionSection(
        state_dir=str(tmp_path / "state"), authorized_key=f"{key}.pub", rate="100mbit"
    )
    said: list[str] = []
    provider = LabProvider(section, said.append)
    network = provider.open_network("lab-t1", "c", [2220], 22, "0.0.0.0/0")
    planned = [PlannedInstance(f"worker-{i}", "worker", "netns", 0, False) for i in (1, 2)]
    ids = provider.create(planned, "lab-t1", "c", network, {}, "")
    try:
        # A later command finds them from their tags alone, through the state directory.
        again = LabProvider.from_access(provider.access(), said.append)
        found = sorted(again.describe(tags={TAG_RUN: "lab-t1"}), key=lambda i: i.host)
        assert [(i.host, i.state) for i in found] == [
            ("worker-1", "running"),
            ("worker-2", "running"),
        ]
        assert {i.id for i in found} == set(ids.values())
        one, two = found
        # Public address from here; the private one only between the hosts.
        reach = f"python3 -c \"import socket; socket.create_connection(('{two.cluster_address}', 22), 3)\""
        done = ssh(key, one.connect_address, reach)
        assert done.returncode == 0, done.stderr
        with pytest.raises(OSError):
            import socket

            socket.create_connection((two.cluster_address, 22), timeout=2)
        host = hosts.NamespaceHost(int(one.id.split("-")[1]), int(network.split("-")[1]), Path("."))
        assert set(hosts.shaped_rates(host).values()) == {100 * 10**6}
        assert lab_leftovers(set(ids.values())) != []
        # Another state directory (another user's lab, say) shares the machine's numbers and
        # bridges: its host takes a number of its own and outlives this run's hosts.
        other = LabProvider(
            LabProvisionSection(state_dir=str(tmp_path / "other"), authorized_key=f"{key}.pub"),
            said.append,
        )
        other_network = other.open_network("lab-t2", "c", [2220], 22, None)
        other_ids = other.create(planned[:1], "lab-t2", "c", other_network, {}, "")
    finally:
        provider.terminate(list(ids.values()), network)
    try:
        assert lab_leftovers(set(ids.values())) == []
        (survivor,) = other.describe()
        assert survivor.state == "running" and survivor.connect_address not in {
            i.connect_address for i in found
        }
        assert ssh(key, survivor.connect_address, "true").returncode == 0
    finally:
        other.terminate(list(other_ids.values()), other_network)
    assert lab_leftovers(set(other_ids.values())) == []
    assert hosts.PUBLIC_BRIDGE not in hosts.links() or hosts.numbers_in_use() != (set(), set())
    gone = provider.describe(ids=list(ids.values()), states=("terminated",))
    assert {i.state for i in gone} == {"terminated"}
    assert provider.describe(tags={TAG_RUN: "lab-t1"}) == []


@pytest.mark.ssh
def test_a_host_made_with_any_rate_spelling_is_found_and_ended(lab_root, tmp_path):
    """Issue 39's high finding: 'rate: 1GBIT' passed validate, but the record held it as
    written and every later read refused it, so up, down and gc could not see a live host."""
    key = client_key(tmp_path)
    text = yaml.safe_dump(
        {
            "name": "r", "backend": "ssh", "program": {"argv": ["python3", "t.py"]},
            "roles": {"ps": 1, "worker": 1},
            "ssh": {"provision": {
                "cloud": "lab", "rate": " 1GBIT", "authorized_key": f"{key}.pub",
                "state_dir": str(tmp_path / "state"),
            }},
        }
    )  # fmt: skip
    said: list[str] = []
    provider = LabProvider(parse_config(text).section(SshSection).provision, said.append)
    network = provider.open_network("lab-t3", "c", [2220], 22, None)
    planned = [PlannedInstance("worker-1", "worker", "netns", 0, False)]
    ids = provider.create(planned, "lab-t3", "c", network, {}, "")
    try:
        again = LabProvider.from_access(provider.access(), said.append)
        (found,) = again.describe(tags={TAG_RUN: "lab-t3"})
        assert found.state == "running" and found.id in ids.values()
        host = hosts.NamespaceHost(
            int(found.id.split("-")[1]), int(network.split("-")[1]), Path(".")
        )
        assert set(hosts.shaped_rates(host).values()) == {10**9}
    finally:
        LabProvider.from_access(provider.access(), said.append).terminate(
            list(ids.values()), network
        )
    assert lab_leftovers(set(ids.values())) == []
    assert not any("skipping" in line for line in said), said


@pytest.mark.ssh
def test_a_network_whose_bridge_still_has_ports_is_kept(lab_root, tmp_path):
    """delete_network never pulls a bridge from under a host its records do not show."""
    section = LabProvisionSection(state_dir=str(tmp_path / "state"))
    said: list[str] = []
    provider = LabProvider(section, said.append)
    network = provider.open_network("lab-t4", "c", [2220], 22, None)
    index = int(network.split("-")[1])
    stray = f"tfl-tst{index}"
    subprocess.run(
        ["ip", "link", "add", stray, "type", "veth", "peer", "name", f"{stray}x"], check=True
    )
    try:
        subprocess.run(["ip", "link", "set", stray, "master", hosts.bridge_of(index)], check=True)
        provider.delete_network(network, wait=1)
        assert hosts.bridge_of(index) in hosts.links()
        assert any(stray in line and "kept" in line for line in said), said
    finally:
        subprocess.run(["ip", "link", "delete", stray], check=False)
    provider.delete_network(network, wait=1)
    assert hosts.bridge_of(index) not in hosts.links()


EXAMPLE = ROOT / "examples" / "lab.yaml"


def lab_file(tmp_path: Path, key: Path, **program) -> Path:
    """examples/lab.yaml with this test's key, folders and interpreter (the hosts share the
    disk; sshd's PATH has no TensorFlow)."""
    data = yaml.safe_load(EXAMPLE.read_text())
    python = checkout_python(tmp_path)
    data["program"]["argv"] = [python, *data["program"]["argv"][1:], "--train_steps", "20"]
    data["program"].update(program)
    data["runs_dir"] = str(tmp_path / "runs")
    data["ssh"].update(
        identity_file=str(key), python=python, remote_runs_dir=str(tmp_path / "remote")
    )
    data["ssh"]["provision"].update(authorized_key=f"{key}.pub", state_dir=str(tmp_path / "state"))
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_ids(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "runs").iterdir())


@pytest.mark.slow
@pytest.mark.ssh
def test_up_runs_on_four_lab_hosts_at_1gbit_until_down(lab_root, tmp_path):
    """examples/lab.yaml's hosts and links with the TensorFlow-free stand-in as its program:
    the lab cloud is the subject (MNIST on SSH hosts is tests/ssh/test_ssh_backend.py's one
    TensorFlow run)."""
    key = client_key(tmp_path)
    cluster = lab_file(
        tmp_path, key, argv=[sys.executable, str(FAKE_TASK)], env={"WORK_SECONDS": "0.5"}
    )
    state = tmp_path / "state"
    up = tflaunch("up", str(cluster), timeout=400)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    assert "[worker:2]" in up.stdout and "all ps reachable at start: True" in up.stdout
    assert "estimated cost: USD 0.0000 per hour for 4 instance(s)" in up.stderr
    (run_id,) = run_ids(tmp_path)
    provider = LabProvider(LabProvisionSection(state_dir=str(state)), print)
    found = provider.describe(tags={TAG_RUN: run_id})
    ids = {i.id for i in found}
    try:
        # Not asked to end them: the four hosts stay, each link shaped to 1 Gb/s both ways.
        assert sorted(i.host for i in found) == ["ps-1", "worker-1", "worker-2", "worker-3"]
        for instance in found:
            host = hosts.NamespaceHost(int(instance.id.split("-")[1]), 1, Path("."))
            assert set(hosts.shaped_rates(host).values()) == {10**9}, instance
        status = tflaunch("status", "--cloud", "--runs-dir", str(tmp_path / "runs"))
        assert status.returncode == 0, status.stderr
        rows = [line.split() for line in status.stdout.splitlines() if run_id in line]
        assert sorted((r[1], r[4]) for r in rows) == [
            ("ps-1", "running"), ("worker-1", "running"), ("worker-2", "running"),
            ("worker-3", "running"),
        ]  # fmt: skip
        assert lab_leftovers(ids) != []
        down = tflaunch("down", run_id, "--runs-dir", str(tmp_path / "runs"))
        assert down.returncode == 0, down.stderr
        assert f"terminated 4 instance(s) of run {run_id}" in down.stdout + down.stderr
    finally:
        provider.terminate(list(ids))  # a failed assertion leaves nothing either
    assert lab_leftovers(ids) == []

    # A run that asks for it (up --down) ends its hosts itself.
    quick = lab_file(
        tmp_path, key, argv=[sys.executable, str(FAKE_TASK)], env={"WORK_SECONDS": "0.2"}
    )
    up = tflaunch("up", str(quick), "--down", timeout=120)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    assert "terminating 4 instance(s)" in up.stderr
    (second,) = set(run_ids(tmp_path)) - {run_id}
    ended = provider.describe(tags={TAG_RUN: second}, states=("terminated",))
    assert len(ended) == 4
    assert lab_leftovers({i.id for i in ended}) == []
    assert provider.describe() == []  # and nothing else of this state directory lives


@pytest.mark.ssh
def test_gc_ends_hosts_whose_launcher_is_gone(lab_root, tmp_path):
    from tflaunch.launchers.clouds.records import TAG_LAUNCHER

    key = client_key(tmp_path)
    state = str(tmp_path / "state")
    provider = LabProvider(LabProvisionSection(state_dir=state, authorized_key=f"{key}.pub"), print)
    network = provider.open_network("lab-gc1", "c", [2220], 22, None)
    gone = gone_launcher().tag()  # a launcher of this machine that was killed
    planned = [PlannedInstance("worker-1", "worker", "netns", 0, False)]
    ids = provider.create(planned, "lab-gc1", "c", network, {TAG_LAUNCHER: gone}, "")
    try:
        swept = tflaunch("gc", "--cloud", "lab", "--state-dir", state)
        assert swept.returncode == 0, swept.stderr
        assert "lab-gc1: 1 instance(s) terminated (its launcher is gone)" in swept.stdout
        assert lab_leftovers(set(ids.values())) == []
        assert provider.state.networks() == []  # the run's network went with its last instance
    finally:
        provider.terminate(list(ids.values()), network)
