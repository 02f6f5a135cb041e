"""The performance model's tables: predictions (``tflaunch model``) and predictions beside
measured rows (``tflaunch bench --predict``)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from tflaunch.text import aligned
from tflaunch.tools.perfmodel import Inputs, Prediction, predict


def prediction_lines(predictions: Sequence[Prediction]) -> list[str]:
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
    """``tflaunch bench --predict``: each measured row (bench_results.Row) beside its prediction, and
    the median absolute error in percent."""
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


def inputs_line(inputs: Inputs) -> str:
    """What the model was given, in one line."""
    return (
        f"inputs: compute {inputs.compute_s * 1e3:.1f} ms per step of {inputs.batch_size} images, "
        f"{len(inputs.variable_bytes)} variables {inputs.model_bytes / 1e6:.1f} MB, latency "
        f"{inputs.link.latency_s * 1e6:.0f} µs, bandwidth {inputs.link.bandwidth / 1e6:.0f} MB/s"
        f"{', a NIC per host' if inputs.nic else ''}"
        f"{', cores shared by all tasks' if inputs.shared_cores else ''}"
        + "".join(f", compute {c * 1e3:.0f} ms at {w} workers" for w, c in inputs.compute_at)
    )


def mode_line(sync: bool, packs: int, compact: bool, bucket_bytes: int = 0) -> str:
    """The training mode the PS rows are predicted in, and the all-reduce's packing."""
    cut = f"buckets of {bucket_bytes / 1e6:.1f} MB" if bucket_bytes else f"{packs} pack(s)"
    return (
        "PS steps: "
        + ("synchronous (assumption 10)" if sync else "asynchronous")
        + f"; all-reduce: {cut}, "
        + ("float16 on the wire" if compact else "float32")
    )
