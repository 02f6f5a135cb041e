"""``tflaunch placement``: how evenly each strategy spreads a model's variables over the PS tasks.

For every strategy and PS count it prints max/mean (bytes on the fullest PS over the mean), the
fullest PS's bytes and the bytes on every PS; ``--json`` gives the same as data and ``--plot``
draws bytes per PS as bars, one row per strategy. The model is built once in a TensorFlow graph
(nothing computed) to learn its variables; TensorFlow is imported only when the command runs, so
``tflaunch`` itself stays importable without it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import click

from tflaunch.errors import TflaunchError
from tflaunch.models import placement_math as pm
from tflaunch.models.placement_math import STRATEGIES, VariableSpec
from tflaunch.models.registry import ModelSpec, get_model_spec
from tflaunch.tools.options import flag, model_option, number

MAX_PS = 4096
MB = 1e6


class PlacementError(TflaunchError):
    """The placement report cannot be made (TensorFlow or matplotlib missing)."""


def parse_ps_counts(text: str) -> list[int]:
    """``"1-16"``, ``"2,4,8"`` or ``"1-4,8,16"`` -> sorted distinct PS counts."""
    counts: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        low, sep, high = part.partition("-")
        try:
            first, last = (int(low), int(high)) if sep else (int(part), int(part))
        except ValueError:
            raise click.BadParameter(
                f"{part!r} is not a PS count or range; write e.g. 1-16, 2,4,8 or 1-4,8,16"
            ) from None
        if not 1 <= first <= last <= MAX_PS:
            raise click.BadParameter(
                f"{part!r}: PS counts run from 1 to {MAX_PS}, low end first (e.g. 1-16)"
            )
        counts.update(range(first, last + 1))
    return sorted(counts)


def _ps_counts(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    return parse_ps_counts(value)


def format_table(header: str, rows: Sequence[dict]) -> str:
    """The report as text: one line per strategy and PS count, MB per PS at the end."""
    lines = [
        header,
        "",
        f"{'strategy':<12} {'PS':>4} {'max/mean':>8} {'largest MB':>10} {'pieces':>6}  MB per PS",
    ]
    previous = None
    for row in rows:
        if previous is not None and row["strategy"] != previous:
            lines.append("")
        previous = row["strategy"]
        per_ps = " ".join(f"{b / MB:.2f}" for b in row["bytes_per_ps"])
        lines.append(
            f"{row['strategy']:<12} {row['num_ps']:>4} {row['max_over_mean']:>8.3f} "
            f"{row['largest_bytes'] / MB:>10.2f} {row['pieces']:>6}  {per_ps}"
        )
    return "\n".join(lines)


def plot_bytes_per_ps(title: str, rows: Sequence[dict], path: str) -> None:
    """Bars of MB per PS, grouped by PS count, one row of axes per strategy; dashes: the mean.

    The y axis is logarithmic, so that 95 MB on one PS and 6 MB on each of sixteen are both
    readable, and an almost empty PS (round robin's bias-only tasks) still shows.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlacementError(
            "--plot needs matplotlib, which is not installed here; install tflaunch[tf] "
            "(or pip install matplotlib), or leave out --plot."
        ) from None
    strategies = list(dict.fromkeys(row["strategy"] for row in rows))
    fig, axes = plt.subplots(len(strategies), 1, figsize=(14, 2.6 * len(strategies)), sharey=True)
    axes = [axes] if len(strategies) == 1 else list(axes)
    for ax, strategy in zip(axes, strategies, strict=True):
        _draw_strategy(ax, [row for row in rows if row["strategy"] == strategy])
        worst = max(row["max_over_mean"] for row in rows if row["strategy"] == strategy)
        ax.set_title(f"{strategy}  (worst max/mean {worst:.3f})", loc="left", fontsize=10)
        ax.set_ylabel("MB per PS (log)")
        ax.set_yscale("log")
    axes[-1].set_xlabel("number of PS tasks (one bar per PS; dashes: mean per PS)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _draw_strategy(ax, rows: Sequence[dict]) -> None:
    x = 0.0
    centres, labels = [], []
    for row in rows:
        loads = [b / MB for b in row["bytes_per_ps"]]
        positions = [x + i for i in range(len(loads))]
        ax.bar(positions, loads, width=0.85, color="tab:blue")
        mean = row["mean_bytes"] / MB
        ax.hlines(mean, x - 0.5, x + len(loads) - 0.5, colors="tab:red", linestyles="dashed")
        centres.append(x + (len(loads) - 1) / 2)
        labels.append(str(row["num_ps"]))
        x += len(loads) + 1.5
    ax.set_xticks(centres, labels)
    ax.set_xlim(-1, x - 1)


def require_tensorflow(command: str, why: str) -> None:
    """Refuse ``tflaunch COMMAND`` at once, naming it and the fix, where this Python has no
    TensorFlow (found without importing it: that costs seconds)."""
    import importlib.util
    import sys

    try:
        found = importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise PlacementError(
            f"tflaunch {command} {why} with TensorFlow, which this Python ({sys.executable}) "
            "does not have; install it here (pip install 'tflaunch[tf]') or run the command "
            "where TensorFlow is installed."
        )


def model_variables(
    spec: ModelSpec,
    num_classes: int = 1000,
    trainable_only: bool = True,
    command: str = "placement",
) -> list[VariableSpec]:
    """A model's variables in creation order, from one graph-mode build (nothing computed): what
    a replica_device_setter would place. Imports TensorFlow (``tflaunch COMMAND`` says why)."""
    require_tensorflow(command, "builds the model's variables")
    try:
        from tflaunch.models.placement import graph_variables
    except ImportError as exc:
        raise PlacementError(
            f"tflaunch {command} builds the model's variables with TensorFlow, which cannot be "
            f"imported here ({exc}); install tflaunch[tf] or run it where TensorFlow is installed."
        ) from None
    classes = spec.default_num_classes if spec.fixed_num_classes else num_classes
    variables = graph_variables(lambda: spec.build(classes, "NHWC"))
    return [v for v in variables if v.trainable or not trainable_only]


@click.command()
@model_option("A network of tflaunch.models.registry (tf_cnn_benchmarks' names; aliases accepted).")
@click.option(
    "--num-ps",
    "ps_counts",
    default="1-16",
    show_default=True,
    callback=_ps_counts,
    help="PS counts: a range, a list, or both (1-16, 2,4,8, 1-4,8,16).",
)
@click.option(
    "--strategy",
    "strategies",
    type=click.Choice(STRATEGIES),
    multiple=True,
    help="Repeatable; default: all four.",
)
@number("--num-classes", default=1000, minimum=1)
@flag(
    "--all-variables",
    help="Also non-trainable variables (batch-norm moving statistics), as a cluster places them.",
)
@flag("--json", "as_json", help="Print the figures as JSON.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a PNG bar chart here.")
def placement(
    model: str,
    ps_counts: list[int],
    strategies: tuple[str, ...],
    num_classes: int,
    all_variables: bool,
    as_json: bool,
    plot: str | None,
) -> None:
    """Compare variable placement strategies across PS counts (needs TensorFlow)."""
    require_tensorflow("placement", "builds the model's variables")
    spec = get_model_spec(model)
    variables = model_variables(spec, num_classes, trainable_only=not all_variables)
    kind = "variables" if all_variables else "trainable variables"
    total = sum(v.nbytes for v in variables)
    classes = "" if spec.fixed_num_classes else f", {num_classes} classes"
    header = f"{spec.description}{classes}: {len(variables)} {kind}, {total / MB:.2f} MB"
    rows = [
        pm.summary(pm.place(strategy, variables, n))
        for strategy in strategies or STRATEGIES
        for n in ps_counts
    ]
    if as_json:
        document = {"model": spec.name, "num_classes": num_classes, "variables": len(variables)}
        document |= {"total_bytes": total, "results": rows}
        click.echo(json.dumps(document, indent=2))
    else:
        click.echo(format_table(header, rows))
    if plot:
        plot_bytes_per_ps(header, rows, plot)
        if not as_json:
            click.echo(f"\nplot: {plot}")
