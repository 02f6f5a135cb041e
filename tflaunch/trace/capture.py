"""The launcher's capture for ``tflaunch up --trace`` of any program (see
:mod:`tflaunch.trace.window`): started ahead of the window, it loads only TensorFlow's
profiler client (a fraction of a second, where all of TensorFlow takes seconds on a busy
machine), prints ``ready`` and waits for one line on its input::

    {"tasks": {"worker:0": "127.0.0.1:12220", ...}, "duration_ms": 5000,
     "dirs": {"worker:1": "/runs/R/host2/trace"}, "merge": false}

Then it asks every listed task's profiler server for the same wall-clock window at once (TF's
``client.trace``), and, TensorFlow imported in full now, decodes and merges what came back into
``trace.json`` and the summary (:func:`tflaunch.trace.profiler.merge_dir`). At the end of its input
without an order it exits 3: the window never opened.

Each profiler server saves its own XPlane under the repository the client names, *on its own
host* (TF's remote profiling): ``TRACE_DIR/raw``, or for a task in ``dirs`` (its own host's
trace directory, where it differs from this one) that directory's ``raw/``: one client call per
directory, all at once. Where the tasks share this directory (one machine, Slurm) they are all
here; across SSH hosts the launcher gives the order ``"merge": false`` (capture only), gathers
the other hosts' files into this directory's ``raw/`` and then runs ``--merge`` here.

    python -m tflaunch.trace.capture TRACE_DIR [--tasks JSON --duration_ms N] [--merge]
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import sys
import threading
import time
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

PLUGIN = "tensorflow.python.profiler.internal._pywrap_profiler_plugin"


def profiler_client():
    """TensorFlow's profiler client extension, loaded without importing ``tensorflow``."""
    spec = importlib.util.find_spec("tensorflow")
    found = []
    if spec is not None and spec.origin:
        root = os.path.dirname(spec.origin)
        stem = os.path.join(root, "python/profiler/internal/_pywrap_profiler_plugin")
        found = [p for suffix in EXTENSION_SUFFIXES for p in glob.glob(stem + suffix)]
    if not found:  # another layout: the ordinary, slower way
        from tensorflow.python.profiler.internal import _pywrap_profiler_plugin

        return _pywrap_profiler_plugin
    plugin_spec = importlib.util.spec_from_file_location(PLUGIN, found[0])
    assert plugin_spec is not None and plugin_spec.loader is not None
    module = importlib.util.module_from_spec(plugin_spec)
    plugin_spec.loader.exec_module(module)
    return module


def capture(
    trace_dir: Path,
    targets: dict[str, str],
    duration_ms: int,
    client=None,
    merge: bool = True,
    dirs: dict[str, str] | None = None,
) -> list[Path]:
    """Every task's profiler (task -> host:port) for the same ``duration_ms``, each saving under
    its directory's raw/ (``dirs``; default ``trace_dir``); then merge."""
    client = client or profiler_client()
    started = time.time()
    # The window as it really is (the launcher's order may have waited for this process): a
    # task ending inside it waits for its end (tflaunch's trace hook reads this file).
    window = trace_dir / "window.json"
    window.write_text(json.dumps({"start": started, "end": started + duration_ms / 1000.0}))
    print(f"capturing {duration_ms} ms from {len(targets)} task(s) at {started:.3f}", flush=True)
    raw = trace_dir / "raw"
    groups: dict[str, list[str]] = {}
    for task, address in targets.items():
        groups.setdefault(str((dirs or {}).get(task) or trace_dir), []).append(address)
    errors: list[Exception] = []

    def trace(folder: str, addresses: list[str]) -> None:
        # One attempt: a retry opens a second window after the one the tasks wait for (some
        # may be gone by then) and its profiles replace the first ones.
        try:
            repository = str(Path(folder) / "raw")
            client.trace(",".join(addresses), repository, "", True, duration_ms, 1, {})
        except Exception as exc:
            errors.append(exc)

    # The client call waits outside the interpreter's lock: one thread per directory, at once.
    threads = [threading.Thread(target=trace, args=item) for item in groups.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        # The servers save their XPlanes themselves; the client may still find no response in
        # time (a loaded host): go on with what was saved (here, or on the other hosts).
        saved = list(raw.glob("plugins/profile/*/*.xplane.pb"))
        if not saved and merge:
            raise errors[0]
        said = errors[0]
        print(f"capture: the profiler client said {said}; {len(saved)} profile(s) here", flush=True)
    if not merge:
        print(f"captured into {raw}", flush=True)
        return []
    from tflaunch.trace.profiler import merge_dir

    return merge_dir(trace_dir, targets, 0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tflaunch.trace.capture")
    p.add_argument("trace_dir")
    p.add_argument("--tasks", default=None, help='JSON {"ps:0": "host:profiler port", ...}')
    p.add_argument("--duration_ms", type=int, default=2000)
    p.add_argument("--merge", action="store_true", help="only merge raw/'s profiles of --tasks")
    args = p.parse_args(argv)
    if args.merge:
        from tflaunch.trace.profiler import merge_dir

        try:
            paths = merge_dir(Path(args.trace_dir), json.loads(args.tasks or "{}"), 0)
        except Exception as exc:  # one line for the launcher's verdict
            print(f"error: {type(exc).__name__}: {exc}", flush=True)
            return 1
        print("\n".join(str(path) for path in paths), flush=True)
        return 0
    client = profiler_client()
    targets, duration_ms = (json.loads(args.tasks) if args.tasks else None), args.duration_ms
    merge, dirs = True, None
    if targets is None:
        print(f"ready at {time.time():.3f}", flush=True)
        line = sys.stdin.readline()
        if not line.strip():
            return 3
        order = json.loads(line)
        targets, duration_ms = order["tasks"], int(order["duration_ms"])
        merge, dirs = bool(order.get("merge", True)), order.get("dirs")
    try:
        paths = capture(Path(args.trace_dir), targets, duration_ms, client, merge, dirs)
    except Exception as exc:  # one line for the launcher's verdict
        print(f"error: {type(exc).__name__}: {exc}", flush=True)
        return 1
    print("\n".join(str(path) for path in paths), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
