"""The command line. Commands parse their arguments, call one function per mode, and map domain
errors to exit codes (2 for bad input, the cluster's own code for a failed run). Here: the group
and the commands that read a cluster file (``validate``, ``schema``, ``plan``, ``render``,
``export``, ``up``); those that work from a run id are in :mod:`tflaunch.tools.run_commands`, the
tools' in their ``tflaunch/tools/*_command`` modules. ``up --trace``
has :func:`tflaunch.launch.traced` make one :class:`~tflaunch.trace.request.TraceRequest` that
goes into the config (every task's environment) and the launch options, and shows the merged
trace after the run."""

from __future__ import annotations

import json
import shlex
import sys
import traceback
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
from tflaunch.tools.options import cluster_file_argument, flag, runs_dir_option
from tflaunch.tools.placement_command import placement
from tflaunch.tools.run_commands import RUN_COMMANDS
from tflaunch.tools.tensorboard_command import tensorboard_command
from tflaunch.tools.tune_command import tune_command
from tflaunch.trace.request import DEFAULT_PORT_OFFSET, TraceRequest

RENDER_FORMATS = ("tf_config", "cluster_spec", "env", "command")


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
@flag("--debug", help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Run distributed TensorFlow clusters (PS, workers, chief, evaluator) from one YAML file,
    locally, under Slurm, or on machines reached over SSH."""
    ctx.obj = {"debug": debug}


def _load_plan(path: str) -> tuple[ClusterConfig, Plan]:
    config = load_config(path)
    return config, launch.plan_cluster(config)


@cli.command()
@cluster_file_argument
@flag(
    "--offline",
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
@cluster_file_argument
@flag("--json", "as_json", help="Print the whole plan as JSON.")
@flag(
    "--expand",
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
@cluster_file_argument
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
@cluster_file_argument
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
def export(cluster_file: str, fmt: str, **overrides: str | None) -> None:
    """Print the cluster as a manifest for another system (a Kubeflow TFJob); what it cannot
    express is an error, what only tflaunch's launcher watches is a warning."""
    import yaml

    from tflaunch.tools.tfjob import export_tfjob

    warn = lambda text: click.echo(f"tflaunch: warning: {text}", err=True)  # noqa: E731
    # --image, --namespace, --checkpoint-dir: export_tfjob's parameters of the same names
    manifest = export_tfjob(load_config(cluster_file), **overrides, warn=warn)
    click.echo(yaml.safe_dump(manifest, sort_keys=False, width=100), nl=False)


@cli.command()
@cluster_file_argument
@flag(
    "--detach",
    help="Return once the cluster is ready (batch backends such as Slurm: once the job is "
    "submitted); print the run id.",
)
@runs_dir_option("Where run directories go (default: the file's runs_dir).", default=None)
@flag("--dry-run", help="Print what would be started (Slurm: the job script) and start nothing.")
@flag(
    "--down",
    "down_at_end",
    help="Terminate the machines the run created (ssh.provision) when it ends, however it ends.",
)
@flag(
    "--keep",
    help="Keep the machines (ssh.provision) as the cluster of the file's name, or reuse that "
    "kept cluster when it fits the plan; 'tflaunch down --cluster NAME' ends it.",
)
@flag("--recreate", help="With --keep: replace a kept cluster that does not fit the plan.")
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


cli.add_command(placement)
cli.add_command(bench_command)
cli.add_command(netbench_command)
cli.add_command(model_command)
cli.add_command(tensorboard_command)
cli.add_command(tune_command)
for command in RUN_COMMANDS:
    cli.add_command(command)


def main() -> None:
    cli(prog_name="tflaunch")


if __name__ == "__main__":
    main()
