"""Backends: how agents are started on the hosts of a plan. One folder per backend, each
exporting a ``BACKEND`` spec that :mod:`tflaunch.cluster.backends` registers; packages outside this
repository add backends through the ``tflaunch.backends`` entry-point group."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tflaunch.cluster.backends import spec_of

if TYPE_CHECKING:
    from tflaunch.launchers.base import Backend


def get_backend(name: str) -> Backend:
    """An instance of the registered backend called ``name`` (imported on demand)."""
    return spec_of(name).load()()
