"""A traced run's coordinator against a hostile or unlucky agent (issue 29): trace messages whose
fields have the right types but say something the coordinator must not do (a path out of the
trace directory, data that is not base64, an offset past any file, a directory it should not
trust) close that agent's link with one line; a full disk under the trace directory (a real
64 KiB tmpfs) ends the trace collection with one line, and the run still ends with its true
state. Fake agent links as in test_coordinator.py; the trace site is the real one, with the
capture helper (TensorFlow's profiler client, whose window never opens here) left out."""

from __future__ import annotations

import base64
import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.coordinator_fakes import FakeLink
from tflaunch.cluster.config import parse_config
from tflaunch.cluster.placement import make_plan
from tflaunch.cluster.plan import Host
from tflaunch.runtime.coordinator import coordinate
from tflaunch.runtime.run import Run
from tflaunch.trace import files as trace_files
from tflaunch.trace.request import TraceRequest, parse_window
from tflaunch.trace.run import RunTrace
from tflaunch.trace.site import Helper, TraceSite


class NoCaptureSite(TraceSite):
    """The real site, its capture helper a process that waits for an order that never comes
    (the window does not open in these runs) and exits 3 at the end of its input, as the
    real one does, without loading TensorFlow's profiler client."""

    def start_helper(self) -> Helper:
        code = "import sys; sys.exit(0 if sys.stdin.read().strip() else 3)"
        return Helper(
            subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, text=True)
        )


def started(*tasks: str) -> list[dict]:
    return [{"event": "started", "task": t, "pid": 100 + i} for i, t in enumerate(tasks)]


def traced_run(tmp_path: Path, script_b: list[dict], trace_dir: Path | None = None):
    """ps:0 and worker:0 on a, worker:1 on b; every task's work done (the run succeeds), then
    b's agent sends ``script_b``."""
    run = Run.create(tmp_path / "runs", "t")
    trace_dir = trace_dir or run.dir / "trace"
    request = TraceRequest(trace_dir, window=parse_window("50:5"))
    config = {
        "program": {"argv": ["p"], "env": request.to_env()},
        "roles": {"ps": 1, "worker": 2},
        "placement": {"workers_per_host": 1},
        "hosts": ["a", "b"],
        "supervision": {"finish_timeout": 1, "heartbeat": 0.2},
    }
    plan = make_plan(
        parse_config(yaml.safe_dump(config)),
        [Host("a", "10.0.0.1", "10.0.0.1"), Host("b", "10.0.0.2", "10.0.0.2")],
    )
    a = started("ps:0", "worker:0") + [
        {"event": "ready", "task": "ps:0"},
        {"event": "exited", "task": "worker:0", "code": 0},
    ]
    b = started("worker:1") + [{"event": "exited", "task": "worker:1", "code": 0}, *script_b]
    links = [FakeLink("a", ["ps:0", "worker:0"], a), FakeLink("b", ["worker:1"], b)]
    out = io.StringIO()
    site = NoCaptureSite(trace_dir)
    outcome = coordinate(plan, run, links, out=out, trace=RunTrace(request, site))
    return outcome, links, run, out.getvalue()


def piece(path: str, data: bytes = b"x", offset: int = 0, size: int | None = None) -> dict:
    size = offset + len(data) if size is None else size
    encoded = base64.b64encode(data).decode()
    return {"event": "trace_file", "path": path, "offset": offset, "size": size, "data": encoded}


def note(name: str, text: str = "1", folder: str = "/runs/t/b/trace") -> dict:
    return {"event": "trace_note", "name": name, "text": text, "dir": folder}


HOSTILE = {
    "path-dotdot": piece("../../escaped"),
    "path-dotdot-inside": piece("raw/../../escaped"),
    "path-absolute": piece("/tmp/escaped-abs"),
    "path-nul": piece("raw/a\0b"),
    "path-hidden": piece(".hidden"),
    "path-hidden-folder": piece("raw/.git/config"),
    "path-empty": piece(""),
    "path-empty-component": piece("raw//x"),
    "path-long-name": piece("raw/" + "x" * 300),
    "data-not-base64": {**piece("raw/x"), "data": "not base64!"},
    "offset-negative": piece("raw/x", offset=-1, size=10),
    "offset-past-size": piece("raw/x", offset=11, size=10),
    "size-huge": piece("raw/x", size=1 << 62),
    "data-past-size": piece("raw/x", b"12345", size=2),
    "note-dotdot": note("../escaped.tf"),
    "note-slash": note("raw/x.tf"),
    "note-hidden": note(".worker-1.tf"),
    "note-nul": note("worker-1\0.tf"),
    "note-no-kind": note("worker-1"),
    "note-empty": note(""),
    "dir-relative": note("worker-1.python", folder="runs/t/trace"),
    "dir-dotdot": note("worker-1.python", folder="/runs/t/../../etc"),
    "dir-nul": note("worker-1.python", folder="/runs/t\0/trace"),
}


@pytest.mark.parametrize("message", HOSTILE.values(), ids=list(HOSTILE))
def test_a_trace_message_the_site_must_not_follow_closes_its_link(tmp_path, message) -> None:
    """With a trace site active: the message is refused (that agent's link closed, one line),
    nothing is written outside the trace directory, and the run ends in its true state."""
    outcome, links, run, out = traced_run(tmp_path, [message])
    assert outcome.code == 0 and run.record().state == "succeeded", out
    refused = [x for x in out.splitlines() if "closed its agent's link" in x]
    assert len(refused) == 1 and refused[0].startswith(
        f"[tflaunch] b: closed its agent's link: a malformed message ({message['event']}: "
    ), out
    assert "trace collection stopped" not in out
    escaped = [p for p in tmp_path.rglob("*escaped*")] + list(Path("/tmp").glob("escaped-abs"))
    assert escaped == []
    verdict = trace_files.read_verdict(run.dir / "trace")
    assert verdict is not None and not verdict[0]  # the window never opened: said so


def test_a_path_that_runs_into_a_file_is_refused_not_taken_for_a_full_disk(tmp_path) -> None:
    outcome, _, run, out = traced_run(tmp_path, [piece("raw/f", b"abc"), piece("raw/f/g")])
    assert outcome.code == 0 and run.record().state == "succeeded", out
    assert "malformed message (trace_file: path 'raw/f/g': " in out
    assert "raw/f: f is not a folder of" in out  # a file on the way, as a symlink would be
    assert "trace collection stopped" not in out
    assert (run.dir / "trace" / "raw" / "f").read_bytes() == b"abc"


def test_good_pieces_are_written_and_the_site_keeps_its_own_files(tmp_path) -> None:
    """The same site takes a well-formed file in pieces; a piece naming the site's own files
    (its verdict, its notes folder) is left out, not written."""
    script = [
        note("worker-1.python", "41"),
        piece("raw/plugins/profile/1/b.xplane.pb", b"abc", 0, 6),
        piece("raw/plugins/profile/1/b.xplane.pb", b"def", 3, 6),
        piece("verdict.json", b'{"ok": true, "line": "planted"}'),
        piece("tasks/worker-0.tf", b'{"port": 1}'),
    ]
    outcome, links, run, out = traced_run(tmp_path, script)
    assert outcome.code == 0 and "closed its agent's link" not in out, out
    trace = run.dir / "trace"
    assert (trace / "raw/plugins/profile/1/b.xplane.pb").read_bytes() == b"abcdef"
    assert (trace / "tasks" / "worker-1.python").read_text() == "41"
    assert not (trace / "tasks" / "worker-0.tf").exists()
    assert trace_files.read_verdict(trace) != (True, "planted")


@contextlib.contextmanager
def small_tmpfs(tmp_path: Path, size: str):
    """A tmpfs of ``size`` under ``tmp_path``, unmounted at the end (skips without root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)])
    if done.returncode != 0:
        pytest.skip("mount -t tmpfs failed here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs: the trace directory of a run, to be filled."""
    with small_tmpfs(tmp_path, "64k") as mount:
        yield mount


def test_a_full_disk_under_the_trace_directory_stops_the_trace_not_the_run(
    tmp_path, full_disk
) -> None:
    """A host sends more trace files than the trace directory's disk holds: one line says the
    trace collection stopped, the verdict (which no longer fits either) is said, and the run
    ends succeeded — never left 'running'."""
    chunk = os.urandom(24 * 1024)
    script = [piece(f"raw/p{i}.xplane.pb", chunk) for i in range(6)]
    outcome, links, run, out = traced_run(tmp_path, script, trace_dir=full_disk)
    assert outcome.code == 0, out
    record = run.record()
    assert (record.state, record.exit_code) == ("succeeded", 0)
    stopped = [x for x in out.splitlines() if "trace collection stopped" in x]
    assert len(stopped) == 1 and "No space left on device" in stopped[0], out
    assert "b's trace files failed" in stopped[0]
    assert "closed its agent's link" not in out
    verdict = trace_files.read_verdict(full_disk)
    if verdict is None:  # the disk had no room for it: the coordinator said so
        assert "trace: could not write verdict.json" in out, out
    else:
        assert not verdict[0] and verdict[1].startswith("no trace because writing b's trace")


@pytest.mark.parametrize("planted", ["raw", "raw/plugins", "tasks"])
def test_a_folder_symlink_planted_in_the_trace_directory_receives_nothing(
    tmp_path, planted
) -> None:
    """A task sharing the trace directory (local backend, a shared file system) plants a link
    to a folder of the user's where a host's files or notes go: nothing is written through it,
    at any depth (O_NOFOLLOW guarded the last component only)."""
    trace_dir = tmp_path / "trace"
    outside = tmp_path / "outside"
    outside.mkdir()
    link = trace_dir / planted
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    script = [piece("raw/plugins/profile/1/b.xplane.pb", b"abc"), note("worker-1.python", "41")]
    outcome, _, run, out = traced_run(tmp_path, script, trace_dir=trace_dir)
    assert outcome.code == 0 and run.record().state == "succeeded", out
    assert list(outside.rglob("*")) == [], out
    refused = [x for x in out.splitlines() if "closed its agent's link" in x]
    assert len(refused) == 1 and f"{planted.rpartition('/')[2]} is not a folder of" in refused[0]


@pytest.fixture
def full_runs_disk(tmp_path):
    """A 512 KiB tmpfs holding the runs directory itself, trace and all."""
    with small_tmpfs(tmp_path, "512k") as mount:
        yield mount


def test_a_full_disk_holding_the_run_ends_it_succeeded_with_no_partial_trace_files(
    full_runs_disk,
) -> None:
    """The trace fills the disk the run directory is on: the hosts' files written so far are
    removed, so the run's end record fits and says succeeded (it stayed 'running', the end
    write failing out of coordinate())."""
    chunk = os.urandom(64 * 1024)
    script = [piece(f"raw/p{i}.xplane.pb", chunk) for i in range(12)]
    outcome, _, run, out = traced_run(full_runs_disk, script)
    assert outcome.code == 0, out
    record = run.record()
    assert (record.state, record.exit_code) == ("succeeded", 0), out
    assert len([x for x in out.splitlines() if "trace collection stopped" in x]) == 1, out
    assert [p for p in (run.dir / "trace").rglob("*.xplane.pb")] == []
