"""A performance model of distributed CNN training: images/sec for W workers x P PS per variable
update, from a single worker's compute time, the bytes each PS holds and netbench's link figures.

Assumptions (printed by ``tflaunch model``):

1. A worker's step does not overlap compute and communication: it pulls every variable, computes,
   and pushes a gradient of every variable (TF1 between-graph replication as models.benchmark
   runs it). Its transfers to the P PS go in parallel, so its communication time is that of the
   fullest PS: ``t_comm = 2 (alpha + max_p B_p / beta) + 2 gamma n_vars``.
2. ``parameter_server`` and ``distributed_replicated`` move the same bytes (the latter also copies
   the values into the local replica, a memory copy taken as free), asynchronously: every worker
   steps at ``1 / (t_compute + t_comm)``.
3. A PS moves ``2 B_p`` bytes for each step of any worker through its one link of ``beta`` bytes/s,
   so all workers together make at most ``beta / (2 max_p B_p)`` steps per second.
   Steps/s = min(W / (t_compute + t_comm), beta / (2 max_p B_p)).
4. ``collective_all_reduce`` is synchronous ring all-reduce:
   ``step = t_compute + 2 (W-1)/W * B / beta + 2 (W-1) alpha``; W workers make W steps per step.
5. ``alpha`` (latency) and ``beta`` (bandwidth) are one link's, from netbench (median over pairs):
   alpha the smallest message's time, beta the slope between its two largest sizes. Links do not
   slow each other down (no shared switch, memory bus or CPU): on one many-core host this is the
   assumption most likely to fail, which the measured error shows.
6. Compute per step does not change with W (no contention for cores or memory bandwidth); with
   CPU pinning, each task's cores are its own.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from tflaunch.errors import TflaunchError
from tflaunch.models.placement_math import STRATEGIES
from tflaunch.models.registry import VARIABLE_UPDATES as UPDATES

ASSUMPTIONS = __doc__.split("Assumptions (printed by ``tflaunch model``):", 1)[1].strip()


class ModelError(TflaunchError):
    """The model's inputs are missing or inconsistent."""


@dataclass(frozen=True)
class Link:
    """One link: latency (s) and bandwidth (bytes/s)."""

    latency_s: float
    bandwidth: float


@dataclass(frozen=True)
class Inputs:
    """What the model needs: per-step compute, the model's variables (bytes, in creation order),
    the link, the per-worker batch, and an optional per-variable cost."""

    compute_s: float
    batch_size: int
    variable_bytes: tuple[tuple[str, tuple[int, ...], int], ...]  # (name, shape, dtype size)
    link: Link
    per_variable_s: float = 0.0

    @property
    def model_bytes(self) -> int:
        return sum(_nbytes(v) for v in self.variable_bytes)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> Inputs:
        try:
            return cls(
                float(data["compute_s"]),
                int(data["batch_size"]),
                tuple((str(n), tuple(s), int(d)) for n, s, d in data["variable_bytes"]),
                Link(float(data["link"]["latency_s"]), float(data["link"]["bandwidth"])),
                float(data.get("per_variable_s", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"model inputs are incomplete or malformed ({exc!r}).") from None


def _nbytes(var: tuple[str, tuple[int, ...], int]) -> int:
    n = 1
    for d in var[1]:
        n *= d
    return n * var[2]


def bytes_per_ps(inputs: Inputs, num_ps: int, strategy: str) -> tuple[int, ...]:
    """Bytes on each PS when ``strategy`` places the model's variables (models.placement_math,
    the same arithmetic the benchmark's placement uses)."""
    from tflaunch.models.placement_math import VariableSpec, place

    specs = [VariableSpec(n, s, d) for n, s, d in inputs.variable_bytes]
    return place(strategy, specs, num_ps).bytes_per_ps


@dataclass(frozen=True)
class Prediction:
    workers: int
    ps: int
    variable_update: str
    strategy: str | None
    images_per_sec: float
    step_s: float
    bound: str  # "workers" (their own step) or "ps" (the busiest PS's link) or "ring"


def predict(
    inputs: Inputs, workers: int, ps: int, update: str, strategy: str = "round_robin"
) -> Prediction:
    if workers < 1:
        raise ModelError("at least one worker.")
    link = inputs.link
    if update == "collective_all_reduce":
        w = workers
        comm = 2 * (w - 1) / w * inputs.model_bytes / link.bandwidth + 2 * (w - 1) * link.latency_s
        step = inputs.compute_s + comm
        return Prediction(w, ps, update, None, w * inputs.batch_size / step, step, "ring")
    if update not in UPDATES:
        raise ModelError(f"unknown variable update {update!r}; choose one of {', '.join(UPDATES)}.")
    if ps < 1:
        raise ModelError(f"{update} needs at least one PS.")
    loads = bytes_per_ps(inputs, ps, strategy)
    fullest = max(loads)
    n_vars = len(inputs.variable_bytes)
    comm = 2 * (link.latency_s + fullest / link.bandwidth) + 2 * inputs.per_variable_s * n_vars
    step = inputs.compute_s + comm
    worker_bound = workers / step
    ps_bound = link.bandwidth / (2 * fullest) if fullest else float("inf")
    steps_per_s = min(worker_bound, ps_bound)
    bound = "workers" if worker_bound <= ps_bound else "ps"
    return Prediction(
        workers, ps, update, strategy, steps_per_s * inputs.batch_size, workers / steps_per_s, bound
    )


def grid(
    inputs: Inputs,
    workers: Iterable[int],
    ps_counts: Iterable[int],
    updates: Sequence[str] = UPDATES,
    strategies: Sequence[str] = STRATEGIES,
) -> list[Prediction]:
    out = []
    ps_counts = list(ps_counts)
    for w in workers:
        for update in updates:
            if update == "collective_all_reduce":
                out.append(predict(inputs, w, 0, update))
                continue
            for p in ps_counts:
                for s in strategies:
                    out.append(predict(inputs, w, p, update, s))
    return out


def recommend(predictions: Iterable[Prediction]) -> dict[int, Prediction]:
    """Per worker count, the fastest prediction; within 1 % of it, the fewest PS, then the
    simplest strategy (the order of STRATEGIES)."""
    by_w: dict[int, list[Prediction]] = {}
    for p in predictions:
        by_w.setdefault(p.workers, []).append(p)
    best = {}
    for w, preds in by_w.items():
        top = max(p.images_per_sec for p in preds)
        close = [p for p in preds if p.images_per_sec >= 0.99 * top]
        order = {s: i for i, s in enumerate(STRATEGIES)}
        best[w] = min(close, key=lambda p: (p.ps, order.get(p.strategy or "", -1)))
    return best


# -- inputs from measurements ------------------------------------------------------------------


def link_from_netbench(result: Mapping) -> Link:
    """Latency: median over pairs of the smallest message's time. Bandwidth: median over pairs
    of the slope between the two largest sizes (bytes per extra second)."""
    rows = result.get("point_to_point") or []
    sizes = sorted(result.get("sizes") or [])
    if not rows or len(sizes) < 2:
        raise ModelError("netbench result needs point-to-point rows at two sizes at least.")
    by_pair: dict[tuple[str, str], dict[int, float]] = {}
    for r in rows:
        by_pair.setdefault((r["src"], r["dst"]), {})[r["bytes"]] = r["median_s"]
    small, big2, big = sizes[0], sizes[-2], sizes[-1]
    latencies = [t[small] for t in by_pair.values() if small in t]
    slopes = []
    for t in by_pair.values():
        if big in t and big2 in t:
            dt = t[big] - t[big2]
            slopes.append((big - big2) / dt if dt > 0 else big / t[big])
    if not latencies or not slopes:
        raise ModelError("netbench result lacks the smallest or the two largest sizes.")
    return Link(statistics.median(latencies), statistics.median(slopes))


def compute_from_single(images_per_sec: float, batch_size: int) -> float:
    """A lone worker's (no cluster) step time."""
    if images_per_sec <= 0:
        raise ModelError("the single-worker images/sec must be positive.")
    return batch_size / images_per_sec


def load_netbench(path: Path) -> dict:
    candidate = path / "netbench.json" if path.is_dir() else path
    try:
        return json.loads(candidate.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"no netbench result at {candidate}; run 'tflaunch netbench'.") from None
    except ValueError as exc:
        raise ModelError(f"{candidate} is not JSON ({exc}).") from None


# -- text --------------------------------------------------------------------------------------


def prediction_lines(predictions: Sequence[Prediction]) -> list[str]:
    from tflaunch.text import aligned

    rows = [("WORKERS", "PS", "VARIABLE UPDATE", "PLACEMENT", "IMG/s", "STEP ms", "BOUND")]
    for p in predictions:
        rows.append(
            (
                str(p.workers),
                str(p.ps) if p.variable_update != "collective_all_reduce" else "-",
                p.variable_update,
                p.strategy or "-",
                f"{p.images_per_sec:.1f}",
                f"{p.step_s * 1e3:.0f}",
                p.bound,
            )
        )
    return aligned(rows)


def error_pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def measured_lines(inputs: Inputs, rows: Iterable, strategy: str) -> tuple[list[str], float | None]:
    """``tflaunch bench --predict``: each measured row (bench.Row) beside its prediction, and
    the median absolute error in percent."""
    from tflaunch.text import aligned

    table = [("WORKERS", "PS", "VARIABLE UPDATE", "REAL", "MEASURED", "PREDICTED", "ERROR %")]
    errors = []
    for row in rows:
        point = row.point
        if row.mean is None:
            continue
        pred = predict(inputs, point.workers, point.ps, point.variable_update, strategy)
        err = error_pct(pred.images_per_sec, row.mean)
        errors.append(abs(err))
        table.append(
            (
                str(point.workers),
                str(point.ps),
                point.variable_update,
                str(point.real_data),
                f"{row.mean:.1f}",
                f"{pred.images_per_sec:.1f}",
                f"{err:+.1f}",
            )
        )
    median = statistics.median(errors) if errors else None
    lines = aligned(table)
    if median is not None:
        lines.append(f"median absolute error: {median:.1f} % over {len(errors)} rows")
    return lines, median


def load_inputs(path: Path) -> Inputs:
    try:
        return Inputs.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise ModelError(
            f"no model inputs at {path}; write them with 'tflaunch model --save'."
        ) from None
    except ValueError as exc:
        raise ModelError(f"{path} is not JSON ({exc}).") from None


def _model_variables(model: str, num_classes: int) -> tuple[tuple[str, tuple[int, ...], int], ...]:
    """The model's trainable variables, from one TensorFlow graph build (as tflaunch placement)."""
    from tflaunch.models.registry import UnknownModelError, get_model_spec
    from tflaunch.tools.placement_command import model_variables

    try:
        spec = get_model_spec(model)
    except UnknownModelError as exc:
        raise ModelError(str(exc)) from None
    return tuple((v.name, tuple(v.shape), v.dtype_size) for v in model_variables(spec, num_classes))


def _int_list(text: str) -> list[int]:
    from tflaunch.tools.placement_command import parse_ps_counts

    return parse_ps_counts(text)


@click.command("model")
@click.option("--netbench", "netbench_path", default=None, help="netbench.json or its run dir.")
@click.option("--compute-img-s", type=float, default=None, help="A lone worker's images/sec.")
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--model", "model_name", default="inception_v3", show_default=True)
@click.option("--num-classes", type=int, default=1001, show_default=True)
@click.option("--per-variable-us", type=float, default=0.0, show_default=True)
@click.option("--inputs", "inputs_path", default=None, help="Model inputs saved with --save.")
@click.option("--save", "save_path", default=None, help="Write the model inputs here (JSON).")
@click.option("--workers", default="1,2,4,8", show_default=True)
@click.option("--ps", "ps_text", default="1-4", show_default=True)
@click.option("--all", "show_all", is_flag=True, help="Print every prediction, not the best.")
def model_command(
    netbench_path: str | None,
    compute_img_s: float | None,
    batch_size: int,
    model_name: str,
    num_classes: int,
    per_variable_us: float,
    inputs_path: str | None,
    save_path: str | None,
    workers: str,
    ps_text: str,
    show_all: bool,
) -> None:
    """Predict images/sec for W workers x P PS per variable update; recommend P and placement."""
    if inputs_path:
        inputs = load_inputs(Path(inputs_path))
    else:
        if not netbench_path or compute_img_s is None:
            raise ModelError(
                "give --netbench (a netbench run) and --compute-img-s (a lone worker's "
                "images/sec at --batch-size), or --inputs FILE."
            )
        inputs = Inputs(
            compute_from_single(compute_img_s, batch_size),
            batch_size,
            _model_variables(model_name, num_classes),
            link_from_netbench(load_netbench(Path(netbench_path))),
            per_variable_us * 1e-6,
        )
    if save_path:
        Path(save_path).write_text(json.dumps(inputs.to_dict(), indent=1), encoding="utf-8")
    click.echo("Assumptions:\n" + ASSUMPTIONS + "\n")
    click.echo(
        f"inputs: compute {inputs.compute_s * 1e3:.1f} ms per step of {inputs.batch_size} images, "
        f"{len(inputs.variable_bytes)} variables {inputs.model_bytes / 1e6:.1f} MB, latency "
        f"{inputs.link.latency_s * 1e6:.0f} µs, bandwidth {inputs.link.bandwidth / 1e6:.0f} MB/s"
    )
    predictions = grid(inputs, _int_list(workers), _int_list(ps_text))
    if show_all:
        for line in prediction_lines(predictions):
            click.echo(line)
        click.echo("")
    best = recommend(predictions)
    click.echo("Recommended per worker count:")
    for line in prediction_lines([best[w] for w in sorted(best)]):
        click.echo(line)
