"""The command line. Commands parse their arguments, call one function per mode, and map domain
errors to exit codes (2 for bad input, the cluster's own code for a failed run). Most commands
have one mode; ``status`` has four (``--cloud``, the runs list, one run, one run ``--watch``), one
function each (``_cloud_status``, ``_list_runs``, ``_show_run``, ``_watch_run``). ``up --trace``
has :func:`tflaunch.launch.traced` make one :class:`~tflaunch.trace.request.TraceRequest` that
goes into the config (every task's environment) and the launch options, and shows the merged
trace after the run."""

from __future__ import annotations

import functools
import json
import shlex
import sys
import traceback
from dataclasses import asdict
from pathlib import Path

import click

from tflaunch import __version__, launch
from tflaunch.cluster.config import ClusterConfig, config_schema, env_name_problem, load_config
from tflaunch.cluster.placement import cpu_list, gpu_sources
from tflaunch.cluster.plan import Plan, parse_task_name
from tflaunch.cluster.render import long_placeholders, render_task, tf_config
from tflaunch.errors import ConfigError, MissingExtra, TflaunchError
from tflaunch.runtime.run import Run, new_run_id
from tflaunch.text import aligned, for_terminal
from tflaunch.tools.bench_sweep import bench_command
from tflaunch.tools.model_command import model_command
from tflaunch.tools.netbench_command import netbench_command
from tflaunch.tools.options import runs_dir_option
from tflaunch.tools.placement_command import placement
from tflaunch.tools.tensorboard_command import tensorboard_command
from tflaunch.tools.tune_command import tune_command
from tflaunch.trace.request import DEFAULT_PORT_OFFSET, TraceRequest

RENDER_FORMATS = ("tf_config", "cluster_spec", "env", "command")


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


class CliGroup(click.Group):
    """Turns domain errors into one-paragraph messages and exit codes (tracebacks with --debug)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TflaunchError as err:
            if ctx.obj and ctx.obj.get("debug"):
                traceback.print_exc()
            message = for_terminal(str(err), sys.stderr)  # it may quote a host's reply
            click.echo(f"tflaunch: error: {message}", err=True)
            sys.exit(err.exit_code)


@click.group(cls=CliGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tflaunch")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Run distributed TensorFlow clusters (PS, workers, chief, evaluator) from one YAML file,
    locally, under Slurm, or on machines reached over SSH."""
    ctx.obj = {"debug": debug}


def _load_plan(path: str) -> tuple[ClusterConfig, Plan]:
    config = load_config(path)
    return config, launch.plan_cluster(config)


@cli.command()
@click.argument("cluster_file", type=click.Path())
@click.option(
    "--offline",
    is_flag=True,
    help="Check the file and its plan only, not this machine (program on PATH, free ports, "
    "hosts that resolve, program.env_from set).",
)
def validate(cluster_file: str, offline: bool) -> None:
    """Check a cluster file, the plan it makes, and what can be checked here before starting."""
    config = load_config(cluster_file)
    try:
        plan = launch.plan_cluster(config)
    except MissingExtra as err:  # its hosts come from a cloud whose SDK is not installed here
        click.echo(
            f"{cluster_file}: file ok; planning and running it need {err.package} (pip install "
            f"'tflaunch[{err.extra}]'): its hosts come from the cloud"
        )
        return
    if not offline:
        launch.check_here(config, plan)
    click.echo(
        f"{cluster_file}: ok ({len(plan.tasks)} tasks on "
        f"{len(plan.hosts_with_tasks())} host(s), backend {config.backend})"
    )
    note = config.ps_default_note()
    if note:
        click.echo(f"note: {note}")


@cli.command()
def schema() -> None:
    """Print the JSON Schema of the cluster file format (for editors)."""
    click.echo(json.dumps(config_schema(), indent=2))


@cli.command()
@click.argument("cluster_file", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the whole plan as JSON.")
@click.option(
    "--expand",
    is_flag=True,
    help="With --json: also every task's argv and environment, rendered (grows with the square "
    "of the cluster: for small clusters).",
)
def plan(cluster_file: str, as_json: bool, expand: bool) -> None:
    """Show every task: role, host, address:port, GPUs, command."""
    config, the_plan = _load_plan(cluster_file)
    if as_json:
        if expand:
            data = the_plan.to_dict()
            for task, entry in zip(the_plan.tasks, data["tasks"], strict=True):
                view = render_task(the_plan, task)
                entry.update(argv=list(view.argv), env=dict(view.env))
            click.echo(json.dumps(data, indent=2))
        else:
            click.echo(the_plan.to_json(), nl=False)
        return
    pinned = any(task.cpus for task in the_plan.tasks)
    # Lists of the whole cluster would make the table grow with its square: shown once below.
    kept = long_placeholders(the_plan)
    # GPU ids (CUDA_VISIBLE_DEVICES), not counts; CPU cores as a list, likewise.
    rows = [("TASK", "HOST", "ADDRESS", "GPU_IDS", *(("CPUS",) if pinned else ()), "COMMAND")]
    by_default = "*" if config.ps_by_default else ""
    for task in the_plan.tasks:
        gpus = ",".join(task.gpus) if task.gpus else "-"
        cpus = (cpu_list(task.cpus),) if pinned else ()
        command = shlex.join(render_task(the_plan, task, keep=kept).argv)
        name = task.name + (by_default if task.job == "ps" else "")
        rows.append((name, task.host, task.address or "-", gpus, *cpus, command))
    for line in aligned(rows):
        click.echo(line)
    if by_default:
        click.echo(f"* a PS by default: {config.ps_default_note()}")
    ports = launch.ports_line(config, the_plan)
    if ports:
        click.echo(ports)
    checkpoints = launch.checkpoints_line(config, the_plan)
    if checkpoints:
        click.echo(checkpoints)
    for line in gpu_sources(the_plan):
        click.echo(line)
    for name, count in kept.items():
        click.echo(
            f"{{{name}}}: {count:,} addresses, left unexpanded above; see "
            f"'tflaunch render {cluster_file} --task TASK --format command'"
        )


@cli.command()
@click.argument("cluster_file", type=click.Path())
@click.option("--task", "task_name", required=True, help="The task, e.g. worker:1.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(RENDER_FORMATS),
    default="tf_config",
    show_default=True,
    help="What to print.",
)
def render(cluster_file: str, task_name: str, fmt: str) -> None:
    """Print one task's view: its TF_CONFIG, the ClusterSpec, its environment or its command."""
    parse_task_name(task_name)
    _, the_plan = _load_plan(cluster_file)
    task = the_plan.task(task_name)
    if fmt == "tf_config":
        click.echo(json.dumps(tf_config(the_plan, task), indent=2))
    elif fmt == "cluster_spec":
        click.echo(json.dumps({j: list(a) for j, a in the_plan.cluster.items()}, indent=2))
    elif fmt == "env":
        env = render_task(the_plan, task).env
        for key in sorted(env):
            problem = env_name_problem(key)
            if problem:  # the plan came from a checked file; this guards 'eval "$(render)"'
                raise ConfigError(f"{cluster_file}: program.env: {problem}.")
            click.echo(f"export {key}={shlex.quote(env[key])}")
    else:
        view = render_task(the_plan, task)
        click.echo(f"cd {shlex.quote(view.workdir)} && {shlex.join(view.argv)}")


@cli.command()
@click.argument("cluster_file", type=click.Path())
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["tfjob"]),
    required=True,
    help="tfjob: a Kubeflow TFJob (kubeflow.org/v1) for kubectl apply -f.",
)
@click.option("--image", default=None, help="Container image (default: kubernetes.image).")
@click.option("--namespace", default=None, help="Namespace (default: kubernetes.namespace).")
@click.option(
    "--checkpoint-dir",
    default=None,
    help="{checkpoint_dir} in the containers (default: kubernetes.checkpoint_dir).",
)
def export(
    cluster_file: str,
    fmt: str,
    image: str | None,
    namespace: str | None,
    checkpoint_dir: str | None,
) -> None:
    """Print the cluster as a manifest for another system (a Kubeflow TFJob); what it cannot
    express is an error, what only tflaunch's launcher watches is a warning."""
    import yaml

    from tflaunch.tools.tfjob import export_tfjob

    warn = lambda text: click.echo(f"tflaunch: warning: {text}", err=True)  # noqa: E731
    manifest = export_tfjob(load_config(cluster_file), image, namespace, checkpoint_dir, warn)
    click.echo(yaml.safe_dump(manifest, sort_keys=False, width=100), nl=False)


@cli.command()
@click.argument("cluster_file", type=click.Path())
@click.option(
    "--detach",
    is_flag=True,
    help="Return once the cluster is ready (batch backends such as Slurm: once the job is "
    "submitted); print the run id.",
)
@click.option(
    "--runs-dir",
    "--run-dir",
    "runs_dir",
    default=None,
    help="Where run directories go (default: the file's runs_dir).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print what would be started (Slurm: the job script) and start nothing.",
)
@click.option(
    "--down",
    "down_at_end",
    is_flag=True,
    help="Terminate the machines the run created (ssh.provision) when it ends, however it ends.",
)
@click.option(
    "--keep",
    is_flag=True,
    help="Keep the machines (ssh.provision) as the cluster of the file's name, or reuse that "
    "kept cluster when it fits the plan; 'tflaunch down --cluster NAME' ends it.",
)
@click.option(
    "--recreate",
    is_flag=True,
    help="With --keep: replace a kept cluster that does not fit the plan.",
)
@click.option("--run-id", default=None, hidden=True)
@click.option("--attached-daemon", is_flag=True, hidden=True)
@click.option(
    "--terminals",
    type=click.Choice(["tmux", "xterm", "gnome-terminal"]),
    default=None,
    help="Local backend: one window per task showing its output (tmux: headless, "
    "see 'tflaunch attach').",
)
@click.option(
    "--trace",
    "trace_steps",
    default=None,
    metavar="STEPS",
    help="Profile every task of any Python TensorFlow program and merge the traces into "
    "<run>/trace/trace.json: COUNT steps from the leader's first step line at or past FIRST "
    "(FIRST:COUNT, or COUNT from step 2; steps as supervision.step_pattern finds them).",
)
@click.option(
    "--trace-at",
    default=None,
    metavar="TIME",
    help="Instead of --trace: open the trace window this long after the start (30s, 2m).",
)
@click.option(
    "--trace-for",
    default=None,
    metavar="TIME",
    help="How long the trace window lasts (default: COUNT steps at the rate seen; 5s with "
    "--trace-at).",
)
@click.option(
    "--trace-port-offset",
    type=int,
    default=DEFAULT_PORT_OFFSET,
    show_default=True,
    help="Each task's profiler server listens on its cluster port plus this.",
)
def up(
    cluster_file: str,
    detach: bool,
    runs_dir: str | None,
    dry_run: bool,
    down_at_end: bool,
    keep: bool,
    recreate: bool,
    run_id: str | None,
    attached_daemon: bool,
    terminals: str | None,
    trace_steps: str | None,
    trace_at: str | None,
    trace_for: str | None,
    trace_port_offset: int,
) -> None:
    """Start the cluster, stream its output, and exit with its result."""
    if keep and down_at_end:
        raise click.UsageError("--keep keeps the machines and --down terminates them; pick one.")
    if recreate and not keep:
        raise click.UsageError("--recreate replaces a kept cluster; it needs --keep.")
    config = load_config(cluster_file)
    request = None
    if trace_steps or trace_at or trace_for:
        run_id = run_id or new_run_id(config.name)
        runs = runs_dir or config.runs_dir
        config, request = launch.traced(
            config, runs, run_id, trace_steps, trace_at, trace_for, trace_port_offset
        )
    if dry_run:
        run_id = run_id or new_run_id(config.name)
        click.echo(launch.dry_run(config, runs_dir, run_id))
        run_dir = Path(runs_dir or config.runs_dir).resolve() / run_id
        click.echo(
            f"tflaunch: dry run: nothing was started, and the run directory {run_dir} it names "
            f"was not made; 'tflaunch up {cluster_file}' makes it and starts the run.",
            err=True,
        )
        return
    from tflaunch.launchers.base import LaunchOptions

    options = LaunchOptions(
        terminals=terminals,
        down_at_end=down_at_end,
        keep=keep,
        recreate=recreate,
        trace=request,
    )
    result = launch.up(config, cluster_file, runs_dir, run_id, detach, attached_daemon, options)
    if isinstance(result, str):
        click.echo(result)
        return
    if request is not None:
        _show_trace(config, request, Run.open(runs_dir or config.runs_dir, run_id))
    sys.exit(result.code)


def _show_trace(config: ClusterConfig, request: TraceRequest, run: Run) -> None:
    from tflaunch.trace import show

    trace_dir = run.dir / "trace"
    on_hosts = launch.backend_for(config.backend).host_run_dir(config, run.id) is not None
    if on_hosts and not show.has_result(trace_dir):
        click.echo(f"trace: on the first worker's host under {request.trace_dir}")
    else:
        show.show_verdict(trace_dir, click.echo)


run_dir_option = runs_dir_option()


@cli.command()
@click.argument("run_id", required=False)
@run_dir_option
@click.option("--watch", is_flag=True, help="Redraw every --interval seconds until the run ends.")
@click.option(
    "--interval",
    type=float,
    default=2.0,
    show_default=True,
    help="Seconds between redraws with --watch.",
)
@cloud_account_options("With --cloud", cloud_flag=True)
@click.option("--all", "show_all", is_flag=True, help="Without RUN_ID: list every run, not 20.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
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


@cli.command()
@click.argument("run_ids", nargs=-1, required=True, metavar="RUN_ID...")
@run_dir_option
@click.option(
    "--force",
    is_flag=True,
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


@cli.command()
@click.option(
    "--older-than",
    required=True,
    metavar="AGE",
    help="Remove runs that ended (or were lost) longer ago than this: 30m, 12h, 7d, 2w.",
)
@run_dir_option
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
def prune(older_than: str, runs_dir: str, dry_run: bool) -> None:
    """Remove old run directories under --runs-dir; live runs are kept, and so are runs whose
    launcher is on another machine (state unknown)."""
    from tflaunch.tools import runs

    count = runs.prune(runs_dir, runs.parse_age(older_than), dry_run, click.echo)
    click.echo(f"{count} run(s) {'would be ' if dry_run else ''}removed")


@cli.command()
@click.argument("run_id")
@click.option("--task", "tasks", multiple=True, help="Only this task (repeatable), e.g. worker:1.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the run ends.")
@run_dir_option
def logs(run_id: str, tasks: tuple[str, ...], follow: bool, runs_dir: str) -> None:
    """Print the logs of a run's tasks."""
    from tflaunch.runtime import runctl

    run = Run.open(runs_dir, run_id)
    backend = launch.backend_of(run)
    backend.refresh(run)  # a run that lives elsewhere (detached ssh) is brought here first
    for line in runctl.follow_logs(run, list(tasks), follow, lambda: backend.cluster_alive(run)):
        click.echo(for_terminal(line, sys.stdout))


@cli.command()
@click.argument("run_id", required=False)
@run_dir_option
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


@cli.command(name="exec", context_settings={"ignore_unknown_options": True})
@click.argument("run_id")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@run_dir_option
def exec_(run_id: str, command: tuple[str, ...], runs_dir: str) -> None:
    """Run COMMAND on every host of a run, in its workdir, output prefixed by host:
    tflaunch exec RUN -- nvidia-smi"""
    run = Run.open(runs_dir, run_id)
    sys.exit(launch.backend_of(run).exec_command(run, list(command), click.echo))


@cli.command()
@click.argument("cluster_file", required=False, type=click.Path())
@cloud_account_options("The account")
@click.option("--dry-run", is_flag=True, help="List what would be terminated; terminate nothing.")
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


cli.add_command(placement)
cli.add_command(bench_command)
cli.add_command(netbench_command)
cli.add_command(model_command)
cli.add_command(tensorboard_command)
cli.add_command(tune_command)


@cli.command()
@click.argument("run_id")
@run_dir_option
@click.option("--out", "out_dir", default=None, help="Where to write (default: the run directory).")
@click.option(
    "--html", "as_html", is_flag=True, help="Also write report.html: the whole run on one page."
)
@click.option(
    "--force",
    is_flag=True,
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


@cli.command()
@click.argument("run_id")
@run_dir_option
def trace(run_id: str, runs_dir: str) -> None:
    """Summarise a traced run (up --trace) per task and draw its timeline into trace.png, or
    say why it has no trace."""
    from tflaunch.trace import show

    run = Run.open(runs_dir, run_id)
    launch.backend_of(run).refresh(run)  # a run that lives elsewhere (detached ssh)
    show.show_trace(run.dir / "trace", click.echo, refuse_without=True)


@cli.command()
@click.argument("run_id")
@run_dir_option
def attach(run_id: str, runs_dir: str) -> None:
    """Open the tmux session of a run started with 'up --terminals tmux'."""
    launch.attach(Run.open(runs_dir, run_id))


def main() -> None:
    cli(prog_name="tflaunch")


if __name__ == "__main__":
    main()
