"""The ``lab`` cloud's ``ssh.provision`` section (``cloud: lab``). A plain dataclass, read through
the cloud registry, so that reading a cluster file builds nothing."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from tflaunch.launchers.clouds.lab.hosts import canonical_rate, parse_rate
from tflaunch.plugin import ProvisionSection, field

DEFAULT_STATE_DIR = "/run/tflaunch-lab"


def state_dir_problem(value: object) -> str | None:
    """Why ``value`` cannot be lab's state directory, or None: an absolute path of plain
    characters (it is written into each host's sshd configuration), with no ``.`` or ``..``
    (the folders above it are checked by :class:`~tflaunch.launchers.clouds.lab.state.State`
    as they are named)."""
    if not isinstance(value, str) or not re.fullmatch(r"/[A-Za-z0-9._/+-]{0,200}", value):
        return (
            f"{str(value)[:60]!r} is not an absolute path of letters, digits and ._/+- "
            "(at most 200 characters)"
        )
    if {".", ".."} & set(value.split("/")):
        return f"{value!r} has a '.' or '..' component; write the directory's own path"
    return None


def _rate_problem(value: object) -> str | None:
    try:
        parse_rate(str(value))
    except ValueError as err:
        return str(err)
    return None


@dataclass(frozen=True)
class LabProvisionSection(ProvisionSection):
    """Make the run's hosts on this machine: network namespaces, each with its own sshd, a
    public address (198.19.1.x, reached from here) and a private one (198.19.2.x, on the run's
    own bridge), and links as fast as ``rate``. Needs root, iproute2 and openssh-server. They
    are tagged with the run and removed by 'tflaunch down', 'up --down' or 'tflaunch gc'; lab
    has no idle watchdog (a namespace cannot power itself off)."""

    rate: str | None = field(
        None,
        doc="each host's private link, both ways, as tc writes it (1gbit, 500mbit); "
        "absent: unshaped. Kept as bits per second (1gbit: 1000000000bit), the form the "
        "instance records hold",
        check=_rate_problem,
        coerce=canonical_rate,
    )
    authorized_key: str | None = field(
        None,
        doc="public key file the hosts accept for ssh.user (default: ~/.ssh/id_ed25519.pub, "
        "id_ecdsa.pub or id_rsa.pub)",
    )
    state_dir: str = field(
        DEFAULT_STATE_DIR,
        doc="where lab keeps its hosts' records, keys and sshd files (root's, mode 0700)",
        check=state_dir_problem,
    )
    tags: Mapping[str, str] = field(factory=dict, doc="extra tags on every instance")
