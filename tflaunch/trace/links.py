"""The agent's part in ``up --trace`` of any program: its host's trace directory, over the link.

A traced task's hook (``tflaunch/tracehook``) leaves notes in the trace directory of
its own host, ``<the agent's run directory>/trace``, and its profiler server saves what the
capture asks of it under that directory's ``raw/``. The coordinator may run where it cannot read
that disk (a detached SSH run's coordinator on the first host; an attached one on the laptop),
so the agent, which holds the link to it anyway, carries them:

- :meth:`HostTrace.poll` (the agent's loop, a few times a second) reports every new or changed
  note as a :class:`~tflaunch.runtime.protocol.TraceNote`, with the directory's path;
- :meth:`HostTrace.window` writes ``window.json`` when the coordinator opens the capture window
  (:class:`~tflaunch.runtime.protocol.TraceWindow`): a task that ends inside it waits for its end;
- told :class:`~tflaunch.runtime.protocol.TraceCollect`, :meth:`HostTrace.ship` sends, once the
  host's tasks ended, the directory's files (raw profiles; a program's own trace) as
  :class:`~tflaunch.runtime.protocol.TraceFile` pieces and a closing
  :class:`~tflaunch.runtime.protocol.TraceSent`, unless the directory is the coordinator's own.

Nothing here imports TensorFlow; an agent of an untraced run makes none of it.
"""

from __future__ import annotations

import base64
import json
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from tflaunch.runtime import protocol
from tflaunch.runtime.runfiles import open_for_reading, write_run_file
from tflaunch.trace.files import MAX_SHIP, NOTES_DIR, WINDOW_FILE, host_trace_dir, with_hook
from tflaunch.trace.request import TraceRequest

CHUNK = 256 * 1024  # bytes of one TraceFile piece (base64: a third more on the wire)
NOT_SHIPPED = frozenset({NOTES_DIR, WINDOW_FILE})  # at the directory's top


def traced(env: Mapping[str, str]) -> bool:
    return TraceRequest.from_env(env) is not None


class HostTrace:
    """One agent's trace directory and what it has told the coordinator of it."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        emit: Callable[[protocol.Event], None],
        tasks: Iterable[str],
    ):
        self.run_dir = run_dir
        self.dir = host_trace_dir(run_dir)
        self.emit = emit
        # Only the notes of this host's tasks: where the coordinator shares the directory (its
        # own host), the other hosts' notes it copied in are there too.
        self.stems = {task.replace(":", "-") for task in tasks}
        self._seen: dict[str, tuple[int, int]] = {}  # note file -> (mtime_ns, size) reported
        self.collect_to: str | None = None  # set by TraceCollect

    def task_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """A task's environment with the trace hook in its Python and this host's trace
        directory (:func:`~tflaunch.trace.files.with_hook`)."""
        return with_hook(env, self.run_dir)

    def poll(self) -> None:
        """Report the notes that are new or changed since the last poll."""
        folder = self.dir / NOTES_DIR
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for entry in entries:
            if entry.name.partition(".")[0] not in self.stems or not entry.is_file():
                continue
            try:
                info = entry.stat()
                key = (info.st_mtime_ns, info.st_size)
                if self._seen.get(entry.name) == key:
                    continue
                text = Path(entry.path).read_text(errors="replace")
            except OSError:
                continue
            self._seen[entry.name] = key
            self.emit(protocol.TraceNote(name=entry.name, text=text, dir=str(self.dir)))

    def window(self, command: protocol.TraceWindow) -> None:
        """``window.json`` for the host's hooks, unless one here ends as late or later (the
        coordinator's own, a file system shared with it; the capture helper's, which writes
        the window as it really started)."""
        text = json.dumps({"start": command.start, "end": command.end}) + "\n"
        try:
            if float(json.loads((self.dir / WINDOW_FILE).read_text())["end"]) >= command.end:
                return
        except (OSError, ValueError, KeyError, TypeError):
            pass
        try:
            write_run_file(self.dir / WINDOW_FILE, text)
        except OSError:
            pass  # the tasks then do not wait for the window's end; the capture still runs

    def collect(self, command: protocol.TraceCollect) -> None:
        self.collect_to = command.to

    def ship(self) -> bool:
        """Send the directory's files if the coordinator asked for them and cannot read them
        here. Whether anything was sent (the agent then gives its link time to drain)."""
        if self.collect_to is None or not self.dir.is_dir():
            return False
        if _same_dir(self.collect_to, self.dir):
            return False
        files = self._files()
        total = sum(size for _, size in files)
        if total > MAX_SHIP:
            self.emit(
                protocol.TraceSent(
                    error=f"{total} bytes of trace files under {self.dir}, more than the "
                    f"{MAX_SHIP} a host sends; they stay there"
                )
            )
            return True
        sent, count = [], 0
        for path, size in files:
            relative = path.relative_to(self.dir).as_posix()
            try:  # never through a symlink, at any folder of the path: a planted one is skipped
                with open_for_reading(path, root=self.dir) as f:
                    offset = 0
                    while True:
                        data = f.read(CHUNK)
                        if not data and offset:
                            break
                        self.emit(
                            protocol.TraceFile(
                                path=relative,
                                offset=offset,
                                size=size,
                                data=base64.b64encode(data).decode(),
                            )
                        )
                        offset += len(data)
                        if not data:
                            break
            except OSError:
                continue
            sent.append(relative)
            count += offset
        self.emit(protocol.TraceSent(files=sent, bytes=count))
        return True

    def _files(self) -> list[tuple[Path, int]]:
        out = []
        for root, dirs, names in os.walk(self.dir):
            here = Path(root)
            # hidden folders and files stay (a coordinator refuses their names)
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            if here == self.dir:
                dirs[:] = [d for d in dirs if d not in NOT_SHIPPED]
            for name in sorted(names):
                if name.startswith(".") or (here == self.dir and name in NOT_SHIPPED):
                    continue
                path = here / name
                try:
                    info = path.lstat()
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode):  # a symlink to a file of the user's is not sent
                    out.append((path, info.st_size))
        return sorted(out)


def _same_dir(other: str, mine: Path) -> bool:
    try:
        return os.path.samefile(other, mine)
    except OSError:
        return False
