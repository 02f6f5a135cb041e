"""``mkdir -p`` over SFTP when several hosts' syncs make the same directories at once: hosts that
share a file system (NFS homes; the SSH test hosts share this machine's) race between the look
and the mkdir, and SFTP reports the loser's mkdir only as a generic failure."""

from __future__ import annotations

import stat
from types import SimpleNamespace

import pytest

from tflaunch.launchers.ssh.sync import makedirs


class RacingSftp:
    """An SFTP client over ``made`` (the paths that exist) whose mkdir of ``contested`` loses
    to another host: the directory is made by someone else, and this mkdir fails."""

    def __init__(self, contested: str, made_as: int = stat.S_IFDIR) -> None:
        self.made = {"/"}
        self.kinds: dict[str, int] = {}
        self.contested, self.made_as = contested, made_as
        self.mkdirs: list[str] = []

    def stat(self, path: str):
        if path not in self.made:
            raise FileNotFoundError(path)
        return SimpleNamespace(st_mode=self.kinds.get(path, stat.S_IFDIR) | 0o755)

    def mkdir(self, path: str) -> None:
        self.mkdirs.append(path)
        if path == self.contested:
            self.made.add(path)  # the other host's mkdir came first
            self.kinds[path] = self.made_as
            raise OSError("Failure")
        self.made.add(path)


def test_a_directory_another_host_made_meanwhile_is_used():
    sftp = RacingSftp("/w/hosts")
    makedirs(sftp, "/", "w/hosts/host2/work")
    assert sftp.mkdirs == ["/w", "/w/hosts", "/w/hosts/host2", "/w/hosts/host2/work"]
    assert "/w/hosts/host2/work" in sftp.made


def test_a_file_in_the_way_still_fails():
    sftp = RacingSftp("/w/hosts", made_as=stat.S_IFREG)
    with pytest.raises(OSError, match="Failure"):
        makedirs(sftp, "/", "w/hosts/host2/work")
    assert sftp.mkdirs == ["/w", "/w/hosts"]
