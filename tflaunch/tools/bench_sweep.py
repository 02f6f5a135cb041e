"""``tflaunch bench SWEEP.yaml``: throughput sweeps that reproduce the CSCS tables.

A sweep file names a cluster file whose program is a tf_cnn_benchmarks-style benchmark (one that
accepts ``--variable_update`` and ``--data_dir`` and prints ``total images/sec: X``, such as
``python -m tflaunch.models.benchmark``) and the grid to run it on::

    name: inception3-local
    cluster: bench-local.yaml        # relative to the sweep file; its roles are overridden
    workers: [1, 2]
    ps: [1, 2]                       # default: 1 .. workers; counts above the workers skipped
    variable_updates: [parameter_server, distributed_replicated]
    data: [synthetic, real]          # real appends --data_dir DATA_DIR
    data_dir: /data/imagenet-tfrecords
    repeats: 5
    output_dir: bench-inception3     # default: bench-<name>, relative to the sweep file

Every grid point (workers x PS x variable update x data) runs ``repeats`` times through the
cluster file's own backend (``tflaunch.launch``: the same path as ``tflaunch up``), repeat-major
(all points once, then all again) so slow drifts of the machine spread over every point. The
img/s of a run is the ``total images/sec`` line of worker 0 (or the chief): for tflaunch.models.benchmark,
the sum of the workers' own images/sec. ``collective_all_reduce`` uses no PS and runs once per
worker count with 0 PS.

Output: the CSCS table (Num PSs, Num workers, Variable Update, Real Data, Img/s: the mean over
the repeats), the best row per worker count and data kind with scaling efficiency
(img/s / (workers x the best one-worker img/s)), and I/O overhead (synthetic - real) / synthetic;
``results.csv``, ``results.json`` and PNG plots in the output directory. Each run's output goes
to ``<output_dir>/logs/``, its run directory to ``<output_dir>/runs/``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import yaml

from tflaunch.errors import ConfigError
from tflaunch.models.registry import VARIABLE_UPDATES, UnknownModelError, get_model_spec
from tflaunch.runtime.statusline import StatusLine
from tflaunch.tools import bench_results as results
from tflaunch.tools.bench_results import Measurement, Point, Row
from tflaunch.tools.options import flag

DATA_KINDS = ("synthetic", "real")
SWEEP_KEYS = (
    "name",
    "cluster",
    "workers",
    "ps",
    "variable_updates",
    "data",
    "data_dir",
    "repeats",
    "output_dir",
)
RESERVED_FLAGS = ("--variable_update", "--data_dir")
BENCHMARK_MODULE = "tflaunch.models.benchmark"
TOTAL_LINE = re.compile(r"^\[(?:worker|chief):0\]\s+total images/sec: ([0-9.]+)\s*$", re.M)


@dataclass(frozen=True)
class Sweep:
    """A parsed sweep file; paths are absolute."""

    name: str
    cluster: Path
    workers: tuple[int, ...]
    ps: tuple[int, ...] | None  # None: 1 .. workers
    variable_updates: tuple[str, ...]
    data: tuple[str, ...]
    data_dir: Path | None
    repeats: int
    output_dir: Path


# --- the sweep file --------------------------------------------------------------------------


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file; ConfigError says which key is wrong and what to write."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the sweep file ({err.strerror}).") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err}).") from None
    return parse_sweep(data, path)


def parse_sweep(data: Any, source: Path) -> Sweep:
    """Check the sweep mapping read from ``source`` (relative paths resolve against its folder)."""

    def fail(key: str, message: str) -> ConfigError:
        return ConfigError(f"{source}: {key}: {message}")

    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: a sweep file is a mapping with at least 'cluster' and 'workers'."
        )
    unknown = sorted(set(data) - set(SWEEP_KEYS))
    if unknown:
        raise fail(unknown[0], f"unknown key; the keys are {', '.join(SWEEP_KEYS)}.")
    base = source.resolve().parent
    if "cluster" not in data or "workers" not in data:
        raise ConfigError(f"{source}: 'cluster' (a cluster file) and 'workers' are required.")
    workers = _counts(data["workers"], "workers", fail)
    ps = None if data.get("ps", "all") == "all" else _counts(data["ps"], "ps", fail)
    updates = _choices(
        data.get("variable_updates", ["parameter_server"]),
        VARIABLE_UPDATES,
        "variable_updates",
        fail,
    )
    kinds = _choices(data.get("data", ["synthetic"]), DATA_KINDS, "data", fail)
    data_dir = data.get("data_dir")
    if "real" in kinds and not data_dir:
        raise fail("data_dir", "'data: [real]' needs data_dir, a folder of ImageNet TFRecords.")
    repeats = data.get("repeats", 5)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise fail("repeats", f"expected a whole number of at least 1, not {repeats!r}.")
    name = str(data.get("name", source.stem))
    return Sweep(
        name=name,
        cluster=base / str(data["cluster"]),
        workers=workers,
        ps=ps,
        variable_updates=updates,
        data=kinds,
        data_dir=(base / str(data_dir)) if data_dir else None,
        repeats=repeats,
        output_dir=Path(os.path.normpath(base / str(data.get("output_dir", f"bench-{name}")))),
    )


def _counts(value: Any, key: str, fail: Callable[[str, str], ConfigError]) -> tuple[int, ...]:
    items = value if isinstance(value, list) else [value]
    if not items or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 1 for i in items
    ):
        raise fail(
            key, f"expected a list of whole numbers of at least 1, e.g. [1, 2, 4], not {value!r}."
        )
    return tuple(sorted(set(items)))


def _choices(value: Any, valid: Sequence[str], key: str, fail) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    bad = [i for i in items if i not in valid]
    if bad or not items:
        raise fail(key, f"{bad[0] if bad else value!r} is not one of {', '.join(valid)}.")
    return tuple(dict.fromkeys(items))


# --- the grid --------------------------------------------------------------------------------


def grid(sweep: Sweep) -> list[Point]:
    """Every point: workers x PS counts (1..workers, or the listed ones up to the workers) x
    variable updates x data kinds; collective_all_reduce once per worker count, with 0 PS."""
    points = []
    for workers in sweep.workers:
        ps_counts = [p for p in (sweep.ps or range(1, workers + 1)) if p <= workers]
        for update in sweep.variable_updates:
            for kind in sweep.data:
                counts = [0] if update == "collective_all_reduce" else ps_counts
                points += [Point(workers, p, update, kind == "real") for p in counts]
    return points


def point_argv(base_argv: Sequence[str], point: Point, data_dir: Path | None) -> tuple[str, ...]:
    """The program's argv for a point: the base argv plus the variable update and data flags."""
    reserved = [a for a in base_argv if a.split("=")[0] in RESERVED_FLAGS]
    if reserved:
        raise ConfigError(
            f"the cluster file's program already passes {reserved[0]}; tflaunch bench sets "
            f"{' and '.join(RESERVED_FLAGS)} for each grid point, so remove it from program.argv."
        )
    check_benchmark_model(base_argv)
    argv = [*base_argv, "--variable_update", point.variable_update]
    if point.real_data:
        argv += ["--data_dir", str(data_dir)]
    return tuple(argv)


def check_benchmark_model(argv: Sequence[str]) -> None:
    """Refuse a ``--model`` that ``tflaunch.models.benchmark`` would refuse at every grid point,
    before any point runs (the names are those of ``tflaunch.models.registry``)."""
    if BENCHMARK_MODULE not in argv:
        return
    for i, arg in enumerate(argv):
        flag, sep, value = arg.partition("=")
        if flag == "--model" and (sep or i + 1 < len(argv)):
            name = value if sep else argv[i + 1]
            try:
                get_model_spec(name, benchmark=True)
            except UnknownModelError as exc:
                raise ConfigError(f"the cluster file's program: {exc}.") from None


def parse_total(output: str) -> float | None:
    """Worker 0's (or the chief's) ``total images/sec`` from a run's prefixed output."""
    match = TOTAL_LINE.search(output)
    return float(match.group(1)) if match else None


def results_document(sweep: Sweep, measurements: Sequence[Measurement]) -> dict:
    rows = results.aggregate(measurements)
    best = results.best_rows(rows)
    eff = results.efficiency(best)
    return {
        "sweep": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(sweep).items()
        },
        "measurements": [dataclasses.asdict(m) for m in measurements],
        "rows": [dataclasses.asdict(r) for r in rows],
        "best": [
            {**dataclasses.asdict(row), "efficiency": eff.get(key)}
            for key, row in sorted(best.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        ],
        "io_overhead": {str(w): o for w, o in results.io_overhead(best).items()},
    }


# --- running ---------------------------------------------------------------------------------


Runner = Callable[[Point, int], Measurement]


class SweepInterrupted(Exception):
    """A run was stopped by a signal (Ctrl-C, SIGTERM): the sweep stops, with this exit code."""

    def __init__(self, code: int) -> None:
        super().__init__(f"interrupted (exit {code})")
        self.code = code


def run_sweep(
    sweep: Sweep,
    runner: Runner,
    points: Sequence[Point],
    echo: Callable[[str], None],
    measurements: list[Measurement] | None = None,
) -> list[Measurement]:
    """Every point ``repeats`` times, repeat-major, with a progress line per run.

    Measurements are appended to ``measurements`` as they come, so that a caller still has the
    finished runs when the runner raises :class:`SweepInterrupted`."""
    total = len(points) * sweep.repeats
    measurements = [] if measurements is None else measurements
    started = time.monotonic()
    for repeat in range(1, sweep.repeats + 1):
        for point in points:
            done = len(measurements)
            echo(f"[{done + 1}/{total}] {point.label}, repeat {repeat}/{sweep.repeats} ...")
            run_started = time.monotonic()
            line = StatusLine(
                sys.stdout,
                lambda: _sweep_status(started, run_started, done, total),  # noqa: B023
            )
            try:
                m = runner(point, repeat)
            finally:
                line.stop()
            measurements.append(m)
            elapsed = time.monotonic() - started
            left = elapsed / (done + 1) * (total - done - 1)
            result = (
                f"{m.images_per_sec:.2f} img/s"
                if m.images_per_sec
                else f"FAILED (exit {m.exit_code})"
            )
            echo(
                f"[{done + 1}/{total}] {result}  run {m.run_id}  "
                f"({_clock(elapsed)} elapsed, ~{_clock(left)} left)"
            )
    return measurements


def _sweep_status(started: float, run_started: float, done: int, total: int) -> str:
    """The status line under a sweep on a terminal: runs done, elapsed, and the time left
    (the runs so far took on average what each of the others will)."""
    now = time.monotonic()
    line = (
        f"bench: {done} of {total} runs done, run {done + 1} going; {_clock(now - started)} elapsed"
    )
    if done:
        per_run = (run_started - started) / done
        left = per_run * (total - done) - (now - run_started)
        line += f", ~{_clock(max(0.0, left))} left"
    return line


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def cluster_runner(sweep: Sweep) -> Runner:
    """Runs a point through the cluster file's backend, as ``tflaunch up`` does."""
    from tflaunch import launch
    from tflaunch.cluster.config import load_config

    base = load_config(sweep.cluster)
    logs = sweep.output_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    def run(point: Point, repeat: int) -> Measurement:
        argv = point_argv(base.program.argv, point, sweep.data_dir)
        config = dataclasses.replace(
            base,
            name=f"{base.name}-{point.slug}",
            roles=dataclasses.replace(base.roles, ps=point.ps, worker=point.workers),
            program=dataclasses.replace(base.program, argv=argv),
        )
        log_path = logs / f"{point.slug}-r{repeat}.log"
        with log_path.open("w") as out, contextlib.redirect_stdout(out):
            run_, outcome = launch.run_cluster(config, str(sweep.output_dir / "runs"))
        if outcome.interrupted:
            raise SweepInterrupted(outcome.code)
        value = parse_total(log_path.read_text()) if outcome.code == 0 else None
        return Measurement(point, repeat, value, outcome.code, run_.id)

    return run


def write_outputs(sweep: Sweep, measurements: Sequence[Measurement]) -> list[Path]:
    """results.csv, results.json and the PNG plots; returns the paths written."""
    from tflaunch.tools.bench_sweep_plot import plot_results

    out = sweep.output_dir
    out.mkdir(parents=True, exist_ok=True)
    rows = results.aggregate(measurements)
    results.write_csv(out / "results.csv", rows)
    (out / "results.json").write_text(json.dumps(results_document(sweep, measurements), indent=1))
    best = results.best_rows(rows)
    plots = plot_results(rows, best, results.efficiency(best), out, sweep.name)
    return [out / "results.csv", out / "results.json", *plots]


def run_bench(
    sweep_file: str,
    repeats: int | None,
    dry_run: bool,
    echo: Callable[[str], None],
    predict: str | None = None,
) -> int:
    """The body of ``tflaunch bench``: run, report, write; exit code 0 unless every run failed."""
    sweep = load_sweep(sweep_file)
    inputs = _load_model_inputs(predict)
    if repeats is not None:
        sweep = dataclasses.replace(sweep, repeats=repeats)
    points = grid(sweep)
    echo(
        f"sweep {sweep.name}: {len(points)} grid points x {sweep.repeats} repeats "
        f"= {len(points) * sweep.repeats} runs of {sweep.cluster}"
    )
    if dry_run:
        for point in points:
            echo(f"  {point.label}")
        return 0
    if "real" in sweep.data and not (sweep.data_dir and sweep.data_dir.is_dir()):
        raise ConfigError(
            f"{sweep_file}: data_dir {sweep.data_dir} is not a directory. Point it at ImageNet "
            "TFRecords, or write a small set with `python -m tflaunch.models.tfrecords --out DIR`."
        )
    measurements: list[Measurement] = []
    interrupted = None
    try:
        run_sweep(sweep, cluster_runner(sweep), points, echo, measurements)
    except SweepInterrupted as stop:
        interrupted = stop.code
        echo(f"sweep interrupted after {len(measurements)} runs; reporting those")
    if not measurements:
        return interrupted or 1
    rows = results.aggregate(measurements)
    echo("")
    echo(results.table(rows))
    echo("")
    echo(results.best_table(rows))
    echo("")
    if inputs is not None:
        echo_predictions(sweep, rows, inputs, echo)
    for path in write_outputs(sweep, measurements):
        echo(f"wrote {path}")
    if interrupted is not None:
        return interrupted
    return 0 if any(m.images_per_sec is not None for m in measurements) else 1


def _load_model_inputs(path: str | None):
    if path is None:
        return None
    from tflaunch.tools.perfmodel_inputs import load_inputs

    return load_inputs(Path(path))


def echo_predictions(sweep: Sweep, rows: Sequence[Row], inputs, echo) -> None:
    """The performance model's prediction beside each measured row, with the error."""
    from tflaunch.cluster.config import load_config
    from tflaunch.tools.netbench_command import placement_of
    from tflaunch.tools.perfmodel_text import measured_lines

    strategy = placement_of(load_config(sweep.cluster).program.argv)
    echo(f"Predicted (tflaunch model, variable placement {strategy}) beside measured")
    lines, _ = measured_lines(inputs, rows, strategy)
    for line in lines:
        echo(line)
    echo("")


@click.command("bench")
@click.argument("sweep_file", type=click.Path())
@click.option(
    "--repeats", type=click.IntRange(min=1), default=None, help="Override the sweep file's repeats."
)
@flag("--dry-run", help="List the grid points; run nothing.")
@click.option(
    "--predict",
    default=None,
    metavar="INPUTS",
    help="Print the performance model's prediction beside each row (inputs from "
    "'tflaunch model --save INPUTS').",
)
def bench_command(sweep_file: str, repeats: int | None, dry_run: bool, predict: str | None) -> None:
    """Run a throughput sweep (workers x PS x variable updates x data) and report it."""
    sys.exit(run_bench(sweep_file, repeats, dry_run, click.echo, predict))
