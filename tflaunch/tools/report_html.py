"""``tflaunch report RUN --html``: one self-contained page that shows a run.

Everything a run left, on one page that needs no network to view: the run's state and its
success or failure report, a task table with restarts, a timeline of the events (starts, exits,
restarts, stalls) drawn as inline SVG beside the event list, every plot the run directory holds
(resource plots, step rates, trace, netbench) embedded as data URIs, and the text summaries
(resources, trace, netbench, model) with links to the files they came from. No script runs on
the page.

The page is meant to be shared, so it holds only what the run directory itself holds: every file
is read through :func:`~tflaunch.runtime.runfiles.open_for_reading` (no symlink followed, no FIFO,
size-capped, a log's tail read from its end), and the page is written with the run's file mode,
never through a symlink. A run that failed while its machines were made (no plan, no events)
gets a page too.
"""

from __future__ import annotations

import base64
import html
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tflaunch.errors import ConfigError, TflaunchError
from tflaunch.runtime import protocol
from tflaunch.runtime.run import Run, RunRecord
from tflaunch.runtime.runfiles import (
    EVENTS_FILE,
    PLAN_FILE,
    RunFileError,
    read_run_bytes,
    read_run_text,
    tail_lines,
)
from tflaunch.text import local_time, usable_time

# Events drawn on the timeline, with their colour and a one-word label.
MARKS: dict[type[protocol.Event], tuple[str, str]] = {
    protocol.Started: ("#2b7bb9", "start"),
    protocol.Ready: ("#3a9d5d", "ready"),
    protocol.Exited: ("#555555", "exit"),
    protocol.Restarting: ("#e08a00", "restart"),
    protocol.ClusterRestarting: ("#e08a00", "cluster restart"),
    protocol.RunningAgain: ("#3a9d5d", "running again"),
    protocol.Stalled: ("#c0392b", "stall"),
}
# Text results a run directory may hold, with the heading they get (relative to the run dir).
TEXTS = {
    "summary.txt": "Resources",
    "trace/trace_summary.txt": "Trace summary",
    "netbench.txt": "Netbench",
    "model.txt": "Performance model",
    "tune.txt": "Tune",
    "steps_summary.txt": "Step rates",
}
LINKS = (
    "trace/trace.json",
    "netbench.json",
    "summary.json",
    "tune.json",
    "tuned.yaml",
    EVENTS_FILE,
    PLAN_FILE,
)
LOG_TAIL = 20


@dataclass(frozen=True)
class Section:
    """One part of the page: an id for links, a heading, and its HTML body."""

    id: str
    title: str
    body: str


def write_html_report(run: Run, out_dir: Path | None = None, force: bool = False) -> Path:
    """Write ``report.html`` for ``run`` (the resource plots first, where samples exist); to
    ``out_dir`` as :class:`tflaunch.tools.report.ReportTarget` writes there (``force``: over
    files that are not tflaunch's report)."""
    from tflaunch.tools.report import make_report, report_dir

    target = report_dir(run, out_dir, force)
    no_plots = None
    try:
        make_report(run, target)
    except ConfigError:
        raise  # --out holds a file that is not tflaunch's: refused, the page is not written
    except TflaunchError as err:  # no samples, or no matplotlib to draw them: the page says which
        no_plots = str(err)
    return target.write("report.html", render_page(run, target.dir, no_plots))


def render_page(run: Run, out: Path, no_plots: str | None = None) -> str:
    """The page's HTML, from the run directory and the report files in ``out``; ``no_plots``:
    why the resource plots could not be drawn (no samples, no matplotlib)."""
    problems: list[str] = []
    try:
        record = run.checked_record()
    except OSError as e:  # missing or not a record: the page shows what can be shown
        record = run.record()
        problems.append(str(e))
    events = _events(run, problems)
    sections = [
        _state_section(run, record, problems),
        _tasks_section(run, events),
        _timeline_section(events, record),
        _plots_section(run.dir, out, no_plots),
        *_text_sections(run.dir, out),
        _files_section(run.dir, out),
    ]
    nav = " · ".join(f'<a href="#{s.id}">{html.escape(s.title)}</a>' for s in sections)
    body = "\n".join(
        f'<section id="{s.id}"><h2>{html.escape(s.title)}</h2>\n{s.body}</section>'
        for s in sections
    )
    from tflaunch.tools.report import HTML_START

    title = f"tflaunch run {run.id}"
    return (
        f"{HTML_START.decode()}{html.escape(run.id)}</title><style>{_CSS}</style></head><body>\n"
        f"<h1>{html.escape(title)}</h1>\n<nav>{nav}</nav>\n{body}\n"
        f"<footer>written {time.strftime('%Y-%m-%d %H:%M:%S')} by tflaunch report --html"
        "</footer></body></html>\n"
    )


def _or_dash(value: Any) -> Any:
    return "-" if value is None else value


def _events(run: Run, problems: list[str]) -> list[dict[str, Any]]:
    """The run's events that can be drawn: each with a time, its task (if any) a name."""
    try:
        return [
            e
            for e in run.events()
            if isinstance(e.get("time"), int | float) and isinstance(e.get("task", ""), str)
        ]
    except RunFileError as e:
        problems.append(str(e))
        return []


def _state_section(run: Run, record: RunRecord, problems: list[str]) -> Section:
    state = str(record.state or "unknown")
    rows = [
        ("state", f'<span class="state {html.escape(state)}">{html.escape(state)}</span>'),
        ("exit code", _esc(_or_dash(record.exit_code))),
        ("backend", _esc(_or_dash(record.backend))),
        ("hosts", _esc(", ".join(record.hosts) or "-")),
        ("started", local_time(record.started)),
        ("ended", local_time(record.ended)),
        ("duration", _span(record.started, record.ended)),
        ("run directory", _esc(run.dir)),
    ]
    table = (
        '<table class="kv">'
        + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
        + "</table>"
    )
    message = record.message
    report = f'<pre class="report">{_esc(message)}</pre>' if message else ""
    unreadable = "".join(f'<p class="problem">unreadable: {_esc(p)}</p>' for p in problems)
    return Section("state", "Run", table + report + unreadable)


def _tasks_section(run: Run, events: list[dict[str, Any]]) -> Section:
    from tflaunch.runtime import runctl

    try:
        plan = run.read_plan()
        states = runctl.task_states(run)
    except FileNotFoundError:
        return Section(
            "tasks",
            "Tasks",
            "<p>No plan: the run ended before its tasks were placed (while its machines were "
            "being made, or before they could be reached).</p>",
        )
    except (RunFileError, TypeError, ValueError, KeyError, AttributeError) as e:
        return Section("tasks", "Tasks", f'<p class="problem">unreadable: {_esc(e)}</p>')
    # A task failed if its last exit was non-zero and not a stop that tflaunch asked for.
    last_exit = {
        r.event.task: r.event
        for r in protocol.records(events)
        if isinstance(r.event, protocol.Exited) and r.event.task
    }
    head = (
        "<tr>"
        + "".join(
            f"<th>{h}</th>"
            for h in ("task", "host", "port", "GPUs", "state", "pid", "exit", "restarts")
        )
        + "</tr>"
    )
    rows, tails = [], []
    for task in plan.tasks:
        s = states[task.name]
        restarts = f"{s['restarts']} (last: {s['cause']})" if s["restarts"] else "-"
        exit_event = last_exit.get(task.name)
        failed = exit_event is not None and exit_event.code != 0 and not exit_event.stopped_by
        rows.append(
            f'<tr class="{"failed" if failed else ""}">'
            + "".join(
                f"<td>{_esc(v)}</td>"
                for v in (
                    task.name,
                    task.host,
                    task.port or "-",
                    ",".join(task.gpus) or "-",
                    s["state"],
                    s["pid"] or "-",
                    "-" if s["code"] is None else s["code"],
                    restarts,
                )
            )
            + "</tr>"
        )
        if failed:
            tails.append(_log_tail(run, task.name, task.log_name))
    return Section("tasks", "Tasks", f"<table>{head}{''.join(rows)}</table>{''.join(tails)}")


def _log_tail(run: Run, name: str, log_name: str) -> str:
    try:
        path = run.log_path(log_name)
        lines = tail_lines(path, LOG_TAIL)
    except RunFileError as e:
        return f'<p class="problem">{_esc(name)}: unreadable: {_esc(e)}</p>'
    except OSError:
        return f"<p>{_esc(name)}: no log at {_esc(run.dir / log_name)}</p>"
    return (
        f"<h3>{_esc(name)}: the last {len(lines)} lines of {_esc(path.name)}</h3>"
        f"<pre>{_esc(chr(10).join(lines))}</pre>"
    )


def _timeline_section(events: list[dict[str, Any]], record: RunRecord) -> Section:
    if not events:
        return Section("timeline", "Timeline", "<p>No events were recorded.</p>")
    start = min(e.get("time", 0) for e in events)
    end = max(max(e.get("time", 0) for e in events), usable_time(record.ended) or 0.0)
    span = max(end - start, 1e-3)
    tasks = list(dict.fromkeys(e["task"] for e in events if "task" in e))
    return Section(
        "timeline",
        "Timeline",
        _timeline_svg(events, tasks, start, span) + _event_table(events, start),
    )


def _timeline_svg(events: list[dict[str, Any]], tasks: list[str], start: float, span: float) -> str:
    label, width, row = 110, 760, 22
    height = row * (len(tasks) + 1) + 10
    parts = [
        f'<svg class="timeline" viewBox="0 0 {label + width + 40} {height}" '
        f'width="{label + width + 40}" height="{height}" role="img" '
        'aria-label="task events over time">'
    ]
    for i, task in enumerate(tasks):
        y = row * (i + 1)
        parts.append(f'<text x="4" y="{y + 4}">{_esc(task)}</text>')
        parts.append(f'<line x1="{label}" x2="{label + width}" y1="{y}" y2="{y}" class="lane"/>')
    for e in events:
        record = protocol.record_of(e)  # None for a malformed line
        mark = MARKS.get(type(record.event)) if record else None  # type: ignore[arg-type]
        if not mark or e.get("task") not in tasks:
            continue
        x = label + width * (e.get("time", start) - start) / span
        y = row * (tasks.index(e["task"]) + 1)
        colour, word = mark
        detail = f"{e['task']} {word} at +{e.get('time', start) - start:.2f} s"
        if "code" in e:
            detail += f" (code {e['code']})"
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y}" r="5" fill="{colour}"><title>{_esc(detail)}</title>'
            "</circle>"
        )
    axis_y = row * (len(tasks) + 1)
    for k in range(6):
        x = label + width * k / 5
        parts.append(
            f'<text x="{x:.0f}" y="{axis_y}" class="axis" text-anchor="middle">+{span * k / 5:.1f} s</text>'
        )
    parts.append("</svg>")
    legend = " ".join(
        f'<span class="key" style="background:{c}"></span>{w}' for c, w in MARKS.values()
    )
    return "".join(parts) + f'<p class="legend">{legend}</p>'


def _event_table(events: list[dict[str, Any]], start: float) -> str:
    rows = []
    for e in events:
        details = protocol.details_of(e)
        rest = {k: v for k, v in details.items() if k not in ("time", "host", "task", "log")}
        rows.append(
            "<tr>"
            f"<td>+{e.get('time', start) - start:.2f} s</td><td>{_esc(e.get('host', ''))}</td>"
            f"<td>{_esc(e.get('task', ''))}</td><td>{_esc(protocol.kind_of(e))}</td>"
            f"<td>{_esc(', '.join(f'{k}={v}' for k, v in rest.items()))}</td></tr>"
        )
    return (
        "<details><summary>all events</summary><table><tr><th>time</th><th>host</th>"
        f"<th>task</th><th>event</th><th>detail</th></tr>{''.join(rows)}</table></details>"
    )


def _plots_section(run_dir: Path, out: Path, no_plots: str | None = None) -> Section:
    found = {png: out for png in out.glob("*.png")}
    for png in [*run_dir.glob("*.png"), *run_dir.glob("*/*.png")]:
        found.setdefault(png, run_dir)
    pngs = {}
    for png in sorted(found):
        try:  # only the run's own files: a link planted in its place (or its folder's) is not
            pngs[png] = read_run_bytes(png, root=found[png])
        except OSError:
            continue
    why = f"<p>No resource plots: {_esc(no_plots)}</p>" if no_plots else ""
    if not pngs:
        return Section("plots", "Plots", why or "<p>No plots: no trace or netbench results.</p>")
    figures = [why] if why else []
    for png, content in pngs.items():
        data = base64.b64encode(content).decode("ascii")
        name = _relative(png, run_dir, out)
        figures.append(
            f'<figure><img alt="{_esc(name)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_esc(name)}</figcaption></figure>"
        )
    return Section("plots", "Plots", "".join(figures))


def _text_sections(run_dir: Path, out: Path) -> list[Section]:
    sections = []
    for name, title in TEXTS.items():
        root = out if os.path.lexists(out / name) else run_dir
        try:
            text = f"<pre>{_esc(read_run_text(root / name, root=root))}</pre>"
        except RunFileError as e:
            text = f'<p class="problem">unreadable: {_esc(e)}</p>'
        except OSError:
            continue  # not there
        slug = name.replace("/", "-").replace(".", "-")
        sections.append(Section(slug, title, text))
    return sections


def _files_section(run_dir: Path, out: Path) -> Section:
    items = []
    for name in LINKS:
        path = run_dir / name
        if _own_file(run_dir, name):
            href = path.relative_to(out) if path.is_relative_to(out) else path.resolve().as_uri()
            items.append(f'<li><a href="{_esc(href)}">{_esc(name)}</a></li>')
    body = f"<ul>{''.join(items)}</ul>" if items else "<p>No result files.</p>"
    return Section("files", "Files", body)


def _own_file(root: Path, name: str) -> bool:
    """Whether ``root/name`` is a regular file reached without a symlink."""
    path = root
    for part in Path(name).parts:
        path = path / part
        try:
            mode = path.lstat().st_mode
        except OSError:
            return False
        if stat.S_ISLNK(mode):
            return False
    return stat.S_ISREG(mode)


def _relative(path: Path, *roots: Path) -> str:
    for root in roots:
        if path.is_relative_to(root):
            return str(path.relative_to(root))
    return path.name


def _esc(value: object) -> str:
    return html.escape(str(value))


def _span(start: float | None, end: float | None) -> str:
    start, end = usable_time(start), usable_time(end)
    return f"{end - start:.1f} s" if start and end else "-"


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px}
nav a{margin:0 4px}table{border-collapse:collapse;margin:8px 0}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
tr.failed td{background:#fdecea}.problem{color:#a02020}pre{background:#f6f6f6;padding:8px;overflow:auto;max-height:420px}
.state{padding:1px 8px;border-radius:8px;background:#eee}.state.succeeded{background:#d7f0dd}
.state.failed{background:#f7d4d0}.state.running{background:#dbe9f7}
svg.timeline text{font-size:11px}svg .lane{stroke:#ccc}svg .axis{fill:#666}
.key{display:inline-block;width:10px;height:10px;border-radius:5px;margin:0 3px 0 10px}
figure{display:inline-block;margin:6px;max-width:520px}figure img{max-width:100%}
footer{color:#888;margin-top:24px;font-size:12px}
"""
