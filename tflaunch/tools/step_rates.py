"""Step rates of any program, from the progress samples the coordinator keeps
(``progress.jsonl``, see :mod:`tflaunch.runtime.progress`): each task's step and steps/s for
``status``, and for ``report`` a plot of steps/s (and images/sec where the output has them) per
task over time with the straggler figures: the spread of step rate across the workers and the
slowest one."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tflaunch.runtime.progress import TaskSeries, read_progress, straggler_figures
from tflaunch.runtime.run import Run
from tflaunch.text import aligned

PLOT = "steps_per_task.png"


def _order(task: str) -> tuple[int, int]:
    job, _, index = task.partition(":")
    return {"chief": 0, "worker": 1, "ps": 2}.get(job, 3), int(index) if index.isdigit() else 0


def _series(run: Run) -> list[TaskSeries]:
    return sorted(read_progress(run.dir).values(), key=lambda s: _order(s.task))


def _last_rate(series: TaskSeries) -> float | None:
    return next((r for r in reversed(series.rates) if r is not None), None)


def status_lines(run: Run) -> list[str]:
    """Each task's latest step, steps/s over the last 10 s of samples, and images/sec."""
    series = [s for s in _series(run) if any(x is not None for x in s.steps)]
    if not series:
        return []
    rows = [("TASK", "STEP", "STEPS/S", "IMG/S")]
    for s in series:
        step = next(x for x in reversed(s.steps) if x is not None)
        rate = s.latest_step_rate()
        img = _last_rate(s)
        rows.append(
            (
                s.task,
                str(step),
                "-" if rate is None else f"{rate:.2f}",
                "-" if img is None else f"{img:.1f}",
            )
        )
    return ["progress (from the tasks' output):", *aligned(rows)]


def progress_summary(run: Run) -> tuple[dict[str, Any] | None, str]:
    """Per task: last step, mean steps/s and mean images/sec; the straggler figures. Also as
    text for summary.txt. (None, "") without samples."""
    series = _series(run)
    if not series:
        return None, ""
    tasks: dict[str, Any] = {}
    for s in series:
        steps = [x for x in s.steps if x is not None]
        rates = [r for r in s.rates if r is not None]
        tasks[s.task] = {
            "last_step": steps[-1] if steps else None,
            "steps_per_s": s.mean_step_rate(),
            "images_per_s": sum(rates) / len(rates) if rates else None,
        }
    stragglers = straggler_figures(series)
    rows = [("TASK", "LAST STEP", "STEPS/S (mean)", "IMG/S (mean)")]
    for task, t in tasks.items():
        rows.append(
            (
                task,
                "-" if t["last_step"] is None else str(t["last_step"]),
                "-" if t["steps_per_s"] is None else f"{t['steps_per_s']:.2f}",
                "-" if t["images_per_s"] is None else f"{t['images_per_s']:.1f}",
            )
        )
    lines = ["", "Progress (steps found in each task's output):", *aligned(rows)]
    lines.append(straggler_line(stragglers))
    return {"tasks": tasks, "stragglers": stragglers}, "\n".join(lines) + "\n"


def straggler_line(stragglers: dict[str, Any] | None) -> str:
    if stragglers is None:
        return "stragglers: fewer than two workers with a step rate"
    rates = stragglers["steps_per_s"]
    slowest = stragglers["slowest"]
    return (
        f"stragglers: step rate spread {stragglers['spread'] * 100:.0f}% across "
        f"{len(rates)} workers ({min(rates.values()):.2f}-{max(rates.values()):.2f} steps/s); "
        f"slowest {slowest} at {rates[slowest]:.2f} steps/s"
    )


PNG_SOFTWARE = "tflaunch report"  # in a report PNG's metadata: how report --out knows its own


def png_bytes(figure: Any) -> bytes:
    """A matplotlib figure as a report's PNG, its Software field saying tflaunch wrote it."""
    data = io.BytesIO()
    figure.savefig(data, format="png", dpi=100, metadata={"Software": PNG_SOFTWARE})
    return data.getvalue()


def plot_progress(run: Run, write: Callable[[str, bytes], Path]) -> list[Path]:
    """steps_per_task.png: steps/s per task over time (and images/sec per task below it, when
    the output has them), the straggler summary as its title, handed to ``write`` (name, PNG;
    where it wrote it). [] without step samples."""
    series = [s for s in _series(run) if s.step_rates()]
    if not series:
        return []
    from tflaunch.tools.bench_sweep_plot import pyplot

    plt = pyplot()
    with_img = any(r is not None for s in series for r in s.rates)
    fig, axes = plt.subplots(
        2 if with_img else 1, 1, figsize=(11, 7 if with_img else 4.2), sharex=True, squeeze=False
    )
    origin = min(s.times[0] for s in series)
    ax = axes[0][0]
    for s in series:
        points = s.step_rates()
        ax.plot([t - origin for t, _ in points], [r for _, r in points], marker=".", label=s.task)
    ax.set_ylabel("steps/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    if with_img:
        ax2 = axes[1][0]
        for s in series:
            points = [(t - origin, r) for t, r in zip(s.times, s.rates, strict=True) if r]
            if points:
                ax2.plot(*zip(*points, strict=True), marker=".", label=s.task)
        ax2.set_ylabel("images/sec (as printed)")
        ax2.set_ylim(bottom=0)
        ax2.grid(alpha=0.3)
    axes[-1][0].set_xlabel("seconds since the first sample")
    fig.suptitle(f"{run.id}: step rate per task\n{straggler_line(straggler_figures(series))}")
    fig.tight_layout()
    path = write(PLOT, png_bytes(fig))
    plt.close(fig)
    return [path]
