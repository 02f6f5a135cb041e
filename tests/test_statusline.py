"""Progress you can see: on a terminal, ``up`` keeps one status line under the streamed output
(steps/s per worker, the slowest, elapsed, the time left where the total is known) and a sweep
shows runs done and time left; without a terminal the output is plain lines only."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
import time

from tests.helpers import ROOT, tflaunch, write_cluster
from tflaunch.runtime.statusline import ClusterProgress, StatusLine, wants_status_line


def test_progress_line_names_rates_the_slowest_and_time_left():
    progress = ClusterProgress(2, clock_start=time.monotonic() - 65)
    assert "no step line yet" in progress.render()
    progress.line("worker:0", "worker:0 step 1/100")
    for t in range(11):
        progress.step("worker:0", 10 * t, 1000.0 + t)  # 10 steps/s
        progress.step("worker:1", 5 * t, 1000.0 + t)  # 5 steps/s
    line = progress.render()
    assert line.startswith("1:05 elapsed")
    assert "worker:0 10.00 steps/s" in line and "worker:1 5.00 steps/s" in line
    assert "slowest worker:1" in line and "step 50/100" in line
    assert "~0:10 left" in line  # 50 steps at 5 steps/s


def test_totals_from_keras_epochs_and_training_to_step():
    keras = ClusterProgress(1)
    keras.line("worker:0", "Epoch 1/5")
    keras.line("worker:0", "\r 3/20 [==>......] - ETA: 1s - loss: 0.5")
    assert keras.total == 100
    mnist = ClusterProgress(1)
    mnist.line("worker:0", "worker 0: training to global step 200")
    assert mnist.total == 200


def test_a_restarted_count_starts_the_rate_again():
    progress = ClusterProgress(1)
    progress.step("worker:0", 100, 1.0)
    progress.step("worker:0", 200, 2.0)
    progress.step("worker:0", 3, 3.0)  # restarted from a checkpoint at step 0
    progress.step("worker:0", 13, 4.0)
    assert progress.rates()["worker:0"] == (13, 10.0)


def test_without_a_terminal_lines_are_plain():
    out = io.StringIO()
    assert not wants_status_line(out)
    line = StatusLine(out, lambda: "never drawn")
    line.write("[worker:0] hello")
    line.stop()
    assert out.getvalue() == "[worker:0] hello\n"


def on_pty(argv: list[str], timeout: float = 120) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal as its stdin, stdout and stderr; what it wrote."""
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "200"}
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the terminal closed: the process and its children are gone
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=10), b"".join(chunks).decode(errors="replace")


def smoke_cluster(tmp_path):
    argv = [sys.executable, "-m", "tflaunch.models.smoke", "--steps", "12", "--step-seconds", "0.3"]
    return write_cluster(tmp_path / "smoke.yaml", {"argv": argv})


def test_up_on_a_terminal_keeps_a_status_line_and_without_one_does_not(tmp_path):
    path = smoke_cluster(tmp_path)
    code, shown = on_pty([sys.executable, "-m", "tflaunch", "up", str(path)])
    assert code == 0, shown[-2000:]
    assert "[worker:1] worker:1 done" in shown
    assert "steps/s" in shown and "elapsed" in shown and "step 12/12" in shown
    assert "slowest worker:" in shown and "left" in shown
    plain = tflaunch("up", str(path))
    assert plain.returncode == 0, plain.stderr
    assert "[worker:1] worker:1 done" in plain.stdout
    assert "steps/s" not in plain.stdout + plain.stderr and "\x1b[" not in plain.stdout
    run_id = plain.stdout.split("[tflaunch] run ", 1)[1].split()[0]
    status = tflaunch("status", run_id, "--runs-dir", str(tmp_path / "runs"))
    ps_row = next(line for line in status.stdout.splitlines() if line.startswith("ps:0 "))
    assert "143 (stopped at the end, as PS are)" in ps_row  # SIGTERM at the end is normal


SWEEP = """
import sys, time
from pathlib import Path
from tflaunch.tools.bench_sweep import Measurement, Point, parse_sweep, run_sweep
folder = Path(sys.argv[1])
sweep = parse_sweep({"cluster": "c.yaml", "workers": [1], "repeats": 3}, folder / "s.yaml")
def runner(point, repeat):
    time.sleep(1.2)
    return Measurement(point, repeat, 1.0, 0, f"run{repeat}")
run_sweep(sweep, runner, [Point(1, 1, "parameter_server", False)], print)
"""


def test_a_sweep_on_a_terminal_shows_runs_done_and_time_left(tmp_path):
    argv = [sys.executable, "-c", SWEEP, str(tmp_path)]
    code, shown = on_pty(argv)
    assert code == 0, shown
    assert "bench: 0 of 3 runs done, run 1 going" in shown
    assert "bench: 2 of 3 runs done, run 3 going" in shown and "left" in shown
    plain = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert plain.returncode == 0 and "bench:" not in plain.stdout
    assert "[3/3] 1.00 img/s" in plain.stdout
