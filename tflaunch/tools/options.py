"""Click options more than one command takes, written once."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from tflaunch.errors import ConfigError
from tflaunch.models.registry import model_names

Decorator = Callable[[Any], Any]

# The cluster file a command reads (validate, plan, render, export, up).
cluster_file_argument = click.argument("cluster_file", type=click.Path())


def runs_dir_option(
    help: str = "Where the run directories are.", default: str | None = "runs"
) -> Decorator:
    """``--runs-dir`` (alias ``--run-dir``), the folder of run directories, ``runs`` by default
    (None: the cluster file's ``runs_dir``, for commands that read one)."""
    return click.option(
        "--runs-dir", "--run-dir", "runs_dir", default=default, show_default=True, help=help
    )


def flag(*decls: str, help: str) -> Decorator:
    """An option that is off unless given."""
    return click.option(*decls, is_flag=True, help=help)


def number(
    *decls: str, default: float, minimum: float, help: str | None = None, **more: Any
) -> Decorator:
    """A count (an int ``default``) or an amount (a float one) of at least ``minimum``, its
    default shown in ``--help``; ``more``: click's other settings (metavar, callback)."""
    kind = click.IntRange if isinstance(default, int) else click.FloatRange
    return click.option(
        *decls, type=kind(min=minimum), default=default, show_default=True, help=help, **more
    )


def link_option(help: str, parse: Callable[[str], Any]) -> Decorator:
    """``--link US,MB_S``: one link's latency (µs) and bandwidth (MB/s), as ``parse`` reads them
    (:func:`tflaunch.tools.perfmodel_inputs.parse_link`); None when not given."""

    def given(ctx: click.Context, param: click.Parameter, text: str | None) -> Any:
        return parse(text) if text else None

    return click.option("--link", callback=given, metavar="US,MB_S", help=help)


def model_option(help: str) -> Decorator:
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
