"""One terminal window per task for the local backend (``tflaunch up --terminals KIND``).

The windows only *show* the tasks: each follows its task's log file (``tail -F``) while the agent
keeps starting, supervising, logging and tearing down the tasks exactly as without windows, so a
closed window never stops a task and Ctrl-C in the launcher stops everything as usual.

Kinds: ``tmux`` (works headless: a detached session named after the run, one window per task;
``tflaunch attach RUN`` opens it), ``xterm`` and ``gnome-terminal`` (need a display).

Closing: every window's ``tail`` follows a *sentinel* process (``tail --pid``) that tflaunch
starts and kills at teardown, so all windows close then — also those a terminal server owns
(gnome-terminal) and, since the sentinel dies with its parent, after a ``kill -9`` of the
launcher. tmux sessions are killed and xterm process groups terminated on top of that.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tflaunch.plugin import LaunchError, Plan, Run, spawn, terminate_group

KINDS = ("tmux", "xterm", "gnome-terminal")
TMUX_TIMEOUT = 10.0  # seconds for one tmux command: every wait has a deadline


@dataclass(frozen=True)
class TerminalsDetails:
    """What ``--terminals`` adds to run.json (:class:`tflaunch.runtime.run.RunRecord`'s
    details): the kind of windows, and a tmux run's session and socket to attach to."""

    terminals: str | None = None
    terminals_session: str | None = None
    terminals_socket: str | None = None


def check(kind: str) -> None:
    """Raise LaunchError (exit 2) when windows of ``kind`` cannot be opened here."""
    if kind not in KINDS:
        raise LaunchError(f"unknown terminal kind '{kind}'; choose one of {', '.join(KINDS)}.")
    if not shutil.which(kind):
        raise LaunchError(
            f"--terminals {kind}: the program '{kind}' is not installed (not on "
            f"PATH). Install it, or choose another of {', '.join(KINDS)}."
        )
    if kind == "xterm" and not os.environ.get("DISPLAY"):
        raise LaunchError(
            "--terminals xterm needs an X display, and DISPLAY is not set. Run "
            "from a graphical session, or use --terminals tmux (works without one)."
        )
    if kind == "gnome-terminal" and not (
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    ):
        raise LaunchError(
            "--terminals gnome-terminal needs a display, and neither DISPLAY nor "
            "WAYLAND_DISPLAY is set. Run from a graphical session, or use "
            "--terminals tmux (works without one)."
        )


def session_name(run: Run) -> str:
    """The tmux session of a run: its id (tmux does not allow '.' or ':' in session names)."""
    return run.id.replace(".", "_").replace(":", "_")


@dataclass
class Terminals:
    """The open windows of a run and what closes them."""

    kind: str
    sentinel: subprocess.Popen
    session: str | None = None
    socket: str | None = None
    windows: list[subprocess.Popen] = field(default_factory=list)

    def close(self) -> None:
        """Close every window; bounded, and safe to call twice."""
        terminate_group(self.sentinel, 1.0)  # reaped: tail --pid sees it gone
        if self.session:
            _tmux(self.socket, "kill-session", "-t", self.session, check=False)
        for window in self.windows:
            terminate_group(window, 2.0)

    def __enter__(self) -> Terminals:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def follow_command(log: Path, sentinel_pid: int) -> list[str]:
    """The command a window runs: the whole log, then new lines, until the sentinel is gone."""
    if sys.platform.startswith("linux"):  # GNU tail: --pid, fractional -s
        return ["tail", "-n", "+1", "-s", "0.3", "--pid", str(sentinel_pid), "-F", str(log)]
    return ["tail", "-n", "+1", "-F", str(log)]


def open_terminals(kind: str, plan: Plan, run: Run) -> Terminals:
    """Open one window per task of ``plan``; the caller closes them (``with`` or ``close``)."""
    check(kind)
    # The sentinel dies with this process even on kill -9 (parent-death signal), closing windows.
    sentinel = spawn(["sleep", "2147483647"], os.environ, cwd=None, stdout=subprocess.DEVNULL)
    terminals = Terminals(kind, sentinel)
    try:
        windows = []
        for task in plan.tasks:
            log = run.log_path(task.log_name)
            log.touch()  # the agent appends to it; the window shows it from its first line
            windows.append((task.name, follow_command(log, sentinel.pid)))
        if kind == "tmux":
            _open_tmux(terminals, run, windows)
        else:
            _open_windows(terminals, run, windows)
    except BaseException:
        terminals.close()
        raise
    return terminals


def _open_tmux(terminals: Terminals, run: Run, windows: list[tuple[str, list[str]]]) -> None:
    session = session_name(run)
    (first_name, first_cmd), rest = windows[0], windows[1:]
    _tmux(
        None,
        "new-session",
        "-d",
        "-s",
        session,
        "-n",
        first_name,
        "-x",
        "200",
        "-y",
        "50",
        *first_cmd,
    )
    terminals.session = session
    for name, cmd in rest:
        _tmux(None, "new-window", "-d", "-t", f"{session}:", "-n", name, *cmd)
    terminals.socket = (
        _tmux(None, "display-message", "-p", "-t", session, "#{socket_path}").strip() or None
    )
    run.update_part(
        TerminalsDetails,
        terminals="tmux",
        terminals_session=session,
        terminals_socket=terminals.socket,
    )


def _open_windows(terminals: Terminals, run: Run, windows: list[tuple[str, list[str]]]) -> None:
    for name, cmd in windows:
        title = f"{name} | {run.id}"
        if terminals.kind == "xterm":
            argv = ["xterm", "-T", title, "-e", *cmd]
        else:  # --wait: the client lives as long as its window, so teardown can reap it
            argv = ["gnome-terminal", "--wait", f"--title={title}", "--", *cmd]
        terminals.windows.append(spawn(argv, os.environ, cwd=None, stdout=subprocess.DEVNULL))
    # A terminal that cannot reach the display exits at once: report that instead of running blind.
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        failed = [w for w in terminals.windows if w.poll() not in (None, 0)]
        if failed:
            raise LaunchError(
                f"--terminals {terminals.kind}: the window could not be opened "
                f"(exit code {failed[0].returncode}; display "
                f"{os.environ.get('DISPLAY') or os.environ.get('WAYLAND_DISPLAY')}). "
                "Check the display, or use --terminals tmux."
            )
        time.sleep(0.1)
    run.update_part(TerminalsDetails, terminals=terminals.kind)


def _tmux(socket: str | None, *args: str, check: bool = True) -> str:
    argv = ["tmux", *(["-S", socket] if socket else []), *args]
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=TMUX_TIMEOUT, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        if check:
            raise LaunchError(
                f"tmux did not answer within {TMUX_TIMEOUT:g} s ({args[0]})."
            ) from None
        return ""
    if check and result.returncode != 0:
        raise LaunchError(
            f"tmux {args[0]} failed: {result.stderr.strip() or result.returncode}. "
            "Is another tmux session of that name open?"
        )
    return result.stdout


def attach(run: Run) -> None:
    """Replace this process with a tmux client on the run's session."""
    record = run.record()
    details = record.part(TerminalsDetails)
    session, socket = details.terminals_session, details.terminals_socket
    if not session:
        raise LaunchError(
            f"run {run.id} has no tmux session: it was started without "
            "'--terminals tmux'. Follow it with 'tflaunch logs RUN -f'."
        )
    if not shutil.which("tmux"):
        raise LaunchError("tmux is not installed here (not on PATH); install it to attach.")
    base = ["tmux", *(["-S", socket] if socket else [])]
    probe = subprocess.run(
        [*base, "has-session", "-t", session],
        capture_output=True,
        timeout=TMUX_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    if probe.returncode != 0:
        raise LaunchError(
            f"the tmux session {session} of run {run.id} is gone: the run has ended "
            f"(state: {record.state or 'unknown'}). See 'tflaunch logs {run.id}'."
        )
    # Inside tmux already, attaching would nest sessions: switch this client instead.
    command = "switch-client" if os.environ.get("TMUX") else "attach-session"
    os.execvp(base[0], [*base, command, "-t", session])
