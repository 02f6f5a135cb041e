"""The trace format, without TensorFlow: per-task events merged into one Chrome trace-event
document (``trace.json``), and the per-task summary.

The capture (:mod:`tflaunch.trace.capture`) and a program's own tracer
(:mod:`tflaunch.trace.profiler`), both with TensorFlow, decode the profilers' XPlanes into
:class:`TaskTrace` s and write the merged trace and the summary here; ``tflaunch trace`` and
``up --trace`` (:mod:`tflaunch.trace.show`) read them back to print the summary and draw the
timeline. Each task's events carry its own wall clock (nanoseconds since the epoch): one host's
tasks share a clock exactly; across hosts the alignment is as good as their NTP.

Categories: ``step`` (one training step of a worker, ``step_num`` in its args), ``compute`` (a
kernel), ``communication`` (``_Send``/``_Recv`` kernels and collective all-reduce kernels: moving
tensors), ``recv_wait`` (a remote receive outstanding, from the request to the tensor's arrival:
the transfer and the wait for the sender to produce it, which the receiver cannot tell apart),
``runtime`` (``RunGraph``: a graph partition run on behalf of a step).

Open ``trace.json`` in the Perfetto UI (https://ui.perfetto.dev, "Open trace file") or
chrome://tracing; the raw per-task XPlanes under ``raw/`` open in TensorBoard's profile plugin
(``tensorboard --logdir <trace dir>/raw``) where it is installed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tflaunch.trace.request import TraceError

CATEGORIES = ("step", "compute", "communication", "recv_wait", "runtime")
TRACE_FILE = "trace.json"
SUMMARY_JSON = "trace_summary.json"
SUMMARY_TXT = "trace_summary.txt"
PNG_FILE = "trace.png"
HOW_TO_OPEN = (
    "open trace.json in https://ui.perfetto.dev (Open trace file) or chrome://tracing; "
    "raw/ holds each task's XPlane for TensorBoard's profile plugin (tensorboard --logdir raw)"
)


@dataclass(frozen=True)
class Event:
    """One interval on one thread of one task; times in nanoseconds since the epoch."""

    thread: str
    name: str
    category: str
    start_ns: int
    duration_ns: int
    args: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskTrace:
    """Every kept event of one task, and where its clock and window came from."""

    task: str
    host: str
    events: Sequence[Event]
    profile_start_ns: int = 0


def _task_order(task: str) -> tuple[int, int]:
    job, _, index = task.partition(":")
    rank = {"chief": 0, "worker": 1, "ps": 2, "evaluator": 3}.get(job, 4)
    return rank, int(index) if index.isdigit() else 0


def merge(tasks: Iterable[TaskTrace]) -> dict:
    """One Chrome trace-event document: a process per task (sorted chief, workers, PS), a thread
    per profiler line, times in microseconds from the earliest event of any task."""
    tasks = sorted(tasks, key=lambda t: _task_order(t.task))
    starts = [e.start_ns for t in tasks for e in t.events]
    if not starts:
        raise TraceError("the profiler returned no events from any task; nothing to merge.")
    origin = min(starts)
    events: list[dict] = []
    for pid, task in enumerate(tasks, start=1):
        events.append(_meta("process_name", pid, 0, name=f"{task.task} ({task.host})"))
        events.append(_meta("process_sort_index", pid, 0, sort_index=pid))
        threads = _thread_ids(task.events)
        for thread, tid in threads.items():
            events.append(_meta("thread_name", pid, tid, name=thread))
            events.append(_meta("thread_sort_index", pid, tid, sort_index=tid))
        for e in sorted(task.events, key=lambda e: e.start_ns):
            events.append(
                {
                    "ph": "X",
                    "pid": pid,
                    "tid": threads[e.thread],
                    "name": e.name,
                    "cat": e.category,
                    "ts": (e.start_ns - origin) / 1000.0,
                    "dur": e.duration_ns / 1000.0,
                    "args": dict(e.args),
                }
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "origin_unix_ns": origin,
            "tasks": {t.task: {"pid": i, "host": t.host} for i, t in enumerate(tasks, start=1)},
            "profile_start_skew_ms": _start_skew_ms(tasks),
        },
    }


def _meta(kind: str, pid: int, tid: int, **args: object) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": args}


def _thread_ids(events: Sequence[Event]) -> dict[str, int]:
    """Step markers' thread first, then threads by how busy they are."""
    busy: dict[str, int] = {}
    steps = set()
    for e in events:
        busy[e.thread] = busy.get(e.thread, 0) + e.duration_ns
        if e.category == "step":
            steps.add(e.thread)
    order = sorted(busy, key=lambda t: (t not in steps, -busy[t], t))
    return {thread: i for i, thread in enumerate(order, start=1)}


def _start_skew_ms(tasks: Sequence[TaskTrace]) -> float:
    """How far apart the tasks' profilers started on their own clocks: request latency plus
    clock offset, an upper bound of the misalignment on one host."""
    starts = [t.profile_start_ns for t in tasks if t.profile_start_ns]
    return (max(starts) - min(starts)) / 1e6 if starts else 0.0


# -- summary ---------------------------------------------------------------------------------


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping intervals merged, in order."""
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _length(intervals: Sequence[tuple[float, float]], lo: float, hi: float) -> float:
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in intervals)


def events_by_task(trace: Mapping) -> tuple[dict[int, str], dict[int, list[dict]]]:
    names: dict[int, str] = {}
    events: dict[int, list[dict]] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[e["pid"]] = str(e["args"]["name"]).split(" ")[0]
        elif e.get("ph") == "X":
            events.setdefault(e["pid"], []).append(e)
    return names, events


def step_windows(trace: Mapping) -> dict[str, list[tuple[int, float, float]]]:
    """Each worker's traced steps: (step_num, start µs, end µs)."""
    names, events = events_by_task(trace)
    out: dict[str, list[tuple[int, float, float]]] = {}
    for pid, evs in events.items():
        steps = [
            (int(e["args"].get("step_num", -1)), e["ts"], e["ts"] + e["dur"])
            for e in evs
            if e["cat"] == "step"
        ]
        if steps:
            out[names.get(pid, str(pid))] = sorted(steps, key=lambda s: s[1])
    return out


def summarize(trace: Mapping) -> dict[str, dict]:
    """Per task, per step: milliseconds computing, communicating, waiting on a remote receive,
    and idle.

    A worker's figures are over its own traced steps. A PS has no steps of its own: its window
    runs from the first traced step of any worker to the last one's end, and its per-step figures
    are that window's totals over the number of worker steps in it (the steps it served).
    Each instant counts once, in the first of: compute (any compute kernel running on any
    thread), communication (a send, receive or collective kernel), recv wait (a remote receive
    outstanding), idle.
    """
    names, events = events_by_task(trace)
    steps = step_windows(trace)
    all_steps = [s for task_steps in steps.values() for s in task_steps]
    summary: dict[str, dict] = {}
    for pid in sorted(events):
        task = names.get(pid, str(pid))
        own = steps.get(task)
        if own:
            windows, served = [(s[1], s[2]) for s in own], len(own)
        elif all_steps:
            windows = [(min(s[1] for s in all_steps), max(s[2] for s in all_steps))]
            served = len(all_steps)
        elif events[pid]:  # no task marked its steps: the whole captured window, as one
            windows = [
                (min(e["ts"] for e in events[pid]), max(e["ts"] + e["dur"] for e in events[pid]))
            ]
            served = 1
        else:
            continue
        layers: list[tuple[float, float]] = []
        covered = []
        for cat in ("compute", "communication", "recv_wait"):
            layers = union(
                layers + [(e["ts"], e["ts"] + e["dur"]) for e in events[pid] if e["cat"] == cat]
            )
            covered.append(sum(_length(layers, a, b) for a, b in windows))
        wall = sum(b - a for a, b in windows)
        parts = {
            "total": wall,
            "compute": covered[0],
            "communication": covered[1] - covered[0],
            "recv_wait": covered[2] - covered[1],
            "idle": wall - covered[2],
        }
        summary[task] = {
            "steps": served if all_steps else 0,
            "own_steps": bool(own),
            "window_ms": wall / 1000.0,
            "per_step_ms": {k: v / served / 1000.0 for k, v in parts.items()},
        }
    return summary


def summary_lines(summary: Mapping[str, Mapping]) -> list[str]:
    from tflaunch.text import aligned

    head = ("TASK", "STEPS", "STEP ms", "COMPUTE ms", "COMM ms", "RECV WAIT ms", "IDLE ms")
    rows = [head]
    for task, s in summary.items():
        p = s["per_step_ms"]
        steps = str(s["steps"]) if s["own_steps"] else f"{s['steps']} served"
        if not s["steps"]:
            steps = "window"  # no step markers: the figures are the window's totals
        cells = [p[k] for k in ("total", "compute", "communication", "recv_wait", "idle")]
        rows.append((task, steps, *(f"{v:.1f}" for v in cells)))
    return aligned(rows)


def write_outputs(trace: Mapping, out_dir: Path) -> list[Path]:
    """trace.json, trace_summary.json and trace_summary.txt in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(trace)
    paths = [out_dir / TRACE_FILE, out_dir / SUMMARY_JSON, out_dir / SUMMARY_TXT]
    paths[0].write_text(json.dumps(trace), encoding="utf-8")
    paths[1].write_text(json.dumps(summary, indent=1), encoding="utf-8")
    paths[2].write_text("\n".join(summary_lines(summary)) + "\n", encoding="utf-8")
    return paths


def load_trace(path: Path) -> dict:
    try:
        trace = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TraceError(
            f"no trace at {path}: run the cluster with 'tflaunch up CLUSTER --trace STEPS' "
            "(any Python TensorFlow program; where a traced run has none, its verdict.json "
            "says why)."
        ) from None
    except ValueError as exc:
        raise TraceError(f"{path} is not JSON ({exc}).") from None
    if not isinstance(trace, dict) or "traceEvents" not in trace:
        raise TraceError(f"{path} is not a Chrome trace-event file (no traceEvents).")
    return trace
