"""Launchers: everything that puts a plan on machines.

- Backends (``local/``, ``slurm/``, ``ssh/``): how agents are started on the hosts of a plan, one
  folder each, exporting a ``BACKEND`` spec that :mod:`tflaunch.cluster.backends` registers
  (packages outside this repository add theirs through the ``tflaunch.backends`` entry-point
  group), over the interface they fill in (``base.py``) and the batch schedulers' base
  (``batch/``).
- Clouds (``clouds/``): where ``ssh.provision``'s machines come from, one folder per provider.
- ``tensorboard_serve.py``: TensorBoard on a run's logs, served here or forwarded, for every
  backend.

This module finds a backend by name (:func:`get_backend`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tflaunch.cluster.backends import spec_of

if TYPE_CHECKING:
    from tflaunch.launchers.base import Backend


def get_backend(name: str) -> Backend:
    """An instance of the registered backend called ``name`` (imported on demand)."""
    return spec_of(name).load()()
