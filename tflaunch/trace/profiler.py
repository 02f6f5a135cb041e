"""Profiler traces of every task of a cluster for a window of timed steps (the TensorFlow side of
``tflaunch up --trace``; the format and the summary are in :mod:`tflaunch.trace.format`).

Programs call ``setup(info)`` once at start (every task, PS included: it starts TensorFlow's
profiler server on the task's cluster port plus ``TFLAUNCH_TRACE_PORT_OFFSET``) and the timed loop
calls ``active()``'s ``at_step``/``run_step``/``finish``. The first worker, at the window's first step,
asks every task's profiler server for one window of wall-clock time covering the window's steps
(``tf.profiler.experimental.client.trace`` over all of them, from a thread, so its own steps go on),
then turns the XPlanes it got into ``trace.json`` and the per-task summary. A single process (no
cluster) starts and stops its own profiler at exactly the window's steps.

    python -m tflaunch.trace.profiler merge TRACE_DIR --tasks '{"ps:0": "127.0.0.1:2230", ...}'

merges an existing ``TRACE_DIR/raw`` again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import tensorflow as tf

from tflaunch.trace import format as fmt
from tflaunch.trace import request, transfers
from tflaunch.trace.request import TraceError, TraceWindow

COMM_KERNELS = {
    "_Send",
    "_Recv",
    "_HostSend",
    "_HostRecv",
    "CollectiveReduceV2",
    "CollectiveReduce",
    "CollectiveGatherV2",
    "CollectiveBcastSendV2",
    "CollectiveBcastRecvV2",
    "CollectiveAllToAllV2",
}
RUNTIME_EVENTS = {"RunGraph"}
STEP_EVENT = "train"
# A remote capture lasts a fixed time: the window's steps at the slowest recent step time, times
# what profiling costs (measured: InceptionV3 steps took 2-3x as long while traced on 2 cores),
# plus the time the profilers need to start. Only steps wholly inside the capture are summarised.
PROFILED_SLOWDOWN = 3.0
CAPTURE_SLACK_S = 1.0
JOIN_MARGIN_S = 60.0

_active: StepTracer | None = None


def active() -> StepTracer | None:
    """The tracer ``setup`` made for this process, if the run is traced."""
    return _active


def setup(info, env: Mapping[str, str] = os.environ) -> StepTracer | None:
    """Start this task's part of a traced run, if ``TFLAUNCH_TRACE_STEPS`` asks for one."""
    global _active
    if not env.get(request.STEPS_ENV):
        return None
    window = request.parse_window(env[request.STEPS_ENV])
    trace_dir = Path(os.path.expanduser(env.get(request.DIR_ENV) or "tflaunch-trace"))
    offset = int(env.get(request.PORT_OFFSET_ENV) or request.DEFAULT_PORT_OFFSET)
    _active = StepTracer(window, trace_dir, offset, info)
    _active.start_server()
    if info is not None and env.get("TFLAUNCH_TASK"):  # the launcher's capture stands aside
        notes = trace_dir / "tasks"
        notes.mkdir(parents=True, exist_ok=True)
        (notes / f"{env['TFLAUNCH_TASK'].replace(':', '-')}.inprogram").write_text("")
    return _active


def task_addresses(info) -> dict[str, str]:
    """Every task of the cluster and its host:port (chief, workers, PS)."""
    out = {}
    for job in ("chief", "worker", "ps"):
        for index, address in enumerate(info.cluster.get(job, [])):
            out[f"{job}:{index}"] = address
    return out


def profiler_address(address: str, offset: int) -> str:
    host, _, port = address.rpartition(":")
    return f"{host}:{request.profiler_port(int(port), offset)}"


class StepTracer:
    """Step markers for every worker; the capture, for the first worker (or a lone process)."""

    def __init__(self, window: TraceWindow, trace_dir: Path, offset: int, info) -> None:
        self.window = window
        self.trace_dir = trace_dir
        self.raw_dir = trace_dir / "raw"
        self.offset = offset
        self.info = info
        self.capturing = info is None or (info.is_chief)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._local_started = False

    def start_server(self) -> None:
        if self.info is None or not (self.info.is_training_task or self.info.job_name == "ps"):
            return
        if os.environ.get(request.PROFILER_PID_ENV):
            return  # tflaunch's trace hook owns this task's server (started when TF loaded)
        address = task_addresses(self.info)[self.info.name]
        port = request.profiler_port(int(address.rpartition(":")[2]), self.offset)
        tf.profiler.experimental.server.start(port)

    def run_step(self, step: Callable[[], object], step_num: int) -> object:
        """Run ``step`` inside a profiler step marker (cheap when no profiler is collecting)."""
        with tf.profiler.experimental.Trace(STEP_EVENT, step_num=step_num, _r=1):
            return step()

    def at_step(self, step: int, recent_step_s: list[float]) -> None:
        """Called before timed step ``step`` (1-based) with the step times so far."""
        if not self.capturing:
            return
        if self.info is None:
            if step == self.window.first:
                tf.profiler.experimental.start(str(self.raw_dir))
                self._local_started = True
            elif step == self.window.first + self.window.count and self._local_started:
                self._stop_local()
            return
        if step == self.window.first and self._thread is None:
            recent = recent_step_s[-5:] or [1.0]
            seconds = self.window.count * max(recent) * PROFILED_SLOWDOWN + CAPTURE_SLACK_S
            self._thread = threading.Thread(
                target=self._capture, args=(seconds,), name="tflaunch-trace", daemon=True
            )
            self._thread.start()

    def _capture(self, seconds: float) -> None:
        targets = [profiler_address(a, self.offset) for a in task_addresses(self.info).values()]
        try:
            tf.profiler.experimental.client.trace(
                ",".join(f"grpc://{t}" for t in targets),
                str(self.raw_dir),
                max(1, int(seconds * 1000)),
                num_tracing_attempts=3,
            )
        except Exception as exc:  # reported by finish(); a failed capture must not fail training
            self._error = exc

    def _stop_local(self) -> None:
        tf.profiler.experimental.stop()
        self._local_started = False

    def finish(self) -> None:
        """Wait for the capture (bounded), then write the merged trace and the summary."""
        if not self.capturing:
            return
        if self._local_started:
            self._stop_local()
        if self._thread is not None:
            self._thread.join(JOIN_MARGIN_S)
            if self._thread.is_alive() or self._error is not None:
                print(f"trace: the capture failed ({self._error or 'timed out'})", flush=True)
                return
        tasks = {"local": ""} if self.info is None else task_addresses(self.info)
        try:
            paths = merge_dir(self.trace_dir, tasks, self.offset)
        except TraceError as exc:
            print(f"trace: {exc}", flush=True)
            return
        print(f"trace: wrote {', '.join(str(p) for p in paths)}", flush=True)


# -- XPlane to events ------------------------------------------------------------------------


def _xspace(path: Path):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    return space


def _stat_value(plane, stat) -> object:
    kind = stat.WhichOneof("value")
    if kind == "ref_value":
        return plane.stat_metadata[stat.ref_value].name
    if kind == "bytes_value":
        return stat.bytes_value.hex()
    return getattr(stat, kind) if kind else None


def _profile_start_ns(space) -> int:
    for plane in space.planes:
        for stat in plane.stats:
            if plane.stat_metadata[stat.metadata_id].name == "profile_start_time":
                return int(_stat_value(plane, stat))
    return 0


def decode(path: Path, task: str, host: str) -> fmt.TaskTrace:
    """Keep steps, kernels, remote receives (start to arrival) and graph runs of one XSpace."""
    space = _xspace(path)
    start = _profile_start_ns(space)
    events: list[fmt.Event] = []
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        pending: dict[tuple, tuple[str, int]] = {}
        dones: list[tuple[tuple, int]] = []
        for line in plane.lines:
            thread = line.display_name or line.name
            base = start + line.timestamp_ns
            for e in line.events:
                name = plane.event_metadata[e.metadata_id].name
                t0 = base + e.offset_ps // 1000
                dur = e.duration_ps // 1000
                stats = {
                    plane.stat_metadata[s.metadata_id].name: _stat_value(plane, s) for s in e.stats
                }
                if name == STEP_EVENT:
                    args = {"step_num": stats.get("step_num")}
                    events.append(fmt.Event(thread, "step", "step", t0, dur, args))
                elif name.startswith("ExecutorState::ProcessAsync::"):
                    if "Recv" not in str(stats.get("kernel_type", "")):
                        continue
                    key = (stats.get("step_id"), stats.get("name"))
                    if name.endswith("Start"):
                        pending[key] = (thread, t0)
                    elif name.endswith("Done"):
                        dones.append((key, t0 + dur))
                elif name in RUNTIME_EVENTS:
                    events.append(fmt.Event(thread, name, "runtime", t0, dur))
                elif ":" in name and not name.startswith(("ExecutorState", "ThreadpoolListener")):
                    op, _, kernel = name.rpartition(":")
                    cat = "communication" if kernel in COMM_KERNELS else "compute"
                    events.append(fmt.Event(thread, op, cat, t0, dur, {"kernel": kernel}))
        for key, end in dones:
            if key in pending:
                thread, t0 = pending.pop(key)
                args = {"kernel": "_Recv", "tensor": key[1], "step_id": key[0]}
                events.append(fmt.Event(thread, f"recv {key[1]}", "recv_wait", t0, end - t0, args))
    if not any(e.category == "step" for e in events):
        events += _session_run_steps(space, start)
    return fmt.TaskTrace(task, host, events, start)


def _session_run_steps(space, start: int) -> list[fmt.Event]:
    """Steps of a program without step markers (a TF1 ``Session.run`` loop): the regions its
    calling thread spends in TensorFlow (``ThreadpoolListener`` Start/StopRegion). The long
    ones start steps (a hook's short read after each training run belongs to that step); each
    step lasts until the next one starts, its last until its own end. None for a task whose
    threads run no such regions (a PS)."""
    best: list[tuple[int, int]] = []
    thread = ""
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if line.name.startswith("tf_") or "grpc" in line.name.lower():
                continue  # TensorFlow's own pools: the program's calling thread is sought
            regions, opened = [], None
            base = start + line.timestamp_ns
            for e in line.events:
                name = plane.event_metadata[e.metadata_id].name
                t = base + e.offset_ps // 1000
                if name == "ThreadpoolListener::StartRegion":
                    opened = t
                elif name == "ThreadpoolListener::StopRegion" and opened is not None:
                    regions.append((opened, t))
                    opened = None
            if len(regions) > len(best):
                best, thread = regions, line.display_name or line.name
    if len(best) < 2:
        return []
    lengths = sorted(b - a for a, b in best)
    long_enough = 0.2 * lengths[len(lengths) * 3 // 4]
    starts = [(a, b) for a, b in best if b - a >= long_enough]
    steps = []
    for i, (a, b) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else max(b, best[-1][1])
        args = {"step_num": i + 1, "inferred": "Session.run regions"}
        steps.append(fmt.Event(thread, "session run", "step", a, end - a, args))
    return steps


def _find_raw(raw_dir: Path, stem: str) -> Path | None:
    found = sorted(raw_dir.glob(f"plugins/profile/*/{stem}.xplane.pb"))
    return found[-1] if found else None


def merge_dir(trace_dir: Path, tasks: Mapping[str, str], offset: int) -> list[Path]:
    """Decode ``trace_dir/raw``'s XPlanes of ``tasks`` (task -> cluster host:port), merge them
    and write trace.json and the summary into ``trace_dir``."""
    raw = trace_dir / "raw"
    traces = []
    for task, address in tasks.items():
        if address:
            prof = profiler_address(address, offset)
            path = _find_raw(raw, prof.replace(":", "_"))
            host = address.rpartition(":")[0]
        else:
            found = sorted(raw.glob("plugins/profile/*/*.xplane.pb"))
            path, host = (found[-1] if found else None), "localhost"
        if path is None:
            print(f"trace: no profile from {task} under {raw}", flush=True)
            continue
        traces.append(decode(path, task, host))
    if not traces:
        raise TraceError(f"no task's profile under {raw}.")
    merged = fmt.merge(traces)
    return fmt.write_outputs(merged, trace_dir) + transfers.write_report(merged, trace_dir)


def capture(trace_dir: Path, targets: Mapping[str, str], duration_ms: int) -> list[Path]:
    """The launcher's capture (``tflaunch up --trace`` of any program): ask every task's
    profiler server (task -> host:profiler port) for the same ``duration_ms`` at once, then
    merge what came back."""
    raw = trace_dir / "raw"
    tf.profiler.experimental.client.trace(
        ",".join(f"grpc://{t}" for t in targets.values()),
        str(raw),
        duration_ms,
        num_tracing_attempts=3,
    )
    return merge_dir(trace_dir, dict(targets), 0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tflaunch.trace.profiler")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("capture", help="capture every task's profiler now, then merge")
    c.add_argument("trace_dir")
    c.add_argument("--tasks", required=True, help='JSON: {"ps:0": "host:profiler port", ...}')
    c.add_argument("--duration_ms", type=int, required=True)
    m = sub.add_parser("merge", help="merge TRACE_DIR/raw into TRACE_DIR/trace.json")
    m.add_argument("trace_dir")
    m.add_argument("--tasks", required=True, help='JSON: {"ps:0": "host:port", ...}')
    m.add_argument("--port_offset", type=int, default=request.DEFAULT_PORT_OFFSET)
    args = p.parse_args(argv)
    try:
        if args.command == "capture":
            paths = capture(Path(args.trace_dir), json.loads(args.tasks), args.duration_ms)
        else:
            paths = merge_dir(Path(args.trace_dir), json.loads(args.tasks), args.port_offset)
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(str(path) for path in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
