"""Working with runs after the start: detaching, status, logs and down, from the run directory.

A detached local or SSH run is an ordinary ``tflaunch up`` coordinator started in its own session
with its output in ``console.log``; the foreground command returns once the events file says the
cluster is ready. ``down`` signals that coordinator, which tears the cluster down as on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil

from tflaunch.errors import LaunchError
from tflaunch.runtime import procs, protocol
from tflaunch.runtime.restart import STALLED
from tflaunch.runtime.run import Outcome, Run
from tflaunch.runtime.runfiles import (
    CONSOLE_FILE,
    LINE_LIMIT,
    RunFileError,
    open_for_reading,
    open_run_file,
    tail_lines,
)


def spawn_detached(
    config_path: str, run: Run, runs_dir: str, timeout: float, options: Sequence[str] = ()
) -> None:
    """Start the coordinator of ``run`` in the background (an ``up`` given ``options`` too);
    return once the cluster is ready."""
    argv = [
        sys.executable,
        "-m",
        "tflaunch",
        "up",
        str(config_path),
        "--runs-dir",
        runs_dir,
        "--run-id",
        run.id,
        "--attached-daemon",
        *options,
    ]
    with open_run_file(run.dir / CONSOLE_FILE, "ab") as console:
        proc = procs.spawn(
            argv,
            os.environ,
            cwd=os.getcwd(),
            stdout=console,
            stderr=subprocess.STDOUT,
            die_with_parent=False,
        )
    sys.stderr.write(
        f"[tflaunch] run {run.id} is starting in the background; waiting up to "
        f"{timeout:g} s for every task to start and every PS to accept connections "
        f"(its output: {run.dir / CONSOLE_FILE})\n"
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cluster_ready(run):
            return
        if proc.poll() is not None:
            tail = _tail(run.dir / CONSOLE_FILE, 20)
            raise LaunchError(
                f"the detached run {run.id} ended before it was ready (exit code "
                f"{proc.returncode}). Its output:\n{tail}"
            )
        time.sleep(0.2)
    raise LaunchError(
        f"the detached run {run.id} was not ready after {timeout:g} s; it keeps "
        f"trying: see 'tflaunch status {run.id}' or stop it with 'tflaunch down {run.id}'."
    )


def coordinator_process(run: Run) -> psutil.Process | None:
    """The run's coordinator if it still runs on this machine: its recorded launcher, checked
    to be the same process (machine, start time, and a tflaunch command line), never a process
    that reused the pid."""
    record = run.record()
    if record.launcher is None or record.has_ended:
        return None
    proc = record.launcher.process()
    try:
        if proc is None or not any("tflaunch" in part for part in proc.cmdline()):
            return None
    except (psutil.Error, OSError):
        return None
    return proc


def coordinator_alive(run: Run) -> bool | None:
    """Whether the run's coordinator still runs; None when it runs on another machine (or the
    run records none), where only that machine can tell."""
    record = run.record()
    if record.launcher is None or not record.launcher.here:
        return None
    return coordinator_process(run) is not None


def stop_local_coordinator(run: Run, grace: float) -> str:
    """SIGTERM the run's coordinator and wait for its teardown; clean up leftovers if it is gone."""
    launcher = run.record().launcher
    if not run.ended and launcher is not None and not launcher.here:
        raise LaunchError(
            f"run {run.id} is coordinated by {launcher.describe()}, which this machine cannot "
            f"see; run 'tflaunch down {run.id}' there."
        )
    proc = coordinator_process(run)
    if proc is not None:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace + 30
        while time.monotonic() < deadline and coordinator_alive(run):
            time.sleep(0.2)
    leftovers = kill_leftover_tasks(run)
    if not run.ended:
        run.finish(Outcome(143, "stopped with tflaunch down; its coordinator was gone", True))
    extra = f"; killed {leftovers} leftover task process group(s)" if leftovers else ""
    return f"run {run.id} is down (state: {run.record().state}){extra}"


def kill_leftover_tasks(run: Run) -> int:
    """SIGKILL the groups of this run's tasks still alive on this machine (a crashed coordinator)."""
    killed = 0
    for record in protocol.records(run.events()):
        event = record.event
        if not isinstance(event, protocol.Started) or not event.pid:
            continue
        try:
            proc = psutil.Process(event.pid)
            if proc.environ().get("TFLAUNCH_TASK") != event.task:
                continue  # the pid was reused by an unrelated process
        except (psutil.Error, OSError, TypeError, ValueError):
            continue
        if procs.signal_group(event.pid, signal.SIGKILL):
            killed += 1
    # What escaped its task's group (a setsid daemon) still carries the run's marker.
    return killed + procs.kill_marked(procs.RUN_MARKER, str(run.dir.resolve()))


def task_states(run: Run) -> dict[str, dict[str, Any]]:
    """The last known state of every task of the run, from the plan and the events."""
    plan = run.read_plan()
    states = {
        t.name: {
            "task": t.name,
            "host": t.host,
            "state": "pending",
            "pid": None,
            "code": None,
            "started": None,
            "restarts": 0,
            "cause": None,
        }
        for t in plan.tasks
    }
    for record in protocol.records(run.events()):
        event = record.event
        state = states.get(getattr(event, "task", None) or "")
        if state is None:
            continue
        if isinstance(event, protocol.Started):
            state.update(state="running", pid=event.pid, started=record.time)
        elif isinstance(event, protocol.Ready):
            state["state"] = "ready"
        elif isinstance(event, protocol.Exited):
            state.update(state="exited", code=event.code)
        elif isinstance(event, protocol.Restarting | protocol.ClusterRestarting):
            state.update(state="restarting", restarts=state["restarts"] + 1)
            state["cause"] = STALLED if event.cause == STALLED else event.code
    return states


def cluster_ready(run: Run) -> bool:
    """Whether the run's coordinator said that every task started (and every PS listens)."""
    return any(isinstance(r.event, protocol.ClusterReady) for r in protocol.records(run.events()))


def follow_logs(run: Run, names: list[str], follow: bool, alive: Any) -> Iterator[str]:
    """Lines of the named tasks' logs, prefixed; with ``follow``, until the run ends. A log that
    is not a regular file of the run directory (a FIFO, a symlink) gets one line saying so."""
    plan = run.read_plan()
    tasks = [plan.task(n) for n in names] if names else list(plan.tasks)
    width = max(len(t.name) for t in tasks) + 2
    handles: dict[str, Any] = {}
    try:
        while True:
            quiet = True
            for task in tasks:
                prefix = f"{'[' + task.name + ']':<{width}} " if len(tasks) > 1 else ""
                handle = handles.get(task.name)
                if handle is None:
                    try:
                        raw = open_for_reading(run.log_path(task.log_name))
                    except FileNotFoundError:
                        continue
                    except RunFileError as e:
                        handles[task.name] = io.StringIO()  # nothing more to read from it
                        yield f"{prefix}[tflaunch] unreadable: {e}"
                        continue
                    handles[task.name] = handle = io.TextIOWrapper(raw, errors="replace")
                for line in iter(lambda h=handle: h.readline(LINE_LIMIT), ""):
                    quiet = False
                    yield prefix + line.rstrip("\n")
            if not follow or (quiet and not alive()):
                return
            if quiet:
                time.sleep(0.3)
    finally:
        for handle in handles.values():
            handle.close()


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join(tail_lines(path, n))
    except RunFileError as e:
        return f"(unreadable: {e})"
    except OSError:
        return "(no output)"
