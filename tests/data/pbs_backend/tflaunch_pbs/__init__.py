"""The ``pbs`` backend (PBS Pro, OpenPBS, Torque): its ``pbs:`` section and its registration."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tflaunch.plugin import MAX_HOSTS, MAX_ITEMS, BackendSpec, Fail, field


@dataclass(frozen=True)
class PbsSection:
    """PBS backend settings (backend: pbs)."""

    nodes: int = field(1, minimum=1, maximum=MAX_HOSTS, doc="nodes, one agent each")
    walltime: str | None = field(None, doc="walltime, quoted: '01:00:00'", line=True)
    queue: str | None = field(None, doc="queue (qsub -q)", line=True)
    python: str = field("python3", doc="Python interpreter on the nodes", line=True)
    setup: tuple[str, ...] = field((), doc="shell lines run before the agents", maximum=MAX_ITEMS)


def check(config, fail: Fail) -> None:
    pbs = config.section(PbsSection)
    if pbs.walltime and not re.fullmatch(r"\d+(:\d\d){0,2}", pbs.walltime):
        fail(("pbs", "walltime"), f"{pbs.walltime!r} is not [[HH:]MM:]SS, e.g. '01:30:00'")
    if pbs.queue and not re.fullmatch(r"[\w.@-]+", pbs.queue):
        fail(("pbs", "queue"), f"{pbs.queue!r} is not a queue name (letters, digits, _.@-)")


BACKEND = BackendSpec(
    name="pbs",
    backend="tflaunch_pbs.backend:PbsBackend",
    section=PbsSection,
    check=check,
)
