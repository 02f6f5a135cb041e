"""``tflaunch tune CLUSTER_FILE``'s command line (the work is :func:`tflaunch.tools.tune.tune`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from tflaunch.tools import tune_settings as ts
from tflaunch.tools.options import flag, link_option, number, runs_dir_option
from tflaunch.tools.perfmodel_inputs import parse_link
from tflaunch.tools.tune import tune
from tflaunch.tools.tune_calibrate import TuneOptions
from tflaunch.tools.tune_settings import TuneError


def _names(ctx: click.Context, param: click.Parameter, text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))


def _ps_hosts(ctx: click.Context, param: click.Parameter, text: str) -> tuple[str, ...]:
    names = _names(ctx, param, text)
    bad = [n for n in names if n not in ts.PS_HOSTS]
    if bad or not names:
        raise TuneError(f"--ps-hosts {text!r}: give colocated, dedicated or both.")
    return names


@click.command("tune")
@click.argument("cluster_file", type=click.Path(dir_okay=False))
@click.option(
    "--verify",
    type=click.IntRange(min=0),
    default=0,
    metavar="K",
    help="Race the top K settings (interleaved runs until they separate); pick by measurement.",
)
@flag("--apply", "apply", help="Start the tuned cluster file at the end.")
@number("--steps", default=10, minimum=1, help="Timed steps of each calibration worker.")
@number("--warmup", default=3, minimum=0)
@number(
    "--verify-steps",
    default=6,
    minimum=1,
    help="The fewest timed steps of a verify run (more where calibration's steps vary).",
)
@number(
    "--verify-rounds",
    default=3,
    minimum=1,
    help="Rounds of the verify race at the most (each runs every setting still in it once).",
)
@click.option(
    "--verify-budget",
    "verify_budget_s",
    type=click.FloatRange(min=0),
    default=0.0,
    metavar="S",
    help="Start no verify round that would take the race past S seconds (0: no limit).",
)
@click.option(
    "--max-ps",
    type=click.IntRange(min=1, max=4096),
    default=None,
    help="Largest PS count tried (default: the file's PS or workers, the larger).",
)
@link_option("The link's latency and bandwidth, instead of running netbench.", parse_link)
@click.option(
    "--model",
    default=None,
    help="For a program other than tflaunch.models.benchmark: its network's name.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="For a program other than tflaunch.models.benchmark: its batch per worker.",
)
@click.option(
    "--trace",
    "trace_steps",
    default="3:3",
    show_default=True,
    metavar="FIRST:COUNT",
    help="For another program: the steps its one traced worker is measured over.",
)
@click.option(
    "--updates",
    default="",
    callback=_names,
    metavar="LIST",
    help="Narrow the grid: variable updates (comma-separated; default: all the program takes).",
)
@click.option(
    "--placements", default="", callback=_names, metavar="LIST", help="Narrow the grid: placements."
)
@click.option(
    "--transfers",
    default="",
    callback=_names,
    metavar="LIST",
    help="Narrow the grid: none, staged (--staged_vars: values one step staler), tic; for "
    "all-reduce packed (--gradient_repacking 4), float16 (--compact_gradient_transfer: gradients "
    "float16 on the wire), packed_float16.",
)
@click.option(
    "--ps-hosts",
    default=",".join(ts.PS_HOSTS),
    callback=_ps_hosts,
    show_default=True,
    metavar="LIST",
    help="Narrow the grid: colocated, dedicated.",
)
@click.option(
    "--out",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where the tuned cluster file goes (default: <file>.tuned.yaml beside it).",
)
@flag(
    "--force",
    help="Replace what stands at the tuned file's path even if tune did not write it (a file "
    "of yours; a symlink is replaced itself, never written through).",
)
@runs_dir_option("Default: the file's runs_dir.", default=None)
def tune_command(cluster_file: str, **options: Any) -> None:
    """Measure the cluster (compute, network), rank every setting the file allows by the
    performance model, and write the fastest as a cluster file."""
    sys.exit(tune(cluster_file, TuneOptions(**options), click.echo))  # each parsed to its type
