"""tflaunch's trace hook, loaded by Python's ``site`` at the start of every Python process of a
traced task (``tflaunch up --trace`` puts this folder first on the task's ``PYTHONPATH``).

It first runs the ``sitecustomize`` that this one hides, if any (a virtualenv's, a
distribution's). Then, inside a traced task (``TFLAUNCH_TRACE_DIR`` and ``TFLAUNCH_TASK`` set),
it notes that the task runs Python and installs an import hook: once ``tensorflow`` has finished
importing, the hook starts TensorFlow's profiler server on the task's cluster port plus
``TFLAUNCH_TRACE_PORT_OFFSET`` and notes the port, for the launcher's capture. It never imports
TensorFlow itself, and only the standard library: a process that never imports TensorFlow pays
for reading a few variables, one small file and one string comparison per new module imported.

Notes are files in ``$TFLAUNCH_TRACE_DIR/tasks/``: ``<task>.python`` (a Python process started)
and ``<task>.tf`` (JSON: pid, port, time, or the error that kept the server from starting).
A process that exits while a capture is on waits for the window's end (``window.json``) first.
One process per task starts the server: its children inherit ``TFLAUNCH_PROFILER_PID`` and leave
the port to it.

That process also gets tflaunch's fix for a crash in TensorFlow's profiler (``profiler_fix.cc``, a
patch of a third-party bug: ``TraceMeRecorder::Consume`` keeps pointers into ``std::deque`` s
that its vector's growth copies and frees, since libstdc++'s deque move is not ``noexcept``;
SIGSEGV or SIGABRT in about one capture of three of a Keras ``fit`` under
MultiWorkerMirroredStrategy; README.md in this folder has the story and the guard). Just before
TensorFlow loads, the hook builds the fix with the machine's C++ compiler, once per machine and TensorFlow
(checked against the installed TensorFlow's own header, cached in ``~/.cache/tflaunch``), and
loads it ahead of TensorFlow. The ``.tf`` note says what came of it (``profiler_fix``);
``TFLAUNCH_PROFILER_FIX=0`` leaves it out.

This module imports only the standard library and nothing of tflaunch (checked: pyproject.toml's
import contract, scripts/hook_imports.py); the launcher's side is ``tflaunch.trace``.
"""

from __future__ import annotations

import os
import sys

# json and time are imported where used: a process that never imports TensorFlow should pay for
# nothing it does not need (json alone costs milliseconds to import).

_HERE = os.path.dirname(os.path.abspath(__file__))
PID_ENV = "TFLAUNCH_PROFILER_PID"
WINDOW_FILE = "window.json"  # written by the launcher when its capture starts: {"end": unix time}
WINDOW_MARGIN_S = 3.0  # for the server to hand its events over
MAX_WAIT_S = 120.0
FIX_ENV = "TFLAUNCH_PROFILER_FIX"  # "0": do not load the profiler fix
FIX_SOURCE = os.path.join(_HERE, "profiler_fix.cc")
FIX_LOADED = "loaded"
# TensorFlow's header the fix's layouts are checked against, under the package's include/.
FIX_HEADER = "xla/tsl/profiler/backends/cpu/traceme_recorder.h"
BUILD_TIMEOUT_S = 300.0
_fix_status = "not loaded: TensorFlow was imported before the trace hook"


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path, as if this one were not there."""
    ours = sys.modules.get("sitecustomize")
    try:
        from importlib.machinery import PathFinder

        path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
        spec = PathFinder.find_spec("sitecustomize", path)
        if spec is None or spec.loader is None:
            return
        from importlib.util import module_from_spec

        module = module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as exc:  # as site.py does: a broken sitecustomize is reported, not fatal
        sys.stderr.write(f"Error in sitecustomize (run by tflaunch's trace hook): {exc!r}\n")
    finally:
        if ours is not None:
            sys.modules["sitecustomize"] = ours


def _note(name: str, text: str) -> None:
    folder = os.path.join(os.path.expanduser(os.environ["TFLAUNCH_TRACE_DIR"]), "tasks")
    task = os.environ["TFLAUNCH_TASK"].replace(":", "-")
    try:
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{task}.{name}.{os.getpid()}")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(folder, f"{task}.{name}"))
    except OSError:
        pass  # tracing must never break the program


def _profiler_port() -> int | None:
    """The task's cluster port plus the offset, from the cluster file every task gets."""
    import json

    job, _, index = os.environ["TFLAUNCH_TASK"].partition(":")
    try:
        with open(os.environ["TFLAUNCH_CLUSTER_FILE"]) as f:
            address = json.load(f)["cluster"][job][int(index)]
        port = int(address.rpartition(":")[2])
        offset = int(os.environ.get("TFLAUNCH_TRACE_PORT_OFFSET") or 10000)
    except (KeyError, IndexError, ValueError, OSError):
        return None  # no port of its own (an evaluator): nothing to listen on
    return port + offset if port + offset <= 65535 else port - offset


def _start_profiler(tf) -> None:
    import json
    import time

    if os.environ.get(PID_ENV):
        return  # a parent process of this task has the task's profiler port
    port = _profiler_port()
    if port is None:
        _note("tf", json.dumps({"pid": os.getpid(), "error": "the task has no cluster port"}))
        return
    os.environ[PID_ENV] = str(os.getpid())
    try:
        tf.profiler.experimental.server.start(port)
    except Exception as exc:
        _note("tf", json.dumps({"pid": os.getpid(), "port": port, "error": repr(exc)}))
        return
    note = {"pid": os.getpid(), "port": port, "time": time.time(), "profiler_fix": _fix_status}
    _note("tf", json.dumps(note))
    import threading

    try:  # called at shutdown before any atexit handler (TensorFlow's tear its runtime down)
        threading._register_atexit(_outlast_window)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        import atexit

        atexit.register(_outlast_window)


def _outlast_window() -> None:
    """A task that ends while the launcher's capture is on keeps its profiler server until the
    window closes: its events reach the trace, and the process does not exit under a profiler
    session that is still collecting (seen to crash the process)."""
    import json
    import time

    path = os.path.join(os.path.expanduser(os.environ["TFLAUNCH_TRACE_DIR"]), WINDOW_FILE)
    try:
        with open(path) as f:
            end = float(json.load(f)["end"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    wait = end + WINDOW_MARGIN_S - time.time()
    if wait > 0:
        time.sleep(min(wait, MAX_WAIT_S))


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(base, "tflaunch")
    try:
        os.makedirs(folder, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
    except OSError:
        pass
    folder = os.path.join(os.path.expanduser(os.environ["TFLAUNCH_TRACE_DIR"]), "profiler_fix")
    os.makedirs(folder, exist_ok=True)
    return folder


def _build_fix(cxx: str, include: str, path: str) -> str:
    """Check the fix's layouts against TensorFlow's header, then build it; '' or why not."""
    import subprocess

    tmp = f"{path}.{os.getpid()}.tmp"
    common = [cxx, "-std=c++17", "-w", "-O2"]
    steps = (
        ("its layouts differ from TensorFlow's", ["-fsyntax-only", "-DTFLAUNCH_CHECK_LAYOUT"]),
        ("it did not build", ["-shared", "-fPIC", "-fvisibility=hidden", "-o", tmp]),
    )
    for why, args in steps:
        argv = [*common, *args, f"-I{include}", FIX_SOURCE]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"not built: {cxx}: {exc}"
        if done.returncode != 0:
            lines = [x for x in done.stderr.splitlines() if "error" in x] or [""]
            return f"not built: {why} ({lines[0].strip()[:200]})"
    os.replace(tmp, path)
    return ""


def _load_profiler_fix(origin: str | None) -> str:
    """Build (once, cached) and load the fix for TensorFlow's profiler, ahead of TensorFlow's own
    libraries, so that its one function takes the place of theirs; says what came of it."""
    if os.environ.get(FIX_ENV) == "0":
        return f"off ({FIX_ENV}=0)"
    if not sys.platform.startswith("linux"):
        return "not needed (the crash is libstdc++'s, on Linux)"
    if not origin:
        return "not loaded: TensorFlow's package has no location"
    import shutil

    include = os.path.join(os.path.dirname(origin), "include")
    try:
        with open(FIX_SOURCE, "rb") as f:
            source = f.read()
        with open(os.path.join(include, FIX_HEADER), "rb") as f:
            header = f.read()
    except OSError:
        return "not built: the installed TensorFlow has no C++ headers to check it against"
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        return "not built: no C++ compiler (g++) on this host"
    import ctypes
    import hashlib

    key = hashlib.sha256(source + header + cxx.encode()).hexdigest()[:16]
    path = os.path.join(_cache_dir(), f"profiler_fix-{key}.so")
    failed = path + ".failed"
    try:
        if not os.path.exists(path) and not os.path.exists(failed):
            import fcntl

            with open(path + ".lock", "w") as lock:  # one build per host: the others wait
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not os.path.exists(path) and not os.path.exists(failed):
                    why = _build_fix(cxx, include, path)
                    if why:
                        with open(failed, "w") as f:
                            f.write(why)
        if os.path.exists(failed):
            with open(failed) as f:
                return f.read()
        ctypes.CDLL(path, mode=os.RTLD_GLOBAL | os.RTLD_NOW)
    except OSError as exc:
        return f"not loaded: {exc}"
    return FIX_LOADED


class _Loader:
    """The real loader of ``tensorflow``; starts the profiler once the module is complete."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        global _fix_status
        spec = module.__spec__
        if not os.environ.get(PID_ENV):  # the process that will start the task's profiler
            try:
                _fix_status = _load_profiler_fix(getattr(spec, "origin", None))
            except Exception as exc:  # tracing must never break the program
                _fix_status = f"not loaded: {exc!r}"
        try:
            self._loader.exec_module(module)
        finally:
            module.__loader__ = self._loader
            if spec is not None:
                spec.loader = self._loader
        _start_profiler(module)


class _Finder:
    """On ``sys.meta_path``: answers only for ``tensorflow``, once, with the real spec."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        from importlib.util import find_spec

        spec = find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def _install() -> None:
    if not (os.environ.get("TFLAUNCH_TRACE_DIR") and os.environ.get("TFLAUNCH_TASK")):
        return
    if not os.environ.get(PID_ENV):
        _note("python", str(os.getpid()))
    if "tensorflow" in sys.modules:
        _start_profiler(sys.modules["tensorflow"])
    else:
        sys.meta_path.insert(0, _Finder())


_chain()
_install()
