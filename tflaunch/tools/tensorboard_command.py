"""``tflaunch tensorboard RUN``: TensorBoard over a run's summaries, reachable on a local port.

Where TensorBoard runs is the run's backend's choice (:meth:`Backend.tensorboard
<tflaunch.launchers.base.Backend.tensorboard>`): here over the run directory for local and Slurm
runs (on this machine or a file system shared with the nodes); on the first worker's host, with a
local port forwarded to it, for SSH runs.
"""

from __future__ import annotations

import sys

import click

from tflaunch import launch
from tflaunch.launchers.tensorboard_serve import DEFAULT_PORT
from tflaunch.runtime.run import Run
from tflaunch.tools.options import runs_dir_option


@click.command("tensorboard")
@click.argument("run_id")
@runs_dir_option()
@click.option("--logdir", default=None, help="Default: the run directory (on the host, for SSH).")
@click.option("--port", type=int, default=DEFAULT_PORT, show_default=True, help="Local port.")
@click.option("--remote-port", type=int, default=DEFAULT_PORT, show_default=True)
def tensorboard_command(
    run_id: str, runs_dir: str, logdir: str | None, port: int, remote_port: int
) -> None:
    """Start TensorBoard where the run's summaries are and forward it to a local port."""
    run = Run.open(runs_dir, run_id)
    sys.exit(launch.backend_of(run).tensorboard(run, logdir, port, remote_port, click.echo))
