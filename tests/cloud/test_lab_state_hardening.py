"""The lab cloud's inputs from the file system are bounded and its state directory cannot be
swapped (issue 39): the authorized_key file is read no further than its limit, and the state
directory has no ``..`` and sits under folders only root (or this user) may change."""

from __future__ import annotations

import os
import tracemalloc

import pytest

from tflaunch.cluster.config import parse_config
from tflaunch.errors import ConfigError, LaunchError
from tflaunch.launchers.clouds.lab.provider import MAX_KEY_BYTES, LabProvider, authorized_keys
from tflaunch.launchers.clouds.lab.state import State

NOBODY = 65534


def test_a_huge_authorized_key_file_is_refused_having_read_its_limit(tmp_path):
    huge = tmp_path / "id.pub"
    with huge.open("wb") as f:
        f.write(b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA me@laptop\n")
        f.truncate(300 << 20)  # 300 MB, sparse
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="not an OpenSSH public key file"):
            authorized_keys(str(huge))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * MAX_KEY_BYTES, f"{peak} bytes held to read a {MAX_KEY_BYTES}-byte limit"


def test_a_fifo_for_authorized_key_is_no_key_and_does_not_block(tmp_path):
    fifo = tmp_path / "id.pub"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="no public key found"):
        authorized_keys(str(fifo))


@pytest.mark.parametrize(
    ("in_files", "why", "recorded"),
    [
        (
            ["relative/dir", "'/tmp/a b'", '"/tmp/x\\nForceCommand id"'],
            "not an absolute path of letters",
            "/tmp/x\nHostKey /etc/shadow",
        ),
        (
            ["/run/x/../tflaunch-lab", "/run/./lab", "/.."],
            "has a '.' or '..' component",
            "/home/../run/lab",
        ),
    ],
    ids=["not-plain-absolute", "dot-dot"],
)
def test_a_state_directory_must_be_a_plain_absolute_path(tmp_path, in_files, why, recorded):
    """Refused in a cluster file (ConfigError) and in a run's record (LaunchError)."""
    text = "backend: ssh\nprogram: [x]\nssh:\n  provision: {cloud: lab, state_dir: %s}\n"
    for bad in in_files:
        with pytest.raises(ConfigError, match=why):
            parse_config(text % bad, source=str(tmp_path / "c.yaml"), base_dir=str(tmp_path))
    with pytest.raises(LaunchError, match="state directory recorded for the run"):
        LabProvider.from_access({"state_dir": recorded}, print)


def _state_under(folder) -> State:
    folder.mkdir(exist_ok=True)
    return State(folder / "sub" / "state", print)


def test_a_state_directory_under_a_folder_another_user_may_change_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("a folder of another user needs root to make")
    theirs = tmp_path / "theirs"
    state = _state_under(theirs)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(LaunchError, match=r"could be swapped .*belongs to another user"):
        state.locked().__enter__()
    assert not (theirs / "sub").exists()  # refused before anything was made there
    with pytest.raises(LaunchError, match="belongs to another user"):
        state.instances()

    link = tmp_path / "link"
    link.symlink_to(theirs)
    with pytest.raises(LaunchError, match="belongs to another user"):
        State(link / "state", print).exists()

    open_folder = tmp_path / "open"
    state = _state_under(open_folder)
    open_folder.chmod(0o777)
    with pytest.raises(LaunchError, match="may be written by others"):
        state.exists()
    open_folder.chmod(0o1777)  # sticky, as /tmp: only an entry's owner may rename it
    with state.locked():
        pass
    assert state.exists() and state.instances() == []
