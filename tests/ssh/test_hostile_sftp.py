"""A hostile host's SFTP server against the trace copy-back (``fetch_tree``, run on every
``status``/``logs``/``trace`` of a detached run) and the host-to-host profile copy: a real
paramiko SFTP server, in this process over a socket pair, lists names that climb out of the
folder, absolute names, empty and dot names, a symlink and a device; nothing may be written
outside the run directory, and the one honest file still arrives."""

from __future__ import annotations

import os
import socket
import stat
import threading
from pathlib import Path

import paramiko
import pytest

from tflaunch.launchers.ssh.trace import fetch_tree

HOSTILE_NAMES = ["../../escaped", "..", ".", "", "sub/../../../escaped2"]


class _HostileFolder(paramiko.SFTPServerInterface):
    """Every folder lists the hostile names (as files), a symlink, a FIFO, one honest file and
    one honest sub-folder; every file reads as ``PAYLOAD``."""

    PAYLOAD = b"planted by a hostile host\n"
    absolute = "/nonexistent/abs-escaped"  # an absolute name, set by the test under its tmp_path

    def _attr(self, name: str, mode: int) -> paramiko.SFTPAttributes:
        attr = paramiko.SFTPAttributes()
        attr.filename, attr.st_mode, attr.st_size = name, mode, len(self.PAYLOAD)
        attr.st_mtime = attr.st_atime = 0
        return attr

    def list_folder(self, path):
        names = [*HOSTILE_NAMES, self.absolute]
        listing = [self._attr(name, stat.S_IFREG | 0o644) for name in names]
        listing.append(self._attr("../climb-dir", stat.S_IFDIR | 0o755))
        listing.append(self._attr("link", stat.S_IFLNK | 0o777))
        listing.append(self._attr("fifo", stat.S_IFIFO | 0o644))
        listing.append(self._attr("honest.json", stat.S_IFREG | 0o644))
        if path.count("/") < 12:  # one honest sub-folder a level, deeper than any trace
            listing.append(self._attr("raw", stat.S_IFDIR | 0o755))
        return listing

    def stat(self, path):
        return self._attr(os.path.basename(path), stat.S_IFREG | 0o644)

    lstat = stat

    def open(self, path, flags, attr):
        handle = paramiko.SFTPHandle(flags)
        reader = _Reader(self.PAYLOAD)
        handle.readfile = reader  # SFTPHandle.read reads readfile at the asked offset
        return handle


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def seek(self, offset: int) -> None:
        self.at = offset

    def tell(self) -> int:
        return self.at

    def read(self, n: int) -> bytes:
        chunk = self.data[self.at : self.at + n]
        self.at += len(chunk)
        return chunk

    def close(self) -> None:
        pass


class _AnyLogin(paramiko.ServerInterface):
    def get_allowed_auths(self, username):
        return "password"

    def check_auth_password(self, username, password):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED


@pytest.fixture
def hostile_sftp():
    server_sock, client_sock = socket.socketpair()
    server = paramiko.Transport(server_sock)
    server.add_server_key(paramiko.RSAKey.generate(2048))
    server.set_subsystem_handler("sftp", paramiko.SFTPServer, _HostileFolder)
    threading.Thread(
        target=server.start_server, kwargs={"server": _AnyLogin()}, daemon=True
    ).start()
    client = paramiko.Transport(client_sock)
    client.connect(username="laptop", password="x")
    sftp = paramiko.SFTPClient.from_transport(client)
    yield sftp
    sftp.close()
    client.close()
    server.close()


def test_fetch_tree_writes_nothing_outside_the_run_directory(hostile_sftp, tmp_path):
    box = tmp_path / "box"  # everything of the laptop this test may see written
    run_trace = box / "runs" / "r1" / "trace"
    run_trace.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (run_trace / "link").symlink_to(outside / "through-link")  # planted beforehand
    _HostileFolder.absolute = str(outside / "abs-escaped")

    fetch_tree(hostile_sftp, "/remote/trace", run_trace)

    written = sorted(p.relative_to(box).as_posix() for p in box.rglob("*") if p.is_file())
    assert written[0] == "runs/r1/trace/honest.json"
    assert all(name.startswith("runs/r1/trace/") for name in written)
    assert all(Path(name).name in ("honest.json", "link") for name in written), written
    assert not list(tmp_path.glob("*escaped*")) and not (tmp_path / "climb-dir").exists()
    assert list(outside.iterdir()) == []  # the planted symlink was not written through
    assert (run_trace / "honest.json").read_bytes() == _HostileFolder.PAYLOAD
    assert not (run_trace / "fifo").exists()
    depth = max(len(p.relative_to(run_trace).parts) for p in run_trace.rglob("*"))
    assert depth <= 8  # an endless listing stops at the depth bound
