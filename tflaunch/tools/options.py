"""Click options more than one command takes, written once."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from tflaunch.errors import ConfigError
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


def cloud_account_options(what: str, cloud_flag: bool = False):  # noqa: ANN201 (a decorator)
    """``--cloud NAME`` and every registered cloud's admin options (EC2: ``--region``,
    ``--profile``), which name an account without a cluster file; the command gets ``cloud``
    and ``account``, a dict of the options by name. ``cloud_flag``: ``--cloud`` alone is
    allowed too (``status --cloud``)."""
    from tflaunch.launchers.clouds.admin import admin_options

    try:
        extra = admin_options()
    except ConfigError:  # a broken cloud plugin: the command that uses it says so
        extra = []

    def decorate(command):  # noqa: ANN001, ANN202
        names = [option.name for option in extra]

        def gather(**kwargs):  # noqa: ANN003, ANN202
            kwargs["account"] = {name: kwargs.pop(name) for name in names}
            return command(**kwargs)

        wrapped = functools.update_wrapper(gather, command)  # its options too (__click_params__)
        wrapped.__click_params__ = list(getattr(command, "__click_params__", []))
        for option in reversed(extra):
            wrapped = click.option(
                option.flag, option.name, default=None, hidden=option.hidden,
                help=f"{what}: {option.help}",
            )(wrapped)  # fmt: skip
        if cloud_flag:
            return click.option(
                "--cloud", "cloud", is_flag=False, flag_value="", default=None,
                help="List the tflaunch instances of the accounts the runs directory knows "
                "(runs and kept clusters): cluster, role, type, state, age, idle time, "
                "autostop, cost; with a NAME, also that cloud's account the options below name.",
            )(wrapped)  # fmt: skip
        return click.option(
            "--cloud",
            default=None,
            help=f"{what}: the cloud (default: the file's, else the default one).",
        )(wrapped)

    return decorate
