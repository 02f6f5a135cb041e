"""The launcher side of traces (``tflaunch up --trace``, ``tflaunch trace RUN``): the traced
run's environment and trace directory, the summary printed again, and the timeline drawn.
The format itself (merge, summary) is ``tflaunch.models.trace_format``; see its docstring for how
a trace is taken and what its categories mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tflaunch.models.trace_format import (  # noqa: F401 - the format, re-exported
    CATEGORIES,
    DEFAULT_FIRST_STEP,
    DEFAULT_PORT_OFFSET,
    DIR_ENV,
    HOW_TO_OPEN,
    PNG_FILE,
    PORT_OFFSET_ENV,
    STEPS_ENV,
    SUMMARY_JSON,
    SUMMARY_TXT,
    TRACE_FILE,
    Event,
    TaskTrace,
    TraceError,
    TraceWindow,
    events_by_task,
    load_trace,
    merge,
    parse_window,
    profiler_port,
    step_windows,
    summarize,
    summary_lines,
    trace_env,
    write_outputs,
)

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
    from tflaunch.tools.bench_sweep_plot import pyplot

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


# -- launcher side ---------------------------------------------------------------------------


def parse_seconds(text: str, option: str) -> float:
    """``30``, ``30s``, ``2m`` or ``1h`` as seconds (a positive number)."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    body, scale = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1.0)
    try:
        seconds = float(body) * scale
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise TraceError(f"{option} {text!r}: give a positive duration such as 30, 30s or 2m.")
    return seconds


def any_program_config(
    config,
    runs_dir: str,
    run_id: str,
    steps: str | None,
    at: str | None,
    length: str | None,
    port_offset: int,
):
    """``config`` traced by the launcher (any Python TensorFlow program): every task gets the
    trace hook, and the window is ``steps`` (FIRST:COUNT of the leader's step lines) or
    ``at``/``length``."""
    from dataclasses import replace

    from tflaunch.runtime.tracehook import request_env

    if at is None and length is not None and steps is None:
        raise TraceError("--trace-for needs --trace-at (or --trace STEPS) to say when.")
    if steps and at:
        raise TraceError("give --trace STEPS or --trace-at, not both.")
    window_steps = str(parse_window(steps)) if steps else None
    at_s = parse_seconds(at, "--trace-at") if at else None
    for_s = parse_seconds(length, "--trace-for") if length else None
    trace_dir = trace_dir_for(config, runs_dir, run_id)
    env = {
        **config.program.env,
        **request_env(trace_dir, port_offset, window_steps, at_s, for_s),
    }
    return replace(config, program=replace(config.program, env=env))


def trace_dir_for(config, runs_dir: str, run_id: str) -> str:
    """Where the first worker writes the trace: the run directory where the nodes share this
    machine's files (local, Slurm), else the run directory on the hosts (ssh)."""
    import posixpath

    from tflaunch import launch

    on_hosts = launch.backend_for(config.backend).host_run_dir(config, run_id)
    if on_hosts is not None:
        return posixpath.join(on_hosts, "trace")
    return str(Path(runs_dir).resolve() / run_id / "trace")


def show_verdict(trace_dir: Path, show) -> None:
    """After a traced run: the summary and where the trace is, or the one line saying why there
    is none."""
    from tflaunch.runtime.tracehook import read_verdict

    if (trace_dir / TRACE_FILE).exists():
        show_trace(trace_dir, show)
        return
    verdict = read_verdict(trace_dir)
    show(
        verdict[1] if verdict else "no trace because no task wrote one (see the first worker's log)"
    )


def show_transfers(trace: Mapping, trace_dir: Path, show) -> None:
    """Per worker step: arrival order against consumption order, overlap; the step-time spread
    (tflaunch.models.trace_transfers)."""
    from tflaunch.models import trace_transfers

    report = trace_transfers.transfer_report(trace, trace_transfers.load_order(trace_dir))
    for line in trace_transfers.report_lines(report):
        show(line)


def show_trace(trace_dir: Path, show) -> list[Path]:
    """Print the per-task summary and how to open the trace; draw trace.png. Returns the files."""
    trace = load_trace(trace_dir / TRACE_FILE)
    for line in summary_lines(summarize(trace)):
        show(line)
    show_transfers(trace, trace_dir, show)
    png = render_png(trace, trace_dir / PNG_FILE)
    show(f"trace: {trace_dir / TRACE_FILE} ({HOW_TO_OPEN}); timeline {png}")
    return [trace_dir / TRACE_FILE, png]
