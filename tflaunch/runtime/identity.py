"""Who launched a run, or holds a lock: a process's identity across machines.

A pid names a process only inside one PID namespace of one boot of one machine, and a hostname
does not name a machine (two containers, or a container and its host, often share one). So a
launcher is recorded as :class:`Launcher`: the machine (the kernel's boot id and the PID
namespace, which two containers with one hostname never share; :func:`machine_id`), the pid,
and the process's start time (a reused pid starts later). ``run.json`` keeps it as an object
(:meth:`Launcher.to_dict`), cloud tags and kept-cluster locks as one string
(:meth:`Launcher.tag`). Whether that process still runs can only be told on its own machine:
:meth:`Launcher.alive` says True or False there, and None (unknown) anywhere else.
"""

from __future__ import annotations

import functools
import os
import re
import socket
from dataclasses import dataclass
from typing import Any

import psutil

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
PID_NAMESPACE = "/proc/self/ns/pid"
START_TOLERANCE = 0.05  # seconds: one process's start time, read twice, differs by less
# A tag is ``host:pid:start:machine``; the machine is ``<boot id>/<pid namespace>``.
_MACHINE = re.compile(r"[A-Za-z0-9._/-]{1,120}")
_HOST = re.compile(r"[^:\s]{0,253}")  # a hostname, as gethostname() gives it


@functools.cache
def machine_id() -> str:
    """This process's machine, as no other machine (container, PID namespace) has it:
    ``<boot id>/<pid namespace inode>`` on Linux. Where /proc has neither (a macOS laptop),
    the hostname and boot time, the best that is there."""
    try:
        with open(BOOT_ID_FILE, encoding="ascii") as f:
            boot = f.read().strip()
        namespace = os.readlink(PID_NAMESPACE)  # "pid:[4026531836]"
    except (OSError, UnicodeDecodeError):
        return f"{socket.gethostname()}-{int(psutil.boot_time())}"
    inode = "".join(c for c in namespace if c.isdigit()) or "0"
    return f"{boot}/{inode}"


@dataclass(frozen=True)
class Launcher:
    """One process on one machine: where (``machine``, with ``host`` for messages), which
    (``pid``) and since when (``started``, epoch seconds, as psutil reads it)."""

    host: str
    machine: str
    pid: int
    started: float

    @classmethod
    def current(cls) -> Launcher:
        """This process."""
        me = psutil.Process()
        return cls(socket.gethostname(), machine_id(), me.pid, round(me.create_time(), 2))

    # ---- on disk and in tags ----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "machine": self.machine,
            "pid": self.pid,
            "started": self.started,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Launcher | None:
        """The identity in a run.json object; None when it is not one (a hand-edited file)."""
        if not isinstance(data, dict):
            return None
        host, machine = data.get("host"), data.get("machine")
        pid, started = data.get("pid"), data.get("started")
        if not (isinstance(host, str) and _HOST.fullmatch(host)):
            return None
        if not (isinstance(machine, str) and _MACHINE.fullmatch(machine)):
            return None
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return None
        if not isinstance(started, (int, float)) or isinstance(started, bool):
            return None
        return cls(host, machine, pid, float(started))

    def tag(self) -> str:
        """``host:pid:start:machine``: one string for a cloud tag or a lock's holder."""
        return f"{self.host}:{self.pid}:{self.started:.2f}:{self.machine}"

    @classmethod
    def from_tag(cls, text: str) -> Launcher | None:
        """The identity :meth:`tag` wrote; None for anything else (an older tflaunch's
        ``host:pid:start``, which cannot tell two machines with one hostname apart)."""
        parts = text.split(":")
        if len(parts) != 4:
            return None
        host, pid, started, machine = parts
        try:
            data = {"host": host, "machine": machine, "pid": int(pid), "started": float(started)}
        except ValueError:
            return None
        return cls.from_dict(data)

    # ---- liveness ---------------------------------------------------------------------------

    @property
    def here(self) -> bool:
        """Whether this process runs on the launcher's machine (and PID namespace)."""
        return self.machine == machine_id()

    def process(self) -> psutil.Process | None:
        """The launcher's process, if it runs on this machine and still runs: its pid, checked
        to be the same process by its start time."""
        if not self.here:
            return None
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.started) > START_TOLERANCE:
                return None  # the pid was reused
            return proc
        except (psutil.Error, OSError, ValueError):
            return None

    def alive(self) -> bool | None:
        """True while the process runs, False once it is gone; None when it runs on another
        machine, where only that machine can tell."""
        if not self.here:
            return None
        return self.process() is not None

    def describe(self) -> str:
        """For messages: ``pid 123 on laptop`` and, when it is not this machine, so."""
        elsewhere = "" if self.here else f" (another machine or container: {self.machine})"
        return f"pid {self.pid} on {self.host or '?'}{elsewhere}"
