"""Run directories are private (0700, files 0600) unless run_dir_mode says otherwise, and
program.env_from reaches the tasks without being written to the run directory."""

from __future__ import annotations

import ast
import os
import stat
import sys

import pytest

from tests.helpers import ROOT, tflaunch, write_cluster
from tflaunch.cluster.config import parse_config
from tflaunch.launch import prepare
from tflaunch.runtime.run import Run
from tflaunch.runtime.runfiles import open_run_file


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def usual_umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_run_directory_0700_and_plan_json_0600(tmp_path, usual_umask):
    config = parse_config("program: [p]\nroles: {ps: 1, worker: 1}\n", source="c.yaml")
    plan, run = prepare(config, str(tmp_path / "runs"))
    assert mode(run.dir) == 0o700
    assert mode(run.plan_path) == 0o600 and mode(run.meta_path) == 0o600
    with open_run_file(run.events_path, "a") as f:
        f.write("{}\n")
    assert mode(run.events_path) == 0o600


def test_run_dir_mode_shares_with_the_group(tmp_path, usual_umask):
    config = parse_config("program: [p]\nrun_dir_mode: '0750'\n", source="c.yaml")
    _, run = prepare(config, str(tmp_path / "runs"))
    assert mode(run.dir) == 0o750 and mode(run.plan_path) == 0o640


def test_an_existing_run_directory_keeps_its_mode(tmp_path, usual_umask):
    run = Run.create(tmp_path, "x", "r1")
    os.chmod(run.dir, 0o750)
    Run.create(tmp_path, "x", "r1")  # a resubmitted job, an agent beside the launcher
    assert mode(run.dir) == 0o750


def test_env_from_reaches_the_task_but_no_run_file(tmp_path, usual_umask):
    secret = "s3cr3t-value-for-the-test"
    program = {
        "argv": [sys.executable, "-c", "import os; print('got', os.environ['TFL_SECRET'])"],
        "env_from": ["TFL_SECRET"],
    }
    cluster = write_cluster(tmp_path / "c.yaml", program, roles={"ps": 0, "worker": 1})
    missing = tflaunch("up", str(cluster), unset=("TFL_SECRET",))
    assert missing.returncode == 2
    assert "program.env_from names TFL_SECRET, which is not set" in missing.stderr
    assert not (tmp_path / "runs").exists()
    result = tflaunch("up", str(cluster), env={"TFL_SECRET": secret})
    assert result.returncode == 0, result.stderr
    assert f"got {secret}" in result.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert mode(run_dir) == 0o700
    files = [p for p in run_dir.iterdir() if p.is_file()]
    assert {"plan.json", "run.json", "events.jsonl", "worker-0.log"} <= {p.name for p in files}
    for path in files:
        assert mode(path) == 0o600, path
        if path.name != "worker-0.log":
            assert secret not in path.read_text(), path


# The modules that read run files back (the run list, status, logs, report, --html): every read
# goes through runfiles' safe reader, never a plain open() or Path.read_text() of a run path.
RUN_FILE_READERS = (
    "tflaunch/runtime/run.py",
    "tflaunch/runtime/runctl.py",
    "tflaunch/runtime/monitor.py",
    "tflaunch/runtime/progress.py",
    "tflaunch/tools/runs.py",
    "tflaunch/tools/report.py",
    "tflaunch/tools/report_html.py",
    "tflaunch/tools/step_rates.py",
)


def raw_file_reads(path) -> list[str]:
    """Calls in ``path`` that open or read a file other than through runfiles (``os.open`` of
    a lock, ``/proc`` files and ``Run.open`` aside)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func, where = node.func, f"{path.name}:{node.lineno}"
        if isinstance(func, ast.Attribute) and func.attr in ("read_text", "read_bytes"):
            found.append(f"{where}: .{func.attr}()")
        elif isinstance(func, ast.Attribute) and func.attr == "open":
            owner = func.value.id if isinstance(func.value, ast.Name) else ""
            if owner not in ("os", "Run", "cls"):
                found.append(f"{where}: .open()")
        elif isinstance(func, ast.Name) and func.id == "open":
            first = node.args[0] if node.args else None
            text = ast.unparse(first) if first is not None else ""
            if not text.startswith(("f'/proc/", 'f"/proc/', "'/proc/", '"/proc/')):
                found.append(f"{where}: open({text})")
    return found


def test_run_file_readers_read_only_through_runfiles():
    found = [hit for name in RUN_FILE_READERS for hit in raw_file_reads(ROOT / name)]
    assert found == [], "read run files with runfiles.open_for_reading & co:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "code", ["x = run.plan_path.read_text()", "f = path.open()", "f = open(run.dir / 'x')"]
)
def test_the_reader_scan_finds_a_raw_read(tmp_path, code):
    module = tmp_path / "m.py"
    module.write_text((ROOT / "tflaunch/tools/runs.py").read_text() + "\n\n" + code + "\n")
    assert raw_file_reads(module)


def test_logs_of_a_fifo_or_a_dev_zero_link_say_so_and_do_not_hang(tmp_path):
    from click.testing import CliRunner

    from tests.helpers import left_behind_run
    from tflaunch.cli import cli

    run = left_behind_run(tmp_path / "runs", "logs", "local", state="failed", exit_code=1)
    (run.dir / "worker-0.log").symlink_to("/dev/zero")
    result = CliRunner().invoke(cli, ["logs", run.id, "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0 and "[tflaunch] unreadable: " in result.output
    assert "worker-0.log is a symlink" in result.output
    (run.dir / "worker-0.log").unlink()
    os.mkfifo(run.dir / "worker-0.log")
    result = CliRunner().invoke(cli, ["logs", run.id, "--runs-dir", str(tmp_path / "runs")])
    assert "worker-0.log is a FIFO, not a regular file" in result.output


def test_a_log_line_without_newlines_comes_in_pieces_not_whole(tmp_path):
    from tflaunch.runtime.runfiles import LINE_LIMIT, run_file_lines, tail_lines

    path = tmp_path / "x.log"
    path.write_bytes(b"y" * (3 * LINE_LIMIT + 5) + b"\nlast\n")
    assert [len(line) for line in run_file_lines(path)] == [LINE_LIMIT] * 3 + [5, 4]
    assert tail_lines(path, 2) == ["last"]  # the piece cut at the window's start is left out
