"""The commands that work from a run id (or the runs directory, or a cloud account): ``status``,
``logs``, ``down``, ``exec``, ``report``, ``trace``, ``attach``, ``rm``, ``prune`` and ``gc``.
Each parses its arguments and calls one function per mode; ``status`` has four (``--cloud``, the
runs list, one run, one run ``--watch``), one function each (``_cloud_status``, ``_list_runs``,
``_show_run``, ``_watch_run``). :data:`RUN_COMMANDS` is what ``tflaunch/cli.py`` adds to the
group."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from tflaunch import launch
from tflaunch.cluster.config import load_config
from tflaunch.runtime.run import Run
from tflaunch.text import for_terminal
from tflaunch.tools.options import cloud_account_options, flag, runs_dir_option

run_dir_option = runs_dir_option()


def run_command(required: bool = True) -> Callable[[Callable[..., Any]], click.Command]:
    """A command on one run: its ``RUN_ID`` argument (optional unless ``required``) and
    ``--runs-dir`` first, then the command's own options."""

    def decorate(function: Callable[..., Any]) -> click.Command:
        function = click.argument("run_id", required=required)(run_dir_option(function))
        return click.command()(function)

    return decorate


@run_command(required=False)
@flag("--watch", help="Redraw every --interval seconds until the run ends.")
@click.option(
    "--interval",
    type=float,
    default=2.0,
    show_default=True,
    help="Seconds between redraws with --watch.",
)
@cloud_account_options("With --cloud", cloud_flag=True)
@flag("--all", "show_all", help="Without RUN_ID: list every run, not 20.")
@flag("--json", "as_json", help="Print machine-readable JSON.")
@click.pass_context
def status(
    ctx: click.Context,
    run_id: str | None,
    runs_dir: str,
    watch: bool,
    interval: float,
    cloud: str | None,
    account: dict[str, str | None],
    show_all: bool,
    as_json: bool,
) -> None:
    """Show a run's state and every task's state, pid, CPU %, memory (RSS) and uptime; without
    RUN_ID, list the runs under --runs-dir, newest first (with --cloud, what runs on the cloud
    accounts and what it costs)."""
    if cloud is not None:
        _cloud_status(runs_dir, cloud, account, as_json)
        return
    if any(account.values()):
        raise click.UsageError("the cloud's options go with --cloud.")
    if run_id is None:
        if watch:
            raise click.UsageError("--watch follows one run: give its RUN_ID.")
        _list_runs(runs_dir, show_all, as_json)
    elif watch:
        _watch_run(ctx, runs_dir, run_id, interval)
    else:
        _show_run(runs_dir, run_id, as_json)


def _cloud_status(runs_dir: str, cloud: str, account: dict[str, str | None], as_json: bool) -> None:
    """``status --cloud``: what runs on the cloud accounts, and what it costs."""
    from tflaunch.launchers.clouds.admin import cloud_status

    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo  # JSON alone on stdout
    for line in cloud_status(runs_dir, cloud or None, account, say, as_json):
        click.echo(line)


def _watch_run(ctx: click.Context, runs_dir: str, run_id: str, interval: float) -> None:
    """``status RUN_ID --watch``: the one-run view, redrawn every ``interval`` seconds."""
    from tflaunch.tools.report import watch_status

    run = Run.open(runs_dir, run_id)
    watch_status(run, interval, lambda: ctx.invoke(status, run_id=run_id, runs_dir=runs_dir))


def _show_run(runs_dir: str, run_id: str, as_json: bool) -> None:
    """``status RUN_ID``: the run's state, its backend's lines, every task and its progress; a
    run whose files cannot be read is said to be unreadable, and why."""
    from tflaunch.tools.report import task_table
    from tflaunch.tools.runs import UNREADABLE, liveness, run_row

    run = Run.open(runs_dir, run_id)
    if as_json:
        from tflaunch.runtime.runctl import task_states

        row = run_row(run)
        readable = row.state != UNREADABLE and run.plan_path.exists()
        tasks = list(task_states(run).values()) if readable else []
        click.echo(json.dumps({**asdict(row), "tasks": tasks}, indent=2))
        return
    try:
        run.checked_record()
    except OSError as err:  # missing, not JSON, or not a record: say so, not "backend None"
        click.echo(f"run {run.id}: unreadable: {err}")
        click.echo("its run.json cannot say its state; 'tflaunch logs' still reads its logs")
        return
    state, why = liveness(run)
    if state == UNREADABLE:  # e.g. a detached run's plan.json, which names its hosts
        click.echo(f"run {run.id}: unreadable: {why}")
        return
    record = run.record()
    click.echo(
        f"run {run.id}: {state} (backend {record.backend}"
        + (f", exit code {record.exit_code}" if record.exit_code is not None else "")
        + ")"
    )
    if why:
        click.echo(f"state unknown: {why}")
    for line in launch.backend_of(run).describe(run):
        click.echo(line)
    if not run.plan_path.exists():
        click.echo("no plan yet: the run's machines are being made")
        return
    for line in task_table(run):
        click.echo(line)
    from tflaunch.tools.step_rates import status_lines

    for line in status_lines(run):
        click.echo(line)


def _list_runs(runs_dir: str, show_all: bool, as_json: bool) -> None:
    from tflaunch.tools import runs

    shown, total = runs.run_rows(runs_dir, limit=None if show_all else runs.DEFAULT_LIMIT)
    if as_json:
        click.echo(json.dumps(runs.rows_json(shown), indent=2))
    elif not total:
        click.echo(f"no runs under {runs_dir}/ (start one with 'tflaunch up CLUSTER_FILE')")
    else:
        for line in runs.format_rows(shown, show_all, total):
            click.echo(line)


@click.command()
@click.argument("run_ids", nargs=-1, required=True, metavar="RUN_ID...")
@run_dir_option
@flag(
    "--force",
    help="Also remove runs whose state is unknown (launched from another machine, container or "
    "PID namespace): if one still runs there, its logs, events and plan are lost. Live runs "
    "are refused all the same.",
)
def rm(run_ids: tuple[str, ...], runs_dir: str, force: bool) -> None:
    """Remove the directories of ended (or lost) runs; a live run is refused, and so is one
    whose launcher is on another machine, unless --force."""
    from tflaunch.tools.runs import check_removable, find_removable, remove_run

    found = [find_removable(runs_dir, run_id) for run_id in run_ids]  # all of them, first
    for path in found:
        check_removable(path, force)
    for path in found:
        click.echo(remove_run(path))


@click.command()
@click.option(
    "--older-than",
    required=True,
    metavar="AGE",
    help="Remove runs that ended (or were lost) longer ago than this: 30m, 12h, 7d, 2w.",
)
@run_dir_option
@flag("--dry-run", help="Say what would be removed; remove nothing.")
def prune(older_than: str, runs_dir: str, dry_run: bool) -> None:
    """Remove old run directories under --runs-dir; live runs are kept, and so are runs whose
    launcher is on another machine (state unknown)."""
    from tflaunch.tools import runs

    count = runs.prune(runs_dir, runs.parse_age(older_than), dry_run, click.echo)
    click.echo(f"{count} run(s) {'would be ' if dry_run else ''}removed")


@click.command()
@click.argument("run_id")
@click.option("--task", "tasks", multiple=True, help="Only this task (repeatable), e.g. worker:1.")
@flag("-f", "--follow", help="Keep printing new lines until the run ends.")
@run_dir_option
def logs(run_id: str, tasks: tuple[str, ...], follow: bool, runs_dir: str) -> None:
    """Print the logs of a run's tasks."""
    from tflaunch.runtime import runctl

    run = Run.open(runs_dir, run_id)
    backend = launch.backend_of(run)
    backend.refresh(run)  # a run that lives elsewhere (detached ssh) is brought here first
    for line in runctl.follow_logs(run, list(tasks), follow, lambda: backend.cluster_alive(run)):
        click.echo(for_terminal(line, sys.stdout))


@run_command(required=False)
@click.option("--cluster", default=None, help="Terminate this kept cluster (up --keep) instead.")
@click.option(
    "--file",
    "-f",
    "cluster_file",
    default=None,
    type=click.Path(),
    help="With --cluster: the cluster file whose ssh.provision names the account (a kept "
    "cluster made from another machine).",
)
@cloud_account_options("With --cluster")
@click.pass_context
def down(
    ctx: click.Context,
    run_id: str | None,
    runs_dir: str,
    cluster: str | None,
    cluster_file: str | None,
    cloud: str | None,
    account: dict[str, str | None],
) -> None:
    """Stop a run: every task on every host (or, with --cluster, end a kept cluster, from any
    machine with the account: -f CLUSTER_FILE, or --cloud and its options such as --region,
    say where it runs)."""
    if cluster:
        from tflaunch.launchers.clouds.admin import down_cluster

        if run_id:
            raise click.UsageError("give a run id or --cluster NAME, not both.")
        config = load_config(cluster_file) if cluster_file else None
        given = ctx.get_parameter_source("runs_dir") != click.core.ParameterSource.DEFAULT
        runs = runs_dir if given or config is None else None  # else the file's, as 'up' does
        click.echo(down_cluster(cluster, runs, click.echo, config, cloud, account))
        return
    if cluster_file or cloud or any(account.values()):
        flags = ", ".join(f"--{n.replace('_', '-')}" for n in account)
        raise click.UsageError(f"-f, --cloud and {flags} go with --cluster NAME.")
    if not run_id:
        raise click.UsageError("give the run id to stop, or --cluster NAME.")
    run = Run.open(runs_dir, run_id)
    backend = launch.backend_of(run)
    try:
        grace = run.read_plan().supervision.grace_period
    except OSError:  # no plan yet (its machines are being made), or not one: stop it anyway
        grace = 0.0
    click.echo(backend.down(run, grace))


@click.command(name="exec", context_settings={"ignore_unknown_options": True})
@click.argument("run_id")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@run_dir_option
def exec_(run_id: str, command: tuple[str, ...], runs_dir: str) -> None:
    """Run COMMAND on every host of a run, in its workdir, output prefixed by host:
    tflaunch exec RUN -- nvidia-smi"""
    run = Run.open(runs_dir, run_id)
    sys.exit(launch.backend_of(run).exec_command(run, list(command), click.echo))


@click.command()
@click.argument("cluster_file", required=False, type=click.Path())
@cloud_account_options("The account")
@flag("--dry-run", help="List what would be terminated; terminate nothing.")
def gc(
    cluster_file: str | None,
    cloud: str | None,
    account: dict[str, str | None],
    dry_run: bool,
) -> None:
    """Terminate leaked instances: tflaunch-tagged instances of a cloud account (the cluster
    file's, or --cloud and its options) whose run ended or whose launcher is gone."""
    from tflaunch.launchers.clouds.admin import gc as sweep

    config = load_config(cluster_file) if cluster_file else None
    for line in sweep(config, cloud, account, dry_run, click.echo):
        click.echo(line)


@run_command()
@click.option("--out", "out_dir", default=None, help="Where to write (default: the run directory).")
@flag("--html", "as_html", help="Also write report.html: the whole run on one page.")
@flag(
    "--force",
    help="With --out: replace files there that are not tflaunch's report (a symlink is "
    "replaced itself, never written through).",
)
def report(run_id: str, runs_dir: str, out_dir: str | None, as_html: bool, force: bool) -> None:
    """Plot CPU, packets and memory over time from a run's samples, and print a summary table."""
    from tflaunch.tools.report import make_report

    run = Run.open(runs_dir, run_id)
    if as_html:
        from tflaunch.tools.report_html import write_html_report

        click.echo(f"wrote {write_html_report(run, Path(out_dir) if out_dir else None, force)}")
        return
    _, files = make_report(run, out_dir, show=click.echo, force=force)
    click.echo("wrote " + ", ".join(str(f) for f in files))


@run_command()
def trace(run_id: str, runs_dir: str) -> None:
    """Summarise a traced run (up --trace) per task and draw its timeline into trace.png, or
    say why it has no trace."""
    from tflaunch.trace import show

    run = Run.open(runs_dir, run_id)
    launch.backend_of(run).refresh(run)  # a run that lives elsewhere (detached ssh)
    show.show_trace(run.dir / "trace", click.echo, refuse_without=True)


@run_command()
def attach(run_id: str, runs_dir: str) -> None:
    """Open the tmux session of a run started with 'up --terminals tmux'."""
    launch.attach(Run.open(runs_dir, run_id))


RUN_COMMANDS = (status, logs, down, exec_, report, trace, attach, rm, prune, gc)
