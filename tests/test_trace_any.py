"""Traces and step rates of any program (issue 22): the trace hook (``sitecustomize``) without
TensorFlow, progress parsing, the capture window, the "no trace because" line, the progress
report; and (slow) plain-TensorFlow programs traced through ``tflaunch up --trace``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import (
    cpu_seconds,
    free_port_base,
    hook_env,
    hooked_profiler_port,
    tflaunch,
    wait_until_gone,
    write_cluster,
)
from tflaunch.runtime import protocol
from tflaunch.runtime.progress import ProgressLog, StepParser, read_progress, straggler_figures
from tflaunch.runtime.run import Run
from tflaunch.tools import step_rates
from tflaunch.tools.report import ReportTarget
from tflaunch.trace import files as trace_files
from tflaunch.trace import site as trace_site
from tflaunch.trace import window as trace_window
from tflaunch.trace.links import HostTrace
from tflaunch.trace.request import TraceRequest, TraceWindow

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = Path(__file__).resolve().parent / "programs"


# -- the hook ---------------------------------------------------------------------------------


def test_hook_chains_to_the_sitecustomize_it_hides_and_imports_no_tensorflow(tmp_path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text(
        "import os\nopen(os.environ['THEIRS_MARK'], 'w').write('ran')\n"
    )
    env = {**hook_env(tmp_path, theirs), "THEIRS_MARK": str(tmp_path / "mark")}
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(trace_files.HOOK_DIR)
    code = "import sys, sitecustomize; print('tensorflow' in sys.modules, sitecustomize.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, text=True, capture_output=True, check=True
    )
    loaded, module = out.stdout.split()
    assert loaded == "False"
    assert Path(module).parent == theirs  # the program's own import gets its own (issue 39)
    assert (tmp_path / "mark").read_text() == "ran"  # the hidden one ran
    notes = trace_files.read_notes(tmp_path / "trace")
    assert notes.python == {"worker:0"} and not notes.tf_ports


def test_hook_starts_the_profiler_once_tensorflow_has_imported(tmp_path) -> None:
    """A stand-in ``tensorflow`` package records the server's port: the hook starts it after the
    package's own code ran, on the task's port plus the offset, once per task."""
    fake = tmp_path / "fake"
    (fake / "tensorflow").mkdir(parents=True)
    (fake / "tensorflow" / "__init__.py").write_text(
        "import types, os\n"
        "COMPLETE = True\n"
        "def _start(port):\n"
        "    assert COMPLETE\n"
        "    open(os.environ['STARTED_MARK'], 'a').write(f'{port}\\n')\n"
        "server = types.SimpleNamespace(start=_start)\n"
        "profiler = types.SimpleNamespace(experimental=types.SimpleNamespace(server=server))\n"
    )
    env = {**hook_env(tmp_path, fake), "STARTED_MARK": str(tmp_path / "started")}
    code = (
        "import subprocess, sys, tensorflow\n"
        "assert tensorflow.__spec__.loader.__class__.__name__ != '_Loader'\n"
        "subprocess.run([sys.executable, '-c', 'import tensorflow'], check=True)\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    # the child left the port to its parent
    assert (tmp_path / "started").read_text() == f"{hooked_profiler_port(tmp_path)}\n"
    notes = trace_files.read_notes(tmp_path / "trace")
    assert notes.tf_ports == {"worker:0": hooked_profiler_port(tmp_path)}


_FAKE_HEADER = """#include <cstdint>
#include <deque>
#include <string>
namespace tsl { namespace profiler { struct TraceMeRecorder {
  struct Event { std::string name; int64_t start_time; int64_t end_time;EXTRA };
  struct ThreadInfo { int64_t tid; std::string name; };
  struct ThreadEvents { ThreadInfo thread; std::deque<Event> events; };
}; } }
"""


def _fake_tensorflow_with_header(root: Path, header: str | None) -> Path:
    package = root / "tensorflow"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "import ctypes\n"
        "def _start(port):\n"
        "    try:\n"
        "        calls = ctypes.c_ulong.in_dll(ctypes.CDLL(None), 'tflaunch_tracemefix_calls')\n"
        "    except ValueError:\n"
        "        calls = None\n"
        "    print('fix symbol', calls is not None)\n"
        "class server:\n"
        "    start = staticmethod(_start)\n"
        "class profiler:\n"
        "    class experimental:\n"
        "        server = server\n"
    )
    if header is not None:
        path = package / "include" / "xla/tsl/profiler/backends/cpu/traceme_recorder.h"
        path.parent.mkdir(parents=True)
        path.write_text(header)
    return root


def test_hook_builds_the_profiler_fix_only_against_a_matching_tensorflow_header(tmp_path) -> None:
    """The fix for TensorFlow's profiler crash is built with the host's compiler when the
    installed TensorFlow's header has the layouts it assumes, loaded ahead of TensorFlow (its
    symbol is global) and cached; a header that differs, or none, leaves it out, and the note
    says why."""
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("no C++ compiler")
    cases = {
        "same": (_FAKE_HEADER.replace("EXTRA", ""), "loaded", True),
        "differs": (
            _FAKE_HEADER.replace("EXTRA", " int64_t extra;"),
            "not built: its layouts differ from TensorFlow's",
            False,
        ),
        "none": (None, "not built: the installed TensorFlow has no C++ headers", False),
    }
    for name, (header, status, symbol) in cases.items():
        fake = _fake_tensorflow_with_header(tmp_path / name, header)
        env = {**hook_env(tmp_path / name, fake), "XDG_CACHE_HOME": str(tmp_path / "cache")}
        for _ in range(2):  # the second time from the cache
            out = subprocess.run(
                [sys.executable, "-c", "import tensorflow"],
                env=env,
                text=True,
                capture_output=True,
                timeout=300,
                check=True,
            )
            assert out.stdout.strip() == f"fix symbol {symbol}", (name, out.stdout, out.stderr)
            note = json.loads((tmp_path / name / "trace" / "tasks" / "worker-0.tf").read_text())
            assert note["profiler_fix"].startswith(status), (name, note)
            assert (
                trace_files.read_notes(tmp_path / name / "trace").fixes["worker:0"]
                == (note["profiler_fix"])
            )
    built = sorted(p.name.partition(".")[2] for p in (tmp_path / "cache" / "tflaunch").iterdir())
    assert built == ["failed", "so", "so.lock", "so.lock", "so.sum"]  # .sum: size and checksum
    off = {**hook_env(tmp_path / "same", tmp_path / "same"), "TFLAUNCH_PROFILER_FIX": "0"}
    subprocess.run([sys.executable, "-c", "import tensorflow"], env=off, check=True, timeout=60)
    note = json.loads((tmp_path / "same" / "trace" / "tasks" / "worker-0.tf").read_text())
    assert note["profiler_fix"] == "off (TFLAUNCH_PROFILER_FIX=0)"


@pytest.mark.slow
def test_profiler_fix_takes_the_place_of_tensorflows_vector_growth(tmp_path) -> None:
    """With the real TensorFlow: the hook's fix is loaded before TensorFlow and the profiler's
    collection calls it instead of TensorFlow's own copy of the function that copied the
    per-thread events and left dangling pointers (the Keras MWMS crash)."""
    pytest.importorskip("tensorflow")
    env = {**hook_env(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env["OMP_NUM_THREADS"] = "1"
    code = (
        "import ctypes, sys, tensorflow as tf\n"
        "f = tf.function(lambda x: tf.reduce_sum(tf.matmul(x, x)))\n"
        "x = tf.ones((32, 32))\n"
        "tf.profiler.experimental.start(sys.argv[1])\n"
        "for _ in tf.data.Dataset.range(200).map(lambda v: v * 2, num_parallel_calls=2): f(x)\n"
        "tf.profiler.experimental.stop()\n"
        "lib = ctypes.CDLL(None)\n"
        "print(ctypes.c_ulong.in_dll(lib, 'tflaunch_tracemefix_calls').value)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "logdir")],
        env=env,
        text=True,
        capture_output=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) > 0  # TensorFlow's Consume() called the fix
    assert trace_files.read_notes(tmp_path / "trace").fixes == {"worker:0": "loaded"}


def test_hook_costs_a_process_that_never_imports_tensorflow_little(tmp_path) -> None:
    """Start-up of ``python -c pass`` with and without the hook (interleaved; the least CPU of
    each, the figure least disturbed by a busy machine): the hook adds milliseconds of CPU, not
    the seconds a TensorFlow import would. CPU time, not wall time: a descheduled child's wall
    time says nothing of what the hook costs."""
    plain = {k: v for k, v in os.environ.items() if not k.startswith("TFLAUNCH_")}
    hooked = hook_env(tmp_path)
    used: dict[str, list[float]] = {"plain": [], "hooked": []}
    for _ in range(11):
        for name, env in (("plain", plain), ("hooked", hooked)):
            before = cpu_seconds(children=True)
            subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
            used[name].append(cpu_seconds(children=True) - before)
    added = min(used["hooked"]) - min(used["plain"])
    assert added < 0.05, used


# -- progress ---------------------------------------------------------------------------------


def test_default_patterns_read_keras_tf1_and_benchmark_lines() -> None:
    parser = StepParser()
    keras_epoch = (
        " 1/40 [....] - ETA: 3s - loss: 1.5\x08\x08\x08\r 2/40 [>...] - ETA: 2s - loss: 1.4"
        "\x08\x08\r40/40 [====] - 2s 41ms/step - loss: 0.09"
    )
    assert parser.parse("worker:0", "Epoch 1/3") == (None, None)
    assert parser.parse("worker:0", keras_epoch) == (40, None)
    parser.parse("worker:0", "Epoch 2/3")
    assert parser.parse("worker:0", " 7/40 [==>..] - ETA: 1s")[0] == 47
    assert parser.parse("worker:0", "40/40 - 1s - loss: 0.05")[0] == 80
    assert parser.parse("worker:1", "loss = 0.1424, global_step = 259")[0] == 259
    assert parser.parse("worker:1", "INFO:tensorflow:loss = 0.3, step = 300 (0.5 sec)")[0] == 300
    assert parser.parse("worker:1", "global_step/sec: 4.5") == (None, None)
    assert parser.parse("ps:0", "10\timages/sec: 123.4 +/- 0.5 (jitter = 1.2)\t7.1") == (10, 123.4)
    assert parser.parse("ps:0", "throughput 88 img/s") == (None, 88.0)
    assert parser.parse("ps:0", "examples/sec: 5") == (None, 5.0)
    own = StepParser(r"it=(\d+)", r"speed ([\d.]+)")
    assert own.parse("worker:0", "step 5 it=9 speed 2.5") == (9, 2.5)


def test_progress_log_samples_at_most_twice_a_second_and_keeps_the_last(tmp_path) -> None:
    log = ProgressLog(tmp_path, StepParser())
    for i in range(10):
        log.output("worker:0", f"step {i + 1}", 100.0 + i * 0.1)
    log.output("worker:0", "no step here", 101.5)
    log.close()
    series = read_progress(tmp_path)["worker:0"]
    assert series.steps == [1, 6, 10]
    assert series.times == [100.0, 100.5, 100.9]


def _progress_run(tmp_path: Path, rates: dict[str, float]) -> Run:
    run = Run("r1", tmp_path)
    (tmp_path / "run.json").write_text("{}")
    lines = []
    for i in range(20):
        for task, rate in rates.items():
            step = int(i * rate)
            record = {"time": 1000.0 + i, "task": task, "step": step, "rate": rate * 32}
            lines.append(json.dumps(record))
    (tmp_path / "progress.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_stragglers_status_and_plot(tmp_path) -> None:
    run = _progress_run(tmp_path, {"worker:0": 10.0, "worker:1": 8.0, "worker:2": 10.0})
    figures = straggler_figures(list(read_progress(tmp_path).values()))
    assert figures is not None and figures["slowest"] == "worker:1"
    assert figures["spread"] == pytest.approx(0.2, abs=0.01)
    status = step_rates.status_lines(run)
    assert status[1].split() == ["TASK", "STEP", "STEPS/S", "IMG/S"]
    assert status[3].split() == ["worker:1", "152", "8.00", "256.0"]
    data, text = step_rates.progress_summary(run)
    assert data is not None and "slowest worker:1 at 8.00 steps/s" in text
    (png,) = step_rates.plot_progress(run, ReportTarget(tmp_path, 0o644).write)
    assert png.name == "steps_per_task.png" and png.stat().st_size > 10_000


def test_a_stray_step_before_training_adds_no_time_to_the_mean_rate(tmp_path) -> None:
    """MNIST prints "training to global step 200" before it trains: that sample, then a count
    from 0, must not stretch the time. The task that trained faster is not the straggler."""
    from tflaunch.runtime.progress import TaskSeries

    fast = TaskSeries("worker:1", [0.0, 2.0, 3.5, 5.0], [200, 20, 40, 60], [None] * 4)
    slow = TaskSeries("worker:0", [0.0, 0.5, 2.5, 4.5], [200, 0, 20, 40], [None] * 4)
    assert fast.mean_step_rate() == pytest.approx(40 / 3.0)
    assert slow.mean_step_rate() == pytest.approx(40 / 4.0)
    figures = straggler_figures([fast, slow])
    assert figures is not None and figures["slowest"] == "worker:0"
    restarted = TaskSeries("worker:2", [0.0, 1.0, 9.0, 10.0], [0, 10, 0, 10], [None] * 4)
    assert restarted.mean_step_rate() == pytest.approx(10.0)  # the restart's gap is left out
    assert TaskSeries("worker:3", [0.0, 1.0], [5, 0], [None] * 2).mean_step_rate() is None


# -- the window and the verdict -----------------------------------------------------------------


def _trigger(tmp_path: Path, said: list[str], **window) -> trace_window.TraceTrigger:
    request = TraceRequest(tmp_path / "trace", 10000, **window)
    base = free_port_base()
    addresses = {"worker:0": f"127.0.0.1:{base}", "ps:0": f"127.0.0.1:{base + 10}"}
    return trace_window.TraceTrigger(request, "worker:0", addresses, ["sleep"], said.append, 0.0)


def test_window_waits_for_the_step_rate_and_says_why_there_is_no_trace(tmp_path) -> None:
    said: list[str] = []
    trigger = _trigger(tmp_path, said, window=TraceWindow(20, 5))
    trigger.step("worker:1", 100, 1.0)  # not the leader
    trigger.step("worker:0", 10, 1.0)
    assert trigger.request.window.first == 20 and not trigger.fired
    trigger.step("worker:0", 20, 2.0)  # 10 steps/s: the window is open, but no task has TF
    assert trigger.verdict is not None and not trigger.fired
    ok, line = trigger.finish()
    assert not ok and line.startswith("no trace because no task ran Python (program 'sleep')")
    assert trace_files.read_verdict(tmp_path / "trace") == (False, line)


def test_window_that_never_opens_says_so(tmp_path) -> None:
    notes = tmp_path / "trace" / "tasks"
    notes.mkdir(parents=True)
    (notes / "worker-0.python").write_text("1")
    trigger = _trigger(tmp_path, [], window=TraceWindow(50, 5))
    trigger.step("worker:0", 10, 1.0)
    assert trigger.finish()[1] == (
        "no trace because no task had imported TensorFlow before the run ended "
        "(1 task(s) ran Python)"
    )
    (notes / "worker-0.tf").write_text(json.dumps({"pid": 1, "port": 12220}))
    late = _trigger(tmp_path, [], window=TraceWindow(50, 5))
    late.step("worker:0", 10, 1.0)
    assert "worker:0 printed no step line at or past step 50" in late.finish()[1]
    timed = _trigger(tmp_path, [], at_s=30.0, for_s=2.0)
    timed.tick(10.0)
    assert timed.finish()[1] == "no trace because the run ended before the window at 30 s"


class _FarSite(trace_site.TraceSite):
    """A site whose hosts hold the notes (here: a folder apart) and whose helper cannot start."""

    def __init__(self, local: Path, far: Path):
        super().__init__(local)
        self.far = far
        self.windows: list[str] = []

    def notes(self) -> trace_files.Notes:
        return trace_files.read_notes(self.far)

    def publish_window(self, text: str) -> None:
        self.windows.append(text)

    def start_helper(self) -> trace_site.Helper:
        raise OSError("no route to the leader's host")


def test_window_on_another_site_reads_its_notes_and_says_when_its_helper_failed(tmp_path) -> None:
    far = tmp_path / "far"
    (far / "tasks").mkdir(parents=True)
    (far / "tasks" / "worker-0.tf").write_text(json.dumps({"pid": 1, "port": 12220}))
    site = _FarSite(tmp_path / "trace", far)
    request = TraceRequest(tmp_path / "unused", 10000, at_s=1.0, for_s=2.0)
    said: list[str] = []
    trigger = trace_window.TraceTrigger(
        request, "worker:0", {"worker:0": "10.0.0.5:2220"}, ["python"], said.append, 0.0, site
    )
    trigger.start_helper()
    trigger.tick(1.5)
    assert len(site.windows) == 1 and said[-1].startswith("trace: capturing 2.0 s of 1 task")
    ok, line = trigger.finish()
    assert not ok and line == (
        "no trace because the capture helper did not start: OSError: no route to the leader's host"
    )
    assert trace_files.read_verdict(tmp_path / "trace") == (False, line)
    assert not (tmp_path / "unused").exists()


def test_agents_carry_their_hosts_notes_window_and_profiles_to_the_coordinator(
    tmp_path,
) -> None:
    """Over the link, as a detached SSH run's coordinator gets them: a host's notes (new or
    changed ones only), the window written where its hooks read it, and, asked for, its
    profiles at its end in pieces, byte for byte; a host whose directory is the coordinator's
    sends nothing."""
    wire: list[dict] = []

    def emit(event: protocol.Event) -> None:
        wire.append(json.loads(json.dumps(event.wire())))  # as the link carries it

    host = HostTrace(tmp_path / "host2", emit, ["worker:1"])
    assert host.dir == (tmp_path / "host2").resolve() / "trace"
    (host.dir / "tasks").mkdir(parents=True)
    (host.dir / "tasks" / "ps-0.tf").write_text("{}")  # another host's, copied here
    (host.dir / "tasks" / "worker-1.python").write_text("41")
    (host.dir / "tasks" / "worker-1.tf").write_text(json.dumps({"pid": 41, "port": 12221}))
    host.poll()
    host.poll()  # nothing new
    assert sorted(e["name"] for e in wire) == ["worker-1.python", "worker-1.tf"]
    site = trace_site.TraceSite(tmp_path / "host1" / "trace")
    commands: list[tuple[protocol.Command, str | None]] = []
    site.connect(lambda command, to: commands.append((command, to)))
    for data in wire:
        site.received("host2", protocol.event_of(data))
    assert site.notes().tf_ports == {"worker:1": 12221}
    order = site.order({"tasks": {"worker:0": "h1:1", "worker:1": "h2:2"}, "duration_ms": 9})
    assert order["dirs"] == {"worker:1": str(host.dir)} and order["merge"] is False
    assert commands == [(protocol.TraceCollect(to=str(site.dir)), None)]
    site.publish_window(json.dumps({"start": 5.0, "end": 7.5}))
    window = commands[-1][0]
    assert isinstance(window, protocol.TraceWindow)
    host.window(window)
    assert json.loads((host.dir / "window.json").read_text()) == {"start": 5.0, "end": 7.5}
    host.collect(commands[0][0])
    profile = host.dir / "raw" / "plugins" / "profile" / "s1" / "h2_22221.xplane.pb"
    profile.parent.mkdir(parents=True)
    profile.write_bytes(os.urandom(600 * 1024))  # three pieces
    assert site.drain_s() > 0  # asked, not sent yet: the teardown waits longer
    wire.clear()
    assert host.ship()
    assert [e["event"] for e in wire] == ["trace_file"] * 3 + ["trace_sent"]
    for data in wire:
        site.received("host2", protocol.event_of(data))
    got = site.dir / "raw" / "plugins" / "profile" / "s1" / "h2_22221.xplane.pb"
    assert got.read_bytes() == profile.read_bytes()
    assert site.sent["host2"].files == ["raw/plugins/profile/s1/h2_22221.xplane.pb"]
    assert site.drain_s() == 0
    assert not (site.dir / "tasks" / "window.json").exists()  # notes and window stay home
    same = HostTrace(tmp_path / "host1", emit, ["worker:0"])
    same.collect(protocol.TraceCollect(to=str(site.dir)))
    assert not same.ship()


def test_a_programs_own_trace_written_on_another_host_is_sent_and_named_in_the_verdict(
    tmp_path,
) -> None:
    """tflaunch.models' own trace hooks (the benchmark) write the trace from the first worker,
    here on host2, while the coordinator's site is host1's: host2's agent is asked for its files
    as soon as its in-program note comes (the window need not open), sends trace.json and the
    profiles at its end, and the verdict names the trace; the window that opens later takes no
    capture. Had nothing come, the verdict says so and names who sent nothing."""
    wire: list[dict] = []

    def emit(event: protocol.Event) -> None:
        wire.append(json.loads(json.dumps(event.wire())))

    site = trace_site.TraceSite(tmp_path / "host1" / "trace")
    commands: list[tuple[protocol.Command, str | None]] = []
    site.connect(lambda command, to: commands.append((command, to)))
    coordinators = HostTrace(tmp_path / "host1", emit, ["ps:0"])
    worker = HostTrace(tmp_path / "host2", emit, ["worker:0"])
    for host in (coordinators, worker):
        (host.dir / "tasks").mkdir(parents=True)
    (coordinators.dir / "tasks" / "ps-0.inprogram").write_text("")
    (worker.dir / "tasks" / "worker-0.inprogram").write_text("")
    for name, host in (("host1", coordinators), ("host2", worker)):
        wire.clear()
        host.poll()
        for data in wire:
            site.received(name, protocol.event_of(data))
    # host1's directory is the site's: only host2 is asked, once, and at once
    assert commands == [(protocol.TraceCollect(to=str(site.dir)), "host2")]
    worker.collect(commands[0][0])
    said: list[str] = []
    request = TraceRequest(site.dir, 10000, window=TraceWindow(2, 3))
    addresses = {"ps:0": "10.0.0.1:2230", "worker:0": "10.0.0.2:2220"}
    trigger = trace_window.TraceTrigger(
        request, "worker:0", addresses, ["python"], said.append, 0.0, site
    )
    trigger.step("worker:0", 1, 1.0)
    trigger.step("worker:0", 2, 1.5)  # the window: the program takes its own trace
    assert trigger.in_program and not trigger.fired and trigger.helper is None and not said
    assert site.drain_s() > 0  # host2 has not sent yet: the teardown waits for it
    trace = {"traceEvents": []}
    (worker.dir / "trace.json").write_text(json.dumps(trace))
    profile = worker.dir / "raw" / "plugins" / "profile" / "s1" / "h2_12220.xplane.pb"
    profile.parent.mkdir(parents=True)
    profile.write_bytes(os.urandom(300 * 1024))
    wire.clear()
    assert worker.ship() and not coordinators.ship()
    for data in wire:
        site.received("host2", protocol.event_of(data))
    assert site.drain_s() == 0
    ok, line = trigger.finish()
    assert (ok, line) == (True, f"trace: {site.dir / 'trace.json'}")
    assert trace_files.read_verdict(site.dir) == (True, line)
    assert json.loads((site.dir / "trace.json").read_text()) == trace
    got = site.dir / "raw" / "plugins" / "profile" / "s1" / "h2_12220.xplane.pb"
    assert got.read_bytes() == profile.read_bytes()

    # the same, but host2 never sent: no window opened, and the verdict says why
    empty = trace_site.TraceSite(tmp_path / "other" / "trace")
    empty.connect(lambda command, to: None)
    note = protocol.TraceNote(name="worker-0.inprogram", text="", dir=str(worker.dir))
    empty.received("host2", note)
    request = TraceRequest(empty.dir, 10000, window=TraceWindow(2, 3))
    quiet = trace_window.TraceTrigger(
        request, "worker:0", addresses, ["python"], said.append, 0.0, empty
    )
    ok, line = quiet.finish()
    assert not ok and line == (
        "no trace because the program's own capture (tflaunch.models' trace hooks, from "
        "worker:0) left no trace.json; host2 sent nothing: see worker:0's log"
    )
    assert trace_files.read_verdict(empty.dir) == (False, line)


class _CopyingSite(trace_site.TraceSite):
    """A site that fetches the hosts' files itself (as attached SSH copies over SFTP)."""

    gathers = False

    def __init__(self, local: Path, host_dir: Path):
        super().__init__(local)
        self.host_dir = host_dir
        self.collected = 0

    def collect(self) -> None:
        self.collected += 1
        shutil.copytree(self.host_dir, self.dir, dirs_exist_ok=True)


def test_a_programs_own_trace_is_fetched_by_a_copying_site_also_after_the_window(
    tmp_path,
) -> None:
    """Attached SSH: the window that would have opened for a program on its own hooks still
    ends with the site's copy of the trace from the first worker's host, and a verdict."""
    host = tmp_path / "host2" / "trace"
    (host / "tasks").mkdir(parents=True)
    (host / "tasks" / "worker-0.inprogram").write_text("")
    site = _CopyingSite(tmp_path / "local" / "trace", host)
    sent: list[tuple[protocol.Command, str | None]] = []
    site.connect(lambda command, to: sent.append((command, to)))
    site.received("host2", protocol.TraceNote(name="worker-0.inprogram", text="", dir=str(host)))
    assert sent == []  # this site copies the files itself: no agent is asked
    request = TraceRequest(site.dir, 10000, window=TraceWindow(2, 3))
    trigger = trace_window.TraceTrigger(
        request, "worker:0", {"worker:0": "10.0.0.2:2220"}, ["python"], [].append, 0.0, site
    )
    trigger.step("worker:0", 1, 1.0)
    trigger.step("worker:0", 3, 2.0)
    assert trigger.in_program and site.collected == 0
    (host / "trace.json").write_text('{"traceEvents": []}')
    assert trigger.finish() == (True, f"trace: {site.dir / 'trace.json'}")
    assert site.collected == 1 and (site.dir / "trace.json").exists()


class _WaitingSite(trace_site.TraceSite):
    """This machine's site, with a helper that only takes its order (no TensorFlow)."""

    def start_helper(self) -> trace_site.Helper:
        argv = ["sh", "-c", "cat > /dev/null"]
        return trace_site.Helper(subprocess.Popen(argv, stdin=subprocess.PIPE, text=True))


def test_a_traced_task_dead_by_a_signal_in_the_capture_is_blamed_on_the_profiler(tmp_path) -> None:
    notes = tmp_path / "trace" / "tasks"
    notes.mkdir(parents=True)
    for task, fix in (("worker-0", "loaded"), ("ps-0", "not built: no C++ compiler (g++)")):
        (notes / f"{task}.tf").write_text(json.dumps({"pid": 1, "port": 1, "profiler_fix": fix}))
    said: list[str] = []
    site = _WaitingSite(tmp_path / "trace")
    request = TraceRequest(tmp_path / "trace", 10000, at_s=1.0, for_s=2.0)
    base = free_port_base()
    addresses = {
        "worker:0": f"127.0.0.1:{base}",
        "ps:0": f"127.0.0.1:{base + 10}",
        "worker:1": "h:1",
    }
    trigger = trace_window.TraceTrigger(
        request, "worker:0", addresses, ["python"], said.append, 0.0, site
    )
    assert trigger.crash_note("ps:0", 139, time.monotonic()) == ""  # no capture yet
    trigger.tick(1.5)
    try:
        assert said[0] == (
            "trace: worker:1 had not imported TensorFlow 2 s after the start; not traced"
        )
        assert said[1].startswith(
            "trace: ps:0 runs without tflaunch's fix for a crash in TensorFlow's profiler "
            "(not built: no C++ compiler (g++)); the capture may kill such a task"
        )
        now = time.monotonic()
        ps = trigger.crash_note("ps:0", 128 + signal.SIGABRT, now + 1.0)
        assert ps.startswith("It died by SIGABRT 1.0 s after tflaunch's trace capture began")
        assert "fix for the known crash was not in it: not built: no C++ compiler" in ps
        worker = trigger.crash_note("worker:0", 128 + signal.SIGSEGV, now + 30.0)
        assert "TensorFlow's profiler is the likely cause" in worker and "was loaded" in worker
        assert trigger.crash_note("worker:0", 1, now) == ""  # an exit of its own
        assert trigger.crash_note("worker:0", 128 + signal.SIGKILL, now) == ""
        assert trigger.crash_note("worker:1", 139, now) == ""  # not profiled
        assert trigger.crash_note("worker:0", 139, now + 2.0 + 61.0) == ""  # long after
    finally:
        assert trigger.helper is not None
        trigger.helper.kill()


def test_up_trace_of_a_program_that_is_not_python_ends_with_one_line(tmp_path) -> None:
    for argv, code in ((["sleep", "1"], 0), (["sh", "-c", "exit 3"], 3)):
        cluster = write_cluster(tmp_path / "c.yaml", {"argv": argv}, roles={"ps": 0, "worker": 1})
        result = tflaunch("up", str(cluster), "--trace", "5", cwd=ROOT, timeout=120)
        assert result.returncode == code, result.stdout + result.stderr
        lines = [x for x in (result.stdout + result.stderr).splitlines() if "no trace" in x]
        assert lines == [
            "no trace because no task ran Python (program "
            f"'{argv[0]}'): the trace hook works only in Python programs that import TensorFlow"
        ]


def test_detached_run_keeps_its_trace_options(tmp_path) -> None:
    """``up --detach --trace``: the background coordinator gets the same options (it read the
    cluster file again and traced nothing, silently)."""
    cluster = write_cluster(
        tmp_path / "c.yaml", {"argv": ["sleep", "1"]}, roles={"ps": 0, "worker": 1}
    )
    result = tflaunch("up", str(cluster), "--detach", "--trace", "5", cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = (tmp_path / "runs").iterdir()
    deadline = time.monotonic() + 60
    while trace_files.read_verdict(run / "trace") is None and time.monotonic() < deadline:
        time.sleep(0.2)
    verdict = trace_files.read_verdict(run / "trace")
    assert verdict is not None and verdict[1].startswith("no trace because no task ran Python")
    while Run(run.name, run).record().exit_code is None and time.monotonic() < deadline:
        time.sleep(0.2)  # the background coordinator ends with the run
    assert Run(run.name, run).record().exit_code == 0


def test_trace_options_are_checked(tmp_path) -> None:
    cluster = write_cluster(tmp_path / "c.yaml", {"argv": ["true"]}, roles={"ps": 0, "worker": 1})
    for args, needle in (
        (["--trace-at", "soon"], "--trace-at 'soon'"),
        (["--trace-for", "5s"], "--trace-for needs --trace-at"),
        (["--trace", "3", "--trace-at", "5"], "not both"),
    ):
        result = tflaunch("up", str(cluster), *args, cwd=ROOT)
        assert result.returncode == 2 and needle in result.stderr, result.stderr
    assert not (tmp_path / "runs").exists()


# -- real TensorFlow programs (slow) -------------------------------------------------------------


def _processes(trace: dict) -> dict[str, int]:
    return {
        e["args"]["name"].split()[0]: e["pid"]
        for e in trace["traceEvents"]
        if e["name"] == "process_name"
    }


def _traced(tmp_path: Path, cluster: Path, *args: str, timeout: float = 400):
    result = tflaunch("up", str(cluster), *args, cwd=ROOT, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "no trace" not in result.stdout + result.stderr, result.stdout[-2000:]
    (run,) = (tmp_path / "runs").iterdir()
    trace = json.loads((run / "trace" / "trace.json").read_text())
    return result, run, trace


def _assert_tracks(trace: dict, tasks: set[str], steps_of: set[str]) -> None:
    names = _processes(trace)
    assert set(names) == tasks
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for task, pid in names.items():
        mine = [e for e in spans if e["pid"] == pid]
        assert any(e["cat"] == "compute" for e in mine), task
    for task in steps_of:
        assert any(e["cat"] == "step" and e["pid"] == names[task] for e in spans), task


@pytest.mark.slow
def test_keras_fit_under_multi_worker_mirrored_strategy_traced(tmp_path) -> None:
    """A Keras ``fit`` under MultiWorkerMirroredStrategy, traced: both workers on one time axis.
    Without tflaunch's fix for TensorFlow's profiler (the hook's ``profiler_fix``) a worker died
    by SIGSEGV/SIGABRT in about a third of these runs as its profiler collected; no retries."""
    pytest.importorskip("tensorflow")
    pytest.importorskip("tf_keras")
    argv = [sys.executable, str(PROGRAMS / "keras_mwms.py"), "3", "25"]
    program = {"argv": argv, "env": {"TEST_MARKER": str(tmp_path), "OMP_NUM_THREADS": "1"}}
    cluster = write_cluster(tmp_path / "c.yaml", program, roles={"ps": 0, "worker": 2})
    result, run, trace = _traced(tmp_path, cluster, "--trace", "30:10")
    assert "without tflaunch's fix" not in result.stdout
    fixes = trace_files.read_notes(run / "trace").fixes
    assert fixes == {"worker:0": "loaded", "worker:1": "loaded"}, fixes
    _assert_tracks(trace, {"worker:0", "worker:1"}, {"worker:0", "worker:1"})
    steps = [e for e in trace["traceEvents"] if e.get("cat") == "step"]
    assert steps and not any("inferred" in e["args"] for e in steps)  # Keras' own markers
    last = {s.task: s.steps[-1] for s in read_progress(run).values()}
    assert last == {"worker:0": 75, "worker:1": 75}  # 3 epochs of 25, added up
    assert wait_until_gone(str(tmp_path)) == []


@pytest.mark.slow
def test_status_shows_a_running_workers_steps_and_report_draws_steps_per_task(tmp_path) -> None:
    """While a run goes, `status` shows a running worker's step and steps/s, read from its
    output; `report` draws steps/s per task and says the stragglers' spread. The launcher's part:
    the stand-in counts steps where this test ran examples/local.yaml under --trace (MNIST's
    trace added nothing the local backend's other traced runs lack)."""
    argv = [sys.executable, "-m", "tflaunch.models.smoke", "--steps", "80", "--step-seconds"]
    program = {"argv": [*argv, "0.25"], "env": {"TEST_MARKER": str(tmp_path)}}
    cluster = write_cluster(tmp_path / "smoke.yaml", program)
    runs = tmp_path / "runs"
    up = subprocess.Popen(
        [sys.executable, "-m", "tflaunch", "up", str(cluster), "--run-id", "smoke-steps"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = ""
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and up.poll() is None:
            status = tflaunch("status", "smoke-steps", "--runs-dir", str(runs), cwd=ROOT)
            rows = [x.split() for x in status.stdout.splitlines() if x.startswith("worker:0 ")]
            # the task table's row, then the progress row: step, steps/s
            if len(rows) == 2 and int(rows[1][1]) >= 20 and rows[1][2] != "-":
                seen = status.stdout
                break
            time.sleep(2)
        output, _ = up.communicate(timeout=300)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, output[-3000:]
    assert "progress (from the tasks' output):" in seen, seen
    step, rate = [x.split() for x in seen.splitlines() if x.startswith("worker:0 ")][1][1:3]
    assert int(step) >= 20 and float(rate) > 0
    report = tflaunch("report", "smoke-steps", "--runs-dir", str(runs), cwd=ROOT)
    assert report.returncode == 0, report.stderr
    assert "stragglers: step rate spread" in report.stdout
    assert (runs / "smoke-steps" / "steps_per_task.png").stat().st_size > 10_000
    assert wait_until_gone(str(tmp_path)) == []


def test_compute_from_a_traced_one_worker_run(tmp_path) -> None:
    from tflaunch.tools.perfmodel import ModelError
    from tflaunch.tools.perfmodel_inputs import compute_from_trace

    trace = tmp_path / "trace"
    trace.mkdir()
    step = {"total": 100.0, "compute": 60.0, "communication": 10.0, "recv_wait": 20.0, "idle": 10.0}
    summary = {
        "worker:0": {"steps": 12, "own_steps": True, "per_step_ms": step},
        "ps:0": {"steps": 12, "own_steps": False, "per_step_ms": step},
    }
    (trace / "trace_summary.json").write_text(json.dumps(summary))
    assert compute_from_trace(trace) == (pytest.approx(0.07), "worker:0", 12)
    summary["worker:1"] = summary["worker:0"]
    (trace / "trace_summary.json").write_text(json.dumps(summary))
    with pytest.raises(ModelError, match="needs a traced run of one worker"):
        compute_from_trace(trace)
