"""The ``ssh:`` section of the cluster file, its checks, and the rules for files with
``backend: ssh``. Read by :mod:`tflaunch.cluster.config` through the backend registry."""

from __future__ import annotations

import dataclasses
import posixpath
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import tflaunch.launchers.clouds as clouds
from tflaunch.plugin import MAX_GPUS, MAX_ITEMS, MAX_PORT, MAX_SECONDS, ClusterConfig, Fail, field


@dataclass(frozen=True)
class SshSection:
    """SSH settings (backend: ssh)."""

    user: str | None = field(None, doc="remote user (default: the local user)")
    identity_file: str | None = field(None, doc="private key file")
    port: int = field(22, minimum=1, maximum=MAX_PORT, doc="SSH port")
    connect_timeout: float = field(
        10.0, minimum=0.1, maximum=MAX_SECONDS, doc="seconds to connect to a host"
    )
    host_key_policy: Literal["strict", "accept-new"] = field(
        "strict",
        doc="strict: known hosts only; accept-new: record unknown keys, refuse changed ones",
    )
    known_hosts: str = field("~/.ssh/known_hosts", doc="known_hosts file")
    jump_host: str | None = field(None, doc="[user@]host[:port] to tunnel through")
    public_ips_file: str | None = field(None, doc="file of connect addresses, one per line")
    private_ips_file: str | None = field(
        None, doc="file of cluster addresses, line i = same host as public line i"
    )
    gpus: int | None = field(
        None,
        minimum=0,
        maximum=MAX_GPUS,
        doc="GPUs per host for hosts from files; absent: what pre-flight's nvidia-smi finds",
    )
    upload: tuple[str, ...] = field(
        (), doc="files copied to each host's workdir before the start", maximum=MAX_ITEMS
    )
    python: str = field("python3", doc="Python interpreter on the hosts")
    remote_runs_dir: str | None = field(
        None, doc="run directory on the hosts (default: the local runs_dir path)"
    )
    provision: Any = field(
        None,
        doc="create the hosts for the run in a cloud: 'cloud' names it (see the clouds "
        "registered), the rest are that cloud's settings",
        variants=clouds.PROVISION,
    )
    sync: str | None = field(
        None,
        doc="local directory copied to every host's workdir before the run (honours .gitignore; "
        "copies only what changed)",
    )
    setup: tuple[str, ...] = field(
        (), doc="shell lines run once on every host before the pre-flight check, in the workdir"
    )
    setup_inputs: tuple[str, ...] = field(
        (),
        doc="with setup_once: local files whose contents, with the setup lines, decide whether "
        "setup must run again (e.g. requirements.txt)",
    )
    setup_once: bool = field(
        False,
        doc="skip the setup lines on a host where they (and setup_inputs) already succeeded",
    )
    host_wait: float = field(
        0.0,
        minimum=0,
        doc="when a host stops answering, stop the other hosts' tasks and wait this many seconds "
        "for it to answer again, then start a new agent there and restart the whole cluster from "
        "the checkpoints (counted in supervision.restart.max_cluster_restarts); 0: a host that "
        "stops answering fails the run",
    )
    # Host discovery of each cloud that has it (``ssh.ec2:``), keyed by the cloud's name: read
    # through the cloud registry, present only when written. Set by the loader.
    discover: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({}),
        metadata={"internal": True, "sections": True, "sections_of": clouds.discovery_sections},
    )


def check(config: ClusterConfig, fail: Fail) -> None:
    """The section's own rules (every file), then those of files that choose SSH."""
    ssh = config.section(SshSection)
    if ssh.host_wait and not config.supervision.restart.enabled:
        fail(
            ("ssh", "host_wait"),
            "needs a restart policy in supervision.restart (e.g. ps: exit-code): only with one "
            "do the other hosts' agents stay up to start their tasks again once the lost host "
            "is back",
        )
    if ssh.provision is not None:
        for path, used in (
            (("hosts",), bool(config.hosts)),
            (("ssh", "public_ips_file"), bool(ssh.public_ips_file)),
            *((("ssh", name), True) for name in ssh.discover),
        ):
            if used:
                fail(
                    path,
                    "cannot be combined with ssh.provision, which creates the hosts; "
                    "remove one of the two",
                )
        spec = clouds.spec_for_section(ssh.provision)
        if spec.check is not None:
            spec.check(config, ssh.provision, fail)
    if ssh.public_ips_file and not ssh.private_ips_file:
        fail(
            ("ssh", "private_ips_file"),
            "is required with public_ips_file (line i of each is one host)",
        )
    if config.backend == "ssh" and config.program.env_from:
        fail(
            ("program", "env_from"),
            "is not supported by backend ssh yet: the remote agents do not inherit the "
            "launcher's environment. Set the variables on the hosts (e.g. in a file the "
            "program reads) or use program.env",
        )


def host_run_dir(config: ClusterConfig, run_id: str) -> str:
    """The run's directory as the hosts lay runs out: ``ssh.remote_runs_dir`` (else the local
    runs_dir path), relative to the remote home directory unless absolute. Each host keeps its
    own files in a folder of it named after the host; the default checkpoint directory is
    ``checkpoints/`` in it, one path for every host (shared where the hosts share the disk)."""
    root = config.section(SshSection).remote_runs_dir or config.runs_dir
    if not posixpath.isabs(root) and not root.startswith("~"):
        root = posixpath.join("~", root)  # expanded on the host: relative to the home
    return posixpath.join(root, run_id)
