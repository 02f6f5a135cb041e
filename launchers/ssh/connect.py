"""The SSH connection layer: paramiko clients opened in parallel, with checked host keys.

* Host keys are checked against a known_hosts file (``~/.ssh/known_hosts`` by default). ``strict``
  refuses unknown keys; ``accept-new`` records unknown keys (as OpenSSH's
  StrictHostKeyChecking=accept-new). A *changed* key is refused under every policy. There is no
  silent trust.
* An optional jump host is reached first and every target is tunnelled through a ``direct-tcpip``
  channel of it (OpenSSH's ProxyJump).
* :func:`remote_command` is the one place where a shell command string is built; every value in it
  is ``shlex.quote``-d there. Nothing else in the SSH backend writes shell text.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import errno
import hashlib
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import paramiko

from tflaunch.launchers.ssh.section import SshSection
from tflaunch.plugin import LaunchError, env_name_problem, in_threads

T = TypeVar("T")
_KNOWN_HOSTS_LOCK = threading.Lock()
CHANNEL_WINDOW = 64 * 1024 * 1024
# Threads of one fan-out: every host of a 64-host run at once (an SSH handshake mostly waits).
MAX_PARALLEL = 128


@dataclasses.dataclass(frozen=True)
class SshOptions:
    """How to reach hosts: the ``ssh:`` section with paths expanded."""

    user: str
    identity_file: str | None = None
    port: int = 22
    connect_timeout: float = 10.0
    host_key_policy: str = "strict"
    known_hosts: str = os.path.expanduser("~/.ssh/known_hosts")
    jump_host: str | None = None

    @classmethod
    def from_section(cls, ssh: SshSection, base_dir: str = ".") -> SshOptions:
        identity = ssh.identity_file
        if identity:
            identity = os.path.join(base_dir, os.path.expanduser(identity))
        return cls(
            user=ssh.user or _local_user(),
            identity_file=identity,
            port=ssh.port,
            connect_timeout=ssh.connect_timeout,
            host_key_policy=ssh.host_key_policy,
            known_hosts=os.path.join(base_dir, os.path.expanduser(ssh.known_hosts)),
            jump_host=ssh.jump_host,
        )


def _local_user() -> str:
    import getpass

    return getpass.getuser()


def remote_command(
    argv: Sequence[str],
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    background_output: str | None = None,
    append: bool = False,
) -> str:
    """The shell command line that runs ``argv`` on a host: the ONE place values are quoted.

    ``cwd`` is entered first (a leading ``~/`` is left to the remote shell to expand, the rest is
    quoted). ``env`` is passed through ``env NAME=VALUE``. With ``background_output`` the command
    runs detached in its own session, stdin from /dev/null, stdout and stderr to that file, and
    the command line prints its process id (``append``: added to the file, not replacing it);
    otherwise it ``exec``-s in place of the shell.
    """

    def quote_path(path: str) -> str:
        if path == "~":
            return "~"
        if path.startswith("~/"):
            return "~/" + shlex.quote(path[2:])
        return shlex.quote(path)

    words = [shlex.quote(arg) for arg in argv]
    for name in env or {}:
        problem = env_name_problem(name)
        if problem:  # env would take NAME=VALUE words apart, or options such as -S, otherwise
            raise ValueError(f"remote_command: {problem}")
    if env:
        words = ["env", *(shlex.quote(f"{k}={v}") for k, v in env.items()), *words]
    prefix = f"cd -- {quote_path(cwd)} || exit 97; " if cwd else ""
    if background_output is not None:
        out = quote_path(background_output)
        into = ">>" if append else ">"
        return f"{prefix}setsid {' '.join(words)} </dev/null {into}{out} 2>&1 & echo $!"
    return f"{prefix}exec {' '.join(words)}"


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint of a host key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _UnknownHostKey(Exception):
    def __init__(self, hostname: str, key: paramiko.PKey):
        super().__init__(hostname)
        self.hostname = hostname
        self.key = key


class _RejectUnknown(paramiko.MissingHostKeyPolicy):
    """strict: an unknown key stops the connection (and the caller explains how to accept it)."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey):
        raise _UnknownHostKey(hostname, key)


class _AcceptNew(paramiko.MissingHostKeyPolicy):
    """accept-new: record an unknown key in the known_hosts file (appending, under a lock)."""

    def __init__(self, known_hosts: str, notes: list[str]):
        self.known_hosts = known_hosts
        self.notes = notes

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey):
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        path = Path(self.known_hosts)
        with _KNOWN_HOSTS_LOCK:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with path.open("a") as out:
                out.write(line)
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.notes.append(
            f"recorded the new host key of {hostname} ({key.get_name()} {fingerprint(key)}) "
            f"in {self.known_hosts}"
        )


@dataclasses.dataclass
class CommandResult:
    """Exit status and output of a finished remote command."""

    exit_status: int
    stdout: str
    stderr: str


class Connection:
    """An open SSH connection to one host: run commands, start long-running ones, SFTP."""

    def __init__(
        self,
        name: str,
        address: str,
        client: paramiko.SSHClient,
        notes: list[str],
        via: Connection | None = None,
    ):
        self.name = name
        self.address = address
        self.client = client
        self.notes = notes
        self.via = via  # the jump host this connection is tunnelled through, if any

    @property
    def transport(self) -> paramiko.Transport:
        transport = self.client.get_transport()
        if transport is None:
            raise LaunchError(f"{self.name}: the SSH connection is closed.")
        return transport

    def start(self, command: str) -> paramiko.Channel:
        """Start a command (built by :func:`remote_command`) and return its channel, no PTY.

        The channel's window is large (64 MiB) so that, when the link is cut, sshd keeps taking
        the agent's output for a long while: the agent then never blocks writing an event before
        its heartbeat timeout tears its tasks down."""
        channel = self.transport.open_session(window_size=CHANNEL_WINDOW, timeout=30)
        channel.exec_command(command)
        return channel

    def run(self, command: str, timeout: float = 60.0, stdin: bytes = b"") -> CommandResult:
        """Run a command to completion; bounded by ``timeout`` seconds."""
        channel = self.start(command)
        try:
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + timeout
            while not (
                channel.exit_status_ready()
                and not channel.recv_ready()
                and not channel.recv_stderr_ready()
            ):
                if time.monotonic() > deadline:
                    raise LaunchError(
                        f"{self.name}: a remote command did not finish within {timeout:.0f} s."
                    )
                got = False
                while channel.recv_ready():
                    out += channel.recv(65536)
                    got = True
                while channel.recv_stderr_ready():
                    err += channel.recv_stderr(65536)
                    got = True
                if not got:
                    time.sleep(0.01)
            return CommandResult(
                channel.recv_exit_status(),
                out.decode(errors="replace"),
                err.decode(errors="replace"),
            )
        finally:
            channel.close()

    def sftp(self) -> paramiko.SFTPClient:
        return self.client.open_sftp()

    def close(self) -> None:
        self.client.close()


def parse_jump(spec: str, default_user: str) -> tuple[str, str, int]:
    """``[user@]host[:port]`` -> (user, host, port)."""
    user, _, rest = spec.rpartition("@")
    host, port = rest, 22
    if rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
        if not port_text.isdigit():
            raise LaunchError(
                f"ssh.jump_host: '{spec}' has a port that is not a number; "
                "write [user@]host[:port]."
            )
        port = int(port_text)
    if not host:
        raise LaunchError(f"ssh.jump_host: '{spec}' names no host; write [user@]host[:port].")
    return user or default_user, host, port


def _client(options: SshOptions, notes: list[str]) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    known = Path(options.known_hosts)
    if known.exists():
        try:
            client.load_host_keys(str(known))
        except (OSError, paramiko.SSHException) as err:
            raise LaunchError(f"{known}: cannot read the known_hosts file ({err}).") from err
    if options.host_key_policy == "accept-new":
        client.set_missing_host_key_policy(_AcceptNew(str(known), notes))
    else:
        client.set_missing_host_key_policy(_RejectUnknown())
    return client


def _explain(err: BaseException, name: str, address: str, port: int, options: SshOptions) -> str:
    """One sentence per connection failure, saying what to do."""
    where = f"{name} ({address}:{port})" if name != address else f"{address}:{port}"
    if isinstance(err, _UnknownHostKey):
        return (
            f"{where}: host key unknown ({err.key.get_name()} {fingerprint(err.key)} is not in "
            f"{options.known_hosts}), so the host cannot be told from an impostor. Check the "
            f"fingerprint and add it: ssh-keyscan -p {port} {address} >> {options.known_hosts} "
            "(or connect once with ssh), or set 'ssh.host_key_policy: accept-new' to record "
            "unknown keys on first contact."
        )
    if isinstance(err, paramiko.BadHostKeyException):
        return (
            f"{where}: HOST KEY CHANGED: {options.known_hosts} has {fingerprint(err.expected_key)} "
            f"but the host offers {fingerprint(err.key)}. This may be a re-created instance or an "
            "attack; refused under every policy. If you know why it changed, remove the old "
            f"entry (ssh-keygen -R {address} -f {options.known_hosts}) and connect again."
        )
    if isinstance(err, paramiko.PasswordRequiredException):
        return (
            f"{where}: the key {options.identity_file} is encrypted; load it into ssh-agent "
            "(ssh-add) and leave ssh.identity_file unset, or use an unencrypted key."
        )
    if isinstance(err, paramiko.AuthenticationException):
        key = options.identity_file or "your ssh-agent / default keys"
        return (
            f"{where}: the host refused {key} for user '{options.user}' ({err}). Check "
            "ssh.user and ssh.identity_file, and the key in the host's authorized_keys."
        )
    if isinstance(err, paramiko.ssh_exception.NoValidConnectionsError):
        errnos = {e.errno for e in err.errors.values() if isinstance(e, OSError)}
        if errnos & {errno.EHOSTUNREACH, errno.ENETUNREACH}:
            return (
                f"{where}: unreachable (no route to host). Check the address: the launcher "
                "must use the public (connect) address, or set ssh.jump_host."
            )
        return (
            f"{where}: connection refused. Is sshd running there, on port {port}? Check "
            "ssh.port and the firewall / security group."
        )
    if isinstance(err, UnicodeError):
        return f"{where}: '{address}' is not a valid host name or address; check the host list."
    if isinstance(err, socket.gaierror):
        return f"{where}: cannot resolve the host name ({err.strerror}); check the address."
    if isinstance(err, (socket.timeout, TimeoutError)):
        return (
            f"{where}: no answer within {options.connect_timeout:g} s (unreachable). Check "
            "the address, that the host is up, and that port "
            f"{port} is open to you; raise ssh.connect_timeout for slow links."
        )
    if isinstance(err, OSError) and err.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return (
            f"{where}: unreachable ({err.strerror}). Check the address: the launcher must "
            "use the public (connect) address, or set ssh.jump_host."
        )
    return f"{where}: cannot connect ({type(err).__name__}: {err})."


def connect(
    name: str, address: str, options: SshOptions, jump: Connection | None = None
) -> Connection:
    """Open one checked, authenticated connection (through ``jump`` if given)."""
    notes: list[str] = []
    client = _client(options, notes)
    sock = None
    try:
        if jump is not None:
            sock = jump.transport.open_channel(
                "direct-tcpip",
                (address, options.port),
                ("127.0.0.1", 0),
                timeout=options.connect_timeout,
            )
        client.connect(
            address,
            port=options.port,
            username=options.user,
            key_filename=options.identity_file,
            look_for_keys=options.identity_file is None,
            allow_agent=options.identity_file is None,
            timeout=options.connect_timeout,
            banner_timeout=options.connect_timeout,
            auth_timeout=options.connect_timeout,
            sock=sock,
        )
    except (paramiko.SSHException, OSError, UnicodeError, _UnknownHostKey) as err:
        client.close()
        raise LaunchError(_explain(err, name, address, options.port, options)) from err
    return Connection(name, address, client, notes, via=jump)


def parallel(
    func: Callable[[T], Any], items: Iterable[T]
) -> list[tuple[T, Any, BaseException | None]]:
    """Run ``func`` on every item in threads; (item, result, error) in the items' order. The
    threads are daemons (:func:`tflaunch.plugin.in_threads`): where a caller stops waiting
    (``status``'s deadline over hosts that accept a connection and never speak), a connection
    still waiting on a host does not hold the process at its exit."""
    answers = in_threads(func, items, MAX_PARALLEL, name="tflaunch-ssh")
    for answer in answers:  # errors are reported per host by the caller; SystemExit is not one
        if answer.error is not None and not isinstance(answer.error, Exception):
            raise answer.error
    return [(a.item, a.value, a.error) for a in answers]


def connect_jump(options: SshOptions) -> Connection | None:
    """The connection to ``ssh.jump_host`` that the others tunnel through, if one is set."""
    if not options.jump_host:
        return None
    user, jhost, jport = parse_jump(options.jump_host, options.user)
    jump_options = dataclasses.replace(options, user=user, port=jport)
    return connect(f"jump host {jhost}", jhost, jump_options)


def connect_all(hosts: Sequence[tuple[str, str]], options: SshOptions) -> dict[str, Connection]:
    """Connect to every (name, address) in parallel; one LaunchError naming each failing host."""
    jump = connect_jump(options)
    results = parallel(lambda h: connect(h[0], h[1], options, jump), hosts)
    failures = [str(err) for _, _, err in results if err is not None]
    connections = {h[0]: conn for h, conn, err in results if err is None}
    if failures:
        close_all(connections.values())
        if jump is not None:
            jump.close()
        raise connect_failure(failures, len(hosts))
    return connections


class Unreachable(LaunchError):
    """Hosts that could not be connected to: one line per host (``failures``), and what that
    means for the command (``consequence``: nothing was started, nothing was stopped, ...)."""

    def __init__(
        self, failures: Sequence[str], hosts: int, consequence: str = "nothing was started"
    ):
        self.failures, self.hosts = list(failures), hosts
        super().__init__(
            f"cannot connect to {len(failures)} of {hosts} hosts; {consequence}.\n  "
            + "\n  ".join(failures)
        )

    def because(self, consequence: str) -> Unreachable:
        """The same failures, saying what they mean for another command."""
        return Unreachable(self.failures, self.hosts, consequence)


def connect_failure(failures: Sequence[str], hosts: int) -> Unreachable:
    """The one error for hosts that could not be connected to."""
    return Unreachable(failures, hosts)


def close_all(connections: Iterable[Connection]) -> None:
    """Close every connection, then the jump hosts behind them; never raises."""
    vias = {}
    for conn in list(connections):
        if conn.via is not None:
            vias[id(conn.via)] = conn.via
        with contextlib.suppress(Exception):
            conn.close()
    for via in vias.values():
        with contextlib.suppress(Exception):
            via.close()
