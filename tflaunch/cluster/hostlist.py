"""Slurm host lists (``nid0[0001-0003,0007]``, ``gpu-[1-2]-[01-04]``) to node names and back.

Parsing is python-hostlist's, the library LLNL and NSC tools use, not hand-written: host list
syntax has corners (zero padding, several bracket groups, comma lists inside and outside brackets)
where a home-made parser goes wrong. The tests check it against ``scontrol show hostnames``.
"""

from __future__ import annotations

from collections.abc import Iterable

import hostlist as _hostlist

from tflaunch.errors import LaunchError


def expand(nodelist: str) -> list[str]:
    """Node names of a Slurm host list, in Slurm's order, duplicates kept as Slurm keeps them."""
    text = nodelist.strip()
    if not text:
        raise LaunchError(
            "the Slurm node list is empty; is this running inside a Slurm allocation "
            "(SLURM_JOB_NODELIST set)?"
        )
    try:
        return list(_hostlist.expand_hostlist(text, allow_duplicates=True))
    except _hostlist.BadHostlist as err:
        raise LaunchError(
            f"cannot read the Slurm node list {nodelist!r} ({err}). It should look "
            "like 'nid0[0001-0004]' or 'node1,node3'."
        ) from None


def compress(names: Iterable[str]) -> str:
    """The shortest host list naming ``names`` (sorted, as Slurm prints them)."""
    return _hostlist.collect_hostlist(list(names))
