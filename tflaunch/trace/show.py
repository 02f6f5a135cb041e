"""Showing a trace (``tflaunch trace RUN``, and ``up --trace`` at its end): the per-task summary,
the transfers of a traced run's parameters, where the trace is, the timeline drawn into
``trace.png``; or the one line saying why a run has no trace. No TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tflaunch.trace.files import VERDICT_FILE, read_verdict
from tflaunch.trace.format import (
    CATEGORIES,
    HOW_TO_OPEN,
    PNG_FILE,
    TRACE_FILE,
    events_by_task,
    load_trace,
    summarize,
    summary_lines,
)
from tflaunch.trace.request import TraceError

# -- picture ---------------------------------------------------------------------------------

# Waits are long and overlap the kernels run meanwhile: drawn first, under them.
DRAW_ORDER = ("step", "recv_wait", "compute", "communication", "runtime")
COLOURS = {
    "step": "#bbbbbb",
    "compute": "#2b7bba",
    "communication": "#e6550d",
    "recv_wait": "#fdd0a2",
    "runtime": "#31a354",
}


def render_png(trace: Mapping, path: Path, max_rows_per_task: int = 4) -> Path:
    """A timeline: one band per task (its step row, then its busiest threads), coloured by
    category, on the shared time axis."""
    from tflaunch.plots import pyplot

    plt = pyplot()
    names, events = events_by_task(trace)
    rows: list[tuple[str, list[dict]]] = []
    for pid in sorted(events):
        by_tid: dict[int, list[dict]] = {}
        for e in events[pid]:
            by_tid.setdefault(e["tid"], []).append(e)
        for tid in sorted(by_tid)[:max_rows_per_task]:
            rows.append((f"{names.get(pid, pid)} t{tid}", by_tid[tid]))
    fig, ax = plt.subplots(figsize=(14, 0.45 * len(rows) + 1.6))
    for y, (_, evs) in enumerate(rows):
        for cat in DRAW_ORDER:
            spans = [(e["ts"] / 1000.0, e["dur"] / 1000.0) for e in evs if e["cat"] == cat]
            if not spans:
                continue
            if cat == "step":  # alternate shades so that adjacent steps stay apart
                colours = ["#999999", "#cccccc"] * len(spans)
                ax.broken_barh(spans, (y - 0.4, 0.8), color=colours[: len(spans)], lw=0)
                for e in evs:
                    if e["cat"] == "step":
                        mid = (e["ts"] + e["dur"] / 2) / 1000.0
                        ax.text(
                            mid,
                            y,
                            str(e["args"].get("step_num", "")),
                            ha="center",
                            va="center",
                            fontsize=7,
                        )
            else:
                ax.broken_barh(spans, (y - 0.3, 0.6), color=COLOURS[cat], lw=0)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first traced event (each host's wall clock)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[c]) for c in CATEGORIES]
    ax.legend(handles, CATEGORIES, loc="upper right", fontsize=8, ncol=len(CATEGORIES))
    ax.set_title("tflaunch trace: every task on one time axis")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- text ------------------------------------------------------------------------------------


def has_result(trace_dir: Path) -> bool:
    """Whether ``trace_dir`` holds a trace or the verdict on one."""
    return any((trace_dir / name).exists() for name in (TRACE_FILE, VERDICT_FILE))


def show_verdict(trace_dir: Path, show) -> None:
    """After a traced run: the summary and where the trace is, or the one line saying why there
    is none."""
    if (trace_dir / TRACE_FILE).exists():
        show_trace(trace_dir, show)
        return
    verdict = read_verdict(trace_dir)
    show(
        verdict[1] if verdict else "no trace because no task wrote one (see the first worker's log)"
    )


def show_transfers(trace: Mapping, trace_dir: Path, show) -> None:
    """Per worker step: arrival order against consumption order, overlap; the step-time spread
    (:mod:`tflaunch.trace.transfers`)."""
    from tflaunch.trace import transfers

    report = transfers.transfer_report(trace, transfers.load_order(trace_dir))
    for line in transfers.report_lines(report):
        show(line)


def show_trace(trace_dir: Path, show, refuse_without: bool = False) -> list[Path]:
    """Print the per-task summary and how to open the trace; draw trace.png. Returns the files.
    ``refuse_without``: where the verdict says why there is no trace, that line (TraceError)."""
    verdict = read_verdict(trace_dir)
    refused = refuse_without and verdict is not None and not verdict[0]
    if refused and not (trace_dir / TRACE_FILE).exists():
        raise TraceError(verdict[1])  # the one line saying why there is none
    trace = load_trace(trace_dir / TRACE_FILE)
    for line in summary_lines(summarize(trace)):
        show(line)
    show_transfers(trace, trace_dir, show)
    png = render_png(trace, trace_dir / PNG_FILE)
    show(f"trace: {trace_dir / TRACE_FILE} ({HOW_TO_OPEN}); timeline {png}")
    return [trace_dir / TRACE_FILE, png]
