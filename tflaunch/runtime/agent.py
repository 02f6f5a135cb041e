"""The agent: one per node. Starts that node's tasks, watches them, tears them down.

It starts the node's PS first, waits until every PS of the whole cluster is ready (readiness,
never a fixed sleep: :mod:`tflaunch.runtime.readiness`), then starts the node's chief, workers
and evaluator.
Each task's output is teed raw to its log file and reported upstream line by line. Upstream is a
stream of JSON lines (:mod:`tflaunch.runtime.protocol`): events out (a task started, ready,
exited, a line of its output, an error, ...), commands in (stop, ping, restart one task, stop or
start every task, pass a signal on). Told to
stop, signalled, or losing its launcher (input closed, or no heartbeat within the timeout), it tears every
task down: SIGTERM to the task's process group, the grace period, then SIGKILL.

Restarts are the coordinator's decision; the agent carries them out. :class:`~protocol.Restart`
starts one exited task again in place (same argv, TF_CONFIG, port and GPUs;
``$TFLAUNCH_TASK_RESTARTS`` counts); :class:`~protocol.StopTasks` stops every task of the node
(:class:`~protocol.TasksStopped` when all are gone) and :class:`~protocol.StartTasks` starts them
again in the usual order, for a whole-cluster restart
(``$TFLAUNCH_CLUSTER_RESTARTS`` counts). A lost host's new agent (``--await-start``) starts its
tasks only when told :class:`~protocol.Start`, which carries both counts so far in the run, and
first stops what the old agent left running of them on the host. With any restart policy on, the
agent stays up after its tasks ended, until told to stop. With ``supervision.stall_timeout``, a watched task (the chief and
workers; only the chief with ``success: chief``) that shows no progress that long is stopped and
its exit reported as stalled. SIGUSR1/SIGUSR2 (Slurm's ``--signal`` ahead of the time limit),
received or passed on by the coordinator, go to every task's process group; nothing is stopped.

Started as ``python -m tflaunch.launchers.agent`` (:mod:`tflaunch.launchers.agent`, which hands
it its host's side of ``up --trace``), or through :func:`serve` by a backend's own node process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from tflaunch.cluster.config import LEGACY_KERAS_ENV
from tflaunch.cluster.placement import on_this_host
from tflaunch.cluster.plan import Plan, Task, TaskView
from tflaunch.cluster.render import render_task
from tflaunch.runtime import procs, programcheck, protocol
from tflaunch.runtime.diagnose import program_path
from tflaunch.runtime.link import read_lines
from tflaunch.runtime.monitor import Sampler
from tflaunch.runtime.readiness import wait_for_ps
from tflaunch.runtime.restart import STALLED
from tflaunch.runtime.run import write_cluster_file
from tflaunch.runtime.runfiles import make_run_dir, open_run_file
from tflaunch.runtime.stall import StallWatch
from tflaunch.runtime.tracing import HostTraceMaker

Emit = Callable[[protocol.Event], None]
START_ORDER = (("ps",), ("chief", "worker", "evaluator"))
TASK_VARIABLE = "TFLAUNCH_TASK"  # the task's name, in its environment (render_task)
MAX_COMMAND = 64 * 1024  # characters of one command line
SHIP_DRAIN_S = 120.0  # seconds the link gets to carry the trace files sent at the end


class TaskProcess:
    """One running task: its process group, the thread copying its output, its exit."""

    def __init__(
        self,
        task: Task,
        proc: subprocess.Popen,
        log: IO[bytes],
        emit: Emit,
        on_output: Callable[[str, str], None] | None = None,
    ):
        self.task, self.proc, self.log, self.emit = task, proc, log, emit
        self.on_output = on_output
        self.returncode: int | None = None
        self.stop_reason: str | None = None  # set when the agent stops it (teardown, stall)
        self.done = threading.Event()
        self._reader = threading.Thread(target=self._copy_output, daemon=True)
        self._reader.start()
        threading.Thread(target=self._wait, daemon=True).start()

    def _copy_output(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            self.log.write(raw)
            self.log.flush()
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if self.on_output:
                self.on_output(self.task.name, line)
            self.emit(protocol.Output(task=self.task.name, line=line))

    def _wait(self) -> None:
        returncode = self.proc.wait()
        # Children of the task die with it: nothing of its group outlives the leader.
        procs.signal_group(self.proc.pid, signal.SIGKILL)
        self._reader.join(timeout=2)
        self.log.close()
        self.returncode = procs.exit_code(returncode)
        self.emit(
            protocol.Exited(
                task=self.task.name, code=self.returncode, stopped_by=self.stop_reason or None
            )
        )
        self.done.set()

    def stop(self, reason: str, grace: float) -> threading.Thread:
        """Stop the task's group (SIGTERM, ``grace``, SIGKILL) from a thread of its own."""
        self.stop_reason = self.stop_reason or reason
        thread = threading.Thread(target=procs.terminate_group, args=(self.proc, grace))
        thread.start()
        return thread


def _resolved(view: TaskView) -> TaskView:
    """The view with its workdir made absolute here: an SSH host's plan keeps the workdir as the
    cluster file wrote it (``~/...`` or relative), which means the remote home, where sshd starts
    the agent."""
    return dataclasses.replace(view, workdir=os.path.abspath(os.path.expanduser(view.workdir)))


class Agent:
    """Runs the tasks of one host of a plan."""

    def __init__(
        self,
        plan: Plan,
        host: str,
        run_dir: str | os.PathLike,
        emit: Callable[[dict[str, Any]], None],
        reap_strays: bool = False,
        await_start: bool = False,
        generation: int = 0,
        trace: HostTraceMaker | None = None,
    ):
        plan = on_this_host(plan)  # an SSH host's checkpoint directory: ~ and relative here
        self.plan, self.host, self.run_dir = plan, host, Path(run_dir)
        # With the agent a subreaper, what escaped a task's group is below the agent: kill it.
        self.reap_strays = reap_strays
        self.tasks = plan.tasks_on(host)
        self.views = {t.name: _resolved(render_task(plan, t, self.run_dir)) for t in self.tasks}
        self._emit_wire = emit  # events on the wire: JSON objects
        self.running: dict[str, TaskProcess] = {}
        self.stopping = threading.Event()
        self.stop_reason = ""
        sup = plan.supervision
        self.grace = sup.grace_period
        self.commands: queue.Queue[protocol.Command] = queue.Queue()
        self.restarts: dict[str, int] = {}
        self.generation = generation  # whole-cluster restarts so far in the run
        self.stays_up = sup.restart.enabled
        # Workers serve silently where the chief's exit decides (ParameterServerStrategy):
        # their silence is no stall.
        chief_decides = sup.success == "chief" or (
            sup.success == "auto" and bool(plan.cluster.get("chief"))
        )
        self.watched = ("chief",) if chief_decides else ("chief", "worker")
        self.stall = StallWatch(sup.stall_timeout, sup.step_pattern)
        self._stall_lock = threading.Lock()
        # A lost host's new agent waits for its coordinator's start (with the restart counts)
        self.await_start = await_start
        self.begun = threading.Event()
        if not await_start:
            self.begun.set()
        # up --trace (handed in): the hook in the tasks, their notes and files over the link
        self.trace = trace(self.run_dir, self.emit, [t.name for t in self.tasks]) if trace else None
        self.shipped = False  # trace files were queued: the link needs time to drain

    def begin(self, restarts: dict[str, int] | None, generation: int | None) -> None:
        """Start the tasks (an agent started with ``await_start``), counting ``restarts`` of
        each task and ``generation`` cluster restarts so far in the run."""
        if self.begun.is_set():
            return
        names = {t.name for t in self.tasks}
        for name, count in (restarts or {}).items():
            if name in names and isinstance(count, int) and count >= 0:
                self.restarts[name] = count
        if isinstance(generation, int) and generation >= 0:
            self.generation = generation
        self.begun.set()

    def emit(self, event: protocol.Event) -> None:
        self._emit_wire(event.wire())

    def stop(self, reason: str) -> None:
        if not self.stopping.is_set():
            self.stop_reason = reason
            self.stopping.set()

    def run(self) -> int:
        """Start, supervise and finally tear down this host's tasks. Returns the agent's exit code."""
        self.emit(protocol.AgentStarted(pid=os.getpid(), tasks=[t.name for t in self.tasks]))
        sampler = Sampler.from_supervision(
            self.plan.supervision, self._task_pids, self.emit, hosts=len(self.plan.hosts)
        )
        try:
            while not self.begun.wait(0.1):
                if self.stopping.is_set():
                    return 0
            if self.await_start:
                self._stop_old_tasks()
            if self.tasks:
                write_cluster_file(self.plan, self.run_dir)
            problem = preflight(self.host, self.tasks, self.views)
            if problem:
                self.emit(protocol.AgentError(code=2, message=problem))
                return 2
            if not self._start_all():
                return 1
            self.emit(protocol.HostStarted())
            while not self.stopping.is_set():
                if not self._obey():
                    return 1
                self._check_stalls()
                if self.trace is not None:
                    self.trace.poll()
                if not self.stays_up and all(t.done.is_set() for t in self.running.values()):
                    break
                self.stopping.wait(0.1)
            return 0
        finally:
            self._teardown()
            if self.trace is not None:  # the tasks' last notes, and the files asked for
                self.trace.poll()
                self.shipped = self.trace.ship()
            if sampler:
                sampler.stop()  # after the teardown: the last sample holds all the traffic
            self.emit(protocol.AgentExit(reason=self.stop_reason))

    def _stop_old_tasks(self) -> None:
        """What the lost host's old agent left running of this host's tasks (it stops them only
        once its heartbeat times out): stopped now, as a teardown would, so that the new tasks
        find their ports free. Nothing is found on a new instance, or once the old agent ended."""
        marks = {procs.RUN_MARKER: str(self.run_dir.resolve())}
        names = [t.name for t in self.tasks]
        stopped = procs.stop_marked(marks, names, TASK_VARIABLE, self.grace)
        if stopped:
            self.emit(protocol.OldTasksStopped(tasks=stopped))

    def pass_on(self, signum: int) -> None:
        """Send ``signum`` (SIGUSR1/2: Slurm's warning ahead of the time limit) to every live
        task's process group, so the chief can checkpoint; nothing is stopped."""
        live = [t for t in list(self.running.values()) if not t.done.is_set()]
        for task in live:
            procs.signal_group(task.proc.pid, signum)
        self.emit(
            protocol.SignalPassedOn(
                signal=signal.Signals(signum).name, tasks=[t.task.name for t in live]
            )
        )

    def _start_all(self) -> bool:
        """PS first, then (once every PS of the cluster accepts connections) the others."""
        for jobs in START_ORDER:
            if jobs != START_ORDER[0] and not self._wait_for_ps():
                return False
            for task in self.tasks:
                if task.job in jobs and not self.stopping.is_set():
                    self._start(task)
        return True

    def _obey(self) -> bool:
        """Carry out the coordinator's restart commands; False when the tasks cannot start."""
        while not self.stopping.is_set():
            try:
                command = self.commands.get_nowait()
            except queue.Empty:
                return True
            if isinstance(command, protocol.Restart):
                current = self.running.get(command.task)
                if current is not None and current.done.is_set():
                    self.restarts[current.task.name] = self.restarts.get(current.task.name, 0) + 1
                    self._start(current.task)
            elif isinstance(command, protocol.StopTasks):
                reason = command.reason
                self._stop_tasks(str("cluster restart" if reason is None else reason))
                self.emit(protocol.TasksStopped())
            elif isinstance(command, protocol.StartTasks):
                generation = command.generation
                self.generation = int(self.generation + 1 if generation is None else generation)
                if not self._start_all():
                    return False
        return True

    def _stop_tasks(self, reason: str) -> None:
        threads = [t.stop(reason, self.grace) for t in self.running.values() if not t.done.is_set()]
        for thread in threads:
            thread.join(self.grace + 10)
        for task in self.running.values():
            task.done.wait(timeout=5)
            with self._stall_lock:
                self.stall.forget(task.task.name)

    def _observe(self, task: str, line: str) -> None:
        with self._stall_lock:
            self.stall.output(task, line, time.monotonic())

    def _check_stalls(self) -> None:
        with self._stall_lock:
            stalled = self.stall.stalled(time.monotonic())
        for name, what in stalled:
            current = self.running[name]
            if current.done.is_set():
                continue
            self.emit(protocol.Stalled(task=name, what=what))
            current.stop(STALLED, self.grace)

    def _task_pids(self) -> dict[str, int]:
        # returncode is set the moment the task is reaped, before its output is drained.
        return {
            name: t.proc.pid for name, t in list(self.running.items()) if t.proc.returncode is None
        }

    def _start(self, task: Task) -> None:
        view: TaskView = self.views[task.name]
        env = dict(os.environ)
        env.update(view.env)
        if self.trace is not None:  # up --trace: the trace hook in the task's Python
            env = self.trace.task_env(env)
        env[procs.RUN_MARKER] = str(self.run_dir.resolve())
        restarts = self.restarts.get(task.name, 0)
        env["TFLAUNCH_TASK_RESTARTS"] = str(restarts)
        env["TFLAUNCH_CLUSTER_RESTARTS"] = str(self.generation)
        log = open_run_file(self.run_dir / task.log_name, "ab")  # closed by TaskProcess
        usable = _usable_cpus()
        cpus = [usable[slot] for slot in task.cpus]
        proc = procs.spawn(view.argv, env, view.workdir, cpus=cpus)
        if task.job in self.watched:
            with self._stall_lock:
                self.stall.watch(task.name, time.monotonic())
        self.running[task.name] = TaskProcess(task, proc, log, self.emit, self._observe)
        self.emit(
            protocol.Started(
                task=task.name,
                pid=proc.pid,
                log=str(self.run_dir / task.log_name),
                restarts=restarts,
                generation=self.generation,
                cpus=cpus or None,
                executable=program_path(view.argv[0], view.workdir, _task_path(view)),
            )
        )

    def _wait_for_ps(self) -> bool:
        """Wait until every PS of the cluster accepts connections. False on timeout or stop."""
        own = {t.name for t in self.tasks if t.job == "ps"}
        return wait_for_ps(self.plan, self.host, own, self._live_pid, self.emit, self.stopping)

    def _live_pid(self, name: str) -> int | None:
        """The pid of this host's task ``name`` while it runs (None: not started, or ended)."""
        current = self.running.get(name)
        return None if current is None or current.done.is_set() else current.proc.pid

    def _teardown(self) -> None:
        live = [t for t in self.running.values() if not t.done.is_set()]
        if live:
            self.emit(protocol.Stopping(tasks=[t.task.name for t in live], reason=self.stop_reason))
        threads = [t.stop(self.stop_reason or "teardown", self.grace) for t in live]
        for thread in threads:
            thread.join(self.grace + 10)
        for task in self.running.values():
            task.done.wait(timeout=5)
        strays = procs.kill_descendants() if self.reap_strays else 0
        if strays:
            self.emit(protocol.StraysKilled(count=strays))


class LineEmitter:
    """Writes events as JSON lines to a stream from a thread of its own.

    Emitting never blocks the agent: a stalled stream (a cut SSH link whose window is full) must
    not hold up supervision or teardown. Lifecycle events always queue; output lines beyond
    ``max_pending`` waiting ones are dropped — they are in the task's log anyway — and a note
    says how many. ``close`` flushes what is queued, with a deadline.
    """

    def __init__(self, stream: IO[str], host: str, max_pending: int = 20000):
        self.stream, self.host, self.max_pending = stream, host, max_pending
        self.broken = False
        self.dropped = 0
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write_lines, daemon=True)
        self._writer.start()

    def __call__(self, event: dict[str, Any]) -> None:
        if self.broken:
            return
        if protocol.is_output(event):
            if self._queue.qsize() >= self.max_pending:
                self.dropped += 1
                return
            if self.dropped:
                note = (
                    f"[tflaunch: {self.dropped} output lines not sent upstream while the "
                    "link was slow; the task's log has them]"
                )
                self.dropped = 0
                self._put(protocol.Output(task=event.get("task"), line=note).wire())
        self._put(event)

    def _put(self, event: dict[str, Any]) -> None:
        event = {"time": round(time.time(), 3), "host": self.host, **event}
        self._queue.put(json.dumps(event) + "\n")

    def _write_lines(self) -> None:
        for line in iter(self._queue.get, None):
            if self.broken:
                continue
            try:
                self.stream.write(line)
                if self._queue.empty():
                    self.stream.flush()
            except (OSError, ValueError):
                self.broken = True
        try:
            self.stream.flush()
        except (OSError, ValueError):
            self.broken = True

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (waiting at most ``timeout`` seconds), then stop the writer."""
        self._queue.put(None)
        self._writer.join(timeout)


def listen(agent: Agent, stream: IO[str], heartbeat_timeout: float) -> None:
    """Obey commands from upstream; a closed stream or a silent launcher stops the agent.

    Only well-formed command objects count as commands; anything else (a foreign line, JSON that
    is not an object) is noted in the agent's stderr and ignored, and still counts as a sign of
    life of the link."""
    last_heard = [time.monotonic()]

    def watchdog() -> None:
        while not agent.stopping.wait(1.0):
            if heartbeat_timeout and time.monotonic() - last_heard[0] > heartbeat_timeout:
                agent.stop(f"no word from the launcher for {heartbeat_timeout:g} s")

    threading.Thread(target=watchdog, daemon=True).start()
    try:
        for line in read_lines(stream, MAX_COMMAND):
            last_heard[0] = time.monotonic()
            try:
                data = json.loads(line)
            except ValueError:
                data = None
            if not protocol.is_command(data):
                print(
                    f"tflaunch agent: ignored a line that is not a command: {line[:200]!r}",
                    file=sys.stderr,
                    flush=True,
                )
                continue
            try:
                command = protocol.command_of(data)
            except protocol.ProtocolError as e:
                print(
                    f"tflaunch agent: ignored a malformed command: {e}", file=sys.stderr, flush=True
                )
                continue
            if isinstance(command, protocol.Stop):
                reason = command.reason
                agent.stop(reason if isinstance(reason, str) else "stopped by the launcher")
            elif isinstance(command, protocol.Restart | protocol.StopTasks | protocol.StartTasks):
                agent.commands.put(command)
            elif isinstance(command, protocol.Start):
                agent.begin(command.restarts, command.generation)
            elif isinstance(command, protocol.PassOn) and command.signal in ("SIGUSR1", "SIGUSR2"):
                agent.pass_on(signal.Signals[command.signal])
            elif isinstance(command, protocol.TraceWindow) and agent.trace is not None:
                agent.trace.window(command)
            elif isinstance(command, protocol.TraceCollect) and agent.trace is not None:
                agent.trace.collect(command)
    except (OSError, ValueError):
        pass  # the stream broke: as closed
    agent.stop("the launcher's stream closed")


def serve(
    plan: Plan,
    host: str,
    run_dir: str | os.PathLike,
    commands: IO[str],
    events: IO[str],
    await_start: bool = False,
    generation: int = 0,
    trace: HostTraceMaker | None = None,
) -> int:
    """Run ``host``'s agent with its commands coming from and its events going to two streams
    (pipes, an SSH channel, a TCP connection): the one agent loop of every backend. Signals
    stop it as a ``stop`` command does. ``await_start``: a lost host's new agent, which starts
    its tasks when its coordinator says ``start``; ``generation``: the run's cluster restarts
    before this agent (a detached run started again by its watcher); ``trace``: the host's side
    of ``up --trace`` (:mod:`tflaunch.runtime.tracing`). Returns the agent's exit code."""
    make_run_dir(Path(run_dir))
    emitter = LineEmitter(events, host)
    reap = procs.become_subreaper()
    agent = Agent(
        plan, host, run_dir, emitter, reap_strays=reap, await_start=await_start,
        generation=generation, trace=trace,
    )  # fmt: skip
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: agent.stop(f"signal {signum}"))
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda signum, _frame: agent.pass_on(signum))
    heartbeat_timeout = plan.supervision.heartbeat_timeout
    threading.Thread(target=listen, args=(agent, commands, heartbeat_timeout), daemon=True).start()
    try:
        return agent.run()
    finally:
        emitter.close(SHIP_DRAIN_S if agent.shipped else 5.0)


def preflight(host: str, tasks: list[Task], views: dict[str, TaskView]) -> str | None:
    """Check what would make a task fail at once: missing workdir or program, busy ports,
    too few cores for the tasks' CPU binding."""
    slots = max((max(t.cpus) + 1 for t in tasks if t.cpus), default=0)
    usable = _usable_cpus()
    if slots > len(usable):
        return (
            f"{host} lets tasks use {len(usable)} cores, but placement.cpus_per_task "
            f"binds its {len(tasks)} tasks to {slots}. Lower cpus_per_task or place "
            "fewer tasks on the host."
        )
    for task in tasks:
        view = views[task.name]
        if not os.path.isdir(view.workdir):
            return f"{task.name}: the working directory {view.workdir} does not exist on {host}."
        program = view.argv[0]
        if not program_path(program, view.workdir, _task_path(view)):
            return (
                f"{task.name}: the program '{program}' was not found on {host} "
                f"(workdir {view.workdir}). Install it or fix program.argv."
            )
        if task.port is not None and not procs.port_free(task.port):
            holder = procs.port_holder(task.port)
            return (
                f"{task.name}: port {task.port} on {host} is already in use"
                f"{f' by {holder}' if holder else ''}. Stop that process (a leftover run? "
                "'tflaunch status' lists this runs dir's) or change ports (a local file "
                "without ports: gets free ones)."
            )
    return None


def preflight_here(plan: Plan, hosts: list[str]) -> list[str]:
    """:func:`preflight` of ``hosts``' tasks, run on this machine before anything starts (for
    hosts that are this machine: the local backend's, ``tflaunch validate``), that every
    host's cluster address resolves here, that a Python's script exists and, under
    ``program.keras: legacy``, that the tasks' Python has tf_keras
    (:mod:`~tflaunch.runtime.programcheck`). One sentence per problem."""
    addresses = (plan.host(h).cluster_address for h in hosts)
    problems = procs.unresolved(addresses, "fix hosts: or /etc/hosts")
    views = {}
    for host in hosts:
        tasks = list(plan.tasks_on(host))
        views.update({t.name: render_task(plan, t) for t in tasks})
        problem = preflight(host, tasks, {t.name: views[t.name] for t in tasks})
        if problem:
            problems.append(problem)
        scripts = (programcheck.missing_script(t.name, views[t.name], host) for t in tasks)
        problems += [s for s in scripts if s][:1]  # one task per host says it
    if plan.program.env.get(LEGACY_KERAS_ENV) == "1":  # program.keras: legacy
        keras = programcheck.missing_tf_keras(views.values())
        if keras:
            problems.append(keras)
    return problems


def _task_path(view: TaskView) -> str:
    """The PATH a task's program is looked up in (its own environment's, else the agent's)."""
    return view.env.get("PATH", os.environ.get("PATH", ""))


def _usable_cpus() -> list[int]:
    """The cores this agent may use (its affinity: a Slurm allocation's, or the whole host's)."""
    return sorted(os.sched_getaffinity(0))
