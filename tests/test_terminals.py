"""up --terminals: tmux windows headless (each shows its task's output; nothing is left after the
run, Ctrl-C or a kill -9 of the launcher), attach through a pseudo-terminal, and the errors."""

from __future__ import annotations

import os
import pty
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import skip_or_fail
from tests.helpers import fake_cluster, read_until, tflaunch, up_detached, up_until, wait_until_gone
from tflaunch.launchers.local.terminals import TerminalsDetails, follow_command, session_name
from tflaunch.runtime.run import Run


@pytest.fixture
def tmux_env(monkeypatch):
    """A private tmux server for the test (TMUX_TMPDIR), never the user's own."""
    if not shutil.which("tmux"):
        skip_or_fail("tmux is not installed")
    directory = tempfile.mkdtemp(prefix="tfl-tmux-", dir="/tmp")  # socket paths must be short
    monkeypatch.setenv("TMUX_TMPDIR", directory)
    monkeypatch.delenv("TMUX", raising=False)
    yield directory
    subprocess.run(["tmux", "kill-server"], capture_output=True, timeout=10)
    shutil.rmtree(directory, ignore_errors=True)


def tmux(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, timeout=10)


def pane(session: str, index: str) -> str:
    return tmux("capture-pane", "-p", "-t", f"{session}:{index}").stdout


def tmux_servers(directory: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["name"]):
        try:
            tmux_process = (proc.info["name"] or "").startswith("tmux")
            if tmux_process and proc.environ().get("TMUX_TMPDIR") == directory:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def run_of(tmp_path: Path) -> Run:
    (path,) = (tmp_path / "runs").iterdir()
    return Run.open(tmp_path / "runs", path.name)


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


def assert_nothing_left(tmp_path: Path, directory: str) -> None:
    assert wait_until_gone(str(tmp_path), timeout=15) == []  # tasks, agents and every `tail`
    wait_for(lambda: not tmux_servers(directory), 10, "the tmux server to exit")
    assert tmux("list-sessions").returncode != 0


def test_tmux_windows_show_each_task_and_close_after_the_run(tmp_path, tmux_env):
    cluster = fake_cluster(tmp_path, env={"WORK_SECONDS": "6"})
    with up_until(cluster, "cluster ready", "--terminals", "tmux") as (proc, _):
        run = run_of(tmp_path)
        session = session_name(run)
        assert run.record().part(TerminalsDetails).terminals_session == session
        windows = tmux("list-windows", "-t", session, "-F", "#{window_index} #{window_name}")
        names = dict(line.split(" ", 1)[::-1] for line in windows.stdout.split("\n") if line)
        assert sorted(names) == ["ps:0", "worker:0", "worker:1"]
        for task, index in names.items():
            wanted = [
                f"{task} CUDA_VISIBLE_DEVICES=''",
                "serving" if task == "ps:0" else "all ps reachable at start: True",
            ]
            screen = wait_for(
                lambda i=index, w=wanted: (
                    all(x in pane(session, i) for x in w) and pane(session, i)
                ),
                15,
                f"{task}'s output in its window",
            )
            others = [t for t in names if t != task]
            assert not any(f"{t} CUDA" in screen for t in others)  # one task per window
        proc.wait(timeout=60)
        assert proc.returncode == 0, proc.stderr.read()
    assert_nothing_left(tmp_path, tmux_env)


def test_ctrl_c_closes_the_windows_with_the_cluster(tmp_path, tmux_env):
    cluster = fake_cluster(tmp_path, env={"WORK_SECONDS": "60"})
    with up_until(cluster, "cluster ready", "--terminals", "tmux") as (proc, _):
        assert tmux("has-session", "-t", session_name(run_of(tmp_path))).returncode == 0
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        assert proc.returncode == 130
    assert_nothing_left(tmp_path, tmux_env)


def test_kill_9_of_the_launcher_closes_the_windows_too(tmp_path, tmux_env):
    cluster = fake_cluster(tmp_path, env={"WORK_SECONDS": "60"})
    with up_until(cluster, "cluster ready", "--terminals", "tmux") as (proc, _):
        assert tmux("has-session", "-t", session_name(run_of(tmp_path))).returncode == 0
        proc.kill()
        proc.wait(timeout=5)
    assert_nothing_left(tmp_path, tmux_env)


def test_attach_opens_the_session_in_a_terminal(tmp_path, tmux_env):
    cluster = fake_cluster(tmp_path, env={"WORK_SECONDS": "60"})
    runs = str(tmp_path / "runs")
    run_id = up_detached(cluster, "--terminals", "tmux")
    session = session_name(run_of(tmp_path))
    pid, fd = pty.fork()
    if pid == 0:  # the child: `tflaunch attach` on a pseudo-terminal, as a person would run it
        os.environ["TERM"] = "xterm"
        os.execv(
            sys.executable, [sys.executable, "-m", "tflaunch", "attach", run_id, "--run-dir", runs]
        )
    try:
        clients = wait_for(lambda: tmux("list-clients", "-t", session).stdout, 15, "a client")
        assert len(clients.splitlines()) == 1
        assert psutil.Process(pid).name().startswith("tmux")  # attach became the tmux client
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)
        tflaunch("down", run_id, "--run-dir", runs)
    assert_nothing_left(tmp_path, tmux_env)
    gone = tflaunch("attach", run_id, "--run-dir", runs)
    assert gone.returncode == 2 and "is gone: the run has ended" in gone.stderr


@pytest.fixture
def x_display():
    """A headless X server (Xvfb) on a free display number, for real xterm windows."""
    if not (shutil.which("Xvfb") and shutil.which("xterm") and shutil.which("xwininfo")):
        skip_or_fail("Xvfb, xterm and xwininfo (packages xvfb, xterm, x11-utils) are needed")
    read_end, write_end = os.pipe()
    server = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write_end), "-nolisten", "tcp", "-screen", "0", "1280x1024x24"],
        pass_fds=(write_end,),
        stderr=subprocess.DEVNULL,
    )
    os.close(write_end)
    try:
        with os.fdopen(read_end) as numbers:
            display = f":{numbers.readline().strip()}"
        yield display
    finally:
        server.terminate()
        server.wait(timeout=10)


def window_titles(display: str) -> list[str]:
    tree = subprocess.run(
        ["xwininfo", "-root", "-tree", "-display", display],
        capture_output=True,
        text=True,
        timeout=10,
    ).stdout
    return [line.split('"')[1] for line in tree.splitlines() if line.count('"') >= 2]


def test_xterm_windows_follow_each_task_and_close_after_the_run(tmp_path, x_display):
    cluster = fake_cluster(tmp_path, env={"WORK_SECONDS": "5"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "tflaunch", "up", str(cluster), "--terminals", "xterm"],
        env={**os.environ, "DISPLAY": x_display},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        read_until(proc.stdout, "cluster ready", timeout=30)
        run = run_of(tmp_path)
        titles = wait_for(
            lambda: [t for t in window_titles(x_display) if run.id in t], 15, "three xterm windows"
        )
        assert sorted(t.split(" | ")[0] for t in titles) == ["ps:0", "worker:0", "worker:1"]
        xterms = [
            p
            for p in psutil.process_iter(["name", "environ"])
            if p.info["name"] == "xterm" and (p.info["environ"] or {}).get("DISPLAY") == x_display
        ]
        followed = sorted(c.cmdline()[-1] for x in xterms for c in x.children())
        assert followed == sorted(
            str(run.dir / log) for log in ("ps-0.log", "worker-0.log", "worker-1.log")
        )
        proc.wait(timeout=60)
        assert proc.returncode == 0, proc.stderr.read()
    finally:
        proc.kill()
    assert wait_until_gone(str(tmp_path), timeout=15) == []
    wait_for(
        lambda: not [t for t in window_titles(x_display) if run.id in t], 10, "the windows to close"
    )
    assert not [x for x in xterms if x.is_running() and x.status() != psutil.STATUS_ZOMBIE]


def test_attach_to_a_run_without_terminals_is_bad_input(tmp_path):
    cluster = fake_cluster(tmp_path, env={"WORK_SECONDS": "0.1"})
    assert tflaunch("up", str(cluster)).returncode == 0
    result = tflaunch("attach", run_of(tmp_path).id, "--run-dir", str(tmp_path / "runs"))
    assert result.returncode == 2
    assert "was started without '--terminals tmux'" in result.stderr


def test_xterm_without_a_display_is_bad_input_and_starts_nothing(tmp_path):
    cluster = fake_cluster(tmp_path)
    result = tflaunch(
        "up", str(cluster), "--terminals", "xterm", unset=("DISPLAY", "WAYLAND_DISPLAY"), timeout=60
    )
    assert result.returncode == 2
    assert "--terminals xterm needs an X display, and DISPLAY is not set" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_xterm_that_cannot_open_its_display_is_bad_input_and_leaves_nothing(tmp_path):
    if not shutil.which("xterm"):
        skip_or_fail("xterm is not installed")
    cluster = fake_cluster(tmp_path)
    result = tflaunch("up", str(cluster), "--terminals", "xterm", env={"DISPLAY": ":97"})
    assert result.returncode == 2
    assert "--terminals xterm: the window could not be opened" in result.stderr
    assert "Traceback" not in result.stderr
    assert wait_until_gone(str(tmp_path)) == []
    assert not [
        p
        for p in psutil.process_iter(["name", "environ"])
        if p.info["name"] == "xterm" and (p.info["environ"] or {}).get("DISPLAY") == ":97"
    ]


def test_missing_terminal_program_is_bad_input(tmp_path):
    cluster = fake_cluster(tmp_path)
    result = tflaunch(
        "up",
        str(cluster),
        "--terminals",
        "gnome-terminal",
        env={"PATH": "/nonexistent", "DISPLAY": ":0"},
    )
    assert result.returncode == 2
    assert "the program 'gnome-terminal' is not installed" in result.stderr


def test_terminals_need_the_local_backend(tmp_path):
    cluster = tmp_path / "slurm.yaml"
    cluster.write_text(
        "name: s\nbackend: slurm\nprogram: [python3, train.py]\nroles: {ps: 1, worker: 1}\n"
    )
    result = tflaunch("up", str(cluster), "--terminals", "tmux")
    assert result.returncode == 2
    assert "--terminals works with the local backend only" in result.stderr


def test_window_command_follows_the_log_until_the_sentinel_is_gone(tmp_path):
    log = tmp_path / "worker-0.log"
    log.write_text("one\n")
    sentinel = subprocess.Popen(["sleep", "60"])
    tail = subprocess.Popen(follow_command(log, sentinel.pid), stdout=subprocess.PIPE, text=True)
    try:
        assert tail.stdout.readline() == "one\n"
        with log.open("a") as f:
            f.write("two\n")
        assert tail.stdout.readline() == "two\n"
        sentinel.kill()
        sentinel.wait()
        assert tail.wait(timeout=5) == 0
    finally:
        tail.kill()
        sentinel.kill()


def test_session_name_is_the_run_id_without_characters_tmux_refuses(tmp_path):
    assert (
        session_name(Run("mnist.v2-20260101-000000-ab12", tmp_path))
        == "mnist_v2-20260101-000000-ab12"
    )
