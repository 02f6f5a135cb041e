"""PNG plots of a ``tflaunch bench`` sweep (matplotlib, imported only when plotting).

``images_per_sec.png``: img/s against workers, synthetic data beside real data; one line per
variable update (its best PS count at each worker count), the best row's PS count written at
each point, and a dashed ideal line (one-worker best x workers).
``efficiency.png``: scaling efficiency of the best rows against workers, synthetic beside real,
with 100 % dashed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tflaunch.plots import pyplot


def _kinds(rows: Sequence) -> list[bool]:
    return sorted({r.point.real_data for r in rows})


def plot_results(
    rows: Sequence, best: Mapping, eff: Mapping, out_dir: Path, title: str
) -> list[Path]:
    """Write the two plots of a sweep's rows, given its best row and efficiency per (real data,
    workers); returns their paths (none if no run succeeded)."""
    if not any(r.mean is not None for r in rows):
        return []
    plt = pyplot()
    kinds = _kinds(rows)
    workers = sorted({r.point.workers for r in rows})
    paths = [out_dir / "images_per_sec.png", out_dir / "efficiency.png"]

    fig, axes = _panels(plt, len(kinds))
    for ax, real in zip(axes[0], kinds, strict=True):
        for update in sorted({r.point.variable_update for r in rows}):
            series = _best_per_workers(rows, real, update)
            if series:
                xs = sorted(series)
                ax.plot(xs, [series[w] for w in xs], marker="o", label=update)
        one = best.get((real, 1))
        if one is not None:
            ax.plot(workers, [one.mean * w for w in workers], "k--", lw=1, label="ideal (linear)")
        for (kind, w), row in best.items():
            if kind == real:
                ax.annotate(
                    f"{row.point.ps} PS",
                    (w, row.mean),
                    textcoords="offset points",
                    xytext=(4, -12),
                    fontsize=8,
                )
        _label(ax, real, workers)
        ax.legend(fontsize=8)
    _save(plt, fig, "images/sec (mean over repeats)", f"{title}: throughput", paths[0])

    fig, axes = _panels(plt, len(kinds))
    for ax, real in zip(axes[0], kinds, strict=True):
        xs = sorted(w for (kind, w) in eff if kind == real)
        ax.plot(xs, [100 * eff[(real, w)] for w in xs], marker="o", label="best row")
        for w in xs:
            row = best[(real, w)]
            ax.annotate(
                f"{row.point.ps} PS, {row.point.variable_update}",
                (w, 100 * eff[(real, w)]),
                textcoords="offset points",
                xytext=(-40, -14),
                fontsize=8,
            )
        ax.axhline(100, color="k", ls="--", lw=1)
        _label(ax, real, workers)
        ax.set_ylim(0, 110)
    suptitle = f"{title}: img/s at W workers / (W x img/s at 1 worker)"
    _save(plt, fig, "scaling efficiency (%)", suptitle, paths[1])
    return paths


def _panels(plt: Any, count: int) -> Any:
    """A figure of ``count`` panels side by side, one y axis."""
    return plt.subplots(1, count, figsize=(5.5 * count, 4.2), squeeze=False, sharey=True)


def _label(ax: Any, real: bool, workers: Sequence[int]) -> None:
    """A panel's title (its data kind), its workers axis and grid."""
    ax.set_title(f"{'real' if real else 'synthetic'} data")
    ax.set_xlabel("workers")
    ax.set_xticks(workers)
    ax.grid(alpha=0.3)


def _save(plt: Any, fig: Any, ylabel: str, title: str, path: Path) -> None:
    """The first panel's y label and the figure's title; written to ``path`` and closed."""
    fig.axes[0].set_ylabel(ylabel)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _best_per_workers(rows: Sequence, real: bool, update: str) -> dict[int, float]:
    series: dict[int, float] = {}
    for r in rows:
        p = r.point
        if p.real_data == real and p.variable_update == update and r.mean is not None:
            series[p.workers] = max(series.get(p.workers, 0.0), r.mean)
    return series
