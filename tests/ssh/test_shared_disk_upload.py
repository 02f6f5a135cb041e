"""Hosts that share one disk (an NFS home, or the test hosts, which share this machine's) take
``ssh.upload`` into the same workdir at the same moment. Each host's SFTP session is played here
by a thread over the local disk, held at a barrier at the racy point, so that every host has
looked before any has acted: the folder is missing for all of them, or every copy is written
before any is renamed. The upload must succeed on every host and leave one whole file."""

from __future__ import annotations

import os
import shutil
import threading

from tflaunch.launchers.ssh.session import put_whole, sftp_makedirs

HOSTS = 3


class _SharedDiskSftp:
    """The few SFTPClient calls the upload makes, on the local disk; ``hold`` names the call at
    which every host waits for the others."""

    def __init__(self, barrier: threading.Barrier, hold: str):
        self.barrier, self.hold = barrier, hold

    def _maybe_hold(self, call: str) -> None:
        if call == self.hold:
            self.barrier.wait(timeout=10)

    def stat(self, path: str) -> os.stat_result:
        return os.stat(path)

    def mkdir(self, path: str) -> None:
        self._maybe_hold("mkdir")
        os.mkdir(path)

    def put(self, local: str, remote: str) -> None:
        shutil.copyfile(local, remote)
        self._maybe_hold("put")

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(path, mode)

    def posix_rename(self, old: str, new: str) -> None:
        os.replace(old, new)

    def rename(self, old: str, new: str) -> None:
        os.rename(old, new)

    def remove(self, path: str) -> None:
        os.remove(path)


def _on_every_host(hold: str, action) -> list[BaseException]:
    barrier = threading.Barrier(HOSTS)
    errors: list[BaseException] = []

    def host() -> None:
        try:
            action(_SharedDiskSftp(barrier, hold))
        except BaseException as err:  # noqa: BLE001 (collected for the assertion)
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=host) for _ in range(HOSTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    return errors


def test_hosts_uploading_into_one_shared_workdir_all_succeed(tmp_path):
    local = tmp_path / "train.py"
    local.write_text("print('whole')\n" * 1000)
    local.chmod(0o750)
    workdir = tmp_path / "shared" / "work"
    target = workdir / "train.py"

    def upload(sftp) -> None:
        sftp_makedirs(sftp, str(workdir))
        put_whole(sftp, local, str(target))

    # Every host finds the folder missing, then all make it.
    assert _on_every_host("mkdir", upload) == []
    # Every host has written its copy before any renames it over the target.
    assert _on_every_host("put", upload) == []
    assert target.read_text() == local.read_text()
    assert target.stat().st_mode & 0o777 == 0o750
    assert sorted(p.name for p in workdir.iterdir()) == ["train.py"]  # no temporary left


def test_a_failed_upload_leaves_no_temporary(tmp_path):
    local = tmp_path / "train.py"
    local.write_text("x\n")
    workdir = tmp_path / "work"
    workdir.mkdir()

    class _Refusing(_SharedDiskSftp):
        def chmod(self, path, mode):
            raise PermissionError(13, "Permission denied")

    sftp = _Refusing(threading.Barrier(1), hold="")
    try:
        put_whole(sftp, local, str(workdir / "train.py"))
    except PermissionError:
        pass
    else:
        raise AssertionError("the refused chmod was not raised")
    assert list(workdir.iterdir()) == []
