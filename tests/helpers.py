"""Helpers for tests that run real clusters: free ports, cluster files, process-table checks."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import queue
import random
import re
import resource
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
FAKE_TASK = Path(__file__).resolve().parent / "programs" / "fake_task.py"
FAKE_PSS = Path(__file__).resolve().parent / "programs" / "fake_pss.py"  # models.pss stand-in


def tensorflow_module(*also: str) -> list[pytest.MarkDecorator]:
    """``pytestmark`` of a module all of whose tests are TensorFlow's: each marked `tensorflow`
    and `slow` (as tests/conftest.py marks the tests of a module that imports TensorFlow at top
    level), and skipped where TensorFlow (or a module of ``also``) is not installed. The module
    imports TensorFlow where a test uses it (:class:`LazyModule`, or an import in the test), not
    at top level: every pytest-xdist worker collects every module, and the import costs each
    about 4.5 s of CPU, run there or not."""
    missing = [name for name in ("tensorflow", *also) if importlib.util.find_spec(name) is None]
    reason = f"needs {', '.join(missing)}, not installed"
    return [
        pytest.mark.tensorflow,
        pytest.mark.slow,
        pytest.mark.skipif(bool(missing), reason=reason),
    ]


class LazyModule:
    """A module imported at the first read of one of its attributes (``tf.config``), so that a
    test module can name TensorFlow, or a module that imports it, without importing it when it
    is collected (see :func:`tensorflow_module`)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str):
        if attribute.startswith("_"):  # pytest's collection probes (__test__, fixture markers)
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self._name), attribute)


def free_port_base(span: int = 20) -> int:
    """A base port with ``span`` free ports above it (tests never use the default 2220/2230).

    Below Linux's ephemeral range (32768 and up): a task's port there can be taken, between this
    check and the task's bind, by the local end of some outgoing connection."""
    for _ in range(200):
        base = random.randint(20000, 32700 - span)
        if all(_free(base + i) for i in range(span)):
            return base
    raise RuntimeError("no free port range found")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


@contextmanager
def cpu_bounded(seconds: float, children: bool = False):
    """Asserts that the block's work stays under ``seconds`` of CPU time: this process's, and
    with ``children`` that of the processes it waited for. That is the bound a test of a bomb or
    a 400 MB file means.

    Wall time is no such bound on a shared machine: a suite run saw a config parse that takes
    5 ms take 35 s of wall time, the pytest worker descheduled, and fail a `< 2 s` check."""
    before = cpu_seconds(children)
    yield
    used = cpu_seconds(children) - before
    assert used < seconds, f"the block used {used:.2f} s of CPU, more than {seconds} s"


def cpu_seconds(children: bool = True) -> float:
    """User and system CPU time of this process, and of the children it has waited for."""
    who = [resource.RUSAGE_SELF] + ([resource.RUSAGE_CHILDREN] if children else [])
    usages = [resource.getrusage(w) for w in who]
    return sum(u.ru_utime + u.ru_stime for u in usages)


def checkout_python(folder: Path, checkout: Path = ROOT) -> str:
    """An interpreter for ``ssh.python`` that imports this checkout's tflaunch: sshd hands
    remote commands a fresh environment, without the tests' PYTHONPATH, so a bare interpreter
    on the (shared) hosts would run the installed tflaunch instead of the code under test."""
    path = folder / f"python-{checkout.name}"
    path.write_text(f'#!/bin/sh\nPYTHONPATH={checkout} exec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return str(path)


def mnist_argv(python: str = sys.executable, *extra: str) -> list[str]:
    """``tflaunch.models.mnist`` with the TF1-style cluster placeholders, as examples/local.yaml runs it."""
    return [
        python,
        "-m",
        "tflaunch.models.mnist",
        "--job_name",
        "{job_name}",
        "--task_index",
        "{task_index}",
        "--ps_hosts",
        "{ps_hosts}",
        "--worker_hosts",
        "{worker_hosts}",
        *extra,
    ]


def tiny_benchmark_argv(extra: list[str], tiny_cnn: bool = False) -> list[str]:
    """The benchmark at its smallest that still builds InceptionV3 (75 px, batch 2, 2 steps after
    one warm-up); with ``tiny_cnn``, of tests/tiny_cnn.py's network (8 px), through
    tests/programs/tiny_benchmark.py (give the task PYTHONPATH=ROOT)."""
    if tiny_cnn:
        argv = [sys.executable, str(ROOT / "tests" / "programs" / "tiny_benchmark.py")]
        argv += ["--model", "tiny_cnn", "--image_size", "8"]
    else:
        argv = [sys.executable, "-m", "tflaunch.models.benchmark", "--model", "inception3"]
        argv += ["--image_size", "75"]
    argv += ["--batch_size", "2", "--num_batches", "2"]
    return argv + ["--num_warmup_batches", "1", "--display_every", "1", *extra]


def tiny_tfrecords(folder: Path) -> Path:
    """The benchmark's ``--data_dir`` at its smallest: 12 images of 80 px, 5 classes, 3 shards."""
    from tflaunch.models.data.imagenet import write_dataset

    write_dataset(str(folder), num_images=12, image_size=80, num_classes=5, num_shards=3)
    return folder


def check_benchmark_totals(stdout: str, result_dir: Path, num_ps: int) -> None:
    """A benchmark run by ``tflaunch up`` with two workers and ``--result_json
    RESULT_DIR/{job_name}-{task_index}.json``: every worker prints the same total, the sum of
    both workers' own figures, and each one's document names the cluster's shape."""
    totals = {
        worker: float(m.group(1))
        for worker in ("worker:0", "worker:1")
        for m in re.finditer(rf"^\[{worker}\]\s+total images/sec: ([\d.]+)$", stdout, re.M)
    }
    assert set(totals) == {"worker:0", "worker:1"}, stdout[-3000:]
    docs = [json.loads((result_dir / f"worker-{i}.json").read_text()) for i in (0, 1)]
    own = sum(d["images_per_sec"]["worker"] for d in docs)
    assert abs(totals["worker:0"] - own) <= 0.01 and totals["worker:0"] == totals["worker:1"]
    assert all(d["cluster"]["num_workers"] == 2 and d["cluster"]["num_ps"] == num_ps for d in docs)


def logged_accuracy(log: str, what: str) -> float:
    """The one ``<what> accuracy: X`` line of an MNIST task's log (``train`` or ``test``)."""
    found = re.findall(rf"^{what} accuracy: ([0-9.]+)$", log, flags=re.MULTILINE)
    assert len(found) == 1, f"expected one '{what} accuracy:' line in:\n{log[-3000:]}"
    return float(found[0])


def write_cluster(path: Path, program: dict, **overrides) -> Path:
    """Write a local cluster file on free ports; ``overrides`` are top-level keys."""
    base = free_port_base()
    data = {
        "name": "test",
        "backend": "local",
        "program": program,
        "roles": {"ps": 1, "worker": 2},
        "ports": {"ps": base, "worker": base + 10, "chief": base + 8},
        "supervision": {"grace_period": 2, "ready_timeout": 60},
        "runs_dir": str(path.parent / "runs"),
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path.write_text(yaml.safe_dump(data))
    return path


def up_tensorflow_cluster(tmp_path: Path, program: dict, timeout: float, **overrides):
    """``tflaunch up`` (in the checkout) of a local cluster of TensorFlow ``program`` (its
    ``argv`` and more; TEST_MARKER joins its env) under ``tmp_path``, given 240 s to be ready;
    checked to have succeeded. ``overrides``: the file's other top-level keys."""
    program = {**program, "env": {"TEST_MARKER": str(tmp_path), **program.get("env", {})}}
    overrides["supervision"] = {"ready_timeout": 240, **overrides.get("supervision", {})}
    cluster = write_cluster(tmp_path / "cluster.yaml", program, **overrides)
    result = tflaunch("up", str(cluster), cwd=ROOT, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def fake_cluster(tmp_path: Path, env: dict | None = None, **overrides) -> Path:
    program = {
        "argv": [sys.executable, str(FAKE_TASK)],
        "env": {"TEST_MARKER": str(tmp_path), **(env or {})},
    }
    return write_cluster(tmp_path / "cluster.yaml", program, **overrides)


def tflaunch(
    *args: str,
    cwd: Path | None = None,
    timeout: float = 120,
    env: dict | None = None,
    unset: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """``tflaunch ARGS`` run to its end, in this environment plus ``env`` less ``unset``."""
    environ = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}
    return subprocess.run(
        [sys.executable, "-m", "tflaunch", *args],
        cwd=cwd,
        text=True,
        capture_output=True,
        timeout=timeout,
        env=environ,
    )


def start_tflaunch(*args: str, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tflaunch", *args],
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@contextmanager
def up_until(
    cluster: Path, needle: str, *args: str, timeout: float = 30
) -> Iterator[tuple[subprocess.Popen, str]]:
    """``tflaunch up CLUSTER ARGS`` started, its output read until a line holds ``needle``:
    yields the process and what was read; the process is killed on the way out."""
    proc = start_tflaunch("up", str(cluster), *args)
    try:
        yield proc, read_until(proc.stdout, needle, timeout=timeout)
    finally:
        proc.kill()


def up_detached(cluster: Path, *args: str, timeout: float = 120) -> str:
    """``tflaunch up CLUSTER --detach ARGS``, checked to have started: the run id it printed."""
    started = tflaunch("up", str(cluster), "--detach", *args, timeout=timeout)
    assert started.returncode == 0, started.stderr
    return started.stdout.strip().splitlines()[-1]


@contextmanager
def live_detached_run(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A fake-task run (60 s of work) left running by ``up --detach`` under ``tmp_path/runs``:
    yields that folder and the run id; on the way out the run is brought down, and then
    removed (``rm`` must succeed)."""
    cluster = fake_cluster(tmp_path, env={"WORK_SECONDS": "60"})
    runs = tmp_path / "runs"
    run_id = up_detached(cluster, "--runs-dir", str(runs))
    try:
        yield runs, run_id
    finally:
        tflaunch("down", run_id, "--runs-dir", str(runs))
    assert tflaunch("rm", run_id, "--runs-dir", str(runs)).returncode == 0


def processes_mentioning(marker: str) -> list[psutil.Process]:
    """Live processes whose command line mentions ``marker`` or whose TEST_MARKER it is
    (tasks of ``fake_cluster`` carry it in their environment, and so do their children)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(proc.info["cmdline"] or [])
            if marker in cmdline or proc.environ().get("TEST_MARKER") == marker:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def assert_kill_ends_cluster(
    proc: subprocess.Popen, marker: str, task: str = "worker:1", within: float = 5.0
) -> None:
    """SIGKILL ``task`` (a local task of the run ``proc`` launched) and check that the whole
    cluster ends within ``within`` seconds, with exit 137 and a report naming the task."""
    victims: list[psutil.Process] = []
    deadline = time.monotonic() + 30  # a loaded machine may list a task late
    while not victims and time.monotonic() < deadline and proc.poll() is None:
        victims = [p for p in processes_mentioning(marker) if _task_of(p) == task]
        if not victims:
            time.sleep(0.2)
    if len(victims) != 1:
        out = "" if proc.poll() is None else proc.stderr.read()[-3000:]
        raise AssertionError(
            f"{len(victims)} process(es) of {task} found; the launcher "
            f"{'runs' if proc.poll() is None else f'exited {proc.returncode}'}: {out}"
        )
    (victim,) = victims
    killed_at = time.monotonic()
    victim.kill()
    proc.wait(timeout=within + 10)
    assert time.monotonic() - killed_at < within
    assert proc.returncode == 137
    assert f"{task} on localhost exited with code 137 (SIGKILL)" in proc.stderr.read()


def _task_of(process: psutil.Process) -> str | None:
    try:
        return process.environ().get("TFLAUNCH_TASK")
    except psutil.Error:  # ended, or between exec and its new environment
        return None


def wait_until_gone(marker: str, timeout: float = 10.0) -> list[psutil.Process]:
    """Wait for every process mentioning ``marker`` to end; return those still alive."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = processes_mentioning(marker)
        if not left:
            return []
        time.sleep(0.2)
    return processes_mentioning(marker)


# Keyed by the stream itself (weakly): an id() could be reused by a later stream.
_line_queues: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def read_until(stream, needle: str, timeout: float) -> str:
    """Read lines from ``stream`` until one contains ``needle``; return what was read.

    A thread per stream does the reading (a select() on a buffered text stream misses lines
    already in its buffer), so repeated calls on one stream see every line exactly once.
    """
    lines = _line_queues.get(stream)
    if lines is None:
        lines = _line_queues[stream] = queue.Queue()

        def pump() -> None:
            for line in iter(stream.readline, ""):
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, min(0.2, deadline - time.monotonic())))
        except queue.Empty:
            continue
        if line is None:
            lines.put(None)
            break
        seen.append(line)
        if needle in line:
            return "".join(seen)
    raise AssertionError(f"'{needle}' not seen within {timeout} s; got:\n{''.join(seen)}")


def python_files(*tops: str) -> list[Path]:
    """Every ``.py`` file under the repository's top folders ``tops``, sorted: what the
    tree-scanning tests (stray protocol names, raw run.json reads) read."""
    return sorted(p for top in tops for p in (ROOT / top).rglob("*.py"))


def imported_modules(path: Path) -> list[str]:
    """The modules the Python file ``path`` imports by absolute name, in the order written."""
    modules: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.append(node.module or "")
        elif isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
    return modules


def ready_and_last_worker_exit(run_dir: Path) -> tuple[float, float]:
    """From a run's events: when its cluster was ready, and when its last worker exited."""
    from tflaunch.runtime import protocol

    lines = (run_dir / "events.jsonl").read_text().splitlines()
    events = list(protocol.records(json.loads(line) for line in lines))
    ready = next(r.time for r in events if isinstance(r.event, protocol.ClusterReady))
    last_exit = max(
        r.time
        for r in events
        if isinstance(r.event, protocol.Exited) and r.event.task.startswith("worker")
    )
    return ready, last_exit


def run_program(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python ARGV`` from the checkout (a program of tests/programs and its arguments) with
    TensorFlow's C++ log quiet and nothing else of this environment, checked to succeed."""
    proc = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def upstream(op) -> set[str]:
    """The names of every TensorFlow op that ``op`` waits for, through inputs and control
    inputs (a graph's ``Operation``; nothing here imports TensorFlow)."""
    seen: set[str] = set()
    todo = [op]
    while todo:
        current = todo.pop()
        for dep in [*current.control_inputs, *(t.op for t in current.inputs)]:
            if dep.name not in seen:
                seen.add(dep.name)
                todo.append(dep)
    return seen


def hook_env(tmp_path: Path, *extra_path: Path, **more: str) -> dict[str, str]:
    """The environment of a program the trace hook traces as worker:0 of a one-worker cluster:
    its cluster_spec.json in ``tmp_path`` (a free port), the trace in ``tmp_path/trace``, the
    profiler at the worker's port + 7 (:func:`hooked_profiler_port`), no other TFLAUNCH_
    variable of this process, ``extra_path`` as PYTHONPATH; ``more``: other variables."""
    from tflaunch.trace import files as trace_files

    cluster = tmp_path / "cluster_spec.json"
    cluster.write_text(json.dumps({"cluster": {"worker": [f"127.0.0.1:{free_port_base(8)}"]}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFLAUNCH_")}
    env.update(
        TFLAUNCH_TRACE_HOOK="1",
        TFLAUNCH_TRACE_DIR=str(tmp_path / "trace"),
        TFLAUNCH_TRACE_PORT_OFFSET="7",
        TFLAUNCH_TASK="worker:0",
        TFLAUNCH_CLUSTER_FILE=str(cluster),
        PYTHONPATH=os.pathsep.join(str(p) for p in extra_path),
        **more,
    )
    return trace_files.with_hook(env)


def hooked_profiler_port(tmp_path: Path) -> int:
    """The port the hook gives worker:0's profiler in a :func:`hook_env` run: its cluster port
    + the offset 7."""
    cluster = json.loads((tmp_path / "cluster_spec.json").read_text())["cluster"]
    return int(cluster["worker"][0].rsplit(":", 1)[1]) + 7


def gone_launcher():
    """The identity of a process of this machine that ran and is gone (a killed launcher)."""
    from tflaunch.runtime.identity import Launcher, machine_id

    proc = subprocess.Popen(["sleep", "0"])
    started = round(psutil.Process(proc.pid).create_time(), 2)
    proc.wait()
    return Launcher(socket.gethostname(), machine_id(), proc.pid, started)


def in_second_pid_namespace(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``tflaunch ARGS`` from a second PID namespace with its own /proc and this hostname (a
    second container sharing the runs directory): to it, this namespace's processes do not
    exist, or their pids name others. Needs root (the ``second_pid_namespace`` fixture)."""
    return subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "tflaunch", *args],
        text=True,
        capture_output=True,
        timeout=timeout,
        cwd=ROOT,
    )


def left_behind_run(runs, name: str, backend: str, **meta):
    """A run directory as a backend leaves it: run.json (its launcher gone, unless ``meta``
    names one), a one-task plan, events."""
    from tflaunch.runtime.run import Run

    run = Run.create(runs, name)
    meta.setdefault("launcher", gone_launcher())
    run.update_meta(run_id=run.id, name=name, backend=backend, **meta)
    plan = {
        "name": name,
        "supervision": {},
        "program": {"argv": ["true"], "env": {}, "tf_config": True, "checkpoint_dir": "c"},
        "cluster": {"worker": ["h:1"]},
        "hosts": [{"name": "h", "cluster_address": "h", "connect_address": "h", "gpu_ids": []}],
        "tasks": [
            {
                "job": "worker",
                "index": 0,
                "host": "h",
                "cluster_address": "h",
                "port": 1,
                "gpus": [],
                "workdir": ".",
                "log_name": "worker-0.log",
            }
        ],
    }
    run.plan_path.write_text(json.dumps(plan))
    return run


# An nvidia-smi stand-in that lists GPUs (tests/test_gpus_found.py, tests/ssh/test_ssh_gpus.py).
FAKE_SMI = """#!/bin/sh
[ "$1" = "-L" ] || exit 9
echo "GPU 0: NVIDIA Stand-in (UUID: GPU-aaaa1111-0000-0000-0000-000000000000)"
echo "GPU 1: NVIDIA Stand-in (UUID: GPU-bbbb2222-0000-0000-0000-000000000000)"
"""


TRAFFIC_TASK = ROOT / "tests" / "programs" / "traffic_task.py"


def traffic_cluster(tmp_path: Path, traffic_bytes: int, **env: str) -> Path:
    """1 PS on node-b and 2 workers on node-a: two agents, two loopback addresses."""
    program = {
        "argv": [sys.executable, str(TRAFFIC_TASK)],
        "env": {"TEST_MARKER": str(tmp_path), "TRAFFIC_BYTES": str(traffic_bytes), **env},
    }
    return write_cluster(
        tmp_path / "cluster.yaml",
        program,
        hosts=[
            {"name": "node-a", "address": "127.0.0.1"},
            {"name": "node-b", "address": "127.0.0.2"},
        ],
        placement={"ps": "dedicated"},
        supervision={"sample_interval": 0.2},
    )
