"""``tflaunch report RUN``: plots and a summary table from a run's resource samples.

The plots are the views the PS-versus-all-reduce studies judged clusters by: CPU utilization per
node over time, packets sent and received per node over time (PS traffic grows with the number
of workers), and memory (and CPU) per task. The summary gives each task's mean and peak CPU and
memory and each node's bytes and packets moved while the run was sampled.

Bytes and packets are differences of the cumulative interface counters between consecutive
samples, summed over the run; a node's total is the sum over its interfaces (traffic that passes
a bridge and a veth is counted on both, as the kernel counts it). The agent's first sample is
taken before its tasks start and its last after they ended, so the totals hold all their traffic.

matplotlib is imported only when plotting (with the Agg backend: no display needed).
"""

from __future__ import annotations

import functools
import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tflaunch.cluster.render import render_task
from tflaunch.errors import ConfigError, TflaunchError
from tflaunch.outfiles import write_outside
from tflaunch.runtime.monitor import NET_FIELDS, read_samples
from tflaunch.runtime.run import Run
from tflaunch.runtime.runfiles import file_mode, make_run_dir, replace_run_file
from tflaunch.text import aligned
from tflaunch.tools.step_rates import PNG_SOFTWARE, plot_progress, png_bytes, progress_summary

PLOTS = ("cpu_per_node.png", "packets_per_node.png", "memory_per_task.png", "cpu_per_task.png")
MIB = 1024 * 1024


@dataclass
class Series:
    """One line of a plot: seconds since the run's first sample, and values (None: no value)."""

    seconds: list[float] = field(default_factory=list)
    values: list[float | None] = field(default_factory=list)

    def add(self, second: float, value: float | None) -> None:
        self.seconds.append(second)
        self.values.append(value)

    def stats(self) -> tuple[float | None, float | None]:
        known = [v for v in self.values if v is not None]
        return (sum(known) / len(known), max(known)) if known else (None, None)


@dataclass
class NodeUsage:
    host: str
    cpu: Series = field(default_factory=Series)
    memory: Series = field(default_factory=Series)
    packets_sent_rate: Series = field(default_factory=Series)
    packets_recv_rate: Series = field(default_factory=Series)
    interfaces: dict[str, dict[str, int]] = field(default_factory=dict)  # nic -> field -> total

    def total(self, name: str) -> int:
        return sum(counts[name] for counts in self.interfaces.values())


@dataclass
class TaskUsage:
    task: str
    host: str
    cpu: Series = field(default_factory=Series)
    rss: Series = field(default_factory=Series)
    threads_peak: int = 0


@dataclass
class Usage:
    start: float
    duration: float
    samples: int
    nodes: dict[str, NodeUsage]
    tasks: dict[str, TaskUsage]


def net_steps(
    previous: dict[str, dict[str, int]], current: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    """Per interface, what its counters moved from one sample to the next.

    An interface that appeared meanwhile moved its whole counter (it started from zero); a counter
    that went down (the interface was recreated) counts from zero again.
    """
    moved = {}
    for nic, counts in current.items():
        before = previous.get(nic)
        moved[nic] = {
            f: (counts[f] - before[f] if before and counts[f] >= before[f] else counts[f])
            for f in NET_FIELDS
        }
    return moved


def usage_from_samples(hosts: dict[str, list[dict[str, Any]]]) -> Usage:
    """Series and totals per node and per task from every host's samples (in time order)."""
    start = min(records[0]["time"] for records in hosts.values())
    end = max(records[-1]["time"] for records in hosts.values())
    nodes, tasks = {}, {}
    for host, records in sorted(hosts.items()):
        node = nodes[host] = NodeUsage(host)
        previous = None
        for record in records:
            second = record["time"] - start
            info = record.get("node", {})
            node.cpu.add(second, info.get("cpu_percent"))
            node.memory.add(second, info.get("mem_used"))
            if previous is not None:
                _add_traffic(node, previous, record, second)
            previous = record
            for name, usage in record.get("tasks", {}).items():
                task = tasks.setdefault(name, TaskUsage(name, host))
                task.cpu.add(second, usage.get("cpu_percent"))
                task.rss.add(second, usage.get("rss"))
                task.threads_peak = max(task.threads_peak, usage.get("threads", 0))
    count = sum(len(records) for records in hosts.values())
    return Usage(start, end - start, count, nodes, dict(sorted(tasks.items(), key=_task_order)))


def _add_traffic(node: NodeUsage, previous: dict, record: dict, second: float) -> None:
    moved = net_steps(previous["node"].get("net", {}), record["node"].get("net", {}))
    for nic, counts in moved.items():
        totals = node.interfaces.setdefault(nic, dict.fromkeys(NET_FIELDS, 0))
        for name in NET_FIELDS:
            totals[name] += counts[name]
    interval = record["time"] - previous["time"]
    if interval > 1e-3:
        node.packets_sent_rate.add(
            second, sum(c["packets_sent"] for c in moved.values()) / interval
        )
        node.packets_recv_rate.add(
            second, sum(c["packets_recv"] for c in moved.values()) / interval
        )


def _task_order(item: tuple[str, TaskUsage]) -> tuple[str, int]:
    job, _, index = item[0].partition(":")
    return job, int(index) if index.isdigit() else 0


# ---- summary ----------------------------------------------------------------------------------


def summary(usage: Usage) -> dict[str, Any]:
    """The numbers of the summary table (written as summary.json beside the text)."""
    tasks = {}
    for name, task in usage.tasks.items():
        cpu_mean, cpu_peak = task.cpu.stats()
        rss_mean, rss_peak = task.rss.stats()
        tasks[name] = {
            "host": task.host,
            "cpu_percent_mean": _round(cpu_mean),
            "cpu_percent_peak": cpu_peak,
            "rss_mean": _round(rss_mean, 0),
            "rss_peak": rss_peak,
            "threads_peak": task.threads_peak,
        }
    nodes = {}
    for host, node in usage.nodes.items():
        cpu_mean, cpu_peak = node.cpu.stats()
        nodes[host] = {
            "cpu_percent_mean": _round(cpu_mean),
            "cpu_percent_peak": cpu_peak,
            "mem_used_peak": node.memory.stats()[1],
            **{name: node.total(name) for name in NET_FIELDS},
            "interfaces": {
                nic: counts
                for nic, counts in sorted(node.interfaces.items())
                if any(counts.values())
            },
        }
    return {
        "start": usage.start,
        "seconds": round(usage.duration, 3),
        "samples": usage.samples,
        "tasks": tasks,
        "nodes": nodes,
    }


def format_summary(run_id: str, data: dict[str, Any]) -> str:
    lines = [
        f"run {run_id}: {len(data['tasks'])} task(s) on {len(data['nodes'])} node(s), "
        f"{data['samples']} samples over {data['seconds']:.1f} s",
        "",
    ]
    rows = [("TASK", "HOST", "CPU% MEAN", "CPU% PEAK", "RSS MEAN", "RSS PEAK", "THREADS")]
    for name, t in data["tasks"].items():
        rows.append(
            (
                name,
                t["host"],
                _num(t["cpu_percent_mean"]),
                _num(t["cpu_percent_peak"]),
                _mib(t["rss_mean"]),
                _mib(t["rss_peak"]),
                str(t["threads_peak"]),
            )
        )
    lines += aligned(rows) + [""]
    rows = [
        ("NODE", "CPU% MEAN", "CPU% PEAK", "MEM PEAK", "SENT", "RECEIVED", "PKTS SENT", "PKTS RECV")
    ]
    for host, n in data["nodes"].items():
        rows.append(
            (
                host,
                _num(n["cpu_percent_mean"]),
                _num(n["cpu_percent_peak"]),
                _mib(n["mem_used_peak"]),
                _mib(n["bytes_sent"]),
                _mib(n["bytes_recv"]),
                str(n["packets_sent"]),
                str(n["packets_recv"]),
            )
        )
    lines += aligned(rows) + ["", "bytes per interface (those that moved any):"]
    for host, n in data["nodes"].items():
        for nic, c in n["interfaces"].items():
            lines.append(
                f"  {host} {nic}: sent {c['bytes_sent']} B ({c['packets_sent']} packets),"
                f" received {c['bytes_recv']} B ({c['packets_recv']} packets)"
            )
    return "\n".join(lines) + "\n"


def instance_cost(records: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """Instance-hours and USD of the machines a run created (``instances`` in run.json: launch
    and termination times, hourly price); a machine still running counts up to ``now``."""
    hours, usd, priced = 0.0, 0.0, True
    for record in records:
        spent = max(0.0, (record.get("terminated") or now) - record["launched"]) / 3600
        hours += spent
        if record.get("hourly_usd") is None:
            priced = False
        else:
            usd += spent * record["hourly_usd"]
    running = sum(1 for r in records if not r.get("terminated"))
    return {
        "count": len(records),
        "running": running,
        "instance_hours": round(hours, 4),
        "usd": round(usd, 4) if priced else None,
    }


def format_instance_cost(cost: dict[str, Any]) -> str:
    usd = "unknown (a type without a price)" if cost["usd"] is None else f"USD {cost['usd']:.4f}"
    still = f", {cost['running']} still running" if cost["running"] else ""
    return (
        f"\ninstances: {cost['count']}{still}; {cost['instance_hours']:.4f} instance-hours, {usd}\n"
    )


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / MIB:.1f} MiB"


# ---- plots ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportTarget:
    """Where a run's report goes and how its files get there: into the run directory as its
    files are written (:func:`replace_run_file`), and to ``--out`` through
    :func:`tflaunch.outfiles.write_outside` (no symlink followed; a file there that is not a
    report file of tflaunch's is replaced only with ``force``)."""

    dir: Path
    perms: int  # the run directory's file mode, which the report's files take
    outside: bool = False
    force: bool = False

    def write(self, name: str, data: str | bytes) -> Path:
        path = self.dir / name
        if self.outside:
            ours = functools.partial(is_report_file, name)
            write_outside(path, data, ours, self.force, mode=self.perms)
        else:
            replace_run_file(path, data, self.perms)
        return path


def is_report_file(name: str, head: bytes) -> bool:
    """Whether a file called ``name`` that starts with ``head`` is one ``report`` wrote."""
    if name.endswith(".png"):
        return PNG_SOFTWARE.encode() in head
    if name.endswith(".html"):
        return head.startswith(HTML_START)
    if name == "summary.json":
        return head.startswith(b'{\n  "start": ') and b'\n  "samples": ' in head
    first = head.split(b"\n", 1)[0]
    return name == "summary.txt" and first.startswith(b"run ") and b" task(s) on " in first


HTML_START = b'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>tflaunch run '


def report_dir(
    run: Run, out_dir: str | os.PathLike | ReportTarget | None, force: bool = False
) -> ReportTarget:
    """Where a run's report goes: the run directory, or ``--out`` (made with the run
    directory's mode when new). A symlinked ``--out`` is refused: a report is written where it
    is asked for, never where a planted link points."""
    if isinstance(out_dir, ReportTarget):
        return out_dir
    perms = file_mode(run.dir)
    if not out_dir:
        return ReportTarget(run.dir, perms)
    out = Path(out_dir)
    if out.is_symlink():
        raise ConfigError(
            f"--out {out} is a symlink (to {os.readlink(out)}); tflaunch does not write a "
            "run's report through one. Give the folder itself."
        )
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is not a folder; give a folder to write the report to.")
    make_run_dir(out, stat.S_IMODE(run.dir.stat().st_mode))
    return ReportTarget(out, perms, outside=True, force=force)


def plot(usage: Usage, target: ReportTarget, title: str) -> list[Path]:
    """Write the PNGs; returns their paths."""
    try:
        import matplotlib
    except ImportError:
        raise TflaunchError(
            "the plots need matplotlib, which is not installed here; install it "
            "(pip install matplotlib, or the tf extra) and run the report "
            "again. The summary was written."
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def figure(
        name: str,
        what: str,
        lines: dict[str, Any],
        ylabel: str,
        ymax: float | None = None,
        axes_count: int = 1,
        subtitles: tuple[str, ...] = (),
    ) -> Path:
        fig, axes = plt.subplots(axes_count, 1, figsize=(9, 3.2 * axes_count + 0.6), squeeze=False)
        for i, ax in enumerate(axes[:, 0]):
            for label, series in lines.items():
                data = series[i] if axes_count > 1 else series
                ax.plot(
                    data.seconds,
                    [float("nan") if v is None else v for v in data.values],
                    label=label,
                    marker="." if len(data.seconds) < 40 else None,
                )
            ax.set_ylabel(ylabel)
            ax.set_ylim(bottom=0, top=ymax)
            ax.grid(alpha=0.3)
            if subtitles:
                ax.set_title(subtitles[i], fontsize=10)
            if lines:  # a run with no samples of this kind: an empty plot, no empty legend
                ax.legend(fontsize=8, loc="best")
        axes[-1, 0].set_xlabel("seconds since the run's first sample")
        fig.suptitle(f"{what} — {title}", fontsize=11)
        fig.tight_layout()
        path = target.write(name, png_bytes(fig))
        plt.close(fig)
        return path

    nodes, tasks = usage.nodes.values(), usage.tasks.values()
    mib = {
        t.task: Series(t.rss.seconds, [None if v is None else v / MIB for v in t.rss.values])
        for t in tasks
    }
    return [
        figure(
            PLOTS[0],
            "CPU utilization per node",
            {n.host: n.cpu for n in nodes},
            "% of all cores",
            ymax=105,
        ),
        figure(
            PLOTS[1],
            "Packets per node",
            {n.host: (n.packets_sent_rate, n.packets_recv_rate) for n in nodes},
            "packets/s",
            axes_count=2,
            subtitles=("sent", "received"),
        ),
        figure(PLOTS[2], "Memory per task (RSS, with its children)", mib, "MiB"),
        figure(
            PLOTS[3],
            "CPU per task (with its children)",
            {t.task: t.cpu for t in tasks},
            "% of one core",
        ),
    ]


# ---- the command ------------------------------------------------------------------------------


def make_report(
    run: Run,
    out_dir: str | os.PathLike | ReportTarget | None = None,
    plots: bool = True,
    show: Callable[[str], Any] | None = None,
    force: bool = False,
) -> tuple[str, list[Path]]:
    """Write summary.txt, summary.json and the plots of ``run``; return the text and the files.

    ``show`` gets the summary text as soon as it is written, before the (slower) plots.
    """
    hosts = read_samples(run.dir)
    if not hosts:
        raise TflaunchError(
            f"run {run.id} has no resource samples in {run.dir}: sampling was off "
            "(supervision.sample_interval: 0) or no agent started. Run it again "
            "with sampling on to get a report."
        )
    target = report_dir(run, out_dir, force)
    usage = usage_from_samples(hosts)
    data = summary(usage)
    text = format_summary(run.id, data)
    progress, progress_text = progress_summary(run)  # steps found in the tasks' output
    if progress:
        data["progress"] = progress
        text += progress_text
    instances = run.record().details.get("instances")  # an EC2 run's (launchers/ssh)
    if instances:
        data["instances"] = instance_cost(instances, time.time())
        text += format_instance_cost(data["instances"])
    files = [
        target.write("summary.txt", text),
        target.write("summary.json", json.dumps(data, indent=2) + "\n"),
    ]
    if show:
        show(text)
    if plots:
        files += plot(usage, target, run.id)
        files += plot_progress(run, target.write)
    return text, files


# ---- `tflaunch status`: the task table with usage ---------------------------------------------


def task_table(run: Run) -> list[str]:
    """One row per task: host, state, pid, CPU %, RSS, uptime, exit code.

    Usage comes from psutil when the task runs on this machine, else from the latest sample of
    its host (samples reach the launcher's run directory live on every backend).
    """
    from tflaunch.runtime import runctl
    from tflaunch.runtime.monitor import is_task_process, latest_samples, live_usage

    plan = run.read_plan()
    states = runctl.task_states(run)
    running = {n: s for n, s in states.items() if s["state"] in ("running", "ready") and s["pid"]}
    local = {
        n: s["pid"]
        for n, s in running.items()
        if is_task_process(s["pid"], n, render_task(plan, plan.task(n), run.dir).env)
    }
    usage = live_usage(local) if local else {}
    latest = latest_samples(run.dir) if len(local) < len(running) else {}
    for name in set(running) - set(local):
        sample = latest.get(states[name]["host"], {}).get("tasks", {}).get(name)
        if sample and sample.get("pid") == states[name]["pid"]:
            usage[name] = sample
    now = time.time()
    succeeded = run.record().state == "succeeded"
    rows = [("TASK", "HOST", "STATE", "PID", "CPU%", "RSS", "UPTIME", "EXIT", "RESTARTS")]
    for name, s in states.items():
        used = usage.get(name, {})
        uptime = _duration(now - s["started"]) if name in running and s["started"] else "-"
        rows.append(
            (
                name,
                s["host"],
                s["state"],
                str(s["pid"] or "-"),
                _num(used.get("cpu_percent")),
                _mib(used.get("rss")),
                uptime,
                _exit_text(name, s["code"], succeeded),
                f"{s['restarts']} (last: {s['cause']})" if s["restarts"] else "-",
            )
        )
    return aligned(rows)


def _exit_text(task: str, code: int | None, succeeded: bool) -> str:
    """A task's exit code; a PS's SIGTERM at the end of a run that succeeded is said to be
    normal (a PS serves until the launcher stops it)."""
    if code is None:
        return "-"
    if succeeded and task.startswith("ps:") and code in (143, -15):
        return f"{code} (stopped at the end, as PS are)"
    return str(code)


def watch_status(run: Run, interval: float, show: Callable[[], None]) -> None:
    """Redraw ``show`` every ``interval`` seconds until the run has ended (or Ctrl-C)."""
    import click

    try:
        while True:
            ended = run.record().has_ended  # before drawing: the last screen shows the end
            click.clear()
            show()
            if ended:
                return
            time.sleep(max(0.2, interval))
    except KeyboardInterrupt:
        return


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
