"""Resource samples: what every task and node uses while the cluster runs.

Each agent runs a :class:`Sampler` thread (``supervision.sample_interval`` seconds apart, 1 by
default, 0 turns it off). A sample holds, for every running task of the node, the CPU % (of one
core, so a task busy on four cores shows 400), resident memory, thread and process count of the
task *and every process it started*, and for the node its CPU utilization (% of all cores), its
memory, and the cumulative bytes and packets sent and received per network interface.

Samples travel upstream as ``sample`` events like every other event, so they reach the run
directory of the launcher on every backend (also for agents on remote nodes, live, which
``tflaunch status`` uses); the coordinator writes them with :class:`SampleLog` to
``<run-dir>/samples-<host>.jsonl``, one JSON object a line. Counters are cumulative: a lost line
loses no bytes, and ``tflaunch report`` takes differences.

CPU % is computed from CPU-time differences between two samples, never from a blocking psutil
call, so one sample costs a few milliseconds (see ``benchmarks/sampling_cost.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import psutil

from tflaunch.runtime import protocol
from tflaunch.runtime.runfiles import (
    SAMPLES_PREFIX,
    RunFileError,
    json_lines,
    json_objects,
    open_for_reading,
    open_run_file,
)

if TYPE_CHECKING:
    from tflaunch.cluster.supervision import Supervision

Emit = Callable[[protocol.Event], None]
PidSource = Callable[[], Mapping[str, int]]
NET_FIELDS = ("bytes_sent", "bytes_recv", "packets_sent", "packets_recv")


def samples_path(run_dir: str | os.PathLike, host: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host)
    return Path(run_dir) / f"{SAMPLES_PREFIX}{safe}.jsonl"


# ---- taking samples ---------------------------------------------------------------------------


def _ppid_map_linux() -> dict[int, int]:
    """pid -> parent pid for every process: one pass over /proc (psutil does one per call)."""
    parents = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue  # ended meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
        fields = data[data.rfind(b")") + 2 :].split(None, 2)
        if len(fields) >= 2:
            parents[int(name)] = int(fields[1])
    return parents


def process_tree(roots: list[int]) -> tuple[dict[int, list[int]], dict[int, int]]:
    """For each root pid, the root and its live descendants; and pid -> parent pid of all seen."""
    if not sys.platform.startswith("linux"):
        trees, parents = {}, {}
        for root in roots:
            try:
                members = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
            except psutil.Error:
                members = []
            trees[root] = [p.pid for p in members] or [root]
            for proc in members:
                with contextlib.suppress(psutil.Error):
                    parents[proc.pid] = proc.ppid()
        return trees, parents
    parents = _ppid_map_linux()
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    trees = {}
    for root in roots:
        tree, todo = [], [root]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(children.get(pid, ()))
        trees[root] = tree
    return trees, parents


def _alive(pid: int, parents: Mapping[int, int]) -> bool:
    if sys.platform.startswith("linux"):
        return pid in parents  # the scan of this sample saw every process
    return psutil.pid_exists(pid)


@dataclass(frozen=True)
class _Seen:
    create_time: float
    cpu: float  # user + system + reaped children's, seconds
    ppid: int | None


def _cpu_total(times: Any) -> float:
    """A process's CPU seconds, those of the children it reaped included."""
    return float(times.user + times.system + times.children_user + times.children_system)


class TreeSampler:
    """Measures process trees and the node; keeps the baselines between two samples.

    A tree's CPU time over an interval is the sum of its processes' CPU-time growth, where a
    process's time includes that of the children it reaped (``children_user/system``): so a
    short-lived child between two samples is counted. A child that was seen and then reaped by
    a tree member would be counted twice (once live, once in its parent's reaped time), so its
    last seen time is taken off again.
    """

    def __init__(self) -> None:
        self._seen: dict[int, _Seen] = {}
        self._trees: dict[int, set[int]] = {}  # root -> members at the last sample
        self._last_time: float | None = None
        self._node_cpu: tuple[float, float] | None = None  # (busy, total) CPU seconds

    def sample(self, tasks: Mapping[str, int]) -> dict[str, Any]:
        """One sample of the given tasks (name -> leader pid) and of the node."""
        now = time.time()
        trees, parents = process_tree(list(tasks.values()))
        seen: dict[int, _Seen] = {}
        result = {}
        for name, root in tasks.items():
            record = self._sample_tree(root, trees.get(root, [root]), now, parents, seen)
            if record is not None:
                result[name] = {"pid": root, **record}
        self._seen, self._last_time = seen, now
        self._trees = {root: set(trees.get(root, [root])) for root in tasks.values()}
        return {"time": round(now, 3), "node": self._sample_node(), "tasks": result}

    def _sample_tree(
        self,
        root: int,
        pids: list[int],
        now: float,
        parents: Mapping[int, int],
        seen: dict[int, _Seen],
    ) -> dict[str, Any] | None:
        rss, threads = 0, 0
        totals: dict[int, float] = {}  # live member -> its CPU time now, reaped children's in it
        reaped: list[int] = []  # in the scan, but reaped before it was read
        for pid in pids:  # a parent before its children (process_tree's order)
            try:
                proc = psutil.Process(pid)  # not cached: a reused pid must not pass as the old one
                with proc.oneshot():
                    # A process that exits between status() and memory_info() reads as a zombie
                    # by its memory (all zeros), which no live process has.
                    memory = proc.memory_info().rss
                    if proc.status() == psutil.STATUS_ZOMBIE or memory == 0:
                        if pid == root:
                            return None  # the task has ended; its agent reports the exit
                        self._keep_seen(pid, seen)  # exited, not reaped yet
                        continue
                    times = proc.cpu_times()
                    created = proc.create_time()
                    rss += memory
                    threads += proc.num_threads()
            except psutil.ZombieProcess:
                self._keep_seen(pid, seen)
                continue
            except psutil.NoSuchProcess:
                reaped.append(pid)
                continue
            except psutil.Error:  # not ours to read: nothing to count
                continue
            totals[pid] = _cpu_total(times)
            seen[pid] = _Seen(created, totals[pid], parents.get(pid))
        if not totals:
            return None
        # A child reaped between the scan and its read may have been reaped after its parent was
        # read: the parent is read again, so that its growth (the child's time, now in its reaped
        # time) and the child's leaving fall in this one sample.
        for parent in {parents.get(pid) for pid in reaped} & totals.keys():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(parent)
                if proc.create_time() == seen[parent].create_time:  # not a reused pid
                    totals[parent] = _cpu_total(proc.cpu_times())
                    seen[parent] = replace(seen[parent], cpu=totals[parent])
        last_members = self._trees.get(root, set())
        cpu_delta = 0.0
        for pid, total in totals.items():
            before = self._seen.get(pid)
            if before is not None and before.create_time == seen[pid].create_time:
                cpu_delta += max(0.0, total - before.cpu)
            elif self._last_time is not None and pid not in last_members:
                # New in the tree since the last sample: all its time is new. (At the first
                # sample there is no last one: the processes found then only set the baseline.)
                cpu_delta += total
        left = [pid for pid in last_members - set(pids) if not _alive(pid, parents)]
        for pid in {*left, *reaped}:
            gone = self._seen.get(pid)
            if gone is not None and gone.ppid in totals:
                cpu_delta -= gone.cpu  # reaped by a tree member: its parent's growth holds it
        interval = now - self._last_time if self._last_time is not None else 0.0
        cpu = round(100.0 * max(0.0, cpu_delta) / interval, 1) if interval > 1e-3 else None
        return {"cpu_percent": cpu, "rss": rss, "threads": threads, "procs": len(totals)}

    def _keep_seen(self, pid: int, seen: dict[int, _Seen]) -> None:
        """Carry forward what was counted of a process that has exited but is not reaped yet:
        when its parent reaps it, the parent's growth holds its time, and what was already
        counted of it is taken off then, however many samples later that is."""
        before = self._seen.get(pid)
        if before is not None:
            seen[pid] = before

    def _sample_node(self) -> dict[str, Any]:
        times = psutil.cpu_times()
        total = sum(times)
        idle = times.idle + getattr(times, "iowait", 0.0)
        busy = total - idle
        cpu = None
        if self._node_cpu is not None and total - self._node_cpu[1] > 1e-3:
            cpu = round(100.0 * (busy - self._node_cpu[0]) / (total - self._node_cpu[1]), 1)
            cpu = min(100.0, max(0.0, cpu))
        self._node_cpu = (busy, total)
        memory = psutil.virtual_memory()
        net = {
            nic: {f: getattr(c, f) for f in NET_FIELDS}
            for nic, c in psutil.net_io_counters(pernic=True).items()
        }
        return {
            "cpu_percent": cpu,
            "cpus": psutil.cpu_count() or 1,
            "mem_total": memory.total,
            "mem_used": memory.total - memory.available,
            "mem_percent": memory.percent,
            "net": net,
        }


class Sampler:
    """A thread that emits one ``sample`` event every ``interval`` seconds until stopped.

    The first sample is taken at once (the baseline of the network counters, before any task
    runs) and a last one when stopped (after the tasks ended), so the samples span all the
    traffic of the node's tasks.
    """

    def __init__(self, interval: float, task_pids: PidSource, emit: Emit):
        self.interval, self.task_pids, self.emit = interval, task_pids, emit
        self.sampler = TreeSampler()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one sample at a time: the last one runs in stop()
        self._thread = threading.Thread(target=self._loop, name="tflaunch-sampler", daemon=True)
        self.cpu_seconds = 0.0  # this thread's own CPU time, for the sampling-cost benchmark

    @classmethod
    def from_supervision(
        cls, supervision: Supervision, task_pids: PidSource, emit: Emit, hosts: int = 1
    ) -> Sampler | None:
        """A started sampler at the plan's ``sample_interval``, slowed for clusters of many
        ``hosts`` (:func:`cluster_sample_interval`); None when that is 0 (off)."""
        interval = cluster_sample_interval(supervision.sample_interval, hosts)
        if interval <= 0:
            return None
        sampler = cls(interval, task_pids, emit)
        sampler.start()
        return sampler

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        started = time.thread_time()
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            self.cpu_seconds = time.thread_time() - started
            next_at += self.interval
            # On a busy node a sample may run late: skip ahead instead of catching up in a burst.
            next_at = max(next_at, time.monotonic())
            self._stop.wait(next_at - time.monotonic())

    def sample_once(self) -> None:
        with self._lock:
            try:
                self.emit(protocol.Sample(self.sampler.sample(dict(self.task_pids()))))
            except (psutil.Error, OSError) as err:
                # Monitoring must never take the cluster down: report what broke and go on.
                self.emit(protocol.SampleError(message=f"{type(err).__name__}: {err}"))

    def stop(self, final: bool = True) -> None:
        """Stop the thread (bounded wait) and take the last sample."""
        self._stop.set()
        self._thread.join(timeout=max(5.0, 2 * self.interval))
        if final:
            self.sample_once()


# ---- storing and reading samples --------------------------------------------------------------


# Samples the coordinator takes in per second at most, from all agents together. Measured with
# benchmarks/coordinator_scale.py at 4,096 agents: 4,096 a second (1 Hz each) outran it (events
# queued up to 1.2 GB, a failure took 19 s to stop every agent); 512 a second cost it 14 % of a
# core and left the stop at 0.7 s.
MAX_SAMPLES_PER_SECOND = 512


def cluster_sample_interval(interval: float, hosts: int) -> float:
    """Each agent's sampling interval: ``supervision.sample_interval``, or longer when the
    cluster has more than MAX_SAMPLES_PER_SECOND hosts (4,096 hosts: every 8 s), so that the
    coordinator's load, and the samples files, stay bounded however many nodes there are."""
    if interval <= 0:
        return 0.0
    return max(interval, hosts / MAX_SAMPLES_PER_SECOND)


class SampleLog:
    """The coordinator's writer: ``sample`` events to ``samples-<host>.jsonl`` in the run dir."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self._files: dict[str, IO[str]] = {}

    def write(self, host: str, event: Mapping[str, Any]) -> None:
        out = self._files.get(host)
        if out is None:
            out = self._files[host] = open_run_file(samples_path(self.run_dir, host), "a")
        record = {
            "time": event.get("time"),
            "host": host,
            "node": event.get("node", {}),
            "tasks": event.get("tasks", {}),
        }
        out.write(json.dumps(record, separators=(",", ":")) + "\n")
        out.flush()

    def close(self) -> None:
        for out in self._files.values():
            out.close()
        self._files.clear()


def _records(path: Path) -> Iterator[dict[str, Any]]:
    """A samples file's samples (those with a time); nothing from one that is not a regular
    file of the run directory (a planted FIFO or link)."""
    try:
        for record in json_lines(path):
            if isinstance(record.get("time"), int | float):
                yield record
    except RunFileError:
        return


def read_samples(run_dir: str | os.PathLike) -> dict[str, list[dict[str, Any]]]:
    """Every host's samples, in time order."""
    hosts: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(Path(run_dir).glob(f"{SAMPLES_PREFIX}*.jsonl")):
        for record in _records(path):
            host = record.get("host")
            host = host if isinstance(host, str) else path.stem[len(SAMPLES_PREFIX) :]
            hosts.setdefault(host, []).append(record)
    for records in hosts.values():
        records.sort(key=lambda r: r.get("time") or 0.0)
    return hosts


def latest_samples(run_dir: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """The last sample of every host, read from the end of each file (they grow all run long)."""
    latest = {}
    for path in Path(run_dir).glob(f"{SAMPLES_PREFIX}*.jsonl"):
        record = _last_record(path)
        if record is not None:
            latest[record.get("host", path.stem[len(SAMPLES_PREFIX) :])] = record
    return latest


def _last_record(path: Path, chunk: int = 65536) -> dict[str, Any] | None:
    try:
        f = open_for_reading(path)
    except OSError:
        return None
    with f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - chunk))
        lines = f.read().splitlines()
    return next(json_objects(reversed(lines)), None)


# ---- live usage for `tflaunch status` ---------------------------------------------------------


def is_task_process(pid: int, task_name: str, planned_env: Mapping[str, str]) -> bool:
    """Whether ``pid`` on this machine is that task (not a pid of another node, nor a reused one):
    its environment names the task and holds the planned TF_CONFIG and cluster file."""
    try:
        env = psutil.Process(pid).environ()
    except (psutil.Error, OSError):
        return False
    return env.get("TFLAUNCH_TASK") == task_name and all(
        env.get(key) == planned_env.get(key) for key in ("TF_CONFIG", "TFLAUNCH_CLUSTER_FILE")
    )


def live_usage(pids: Mapping[str, int], window: float = 0.3) -> dict[str, dict[str, Any]]:
    """CPU % over ``window`` seconds, RSS and threads of the given tasks (with their children)."""
    sampler = TreeSampler()
    sampler.sample(pids)
    time.sleep(window)
    return sampler.sample(pids)["tasks"]
