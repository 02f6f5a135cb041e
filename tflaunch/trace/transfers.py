"""How a traced run's parameters travelled, per worker step (no TensorFlow: ``tflaunch trace``
runs it on the launcher):

* **order**: the order in which the variables' receives finished on the worker (arrival), against
  the order in which the forward pass consumes them (the graph's, from ``transfer_order.json``,
  which the benchmark's first worker writes beside the trace), as Kendall's tau: 1 when they
  arrive exactly in consumption order, 0 when the order is unrelated, -1 when reversed;
* **overlap**: the fraction of the worker's communication time during which some compute kernel
  ran on the worker too. Communication: a receive of a variable outstanding (from the request at
  the step's start to the tensor's arrival; every receive without an order file) or a send or
  receive kernel running. Gradients leave through sends as the backward pass makes them; their
  crossing is seen on the PS, not here;
* **spread**: the step times of every traced step of every worker: mean, coefficient of
  variation (standard deviation over mean), min and max.

A receive in the trace is named after the op whose output it carries plus ``_S<n>``; the order
file lists, per variable, the reads whose outputs cross the link. A tensor can cross more than
once a step (with the model's own reads, ``--transfer_order none``, the benchmark's InceptionV3
worker receives each convolution kernel twice: two send/receive pairs for one read, whose
consumers are the convolution, its input gradient and that gradient's ``ShapeN``): ``receives``
counts them, ``received`` counts variables, each in at its first receive.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from tflaunch.trace.format import events_by_task, step_windows, union

ORDER_FILE = "transfer_order.json"
REPORT_JSON = "trace_transfers.json"
REPORT_TXT = "trace_transfers.txt"
_RECV_SUFFIX = re.compile(r"_S\d+$")


def kendall_tau(values: Sequence[float]) -> float:
    """Kendall's tau (tau-a) between positions and ``values``: +1 if ``values`` ascend, -1 if they
    descend; nan for fewer than two values."""
    n = len(values)
    if n < 2:
        return math.nan
    score = 0
    for i in range(n):
        vi = values[i]
        for j in range(i + 1, n):
            d = values[j] - vi
            score += (d > 0) - (d < 0)
    return score / (n * (n - 1) / 2)


def _clip(spans: Iterable[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi]


def _length(spans: Iterable[tuple[float, float]]) -> float:
    return sum(b - a for a, b in spans)


def _intersection(xs: Sequence[tuple[float, float]], ys: Sequence[tuple[float, float]]) -> float:
    """Length of the intersection of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def load_order(trace_dir: Path) -> dict | None:
    path = trace_dir / ORDER_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return None


def _read_ranks(order: Mapping | None) -> dict[str, int]:
    """Read op name -> the consumption rank of the variable it carries."""
    if not order:
        return {}
    return {
        read: int(v["consumption_rank"]) for v in order.get("variables", []) for read in v["reads"]
    }


def transfer_report(trace: Mapping, order: Mapping | None) -> dict:
    """Per worker step: step ms, variables received, Kendall's tau of arrival against consumption
    (None without an order file), overlap; then the step-time spread over all of them."""
    names, events = events_by_task(trace)
    pids = {name: pid for pid, name in names.items()}
    ranks = _read_ranks(order)
    rows = []
    for task, steps in step_windows(trace).items():
        evs = events.get(pids.get(task), [])
        compute = union((e["ts"], e["ts"] + e["dur"]) for e in evs if e["cat"] == "compute")
        sends = [(e["ts"], e["ts"] + e["dur"]) for e in evs if e["cat"] == "communication"]
        recvs = [e for e in evs if e["cat"] == "recv_wait"]
        for step, start, end in steps:
            arrivals, waits = [], []
            for e in recvs:
                if start <= e["ts"] < end:
                    op = _RECV_SUFFIX.sub("", str(e["args"].get("tensor", e["name"])))
                    if op in ranks or not ranks:
                        waits.append((e["ts"], e["ts"] + e["dur"]))
                    if op in ranks:
                        arrivals.append((e["ts"] + e["dur"], ranks[op]))
            receives = len(arrivals)
            first: dict[int, float] = {}  # a variable is in once its first receive is
            for at, rank in arrivals:
                first[rank] = min(first.get(rank, at), at)
            arrivals = sorted((at, rank) for rank, at in first.items())
            step_comm = _clip(union(waits + sends), start, end)
            comm_ms = _length(step_comm) / 1000.0
            overlapped = _intersection(step_comm, _clip(compute, start, end)) / 1000.0
            rows.append(
                {
                    "task": task,
                    "step": step,
                    "step_ms": (end - start) / 1000.0,
                    "received": len(arrivals),
                    "receives": receives,
                    "kendall_tau": kendall_tau([r for _, r in arrivals]) if ranks else None,
                    "comm_ms": comm_ms,
                    "overlap": overlapped / comm_ms if comm_ms > 0 else None,
                }
            )
    return {
        "steps": rows,
        "spread": step_spread([r["step_ms"] for r in rows]),
        "order": _mode(order),
        "gradients": gradient_order(trace, order),
    }


def gradient_order(trace: Mapping, order: Mapping | None) -> dict[str, dict]:
    """Per PS: how the gradients of one worker step (one step id) arrived, against backward
    order (the reverse of consumption): Kendall's tau, +1 when the last layer's come first."""
    if not order:
        return {}
    ranks = (
        {g: int(v["consumption_rank"]) for v in order.get("variables", []) for g in v["gradients"]}
        if all("gradients" in v for v in order.get("variables", []))
        else {}
    )
    names, events = events_by_task(trace)
    out = {}
    for pid, task in names.items():
        if not task.startswith("ps"):
            continue
        by_step: dict[object, list[tuple[float, int]]] = {}
        for e in events.get(pid, []):
            if e["cat"] != "recv_wait":
                continue
            op = _RECV_SUFFIX.sub("", str(e["args"].get("tensor", "")))
            if op in ranks:
                step = e["args"].get("step_id")
                by_step.setdefault(step, []).append((e["ts"] + e["dur"], -ranks[op]))
        taus = [kendall_tau([r for _, r in sorted(a)]) for a in by_step.values() if len(a) > 1]
        if taus:
            out[task] = {"steps": len(taus), "kendall_tau_backward": statistics.fmean(taus)}
    return out


def _mode(order: Mapping | None) -> dict:
    if not order:
        return {}
    keys = ("variable_update", "transfer_order", "staged_vars")
    return {k: order[k] for k in keys if k in order} | {"variables": len(order["variables"])}


def step_spread(step_ms: Sequence[float]) -> dict:
    """Mean, coefficient of variation, min and max of step times (ms)."""
    if not step_ms:
        return {"steps": 0}
    mean = statistics.fmean(step_ms)
    cv = statistics.pstdev(step_ms) / mean if len(step_ms) > 1 and mean > 0 else 0.0
    return {
        "steps": len(step_ms),
        "mean_ms": mean,
        "cv": cv,
        "min_ms": min(step_ms),
        "max_ms": max(step_ms),
    }


def _fmt(value: float | None, pattern: str) -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else pattern.format(value)
    )


def report_lines(report: Mapping) -> list[str]:
    from tflaunch.text import aligned

    mode = report.get("order") or {}
    head = "transfers"
    if mode:
        head += (
            f" ({mode.get('variable_update')}, order {mode.get('transfer_order')}, staged "
            f"{'yes' if mode.get('staged_vars') else 'no'}, {mode.get('variables')} variables)"
        )
    table = [
        (
            "WORKER",
            "STEP",
            "STEP ms",
            "VARIABLES",
            "RECEIVES",
            "TAU (ARRIVAL~USE)",
            "COMM ms",
            "OVERLAP %",
        )
    ]
    for r in report["steps"]:
        table.append(
            (
                r["task"],
                str(r["step"]),
                f"{r['step_ms']:.1f}",
                str(r["received"]),
                str(r["receives"]),
                _fmt(r["kendall_tau"], "{:+.2f}"),
                f"{r['comm_ms']:.1f}",
                _fmt(None if r["overlap"] is None else 100 * r["overlap"], "{:.0f}"),
            )
        )
    s = report["spread"]
    lines = [head + ":", *aligned(table)]
    if s.get("steps"):
        lines.append(
            f"step time over {s['steps']} worker steps: mean {s['mean_ms']:.1f} ms, CV "
            f"{100 * s['cv']:.1f} %, min {s['min_ms']:.1f} ms, max {s['max_ms']:.1f} ms"
        )
    for task, g in (report.get("gradients") or {}).items():
        lines.append(
            f"gradients at {task}: arrival against backward order, Kendall tau "
            f"{g['kendall_tau_backward']:+.2f} (mean over {g['steps']} worker steps served)"
        )
    if not mode:
        lines.append(f"(no {ORDER_FILE} beside the trace: arrival order not compared)")
    return lines


def write_report(trace: Mapping, trace_dir: Path) -> list[Path]:
    """trace_transfers.json and .txt beside the trace."""
    report = transfer_report(trace, load_order(trace_dir))
    paths = [trace_dir / REPORT_JSON, trace_dir / REPORT_TXT]
    paths[0].write_text(json.dumps(report, indent=1), encoding="utf-8")
    paths[1].write_text("\n".join(report_lines(report)) + "\n", encoding="utf-8")
    return paths
