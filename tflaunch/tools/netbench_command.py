"""``tflaunch netbench CLUSTER``: TensorFlow's gRPC runtime measured on the cluster's own hosts and
ports (``tflaunch.models.netbench`` runs as every task, started by the cluster's backend as ``up``
starts the cluster's program).

It prints, between every pair of hosts, the latency (median time of the smallest message) and
the bandwidth (bytes over the median time of the largest message), the full size sweep per pair,
and the PS throughput: W workers pulling and pushing the model's variables, placed on the PS as
the strategy places them. It writes ``netbench.json`` and ``netbench.png`` into the run directory.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import click

from tflaunch.errors import TflaunchError
from tflaunch.models.placement_math import STRATEGIES
from tflaunch.models.registry import model_names
from tflaunch.text import aligned

RESULT_PREFIX = "netbench-result: "
UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "M": 1024**2, "MB": 1024**2, "G": 1024**3}
DEFAULT_SIZES = "1K-64M"
NO_PS_MODEL = "none"  # --ps-model none: skip the PS test
# The registry's networks whose variables netbench can size (and their aliases), and "none".
PS_MODELS = (*model_names(sized_in_graph=True, aliases=True), NO_PS_MODEL)


class NetbenchError(TflaunchError):
    """Bad sizes, or the benchmark cluster failed or printed no result."""


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in UNITS:
        raise NetbenchError(f"{text!r} is not a message size; write e.g. 1K, 256K or 64M.")
    return int(m.group(1)) * UNITS[m.group(2).upper()]


def parse_sizes(text: str) -> list[int]:
    """``1K-64M`` (every power of 4 from 1K to 64M), or a list ``1K,1M,64M``."""
    if "-" in text and "," not in text:
        low, high = (parse_size(p) for p in text.split("-", 1))
        if low < 1 or high < low:
            raise NetbenchError(f"--sizes {text!r}: the range must run from small to large.")
        sizes = []
        size = low
        while size <= high:
            sizes.append(size)
            size *= 4
        if sizes[-1] != high:
            sizes.append(high)
        return sizes
    sizes = sorted({parse_size(p) for p in text.split(",") if p.strip()})
    if not sizes or sizes[0] < 1:
        raise NetbenchError(f"--sizes {text!r}: give at least one size of one byte or more.")
    return sizes


def human_bytes(n: float) -> str:
    for unit, scale in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{n:.0f}B"


def program_argv(python: str, sizes: Sequence[int], options: Mapping[str, object]) -> list[str]:
    argv = [python, "-m", "tflaunch.models.netbench", "--sizes", ",".join(map(str, sizes))]
    for key, value in options.items():
        argv += [f"--{key}", str(value)]
    return argv


def cluster_python(config) -> str:
    """The interpreter the tasks run under on the cluster's hosts (the backend knows)."""
    from tflaunch import launch

    return launch.backend_for(config.backend).python(config)


def placement_of(argv: Sequence[str]) -> str:
    """The ``--variable_placement`` the cluster's own program uses (round robin without one)."""
    for i, arg in enumerate(argv):
        if arg == "--variable_placement" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--variable_placement="):
            return arg.split("=", 1)[1]
    return "round_robin"


def read_result(log: Path) -> dict:
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        raise NetbenchError(f"no log at {log}: the first worker did not run.") from None
    for line in reversed(lines):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    raise NetbenchError(f"the first worker printed no result; see its log {log}.")


def matrices(result: Mapping) -> tuple[list[str], dict, dict]:
    """Hosts, and per (src, dst) host pair: latency (s, smallest size) and bandwidth (B/s,
    largest size)."""
    rows = result["point_to_point"]
    small, large = min(result["sizes"]), max(result["sizes"])
    latency, bandwidth = {}, {}
    for r in rows:
        key = (r["src_host"], r["dst_host"])
        if r["bytes"] == small:
            latency[key] = r["median_s"]
        if r["bytes"] == large:
            bandwidth[key] = r["bytes"] / r["median_s"]
    return list(result["hosts"]), latency, bandwidth


def report_lines(result: Mapping) -> list[str]:
    hosts, latency, bandwidth = matrices(result)
    small, large = human_bytes(min(result["sizes"])), human_bytes(max(result["sizes"]))
    lines = [f"latency (median time of a {small} message, µs), source row -> destination column"]
    lines += aligned(_matrix(hosts, latency, lambda s: f"{s * 1e6:.0f}"))
    lines += ["", f"bandwidth (a {large} message, MB/s), source row -> destination column"]
    lines += aligned(_matrix(hosts, bandwidth, lambda b: f"{b / 1e6:.0f}"))
    lines += ["", "every size (median ms / MB/s)"]
    header = ("SOURCE", "DESTINATION", *(human_bytes(s) for s in result["sizes"]))
    table = [header]
    by_pair: dict[tuple[str, str], dict[int, float]] = {}
    names: dict[tuple[str, str], tuple[str, str]] = {}
    for r in result["point_to_point"]:
        key = (r["src"], r["dst"])
        by_pair.setdefault(key, {})[r["bytes"]] = r["median_s"]
        names[key] = (f"{r['src_host']} {_task(r['src'])}", f"{r['dst_host']} {_task(r['dst'])}")
    for key, times in by_pair.items():
        cells = [
            f"{times[s] * 1e3:.2f}/{s / times[s] / 1e6:.0f}" if s in times else "-"
            for s in result["sizes"]
        ]
        table.append((*names[key], *cells))
    lines += aligned(table)
    if result.get("ps"):
        lines += [""] + ps_lines(result["ps"])
    return lines


def _task(device: str) -> str:
    parts = dict(p.split(":", 1) for p in device.strip("/").split("/"))
    return f"{parts['job']}:{parts['task']}"


def _matrix(hosts: Sequence[str], values: Mapping, fmt) -> list[tuple[str, ...]]:
    rows = [("", *hosts)]
    for a in hosts:
        rows.append((a, *(fmt(values[(a, b)]) if (a, b) in values else "-" for b in hosts)))
    return rows


def ps_lines(ps: Mapping) -> list[str]:
    """PS throughput: each worker's pull+push steps per second and the bytes each PS moved."""
    total = sum(ps["steps_per_s"])
    lines = [
        f"PS throughput: {ps['num_workers']} worker(s) pulling and pushing {ps['model']}'s "
        f"{ps['num_variables']} variables ({ps['total_bytes'] / 1e6:.1f} MB) placed "
        f"{ps['placement']} on {ps['num_ps']} PS",
    ]
    rows = [("WORKER", "STEPS/s", "STEP ms")]
    for i, rate in enumerate(ps["steps_per_s"]):
        rows.append((str(i), f"{rate:.2f}", f"{1e3 / rate:.1f}"))
    lines += aligned(rows)
    rows = [("PS", "MB HELD", "MB/s IN+OUT")]
    for i, held in enumerate(ps["bytes_per_ps"]):
        rows.append((str(i), f"{held / 1e6:.1f}", f"{2 * held * total / 1e6:.0f}"))
    lines += aligned(rows)
    return lines


def plot(result: Mapping, path: Path) -> Path:
    """Bandwidth and time against message size, one line per pair (log-log)."""
    from tflaunch.tools.bench_sweep_plot import pyplot

    plt = pyplot()
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2))
    by_pair: dict[str, list[tuple[int, float]]] = {}
    for r in result["point_to_point"]:
        label = f"{r['src_host']} {_task(r['src'])} -> {r['dst_host']} {_task(r['dst'])}"
        by_pair.setdefault(label, []).append((r["bytes"], r["median_s"]))
    for label, points in by_pair.items():
        points.sort()
        xs = [p[0] for p in points]
        ax_t.plot(xs, [p[1] * 1e3 for p in points], marker="o", label=label)
        ax_b.plot(xs, [p[0] / p[1] / 1e6 for p in points], marker="o", label=label)
    for ax, ylabel in ((ax_t, "median time (ms)"), (ax_b, "bandwidth (MB/s)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_b.legend(fontsize=7)
    fig.suptitle("tflaunch netbench: TensorFlow gRPC point to point")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


@click.command("netbench")
@click.argument("cluster_file", type=click.Path())
@click.option(
    "--sizes",
    default=DEFAULT_SIZES,
    show_default=True,
    help="Message sizes: a range (every power of 4) or a list, e.g. 1K,1M,64M.",
)
@click.option("--min-repeats", type=int, default=5, show_default=True)
@click.option(
    "--max-seconds",
    type=float,
    default=0.5,
    show_default=True,
    help="Repeat each pair and size for at least this long (50 runs at most).",
)
@click.option(
    "--ps-model",
    type=click.Choice(PS_MODELS),
    default="inception_v3",
    show_default=True,
    help=f"A network of tflaunch.models.registry whose variables the PS test places, or "
    f"'{NO_PS_MODEL}' to skip the test.",
)
@click.option(
    "--ps-placement",
    type=click.Choice(STRATEGIES),
    default=None,
    help="Default: the cluster program's --variable_placement, else round_robin.",
)
@click.option("--ps-steps", type=int, default=10, show_default=True)
@click.option(
    "--runs-dir", "--run-dir", "runs_dir", default=None, help="Default: the file's runs_dir."
)
def netbench_command(
    cluster_file: str,
    sizes: str,
    min_repeats: int,
    max_seconds: float,
    ps_model: str,
    ps_placement: str | None,
    ps_steps: int,
    runs_dir: str | None,
) -> None:
    """Measure TensorFlow's gRPC between the cluster's hosts and PS throughput."""
    from tflaunch import launch
    from tflaunch.cluster.config import load_config

    config = load_config(cluster_file)
    options = {
        "min_repeats": min_repeats,
        "max_seconds": max_seconds,
        "ps_model": ps_model,
        "ps_placement": ps_placement or placement_of(config.program.argv),
        "ps_steps": ps_steps,
    }
    python = cluster_python(config)
    if python == sys.executable:  # the tasks run under this very Python (the local backend)
        from tflaunch.tools.placement_command import require_tensorflow

        require_tensorflow("netbench", "runs its tasks under this Python and measures")
    argv = program_argv(python, parse_sizes(sizes), options)
    config = replace(
        config, name=f"{config.name}-netbench", program=replace(config.program, argv=tuple(argv))
    )
    run, outcome = launch.run_cluster(config, runs_dir)
    if outcome.code != 0:  # its one failure report is on stderr already
        raise SystemExit(outcome.code)
    first = "chief-0.log" if config.roles.chief else "worker-0.log"
    result = read_result(run.log_path(first))
    for line in report_lines(result):
        click.echo(line)
    (run.dir / "netbench.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    png = plot(result, run.dir / "netbench.png")
    click.echo(f"wrote {run.dir / 'netbench.json'}, {png}")
