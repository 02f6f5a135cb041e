"""Code sync and setup lines on the SSH namespace test hosts (real sshd, real SFTP).

The hosts share this machine's file system, so each gets its own workdir here: what lands in one
host's workdir is exactly what the sync sent to that host.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import FAKE_TASK, tflaunch
from tflaunch.launchers.ssh.connect import SshOptions, close_all, connect_all
from tflaunch.launchers.ssh.setup import digest_of, run_setup
from tflaunch.launchers.ssh.sync import local_tree, sync_all

pytestmark = [pytest.mark.slow, pytest.mark.ssh]


def make_tree(root: Path) -> None:
    files = {
        ".gitignore": "*.pyc\nbuild/\n/secret.txt\n!keep.pyc\n",
        "train.py": "print('train')\n",
        "pkg/__init__.py": "",
        "pkg/model.py": "x = 1\n",
        "pkg/model.pyc": "compiled",
        "pkg/keep.pyc": "kept by a negation",
        "pkg/.gitignore": "local.cfg\n",
        "pkg/local.cfg": "ignored by the nested .gitignore",
        "build/out.bin": "ignored directory",
        "secret.txt": "ignored at the top only",
        "data/secret.txt": "not ignored: the pattern is anchored",
        "a dir/it's $weird.txt": "nasty name",
        ".git/HEAD": "never copied",
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


EXPECTED = {
    ".gitignore",
    "train.py",
    "pkg/__init__.py",
    "pkg/model.py",
    "pkg/keep.pyc",
    "pkg/.gitignore",
    "data/secret.txt",
    "a dir/it's $weird.txt",
}


def test_local_tree_honours_gitignore(tmp_path):
    make_tree(tmp_path / "src")
    assert set(local_tree(tmp_path / "src")) == EXPECTED


@pytest.fixture()
def connections(ssh_test_hosts, tmp_path):
    known = tmp_path / "known_hosts"
    shutil.copy(ssh_test_hosts.known_hosts, known)
    options = SshOptions(
        user="root", identity_file=str(ssh_test_hosts.client_key), known_hosts=str(known)
    )
    conns = connect_all([(h.name, h.public_address) for h in ssh_test_hosts.hosts], options)
    yield conns
    close_all(conns.values())


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_sync_copies_the_tree_then_only_what_changed(tmp_path, connections):
    source = tmp_path / "src"
    make_tree(source)
    workdirs = {name: str(tmp_path / "hosts" / name / "work") for name in connections}
    said: list[str] = []
    first = sync_all(connections, source, workdirs, said.append)
    for name, workdir in workdirs.items():
        assert files_under(Path(workdir)) == EXPECTED | {".tflaunch-sync.json"}
        assert first[name].copied == len(EXPECTED)
        assert (Path(workdir) / "a dir/it's $weird.txt").read_text() == "nasty name"
    assert said[-1].startswith(f"sync: copied {len(EXPECTED)} file(s) (")
    assert "to each of 3 host(s)" in said[-1]

    time.sleep(1.1)  # a new modification time in whole seconds
    (source / "pkg/model.py").write_text("x = 2\n")
    second = sync_all(connections, source, workdirs, said.append)
    assert {r.copied for r in second.values()} == {1}
    assert said[-1].startswith("sync: copied 1 file(s) (6 B) to each of 3 host(s), 7 unchanged")
    for workdir in workdirs.values():
        assert (Path(workdir) / "pkg/model.py").read_text() == "x = 2\n"

    # A file removed locally goes on the hosts; a file sync never copied stays.
    (source / "train.py").unlink()
    for workdir in workdirs.values():
        (Path(workdir) / "checkpoint.ckpt").write_text("made on the host")
    third = sync_all(connections, source, workdirs, said.append)
    assert {(r.copied, r.removed) for r in third.values()} == {(0, 1)}
    for workdir in workdirs.values():
        assert not (Path(workdir) / "train.py").exists()
        assert (Path(workdir) / "checkpoint.ckpt").exists()


def test_setup_runs_once_per_host_with_prefixed_output(tmp_path, connections):
    workdirs = {name: str(tmp_path / name) for name in connections}
    for workdir in workdirs.values():
        os.makedirs(workdir)
    lines = ["echo hello from $(hostname -I | cut -d' ' -f1)", "echo ran >> count.txt"]
    shown, said = [], []
    digest = digest_of(lines, [])
    run_setup(connections, lines, workdirs, said.append, shown.append, digest)
    for name, workdir in workdirs.items():
        assert (Path(workdir) / "count.txt").read_text() == "ran\n"
        assert any(s.startswith(f"[setup@{name}] hello from 198.18.") for s in shown)
    assert said == ["setup: 2 line(s) ran on 3 host(s)"]
    run_setup(connections, lines, workdirs, said.append, shown.append, digest)  # unchanged
    assert said[-1].endswith("unchanged, skipped on host1, host2, host3")
    for workdir in workdirs.values():
        assert (Path(workdir) / "count.txt").read_text() == "ran\n"


def test_failing_setup_line_stops_the_launch_naming_host_and_line(ssh_test_hosts, tmp_path):
    known = tmp_path / "known_hosts"
    shutil.copy(ssh_test_hosts.known_hosts, known)
    work = tmp_path / "work"
    cluster = {
        "backend": "ssh",
        "program": {"argv": [sys.executable, "fake_task.py"], "workdir": str(work)},
        "roles": {"ps": 1, "worker": 2},
        "runs_dir": str(tmp_path / "runs"),
        "hosts": ssh_test_hosts.cluster_hosts(),
        "ssh": ssh_test_hosts.ssh_section(
            sys.executable,
            tmp_path / "remote",
            known,
            upload=[str(FAKE_TASK)],
            setup=[
                "echo first",
                # fails on host2 only (by its public address)
                f"hostname -I | grep -q {ssh_test_hosts.host(2).public_address} && exit 7 || true",
                "echo third",
            ],
        ),
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cluster))
    result = tflaunch("up", str(path), timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    err = result.stderr
    assert "setup failed; nothing was started" in err
    assert "host2: line 2 of ssh.setup failed with exit code 7: hostname -I" in err
    assert "host1: line" not in err and "host3: line" not in err
    assert "[setup@host1] third" in err
    assert not list((tmp_path / "remote").rglob("*.log"))
    ps = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert ps.stdout.strip() == ""
