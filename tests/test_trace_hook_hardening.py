"""The trace hook against what users' programs and machines do to it (issue 29): a
``find_spec`` probe before the import, a child that imports TensorFlow first, the hook's folder
twice on the path, old Pythons, ``python -I``, a build cache planted by another user, a compiler
that fails once and ``CXX`` with an argument. A stand-in ``tensorflow`` package (no real
TensorFlow: milliseconds a process) records the profiler server's port."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import (
    ROOT,
    cpu_bounded,
    hook_env,
    hooked_profiler_port,
    tflaunch,
    write_cluster,
)
from tflaunch.trace import files as trace_files

PYENV = Path("/root/.pyenv/versions")
_FAKE_TF = (
    "import os, types\n"
    "def _start(port):\n"
    "    open(os.environ['STARTED_MARK'], 'a').write(f'{os.getpid()} {port}\\n')\n"
    "server = types.SimpleNamespace(start=_start)\n"
    "profiler = types.SimpleNamespace(experimental=types.SimpleNamespace(server=server))\n"
)


def _hook_env(tmp_path: Path, *extra_path: Path) -> dict[str, str]:
    """:func:`hook_env`, the hook's start marked in ``tmp_path/started``."""
    return hook_env(tmp_path, *extra_path, STARTED_MARK=str(tmp_path / "started"))


def _fake_tf(tmp_path: Path) -> Path:
    root = tmp_path / "fake"
    (root / "tensorflow").mkdir(parents=True)
    (root / "tensorflow" / "__init__.py").write_text(_FAKE_TF)
    return root


def _python(tmp_path: Path, code: str, env: dict[str, str], python: str = sys.executable):
    return subprocess.run(
        [python, "-c", code], env=env, text=True, capture_output=True, timeout=120, check=True
    )


def _profiled_pid(tmp_path: Path, code: str, env: dict[str, str]) -> int:
    """Run ``code``, which prints its pid, under the hook: that process, and only it, started
    the profiler server, on the task's port. Its pid."""
    pid = int(_python(tmp_path, code, env).stdout)
    assert _started(tmp_path) == [(pid, hooked_profiler_port(tmp_path))]
    return pid


def _started(tmp_path: Path) -> list[tuple[int, int]]:
    mark = tmp_path / "started"
    lines = mark.read_text().split("\n") if mark.exists() else []
    return [tuple(int(x) for x in line.split()) for line in lines if line]  # type: ignore[misc]


def test_a_find_spec_probe_before_the_import_is_still_traced(tmp_path) -> None:
    """``importlib.util.find_spec("tensorflow")`` first (a common library pattern): the hook
    answers that look-up and the later import, and starts the profiler once the package loaded."""
    env = _hook_env(tmp_path, _fake_tf(tmp_path))
    code = (
        "import importlib.util, os, sys\n"
        "assert importlib.util.find_spec('tensorflow') is not None\n"
        "assert importlib.util.find_spec('tensorflow') is not None\n"
        "import tensorflow\n"
        "assert type(tensorflow.__spec__.loader).__name__ != '_Loader'\n"
        "assert not any(getattr(f, 'tflaunch_trace_hook', 0) for f in sys.meta_path)\n"
        "print(os.getpid())\n"
    )
    _profiled_pid(tmp_path, code, env)
    assert trace_files.read_notes(tmp_path / "trace").tf_ports == {
        "worker:0": hooked_profiler_port(tmp_path)
    }


def test_a_child_that_imports_tensorflow_first_leaves_the_port_to_its_task(tmp_path) -> None:
    """TensorBoard-like: the trainer starts a child that imports TensorFlow before the trainer
    does; the port stays the trainer's. A child whose first Python process has ended takes it."""
    env = _hook_env(tmp_path, _fake_tf(tmp_path))
    code = (
        "import os, subprocess, sys\n"
        "subprocess.run([sys.executable, '-c', 'import tensorflow'], check=True)\n"
        "import tensorflow\n"
        "print(os.getpid())\n"
    )
    pid = _profiled_pid(tmp_path, code, env)
    notes = trace_files.read_notes(tmp_path / "trace")
    assert notes.tf_ports == {"worker:0": hooked_profiler_port(tmp_path)}
    assert notes.tf_children["worker:0"]["claimant"] == str(pid)

    (tmp_path / "started").unlink()
    orphan = (
        "import subprocess, sys\n"
        "code = 'import os, time; time.sleep(1); import tensorflow; print(os.getpid())'\n"
        "child = subprocess.Popen([sys.executable, '-c', code], stdout=open(sys.argv[1], 'w'))\n"
    )
    out = tmp_path / "orphan"
    subprocess.run([sys.executable, "-c", orphan, str(out)], env=env, check=True, timeout=60)
    deadline = time.monotonic() + 30
    while not _started(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)
    assert _started(tmp_path) == [(int(out.read_text()), hooked_profiler_port(tmp_path))]


def test_the_hook_folder_twice_on_the_path_registers_once(tmp_path) -> None:
    """The folder on PYTHONPATH twice, once through a symlink: one import hook, the hidden
    sitecustomize run once, and start-up stays milliseconds (it recursed: 196 hooks, 1.7 s)."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text(
        "import os\nopen(os.environ['THEIRS_MARK'], 'a').write('ran\\n')\n"
    )
    link = tmp_path / "hook-link"
    link.symlink_to(trace_files.HOOK_DIR)
    env = _hook_env(tmp_path, link, trace_files.HOOK_DIR, theirs)
    env["THEIRS_MARK"] = str(tmp_path / "mark")
    code = "import sys; print(sum(getattr(f, 'tflaunch_trace_hook', 0) for f in sys.meta_path))"
    with cpu_bounded(1.0, children=True):
        out = _python(tmp_path, code, env)
    assert out.stdout.strip() == "1" and out.stderr == ""
    assert (tmp_path / "mark").read_text() == "ran\n"


@pytest.mark.parametrize("version", ["2.7", "3.6", "3.7"])
def test_old_pythons_compile_the_hook_and_run_their_own_sitecustomize(tmp_path, version) -> None:
    """Python 2.7 and 3.6 compile the shim, run the program's own sitecustomize and note their
    version (the verdict names it); 3.7, the oldest the hook serves, is hooked."""
    found = sorted(PYENV.glob(f"{version}.*/bin/python{version}"))
    if not found:
        pytest.skip(f"no Python {version} here (pyenv's {PYENV})")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text(
        "import os\nopen(os.environ['THEIRS_MARK'], 'a').write('ran\\n')\n"
    )
    env = {**_hook_env(tmp_path, theirs), "THEIRS_MARK": str(tmp_path / "mark")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no .pyc of an old Python left in the package
    out = _python(tmp_path, "import sys; print(sys.version_info[0])", env, str(found[-1]))
    assert out.stderr == "" and (tmp_path / "mark").read_text() == "ran\n"
    notes = trace_files.read_notes(tmp_path / "trace")
    if version == "3.7":
        assert notes.python == {"worker:0"} and not notes.old_python
    else:
        assert notes.old_python == {"worker:0": version} and not notes.python


def test_python_isolated_mode_is_named_in_the_verdict(tmp_path) -> None:
    """``python3 -I`` ignores PYTHONPATH, where the hook comes in: the verdict says so instead
    of "no task ran Python"."""
    argv = [sys.executable, "-I", "-c", "import time; time.sleep(0.5)"]
    cluster = write_cluster(tmp_path / "c.yaml", {"argv": argv}, roles={"ps": 0, "worker": 1})
    result = tflaunch("up", str(cluster), "--trace", "5", cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [x for x in (result.stdout + result.stderr).splitlines() if "no trace" in x]
    assert len(lines) == 1 and "no task ran Python" not in lines[0], lines
    assert lines[0].startswith("no trace because the program runs Python with -I, which ignores")


# -- the profiler fix's build cache -----------------------------------------------------------

_HEADER = """#include <cstdint>
#include <deque>
#include <string>
namespace tsl { namespace profiler { struct TraceMeRecorder {
  struct Event { std::string name; int64_t start_time; int64_t end_time;EXTRA };
  struct ThreadInfo { int64_t tid; std::string name; };
  struct ThreadEvents { ThreadInfo thread; std::deque<Event> events; };
}; } }
"""
_FIX_TF = (
    "import ctypes, os\n"
    "def _start(port):\n"
    "    try:\n"
    "        ctypes.c_ulong.in_dll(ctypes.CDLL(None), 'tflaunch_tracemefix_calls')\n"
    "        print('fix symbol True')\n"
    "    except ValueError:\n"
    "        print('fix symbol False')\n"
    "class server:\n"
    "    start = staticmethod(_start)\n"
    "class profiler:\n"
    "    class experimental:\n"
    "        server = server\n"
)


def _compiler() -> str:
    found = shutil.which("g++") or shutil.which("c++")
    if found is None:
        pytest.skip("no C++ compiler")
    return found


def _fix_env(tmp_path: Path, header: str = _HEADER.replace("EXTRA", "")) -> dict[str, str]:
    package = tmp_path / "fake" / "tensorflow"
    (package / "include" / "xla/tsl/profiler/backends/cpu").mkdir(parents=True)
    (package / "__init__.py").write_text(_FIX_TF)
    (package / "include" / "xla/tsl/profiler/backends/cpu/traceme_recorder.h").write_text(header)
    return {**_hook_env(tmp_path, tmp_path / "fake"), "XDG_CACHE_HOME": str(tmp_path / "cache")}


def _fix_note(tmp_path: Path) -> str:
    return json.loads((tmp_path / "trace" / "tasks" / "worker-0.tf").read_text())["profiler_fix"]


def _planted_library(tmp_path: Path, marker: Path) -> Path:
    """A library whose constructor leaves ``marker``: loaded, it shows."""
    source = tmp_path / "planted.c"
    source.write_text(
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void planted(void) {\n"
        f'  FILE* f = fopen("{marker}", "w"); if (f) fclose(f);\n'
        "}\n"
    )
    out = tmp_path / "planted.so"
    subprocess.run(
        [_compiler(), "-x", "c", "-shared", "-fPIC", "-o", str(out), str(source)], check=True
    )
    return out


def test_a_fix_planted_in_the_cache_by_another_user_is_never_loaded(tmp_path) -> None:
    """The cached fix is loaded only when the cache folder and the file are this user's and no
    one else may write them, never through a symlink; otherwise the fix is built privately and
    the planted library never runs."""
    _compiler()
    env = _fix_env(tmp_path)
    _python(tmp_path, "import tensorflow", env)  # builds into the cache
    cache = tmp_path / "cache" / "tflaunch"
    (built,) = cache.glob("profiler_fix-*.so")
    marker = tmp_path / "planted-ran"
    planted = _planted_library(tmp_path, marker)
    nobody = 65534

    def plant(how: str) -> None:
        built.unlink(missing_ok=True)
        if how == "symlink":
            built.symlink_to(planted)
            return
        shutil.copy(planted, built)
        if how == "another user":
            if os.geteuid() != 0:
                pytest.skip("chown to another user needs root")
            os.chown(built, nobody, nobody)
        elif how == "world-writable":
            built.chmod(0o666)
        elif how == "in a world-writable folder":
            built.chmod(0o644)
            cache.chmod(0o777)

    for how in ("another user", "world-writable", "symlink", "in a world-writable folder"):
        plant(how)
        out = _python(tmp_path, "import tensorflow", env)
        assert not marker.exists(), f"the planted library ran ({how})"
        assert out.stdout.strip() == "fix symbol True", (how, out.stdout, out.stderr)
        assert _fix_note(tmp_path) == "loaded", how
    assert built.is_file() and not built.is_symlink()
    assert stat.S_IMODE(cache.stat().st_mode) == 0o777  # left as it was: used no more


def test_a_compiler_failure_is_tried_again_later_and_cxx_is_split_like_a_shell_word(
    tmp_path,
) -> None:
    """``CXX`` with an argument (``ccache g++``-like: a wrapper and the compiler); the wrapper
    fails once as a compiler killed for memory would: not called a layout mismatch, remembered
    for a while (no build per task start), then tried again and built. A real mismatch stays."""
    compiler = _compiler()
    wrapper = tmp_path / "my cxx"  # a space in its path too: quoted in CXX
    wrapper.write_text(
        "#!/bin/sh\n"
        f'echo run >> "{tmp_path}/calls"\n'
        f'if [ -e "{tmp_path}/fail" ]; then echo "g++: fatal error: Killed signal" >&2; exit 1; fi\n'
        'exec "$@"\n'
    )
    wrapper.chmod(0o755)
    env = {**_fix_env(tmp_path), "CXX": f"'{wrapper}' {compiler}"}
    (tmp_path / "fail").touch()
    out = _python(tmp_path, "import tensorflow", env)
    assert out.stdout.strip() == "fix symbol False"
    why = _fix_note(tmp_path)
    assert why.startswith("not built: the compiler failed") and "layout" not in why, why
    assert "Killed signal" in why
    calls = (tmp_path / "calls").read_text().count("run")
    _python(tmp_path, "import tensorflow", env)  # at once: the failure is remembered
    assert (tmp_path / "calls").read_text().count("run") == calls
    assert _fix_note(tmp_path) == why
    (tmp_path / "fail").unlink()
    (failed,) = (tmp_path / "cache" / "tflaunch").glob("*.failed")
    record = json.loads(failed.read_text())
    assert record["retry"] is not None and record["retry"] > time.time()
    failed.write_text(json.dumps({**record, "retry": time.time() - 1}))  # its time came
    out = _python(tmp_path, "import tensorflow", env)
    assert out.stdout.strip() == "fix symbol True" and _fix_note(tmp_path) == "loaded"

    mismatch = tmp_path / "mismatch"
    env = {**_fix_env(mismatch, _HEADER.replace("EXTRA", " int64_t extra;")), "CXX": compiler}
    _python(mismatch, "import tensorflow", env)
    assert _fix_note(mismatch).startswith("not built: its layouts differ from TensorFlow's")
    (failed,) = (mismatch / "cache" / "tflaunch").glob("*.failed")
    assert json.loads(failed.read_text())["retry"] is None  # final: the header decides


@pytest.mark.parametrize("version", ["2.7", "3.6", "current"])
def test_a_programs_own_import_of_sitecustomize_gets_its_own_module(tmp_path, version) -> None:
    """The hook hides the program's sitecustomize behind its shim and runs it; a program that
    imports it by name gets its own module, not the shim (AttributeError before)."""
    python = sys.executable
    if version != "current":
        found = sorted(PYENV.glob(f"{version}.*/bin/python{version}"))
        if not found:
            pytest.skip(f"no Python {version} here (pyenv's {PYENV})")
        python = str(found[-1])
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("SETTING = 'theirs'\n")
    env = {**_hook_env(tmp_path, theirs), "PYTHONDONTWRITEBYTECODE": "1"}
    code = "import sitecustomize; print(sitecustomize.SETTING)"
    out = _python(tmp_path, code, env, python)
    assert (out.stdout.strip(), out.stderr) == ("theirs", "")
    if version == "current":
        assert trace_files.read_notes(tmp_path / "trace").python == {"worker:0"}  # still hooked


def test_a_cached_fix_cut_short_or_changed_is_built_again(tmp_path) -> None:
    """The cached library is loaded only while its size and checksum are those recorded at
    the build: one cut short ('file too short' before, and never rebuilt), one with a byte
    changed, or one with no record is built again, and the fix loads."""
    _compiler()
    env = _fix_env(tmp_path)
    _python(tmp_path, "import tensorflow", env)  # builds into the cache
    (built,) = (tmp_path / "cache" / "tflaunch").glob("profiler_fix-*.so")
    good = built.read_bytes()
    record = built.with_name(built.name + ".sum")

    def cut_short() -> None:
        built.write_bytes(good[: len(good) // 2])

    def changed() -> None:
        data = bytearray(good)
        data[len(data) // 2] ^= 0xFF
        built.write_bytes(bytes(data))

    for spoil in (cut_short, changed, record.unlink):
        spoil()
        out = _python(tmp_path, "import tensorflow", env)
        assert out.stdout.strip() == "fix symbol True", (spoil.__name__, out.stdout, out.stderr)
        assert _fix_note(tmp_path) == "loaded", spoil.__name__
        assert built.read_bytes() == good and record.is_file(), spoil.__name__
