"""The protocol between agents and their coordinator, and the records of ``events.jsonl``: the one
place where event and command names are spelled.

On the wire every message is one JSON object a line. An agent sends events,
``{"event": NAME, ...}``; the coordinator sends commands, ``{"cmd": NAME, ...}``. Links carry that
wire form (:mod:`tflaunch.runtime.link`); each side turns it into the typed messages below with
:func:`event_of` and :func:`command_of`, and back with ``wire()``. The coordinator records what
happened in ``events.jsonl`` as events too — the agents' (with the host they came from) and its
own (:class:`ClusterReady`, :class:`Restarting`, ...) — and ``status``, ``report``, ``logs`` and
``down`` read them back through :func:`record_of`.

``wire()`` writes ``NAME`` first and then every field in the order the class declares it, leaving
out fields that are ``None``: the bytes of ``events.jsonl`` depend on that order.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

EVENT_KEY = "event"
COMMAND_KEY = "cmd"
MAX_ITEMS = 100_000  # items of one list or mapping field of a message


class ProtocolError(ValueError):
    """A message of a known kind whose field is not what its class declares: its sender is
    not following this protocol (a broken or hostile peer). Its text names the field."""


def _check(value: Any, kind: Any, where: str) -> None:
    """``value`` has the type ``kind`` (a field's annotation): str, int (not bool), float
    (finite; an int is one), bool, ``list[X]``, ``dict[str, X]``, ``Any``, ``X | None``."""
    if kind is Any:
        return
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return
        for option in (a for a in args if a is not type(None)):
            _check(value, option, where)
        return
    if origin in (list, dict):
        if not isinstance(value, origin):
            raise ProtocolError(
                f"{where}: expected a {origin.__name__}, got {type(value).__name__}"
            )
        if len(value) > MAX_ITEMS:
            raise ProtocolError(f"{where}: {len(value)} items; at most {MAX_ITEMS}")
        if origin is list:
            for i, item in enumerate(value):
                _check(item, args[0], f"{where}[{i}]")
        else:
            for key, item in value.items():
                _check(key, args[0], f"{where} key")
                _check(item, args[1], f"{where}.{key}")
        return
    ok = {
        str: isinstance(value, str),
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value),
    }.get(kind, True)
    if not ok:
        raise ProtocolError(f"{where}: expected {kind.__name__}, got {value!r:.60}")


@dataclass(frozen=True)
class Message:
    """One message: a JSON object whose ``KEY`` names its kind (``NAME``)."""

    KEY: ClassVar[str]
    NAME: ClassVar[str]

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {self.KEY: self.NAME}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value
        return out

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Message:
        """The message from a wire object of its kind; missing fields take their defaults and
        unknown keys (``time``, ``host`` added on the way) are left out. A field of the wrong
        type (a string for a number, a list of objects for a list of names, NaN) raises
        :class:`ProtocolError` naming it: every peer's message is checked as strictly as the
        cluster file."""
        hints = _hints(cls)
        values = {}
        for f in dataclasses.fields(cls):
            if f.name in data:
                _check(data[f.name], hints[f.name], f"{cls.NAME}.{f.name}")
                values[f.name] = data[f.name]
        return cls(**values)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


class Event(Message):
    KEY = EVENT_KEY
    RECORDED: ClassVar[bool] = False


class Command(Message):
    KEY = COMMAND_KEY


_EVENTS: dict[str, type[Event]] = {}
_COMMANDS: dict[str, type[Command]] = {}


@typing.dataclass_transform(frozen_default=True)
def _event(name: str, recorded: bool = False):
    """Make an event class a frozen dataclass registered under ``name``; ``recorded``: the
    coordinator keeps the agents' events of this kind in events.jsonl."""

    def register(cls):
        cls.NAME, cls.RECORDED = name, recorded
        _EVENTS[name] = cls = dataclass(frozen=True)(cls)
        return cls

    return register


@typing.dataclass_transform(frozen_default=True)
def _command(name: str):
    """Make a command class a frozen dataclass registered under ``name``."""

    def register(cls):
        cls.NAME = name
        _COMMANDS[name] = cls = dataclass(frozen=True)(cls)
        return cls

    return register


# ---- agent → coordinator --------------------------------------------------------------------


@_event("agent_started", recorded=True)
class AgentStarted(Event):
    pid: int | None = None
    tasks: list[str] = field(default_factory=list)


@_event("started", recorded=True)
class Started(Event):
    """A task's process started (again: ``restarts`` in place, ``generation`` cluster restarts)."""

    task: str = ""
    pid: int | None = None
    log: str | None = None
    restarts: int = 0
    generation: int = 0
    cpus: list[int] | None = None
    executable: str | None = None  # where the program was found on the host (failure reports)


@_event("ready", recorded=True)
class Ready(Event):
    """A PS accepts connections."""

    task: str = ""


@_event("waiting", recorded=True)
class Waiting(Event):
    what: str = ""
    tasks: list[str] = field(default_factory=list)


@_event("exited", recorded=True)
class Exited(Event):
    """A task's process ended; ``stopped_by`` says why when its agent stopped it."""

    task: str = ""
    code: int = 1
    stopped_by: str | None = None


@_event("error", recorded=True)
class AgentError(Event):
    """The agent cannot run its tasks (pre-flight, readiness timeout): the run fails."""

    code: int = 1
    message: str = ""


@_event("stopping", recorded=True)
class Stopping(Event):
    tasks: list[str] = field(default_factory=list)
    reason: str = ""


@_event("agent_exit", recorded=True)
class AgentExit(Event):
    reason: str = ""


@_event("host_started", recorded=True)
class HostStarted(Event):
    """Every task of the host started."""


@_event("stalled", recorded=True)
class Stalled(Event):
    task: str = ""
    what: str = ""


@_event("tasks_stopped", recorded=True)
class TasksStopped(Event):
    """Every task of the host stopped, for a cluster restart."""


@_event("signal_passed_on", recorded=True)
class SignalPassedOn(Event):
    signal: str = ""
    tasks: list[str] = field(default_factory=list)


@_event("old_tasks_stopped", recorded=True)
class OldTasksStopped(Event):
    """A lost host's new agent found ``tasks`` of the run still running there, left by the old
    agent, and stopped them before starting its own."""

    tasks: list[str] = field(default_factory=list)


@_event("strays_killed")
class StraysKilled(Event):
    count: int = 0


@_event("output")
class Output(Event):
    """One line a task printed (or an agent, as ``agent@HOST``)."""

    task: str = ""
    line: str = ""


@_event("sample")
class Sample(Event):
    """Resource usage of the node and its tasks; its fields are the sampler's own."""

    data: dict[str, Any] = field(default_factory=dict)

    def wire(self) -> dict[str, Any]:
        return {self.KEY: self.NAME, **self.data}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Sample:
        return cls({k: v for k, v in data.items() if k != cls.KEY})


@_event("sample_error")
class SampleError(Event):
    message: str = ""


@_event("trace_note")
class TraceNote(Event):
    """``up --trace``: a note the trace hook left in the host's trace directory ``dir`` (its
    file ``name``, e.g. ``worker-1.tf``, and text), so the coordinator sees every host's notes
    without reaching their disks (:mod:`tflaunch.trace.links`)."""

    name: str = ""
    text: str = ""
    dir: str = ""


@_event("trace_file")
class TraceFile(Event):
    """``up --trace``: a piece of a file of the host's trace directory (a task's raw profile),
    ``path`` relative to it, ``data`` base64 from byte ``offset`` of ``size``."""

    path: str = ""
    offset: int = 0
    size: int = 0
    data: str = ""


@_event("trace_sent", recorded=True)
class TraceSent(Event):
    """``up --trace``: the host sent its trace directory's files (``files``: relative paths)
    to the coordinator, ``bytes`` in all, or says why not (``error``)."""

    files: list[str] = field(default_factory=list)
    bytes: int = 0
    error: str | None = None


# ---- from the links themselves --------------------------------------------------------------


@_event("link_closed", recorded=True)
class LinkClosed(Event):
    """The agent's stream ended (the last event of every link)."""


@_event("host_lost")
class HostLost(Event):
    """A host stopped answering (an SSH link's probe); recorded by the coordinator with its host."""

    host: str | None = None
    message: str = ""


@_event("instance_replaced", recorded=True)
class InstanceReplaced(Event):
    """A provisioned host's instance was gone and a new one took its place (``ssh.provision``);
    the new agent's link reports it before the agent's own first event."""

    old: str = ""
    new: str = ""


# ---- the coordinator's own ------------------------------------------------------------------


@_event("host_back")
class HostBack(Event):
    """A lost host answers again with a new agent (``seconds`` after it was lost)."""

    host: str | None = None
    seconds: float | None = None


@_event("host_gone")
class HostGone(Event):
    """A lost host stayed silent until its deadline."""

    message: str = ""


@_event("coordinator_started")
class CoordinatorStarted(Event):
    hosts: list[str] = field(default_factory=list)


@_event("cluster_ready")
class ClusterReady(Event):
    seconds: float = 0.0


@_event("running_again")
class RunningAgain(Event):
    task: str = ""
    seconds: float = 0.0


@_event("restarting")
class Restarting(Event):
    """A task is restarted in place after ``delay`` seconds."""

    task: str = ""
    cause: str = ""
    code: int | None = None
    restart: int = 0
    delay: float = 0.0


@_event("cluster_restarting")
class ClusterRestarting(Event):
    """Every task is restarted: after a task's failure (``task``), or a host lost (``host``)."""

    task: str | None = None
    cause: str = ""
    code: int | None = None
    host: str | None = None
    restart: int | None = None
    delay: float = 0.0
    generation: int = 0


@_event("requeue_scheduled")
class RequeueScheduled(Event):
    signal: str = ""
    after: float = 0.0


@_event("requeueing")
class Requeueing(Event):
    signal: str = ""


@_event("stopping_cluster")
class StoppingCluster(Event):
    pass


@_event("failed")
class Failed(Event):
    task: str | None = None
    code: int = 1
    message: str | None = None


# ---- coordinator → agent --------------------------------------------------------------------


@_command("stop")
class Stop(Command):
    """Stop every task and end the agent."""

    reason: str | None = None


@_command("ping")
class Ping(Command):
    """A sign of life: an agent that hears nothing for its heartbeat timeout stops."""


@_command("restart")
class Restart(Command):
    """Start one exited task again in place."""

    task: str = ""


@_command("stop_tasks")
class StopTasks(Command):
    """Stop every task of the host, answer ``tasks_stopped``, and stay up."""

    reason: str | None = None


@_command("start_tasks")
class StartTasks(Command):
    """Start every task of the host again, as cluster restart ``generation``."""

    generation: int | None = None


@_command("pass_on")
class PassOn(Command):
    """Send ``signal`` (SIGUSR1 or SIGUSR2) to every task."""

    signal: str = ""


@_command("start")
class Start(Command):
    """Begin: sent once to an agent that joined over the rendezvous (Slurm's other nodes), and
    to a lost host's new agent (started with ``--await-start``), which then counts its tasks'
    earlier starts in the run: ``restarts`` by task, ``generation`` cluster restarts."""

    restarts: dict[str, int] | None = None
    generation: int | None = None


@_command("trace_window")
class TraceWindow(Command):
    """``up --trace``: the capture window (unix times): write it where the host's trace hooks
    read it, so a task that ends inside it waits for its end."""

    start: float = 0.0
    end: float = 0.0


@_command("trace_collect")
class TraceCollect(Command):
    """``up --trace``: at its end, send the files of the host's trace directory to the
    coordinator (:class:`TraceFile`, then :class:`TraceSent`), unless that directory is ``to``
    (the coordinator's own: the same file system)."""

    to: str = ""


# ---- reading ---------------------------------------------------------------------------------


def event_of(data: Any) -> Event | None:
    """The typed event of a wire object, or None (not an object, an unknown name); a known
    event with a malformed field raises :class:`ProtocolError`."""
    if not isinstance(data, dict):
        return None
    cls = _EVENTS.get(data.get(EVENT_KEY))  # type: ignore[arg-type]
    return cls.from_wire(data) if cls else None  # type: ignore[return-value]


def command_of(data: Any) -> Command | None:
    """The typed command of a wire object, or None (not an object, an unknown name); a known
    command with a malformed field raises :class:`ProtocolError`."""
    if not isinstance(data, dict):
        return None
    cls = _COMMANDS.get(data.get(COMMAND_KEY))  # type: ignore[arg-type]
    return cls.from_wire(data) if cls else None  # type: ignore[return-value]


def is_command(data: Any) -> bool:
    """Whether ``data`` has the shape of a command (an object naming its kind), known or not."""
    return isinstance(data, dict) and isinstance(data.get(COMMAND_KEY), str)


def kind_of(data: dict[str, Any]) -> str:
    """The name of a recorded event's kind, known or not (to show it)."""
    return str(data.get(EVENT_KEY, ""))


def details_of(data: dict[str, Any]) -> dict[str, Any]:
    """A recorded event's fields, without its kind (to show them)."""
    return {k: v for k, v in data.items() if k != EVENT_KEY}


def is_output(data: dict[str, Any]) -> bool:
    """Whether a wire event is a line of output (cheap: read on every line a task prints)."""
    return data.get(EVENT_KEY) == Output.NAME


class Record(NamedTuple):
    """One line of events.jsonl: when, from which host (if any), what."""

    time: float | None
    host: str | None
    event: Event


def record_of(data: Any) -> Record | None:
    """A line of events.jsonl as a :class:`Record`, or None (not an event of this protocol,
    or a malformed one: a run file is untrusted too, and one bad line hides only itself)."""
    try:
        event = event_of(data)
    except ProtocolError:
        return None
    if event is None:
        return None
    when, host = data.get("time"), data.get("host")
    when = when if isinstance(when, int | float) and not isinstance(when, bool) else None
    return Record(when, host if isinstance(host, str) else None, event)


def records(lines: Iterable[Any]) -> Iterator[Record]:
    """The known events of ``lines`` (parsed events.jsonl objects), in order."""
    for data in lines:
        record = record_of(data)
        if record is not None:
            yield record


def recorded(event: Event) -> bool:
    """Whether the coordinator keeps an agent's event of this kind in events.jsonl."""
    return bool(getattr(event, "RECORDED", False))


EVENT_NAMES = frozenset(_EVENTS)
COMMAND_NAMES = frozenset(_COMMANDS)
