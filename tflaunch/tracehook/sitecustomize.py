"""tflaunch's trace hook, as Python's ``site`` finds it: ``tflaunch up --trace`` puts this folder
first on every traced task's ``PYTHONPATH``, so this file runs at the start of each of the task's
Python processes. The hook itself is ``_tflaunch_hook.py`` beside it (Python 3.7 or newer).

This shim is written so that any Python the user runs can compile it (2.7 included): on Python
3.7 and newer it runs the hook once (a second copy of this folder on the path, under another
name, runs nothing more); on an older Python it leaves a note saying which version the task ran
(``<task>.oldpython``) and only runs the ``sitecustomize`` it hides, if any, as the hook does. It
imports only the standard library and nothing of tflaunch; nothing here may fail the program.
"""

import os
import sys

IMPL = "_tflaunch_hook"


def _run_hook():
    module = sys.modules.get(IMPL)
    if module is None:
        from importlib.util import module_from_spec, spec_from_file_location

        here = os.path.dirname(os.path.realpath(__file__))
        spec = spec_from_file_location(IMPL, os.path.join(here, IMPL + ".py"))
        module = module_from_spec(spec)
        sys.modules[IMPL] = module
        spec.loader.exec_module(module)
    module.main()


def _is_hook_folder(entry, here):
    folder = entry or os.curdir
    try:
        return os.path.realpath(folder) == here or os.path.isfile(
            os.path.join(folder, IMPL + ".py")
        )
    except (OSError, ValueError, TypeError):
        return False


def _old_python_note():
    trace_dir, task = os.environ.get("TFLAUNCH_TRACE_DIR"), os.environ.get("TFLAUNCH_TASK")
    if not trace_dir or not task or os.environ.get("TFLAUNCH_PROFILER_PID"):
        return
    folder = os.path.join(os.path.expanduser(trace_dir), "tasks")
    name = "%s.oldpython" % task.replace(":", "-")
    try:
        if not os.path.isdir(folder):
            os.makedirs(folder)
        tmp = os.path.join(folder, ".%s.%d" % (name, os.getpid()))
        with open(tmp, "w") as f:
            f.write("%d.%d\n" % sys.version_info[:2])
        os.rename(tmp, os.path.join(folder, name))
    except OSError:
        pass


def _old_python_chain():
    """The hidden ``sitecustomize``, run with what this Python has (imp on 2.7); it stays the
    ``sitecustomize`` module, as the hook leaves it (see ``_tflaunch_hook._chain``)."""
    here = os.path.dirname(os.path.realpath(__file__))
    path = [p for p in sys.path if not _is_hook_folder(p, here)]
    ours = sys.modules.pop("sitecustomize", None)
    try:
        try:
            from importlib.machinery import PathFinder
        except ImportError:
            PathFinder = None
        if PathFinder is not None:
            spec = PathFinder.find_spec("sitecustomize", path)
            if spec is not None and spec.loader is not None:
                from importlib.util import module_from_spec

                module = module_from_spec(spec)
                sys.modules["sitecustomize"] = module
                spec.loader.exec_module(module)
        else:
            import imp

            try:
                found = imp.find_module("sitecustomize", path)
            except ImportError:
                found = None
            if found is not None:
                try:
                    imp.load_module("sitecustomize", *found)
                finally:
                    if found[0] is not None:
                        found[0].close()
    except Exception as exc:  # as site.py does: a broken sitecustomize is reported, not fatal
        sys.stderr.write("Error in sitecustomize (run by tflaunch's trace hook): %r\n" % (exc,))
        if ours is not None:
            sys.modules["sitecustomize"] = ours


try:
    if sys.version_info[:2] >= (3, 7):
        _run_hook()
    else:
        _old_python_note()
        _old_python_chain()
except Exception as exc:  # tracing must never break the program
    sys.stderr.write("tflaunch's trace hook failed: %r\n" % (exc,))
