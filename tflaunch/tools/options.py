"""Click options more than one command takes, written once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from tflaunch.models.registry import model_names


def runs_dir_option(help: str = "Where the run directories are.") -> Callable[[Any], Any]:
    """``--runs-dir`` (alias ``--run-dir``), the folder of run directories, ``runs`` by default."""
    return click.option(
        "--runs-dir", "--run-dir", "runs_dir", default="runs", show_default=True, help=help
    )


def model_option(help: str) -> Callable[[Any], Any]:
    """``--model``: a network of :mod:`tflaunch.models.registry` (aliases accepted), Inception v3
    by default."""
    return click.option(
        "--model",
        type=click.Choice(model_names(aliases=True)),
        default="inception3",
        show_default=True,
        help=help,
    )
