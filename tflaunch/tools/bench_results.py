"""What a ``tflaunch bench`` sweep's runs come to: its grid points and measurements, the rows
that average their repeats, the best row per worker count and data kind with scaling efficiency
and I/O overhead, and the CSCS tables and ``results.csv`` that show them."""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, order=True)
class Point:
    """One grid point."""

    workers: int
    ps: int
    variable_update: str
    real_data: bool

    @property
    def label(self) -> str:
        data = "real" if self.real_data else "synthetic"
        return f"{self.workers} workers, {self.ps} PS, {self.variable_update}, {data}"

    @property
    def slug(self) -> str:
        data = "real" if self.real_data else "syn"
        return f"w{self.workers}-ps{self.ps}-{self.variable_update}-{data}"


@dataclass(frozen=True)
class Measurement:
    """One run of one grid point: img/s, or None if the run failed."""

    point: Point
    repeat: int
    images_per_sec: float | None
    exit_code: int
    run_id: str


@dataclass(frozen=True)
class Row:
    """A grid point's repeats, averaged."""

    point: Point
    mean: float | None
    stdev: float | None
    runs: int
    failed: int


# --- aggregation -----------------------------------------------------------------------------


def aggregate(measurements: Iterable[Measurement]) -> list[Row]:
    """Mean and standard deviation over the successful repeats of each point, sorted."""
    by_point: dict[Point, list[Measurement]] = {}
    for m in measurements:
        by_point.setdefault(m.point, []).append(m)
    rows = []
    for point in sorted(by_point):
        values = [m.images_per_sec for m in by_point[point] if m.images_per_sec is not None]
        rows.append(
            Row(
                point,
                statistics.fmean(values) if values else None,
                statistics.stdev(values) if len(values) > 1 else None,
                len(by_point[point]),
                len(by_point[point]) - len(values),
            )
        )
    return rows


def best_rows(rows: Iterable[Row]) -> dict[tuple[bool, int], Row]:
    """(real_data, workers) -> the row with the highest mean img/s."""
    best: dict[tuple[bool, int], Row] = {}
    for row in rows:
        if row.mean is None:
            continue
        key = (row.point.real_data, row.point.workers)
        if key not in best or row.mean > best[key].mean:  # type: ignore[operator]
            best[key] = row
    return best


def efficiency(best: Mapping[tuple[bool, int], Row]) -> dict[tuple[bool, int], float]:
    """Scaling efficiency: best img/s at W workers / (W x best img/s at 1 worker), per data kind."""
    out = {}
    for (real, workers), row in best.items():
        one = best.get((real, 1))
        if one is not None and one.mean:
            out[(real, workers)] = row.mean / (workers * one.mean)  # type: ignore[operator]
    return out


def io_overhead(best: Mapping[tuple[bool, int], Row]) -> dict[int, float]:
    """(synthetic - real) / synthetic of the best rows, per worker count having both."""
    out = {}
    for (real, workers), row in best.items():
        if real or (True, workers) not in best:
            continue
        synthetic, actual = row.mean, best[(True, workers)].mean
        out[workers] = (synthetic - actual) / synthetic  # type: ignore[operator]
    return out


# --- reports ---------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "failed" if value is None else format(value, spec)


def table(rows: Sequence[Row]) -> str:
    """The CSCS table: one line per grid point."""
    head = f"{'Num PSs':>7}  {'Num workers':>11}  {'Variable Update':<22}  {'Real Data':<9}  {'Img/s':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        p = r.point
        spread = f" +/- {r.stdev:.1f}" if r.stdev is not None else ""
        failed = f" ({r.failed}/{r.runs} failed)" if r.failed else ""
        lines.append(
            f"{p.ps:>7}  {p.workers:>11}  {p.variable_update:<22}  "
            f"{str(p.real_data):<9}  {_fmt(r.mean):>9}{spread}{failed}"
        )
    return "\n".join(lines)


def best_table(rows: Sequence[Row]) -> str:
    """The best row per worker count and data kind, with efficiency and I/O overhead."""
    best = best_rows(rows)
    eff = efficiency(best)
    head = (
        f"{'Num workers':>11}  {'Real Data':<9}  {'Num PSs':>7}  {'Variable Update':<22}  "
        f"{'Img/s':>9}  {'Efficiency':>10}"
    )
    lines = ["Best per worker count", head, "-" * len(head)]
    for key in sorted(best, key=lambda k: (k[1], k[0])):
        row = best[key]
        e = f"{100 * eff[key]:.1f} %" if key in eff else "-"
        lines.append(
            f"{row.point.workers:>11}  {str(row.point.real_data):<9}  {row.point.ps:>7}  "
            f"{row.point.variable_update:<22}  {_fmt(row.mean):>9}  {e:>10}"
        )
    overhead = io_overhead(best)
    if overhead:
        parts = ", ".join(f"{w} workers {100 * o:.1f} %" for w, o in sorted(overhead.items()))
        lines += ["", f"I/O overhead (synthetic - real) / synthetic: {parts}"]
    return "\n".join(lines)


def write_csv(path: Path, rows: Sequence[Row]) -> None:
    best = {id(r) for r in best_rows(rows).values()}
    eff = efficiency(best_rows(rows))
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(
            [
                "num_ps",
                "num_workers",
                "variable_update",
                "real_data",
                "img_per_sec",
                "stdev",
                "runs",
                "failed",
                "best",
                "efficiency",
            ]
        )
        for r in rows:
            p = r.point
            key = (p.real_data, p.workers)
            is_best = id(r) in best
            out.writerow(
                [
                    p.ps,
                    p.workers,
                    p.variable_update,
                    p.real_data,
                    _num(r.mean),
                    _num(r.stdev),
                    r.runs,
                    r.failed,
                    is_best,
                    _num(eff.get(key)) if is_best else "",
                ]
            )


def _num(value: float | None) -> str:
    return "" if value is None or math.isnan(value) else f"{value:.3f}"
