"""``tflaunch model``: the click command parses its options into one :class:`ModelOptions` and
calls :func:`run_model`, which gathers the inputs (saved, or measured figures and the model's
variables), predicts every setting and prints the recommendation. Domain errors
(:class:`~tflaunch.tools.perfmodel.ModelError`) leave through the CLI group as exit code 2."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from tflaunch.tools import perfmodel as pm
from tflaunch.tools import perfmodel_inputs as pi
from tflaunch.tools.options import flag, link_option, model_option, number, runs_dir_option
from tflaunch.tools.perfmodel_text import inputs_line, mode_line, prediction_lines


@dataclass(frozen=True)
class ModelOptions:
    """What ``tflaunch model`` was asked, parsed: where the inputs come from and the grid."""

    workers: tuple[int, ...] = (1, 2, 4, 8)
    ps_counts: tuple[int, ...] = (1, 2, 3, 4)
    inputs_path: Path | None = None  # saved inputs (--inputs): nothing else needed
    save_path: Path | None = None
    netbench_path: Path | None = None  # the link: a netbench result, or ...
    link: pm.Link | None = None  # ... given (--link)
    compute_img_s: float | None = None  # the compute: a lone worker's images/sec, or ...
    from_run: str | None = None  # ... a traced one-worker run in runs_dir
    runs_dir: str = "runs"
    batch_size: int = 32
    model: str = "inception3"
    num_classes: int = 1001
    per_variable_s: float = 0.0
    nic: bool = True
    shared_cores: bool = False
    compute_at_img_s: tuple[tuple[int, float], ...] = ()  # (W, each lone worker's img/s)
    show_all: bool = False
    overlap: bool = False
    staged: bool = False
    sync: bool = False
    packs: int = 1
    compact: bool = False
    bucket_mb: float = 0.0


def run_model(options: ModelOptions, echo: Callable[[str], None]) -> None:
    """Predict images/sec for every setting of the grid and recommend one per worker count."""
    if options.sync and options.overlap:
        raise pm.ModelError(
            "--sync with --overlap: ordered reads under the synchronous barrier are not in the "
            "model; give --staged (staged variables) or leave --overlap out."
        )
    inputs = model_inputs(options, echo)
    if options.save_path:
        options.save_path.write_text(json.dumps(inputs.to_dict(), indent=1), encoding="utf-8")
    echo("Assumptions:\n" + pm.ASSUMPTIONS + "\n")
    echo(inputs_line(inputs))
    bucket_bytes = int(options.bucket_mb * 1e6)
    echo(mode_line(options.sync, options.packs, options.compact, bucket_bytes))
    for w in options.workers:
        if w > 1:
            mb = pm.suggest_bucket_bytes(inputs, w, options.compact) / 1e6
            echo(f"all-reduce bucket for {w} workers on this link: --all_reduce_bucket_mb {mb:.1f}")
    predictions = pm.grid(
        inputs, options.workers, options.ps_counts, overlap=options.overlap,
        staged=options.staged, sync=options.sync, packs=options.packs, compact=options.compact,
        bucket_bytes=bucket_bytes,
    )  # fmt: skip
    if options.show_all:
        for line in prediction_lines(predictions):
            echo(line)
        echo("")
    best = pm.recommend(predictions)
    echo("Recommended per worker count:")
    for line in prediction_lines([best[w] for w in sorted(best)]):
        echo(line)


def model_inputs(options: ModelOptions, echo: Callable[[str], None]) -> pm.Inputs:
    """Saved inputs, or the measured figures and the model's variables (TensorFlow builds them)."""
    compute_at = tuple(
        (w, pi.compute_from_single(rate, options.batch_size))
        for w, rate in options.compute_at_img_s
    )
    if options.inputs_path:
        return pi.load_inputs(options.inputs_path)
    has_link = options.netbench_path is not None or options.link is not None
    if not has_link or (options.compute_img_s is None and not options.from_run):
        raise pm.ModelError(
            "give --netbench (a netbench run) or --link, and --compute-img-s (a lone "
            "worker's images/sec at --batch-size) or --from-run (a traced one-worker run); "
            "or --inputs FILE."
        )
    from tflaunch.tools.placement_command import require_tensorflow

    require_tensorflow("model", "builds the model's variables (without --inputs)")
    if options.from_run:
        from tflaunch.runtime.run import Run

        trace = Run.open(options.runs_dir, options.from_run).dir / "trace"
        compute_s, worker, steps = pi.compute_from_trace(trace)
        echo(
            f"from run {options.from_run}: {worker}'s {steps} traced steps, "
            f"{compute_s * 1e3:.1f} ms each without communication "
            f"({options.batch_size / compute_s:.1f} img/s at batch {options.batch_size})"
        )
    else:
        compute_s = pi.compute_from_single(options.compute_img_s or 0.0, options.batch_size)
    link = options.link
    if link is None:
        link = pi.link_from_netbench(pi.load_netbench(options.netbench_path or Path(".")))
    return pm.Inputs(
        compute_s,
        options.batch_size,
        pi.model_variables(options.model, options.num_classes),
        link,
        options.per_variable_s,
        options.nic,
        options.shared_cores,
        compute_at,
    )


def _counts(ctx: click.Context, param: click.Parameter, text: str) -> tuple[int, ...]:
    from tflaunch.tools.placement_command import parse_ps_counts

    return tuple(parse_ps_counts(text))


def _rates(ctx: click.Context, param: click.Parameter, texts: tuple[str, ...]) -> tuple:
    return tuple(pi.workers_rate(t) for t in texts)


def _seconds(ctx: click.Context, param: click.Parameter, microseconds: float) -> float:
    return microseconds * 1e-6


def _packs(ctx: click.Context, param: click.Parameter, packs: int) -> int:
    return max(1, packs)  # 0 and 1 both mean one pack


_PATH = click.Path(path_type=Path)


@click.command("model")
@click.option("--netbench", "netbench_path", type=_PATH, help="netbench.json or its run dir.")
@click.option("--compute-img-s", type=float, default=None, help="A lone worker's images/sec.")
@click.option(
    "--from-run",
    "from_run",
    default=None,
    metavar="RUN",
    help="Instead of --compute-img-s: a traced one-worker run (up --trace) of any program; its "
    "step time less communication is the compute per step of --batch-size images.",
)
@runs_dir_option("Where --from-run's run is.")
@link_option("Instead of --netbench: one link's latency (µs) and bandwidth (MB/s).", pi.parse_link)
@click.option("--batch-size", type=int, default=32, show_default=True)
@model_option("A network of tflaunch.models.registry (as 'tflaunch placement --model').")
@click.option("--num-classes", type=int, default=1001, show_default=True)
@click.option(
    "--per-variable-us", "per_variable_s", type=float, default=0.0, callback=_seconds,
    show_default=True,
)  # fmt: skip
@click.option(
    "--nic/--no-nic",
    default=True,
    show_default=True,
    help="Each host's traffic shares one link of netbench's bandwidth (--no-nic: one host, loopback).",
)
@flag(
    "--shared-cores",
    help="Every task runs on the cores the lone worker used (namespace hosts of one machine).",
)
@click.option(
    "--compute-img-s-at",
    "compute_at_img_s",
    multiple=True,
    callback=_rates,
    metavar="W=IMG_S",
    help="Each of W lone workers' images/sec while all W compute at once (repeatable).",
)
@click.option("--inputs", "inputs_path", type=_PATH, help="Model inputs saved with --save.")
@click.option("--save", "save_path", type=_PATH, help="Write the model inputs here (JSON).")
@click.option("--workers", default="1,2,4,8", callback=_counts, show_default=True)
@click.option("--ps", "ps_counts", default="1-4", callback=_counts, show_default=True)
@flag("--all", "show_all", help="Print every prediction, not the best.")
@flag(
    "--overlap",
    help="PS modes run with --transfer_order tic|tac: communication beside computation "
    "(assumption 8).",
)
@flag(
    "--staged",
    help="parameter_server runs with --staged_vars: the next step's pull beside this step's "
    "compute and push (assumption 8).",
)
@flag(
    "--sync",
    help="PS modes run synchronous steps, as --cross_replica_sync does (assumption 10); "
    "all-reduce always does.",
)
@number(
    "--gradient-repacking",
    "packs",
    default=0,
    minimum=0,
    metavar="N",
    callback=_packs,
    help="All-reduce in N packs, the first beside the backward pass (the benchmark's "
    "--gradient_repacking; assumption 11; 0: one pack).",
)
@flag(
    "--compact-gradient-transfer",
    "compact",
    help="All-reduce's gradients cross as float16, half the bytes (assumption 11).",
)
@number(
    "--all-reduce-bucket-mb",
    "bucket_mb",
    default=0.0,
    minimum=0,
    metavar="MB",
    help="All-reduce in buckets of MB on the wire in the backward pass's order, each beside the "
    "rest of it (the benchmark's --all_reduce_bucket_mb; assumption 11; 0: off). The model "
    "prints the size it suggests for the link either way.",
)
def model_command(**options: Any) -> None:
    """Predict images/sec for W workers x P PS per variable update; recommend P and placement."""
    run_model(ModelOptions(**options), click.echo)  # each option parsed to its field's type
