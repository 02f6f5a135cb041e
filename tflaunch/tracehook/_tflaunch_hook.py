"""tflaunch's trace hook, run by ``sitecustomize.py`` beside it (the shim Python's ``site`` loads at
the start of every Python process of a traced task: ``tflaunch up --trace`` puts this folder first
on the task's ``PYTHONPATH``). Python 3.7 or newer; the shim keeps older ones out.

:func:`main` first runs the ``sitecustomize`` that the shim hides, if any (a virtualenv's, a
distribution's). Then, inside a traced task (``TFLAUNCH_TRACE_DIR`` and ``TFLAUNCH_TASK`` set),
it notes that the task runs Python and installs an import hook: once ``tensorflow`` has finished
importing, the hook starts TensorFlow's profiler server on the task's cluster port plus
``TFLAUNCH_TRACE_PORT_OFFSET`` and notes the port, for the launcher's capture. It never imports
TensorFlow itself, and only the standard library: a process that never imports TensorFlow pays
for reading a few variables, one small file and one string comparison per new module imported.
The import hook answers every look-up of ``tensorflow`` until the package really loads: a
program that first asks ``importlib.util.find_spec("tensorflow")`` is still traced.

Notes are files in ``$TFLAUNCH_TRACE_DIR/tasks/``: ``<task>.python`` (a Python process started),
``<task>.tf`` (JSON: pid, port, time, or the error that kept the server from starting) and
``<task>.tfchild`` (TensorFlow imported by a process that leaves the port to its parent).
A process that exits while a capture is on waits for the window's end (``window.json``) first.

**One port per task.** The task's first Python process claims the port when it starts
(``TFLAUNCH_PROFILER_PID``, its pid, which its children inherit), whether or not it imports
TensorFlow yet: a child (TensorBoard, a data loader) that imports TensorFlow first leaves the port
to it. A child takes the port only when that process has ended; a program that runs its trainer
as a child hands the port over by removing ``TFLAUNCH_PROFILER_PID`` from the child's environment.

That process also gets tflaunch's fix for a crash in TensorFlow's profiler (``profiler_fix.cc``, a
patch of a third-party bug; README.md in this folder has the story and the guard). Just before
TensorFlow loads, the hook builds the fix with the machine's C++ compiler (``CXX``, split like a
shell word, else ``g++``), checked against the installed TensorFlow's own header, once per machine
and TensorFlow in ``~/.cache/tflaunch`` — used only while that directory and each file in it are
this user's and writable by no one else, never through a symlink; otherwise the fix is built in a
private temporary directory. A layout mismatch is remembered; any other build failure is tried
again after ``RETRY_S``. The ``.tf`` note says what came of it (``profiler_fix``);
``TFLAUNCH_PROFILER_FIX=0`` leaves it out.
"""

from __future__ import annotations

import os
import sys

# json and time are imported where used: a process that never imports TensorFlow should pay for
# nothing it does not need (json alone costs milliseconds to import).

_HERE = os.path.dirname(os.path.realpath(__file__))
IMPL_FILE = "_tflaunch_hook.py"  # a folder holding it is a copy of this hook
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
RETRY_S = 60.0  # a build that failed for another reason than the layouts is tried again then
_fix_status = "not loaded: TensorFlow was imported before the trace hook"
_ran = False


def main() -> None:
    """Chain to the hidden ``sitecustomize``, then install the hook: once per process, however
    many copies of the hook's folder the path holds."""
    global _ran
    if _ran:
        return
    _ran = True
    _chain()
    _install()


def is_hook_folder(entry: str) -> bool:
    """Whether a ``sys.path`` entry is this hook's folder (by its real path) or another copy."""
    folder = entry or os.curdir
    try:
        return os.path.realpath(folder) == _HERE or os.path.isfile(os.path.join(folder, IMPL_FILE))
    except (OSError, ValueError):
        return False


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path, as if this one were not there. It stays
    ``sys.modules["sitecustomize"]``: the import ``site`` is in the middle of (the shim's)
    returns it, and so does a program's own ``import sitecustomize`` later."""
    ours = sys.modules.get("sitecustomize")
    try:
        from importlib.machinery import PathFinder

        path = [p for p in sys.path if isinstance(p, str) and not is_hook_folder(p)]
        spec = PathFinder.find_spec("sitecustomize", path)
        if spec is None or spec.loader is None:
            return
        from importlib.util import module_from_spec

        module = module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as exc:  # as site.py does: a broken sitecustomize is reported, not fatal
        sys.stderr.write(f"Error in sitecustomize (run by tflaunch's trace hook): {exc!r}\n")
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


def _owns_port() -> bool:
    """Whether this process is the one of its task that starts the profiler: the task's first
    Python process, or a later one once that has ended without starting it."""
    claimant = os.environ.get(PID_ENV, "")
    if claimant == str(os.getpid()):
        return True
    try:
        os.kill(int(claimant), 0)
    except ProcessLookupError:
        os.environ[PID_ENV] = str(os.getpid())  # it ended: the port is free, this one takes it
        return True
    except (OSError, ValueError):
        pass  # alive under another user (PermissionError), or not a pid: leave it
    return False


def _start_profiler(tf) -> None:
    import json
    import time

    if not _owns_port():  # a parent process of this task has the task's profiler port
        note = {"pid": os.getpid(), "claimant": os.environ.get(PID_ENV, "")}
        _note("tfchild", json.dumps(note))
        return
    port = _profiler_port()
    if port is None:
        _note("tf", json.dumps({"pid": os.getpid(), "error": "the task has no cluster port"}))
        return
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


# -- the profiler fix -------------------------------------------------------------------------


def _trusted(info: os.stat_result, kind: int) -> bool:
    """Owned by this user, writable by no one else, and of ``kind`` (S_IFDIR, S_IFREG)."""
    import stat

    return (
        stat.S_IFMT(info.st_mode) == kind
        and info.st_uid == os.geteuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _open_cache() -> int | None:
    """A descriptor of the shared build cache (``~/.cache/tflaunch``), or None where it is not
    this user's alone: a symlink, another owner, group or other write access."""
    import stat

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(base, "tflaunch")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    if _trusted(os.fstat(fd), stat.S_IFDIR) and os.access(folder, os.W_OK):
        return fd
    os.close(fd)
    return None


def _open_trusted(name: str, folder: int) -> int | None:
    """``name`` in the cache opened for reading if it is a regular file this user owns that no
    one else may write (never through a symlink), else None."""
    import stat

    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except OSError:
        return None
    if _trusted(os.fstat(fd), stat.S_IFREG):
        return fd
    os.close(fd)
    return None


def _compile(cxx: list[str], include: str, out: str) -> tuple[str, bool]:
    """Check the fix's layouts against TensorFlow's header, then build it into ``out``.
    ('', _) when built; else why not, and whether that is final (the layouts differ) or worth
    another try later (no compiler, a timeout, an error of the compiler's own)."""
    import subprocess

    common = [*cxx, "-std=c++17", "-w", "-O2"]
    steps = (
        ("check", ["-fsyntax-only", "-DTFLAUNCH_CHECK_LAYOUT"]),
        ("build", ["-shared", "-fPIC", "-fvisibility=hidden", "-o", out]),
    )
    for step, args in steps:
        argv = [*common, *args, f"-I{include}", FIX_SOURCE]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"not built: the compiler ({' '.join(cxx)}) did not run: {exc}", False
        if done.returncode == 0:
            continue
        lines = [x for x in done.stderr.splitlines() if "error" in x.lower()]
        first = (lines or done.stderr.strip().splitlines()[-1:] or [""])[0].strip()[:200]
        if step == "check" and "static assert" in done.stderr.replace("_", " ").lower():
            return f"not built: its layouts differ from TensorFlow's ({first})", True
        code = done.returncode
        return f"not built: the compiler failed ({step}, exit {code}): {first}", False
    return "", False


def _read_failure(folder: int, name: str) -> str | None:
    """The remembered failure, if it still holds (a retry is not due)."""
    import json
    import time

    fd = _open_trusted(name, folder)
    if fd is None:
        return None
    try:
        with os.fdopen(fd) as f:
            failed = json.load(f)
        if failed.get("retry") is None or time.time() < float(failed["retry"]):
            return str(failed["why"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def _open_built(folder: int, name: str) -> int | None:
    """The cached fix opened as :func:`_open_trusted` opens it, and only while it is what was
    built: the size and SHA-256 recorded beside it at the build (``<name>.sum``). A library cut
    short (a full disk, a killed copy) or changed is not loaded, and is built again."""
    import json

    fd = _open_trusted(name, folder)
    if fd is None:
        return None
    expected = None
    record = _open_trusted(f"{name}.sum", folder)
    if record is not None:
        try:
            with os.fdopen(record, "rb") as f:
                expected = json.loads(f.read(4096))
        except (OSError, ValueError):
            pass
    try:
        if _digest(fd) == (int(expected["size"]), str(expected["sha256"])):  # type: ignore[index]
            return fd
    except (OSError, ValueError, KeyError, TypeError):  # no record, or not one
        pass
    os.close(fd)
    return None


def _digest(fd: int) -> tuple[int, str]:
    """The size and SHA-256 of the open file ``fd`` (read with pread: its offset stays)."""
    import hashlib

    digest, offset = hashlib.sha256(), 0
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return offset, digest.hexdigest()
        digest.update(chunk)
        offset += len(chunk)


def _write_into(folder: int, name: str, data: bytes) -> None:
    """``data`` as ``name`` in the cache, atomically, never through a symlink."""
    tmp = f".{name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=folder)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)


def _build_cached(folder: int, key: str, cxx: list[str], include: str) -> tuple[int | None, str]:
    """The built fix opened from the cache (built there first, under a lock, if need be), or
    (None, why not)."""
    import fcntl
    import hashlib
    import json
    import tempfile
    import time

    name, failed = f"profiler_fix-{key}.so", f"profiler_fix-{key}.failed"
    fd = _open_built(folder, name)
    if fd is not None:
        return fd, ""
    lock = os.open(f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=folder)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per host: the others wait, then read it
        fd = _open_built(folder, name)
        if fd is not None:
            return fd, ""
        why = _read_failure(folder, failed)
        if why is not None:
            return None, why
        with tempfile.TemporaryDirectory(prefix="tflaunch-fix-") as private:
            out = os.path.join(private, name)
            why, final = _compile(cxx, include, out)
            if why:
                retry = None if final else time.time() + RETRY_S
                _write_into(folder, failed, json.dumps({"why": why, "retry": retry}).encode())
                return None, why
            with open(out, "rb") as f:
                built = f.read()
            _write_into(folder, name, built)
            record = {"size": len(built), "sha256": hashlib.sha256(built).hexdigest()}
            _write_into(folder, f"{name}.sum", json.dumps(record).encode())
        fd = _open_built(folder, name)
        return fd, "" if fd is not None else "not loaded: the cache changed under the build"
    finally:
        os.close(lock)


def _build_private(cxx: list[str], include: str) -> tuple[int | None, str]:
    """The fix built in a private temporary directory (the cache is not this user's alone),
    opened; the directory goes, the open file stays loadable."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tflaunch-fix-") as private:
        out = os.path.join(private, "profiler_fix.so")
        why, _ = _compile(cxx, include, out)
        if why:
            return None, why
        return os.open(out, os.O_RDONLY | os.O_NOFOLLOW), ""


def _load_profiler_fix(origin: str | None) -> str:
    """Build (once, cached) and load the fix for TensorFlow's profiler, ahead of TensorFlow's own
    libraries, so that its one function takes the place of theirs; says what came of it."""
    if os.environ.get(FIX_ENV) == "0":
        return f"off ({FIX_ENV}=0)"
    if not sys.platform.startswith("linux"):
        return "not needed (the crash is libstdc++'s, on Linux)"
    if not origin:
        return "not loaded: TensorFlow's package has no location"
    import shlex
    import shutil

    include = os.path.join(os.path.dirname(origin), "include")
    try:
        with open(FIX_SOURCE, "rb") as f:
            source = f.read()
        with open(os.path.join(include, FIX_HEADER), "rb") as f:
            header = f.read()
    except OSError:
        return "not built: the installed TensorFlow has no C++ headers to check it against"
    try:
        cxx = shlex.split(os.environ.get("CXX") or "")
    except ValueError:
        return f"not built: CXX={os.environ['CXX']!r} is not a command"
    if not cxx:
        found = shutil.which("g++") or shutil.which("c++")
        if not found:
            return "not built: no C++ compiler (g++) on this host"
        cxx = [found]
    import ctypes
    import hashlib

    key = hashlib.sha256(source + header + "\0".join(cxx).encode()).hexdigest()[:16]
    folder = _open_cache()
    try:
        if folder is not None:
            fd, why = _build_cached(folder, key, cxx, include)
        else:
            fd, why = _build_private(cxx, include)
    except OSError as exc:
        return f"not loaded: {exc}"
    finally:
        if folder is not None:
            os.close(folder)
    if fd is None:
        return why
    try:  # the file as opened and checked, whatever its name points at by now
        ctypes.CDLL(f"/proc/self/fd/{fd}", mode=os.RTLD_GLOBAL | os.RTLD_NOW)
    except OSError as exc:
        return f"not loaded: {exc}"
    finally:
        os.close(fd)
    return FIX_LOADED


# -- the import hook --------------------------------------------------------------------------


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
        _uninstall()  # tensorflow is loading: no more look-ups to answer
        if _owns_port():  # the process that will start the task's profiler
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
    """On ``sys.meta_path``: answers every look-up of ``tensorflow`` (an import, or a program's
    ``importlib.util.find_spec`` probe) with the real spec whose loader starts the profiler,
    until the package loads."""

    tflaunch_trace_hook = True

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        for finder in list(sys.meta_path):
            if getattr(finder, "tflaunch_trace_hook", False):
                continue  # this one, or another copy of it
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and not isinstance(spec.loader, _Loader):
            spec.loader = _Loader(spec.loader)
        return spec


def _uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "tflaunch_trace_hook", False)]


def _install() -> None:
    if not (os.environ.get("TFLAUNCH_TRACE_DIR") and os.environ.get("TFLAUNCH_TASK")):
        return
    if not os.environ.get(PID_ENV):  # the task's first Python process: the port is its own
        os.environ[PID_ENV] = str(os.getpid())
        _note("python", str(os.getpid()))
    if "tensorflow" in sys.modules:
        _start_profiler(sys.modules["tensorflow"])
    elif not any(getattr(f, "tflaunch_trace_hook", False) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
