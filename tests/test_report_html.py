"""`tflaunch report RUN --html`: one self-contained page, opened in headless Chromium."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import skip_or_fail
from tests.helpers import cpu_bounded, free_port_base, left_behind_run
from tflaunch.cli import cli
from tflaunch.runtime.run import Run
from tflaunch.tools.report_html import write_html_report

FAKE = Path(__file__).parent / "programs" / "fake_task.py"
SECTIONS = ("Run", "Tasks", "Timeline", "Plots", "Resources", "Files")


def _run_cluster(tmp_path: Path, fail: bool) -> Path:
    """A real local run of stand-in tasks: worker 1 fails once and is restarted, or for good."""
    restart = "" if fail else "  restart: {worker: on-failure}\n"
    base = free_port_base()  # not fixed ports: the other pytest worker's runs may hold them
    (tmp_path / "c.yaml").write_text(
        "name: html\nbackend: local\n"
        f"program:\n  argv: [{sys.executable}, {FAKE}]\n"
        '  env: {WORK_SECONDS: "1", FAIL_INDEX: "1", FAIL_CODE: "3", FAIL_RUNS: "1"}\n'
        f"roles: {{ps: 1, worker: 2}}\nports: {{ps: {base + 10}, worker: {base}}}\n"
        f"supervision:\n  sample_interval: 0.3\n{restart}"
    )
    done = subprocess.run(
        [sys.executable, "-m", "tflaunch", "up", "c.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == (3 if fail else 0), done.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    return run_dir


def _sections(page: str) -> list[str]:
    return re.findall(r"<section id=\"[^\"]+\"><h2>([^<]+)</h2>", page)


@pytest.mark.slow
def test_a_restarted_run_shows_its_restart_and_every_plot_inline(tmp_path):
    run_dir = _run_cluster(tmp_path, fail=False)
    path = write_html_report(Run.open(tmp_path / "runs", run_dir.name))
    page = path.read_text()
    assert _sections(page) == list(SECTIONS)
    assert '<span class="state succeeded">succeeded</span>' in page
    assert "1 (last: 3)" in page  # worker:1's restart and its cause
    assert page.count("data:image/png;base64,") == 4  # the four resource plots, embedded
    assert 'src="http' not in page and "<script" not in page  # nothing fetched, nothing run
    assert 'class="failed"' not in page  # the PS stopped at the end is no failure


@pytest.mark.slow
def test_a_failed_run_shows_the_failure_report_and_the_log_tail(tmp_path):
    run_dir = _run_cluster(tmp_path, fail=True)
    page = write_html_report(Run.open(tmp_path / "runs", run_dir.name)).read_text()
    assert '<span class="state failed">failed</span>' in page
    assert "worker:1 on localhost exited with code 3." in page  # the failure report
    assert "worker:1: the last" in page  # its log's tail under the task table
    assert page.count('<tr class="failed">') == 1


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        skip_or_fail("headless Chromium is not installed (Debian package chromium)")
    return subprocess.run(
        [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def test_the_console_check_sees_a_script_error(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>noSuchFunction();</script></body></html>")
    done = _chromium("--dump-dom", bad.as_uri())
    assert any("noSuchFunction" in line for line in _console_errors(done.stderr))


@pytest.mark.slow
def test_the_page_opens_in_headless_chromium(tmp_path):
    run_dir = _run_cluster(tmp_path, fail=True)
    path = write_html_report(Run.open(tmp_path / "runs", run_dir.name))
    dom = _chromium("--dump-dom", path.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert _console_errors(dom.stderr) == []
    assert _sections(dom.stdout) == list(SECTIONS)
    shot = tmp_path / "report.png"
    done = _chromium("--window-size=1200,2000", f"--screenshot={shot}", path.as_uri())
    assert done.returncode == 0 and shot.stat().st_size > 20_000
    keep = Path(__file__).parent.parent / "runs" / "report-html-screenshot.png"
    keep.parent.mkdir(exist_ok=True)
    shutil.copy(shot, keep)  # for a person to look at (runs/ is ignored)


# ---- broken and hostile run directories (no real run: the directory as it was left) ----------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_run_that_failed_while_its_machines_were_made_gets_a_page(tmp_path):
    run = Run.create(tmp_path / "runs", "prov")
    run.update_meta(backend="ssh", state="failed", exit_code=2, message="no capacity in us-x-1")
    path = write_html_report(run)
    page = path.read_text()
    assert _sections(page) == ["Run", "Tasks", "Timeline", "Plots", "Files"]
    assert '<span class="state failed">failed</span>' in page and "no capacity in us-x-1" in page
    assert "No plan: the run ended before its tasks were placed" in page
    assert "No events were recorded." in page
    assert _mode(path) == 0o600


def test_the_page_embeds_nothing_reached_through_links_planted_in_the_run_dir(tmp_path):
    run = left_behind_run(tmp_path / "runs", "planted", "local", state="failed", exit_code=1)
    outside = tmp_path / "outside"
    (outside / "trace").mkdir(parents=True)
    (outside / "secret.txt").write_text("SECRET-TEXT")
    (outside / "secret.png").write_bytes(b"\x89PNG-SECRET-PNG")
    (outside / "trace" / "trace_summary.txt").write_text("SECRET-TRACE")
    (outside / "trace" / "t.png").write_bytes(b"\x89PNG-SECRET-DIR")
    (run.dir / "summary.txt").symlink_to(outside / "secret.txt")
    (run.dir / "plot.png").symlink_to(outside / "secret.png")
    (run.dir / "trace").symlink_to(outside / "trace")
    (run.dir / "netbench.txt").symlink_to("/dev/zero")
    os.mkfifo(run.dir / "model.txt")
    (run.dir / "own.png").write_bytes(b"\x89PNG-OWN")
    page = write_html_report(run).read_text()
    for secret in (b"SECRET-TEXT", b"\x89PNG-SECRET-PNG", b"SECRET-TRACE", b"\x89PNG-SECRET-DIR"):
        assert (
            base64.b64encode(secret).decode() not in page and secret.decode("latin-1") not in page
        )
    assert base64.b64encode(b"\x89PNG-OWN").decode() in page
    assert "summary.txt is a symlink" in page and "model.txt is a FIFO" in page
    assert "trace_summary.txt: trace is not a folder of" in page
    assert 'href="trace/trace.json"' not in page


def test_the_page_and_report_files_replace_planted_links_and_take_the_runs_mode(tmp_path):
    run = left_behind_run(tmp_path / "runs", "links", "local", state="succeeded", exit_code=0)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (run.dir / "report.html").symlink_to(victim)
    (run.dir / "summary.json").symlink_to(victim)
    (run.dir / "samples-h.jsonl").write_text(
        json.dumps({"time": 1.0, "host": "h", "node": {"cpu_percent": 5}, "tasks": {}}) + "\n"
    )
    path = write_html_report(run)
    assert victim.read_text() == "keep me"
    assert not path.is_symlink() and _mode(path) == 0o600
    assert not (run.dir / "summary.json").is_symlink() and _mode(run.dir / "summary.json") == 0o600


def test_a_symlinked_out_is_refused_and_a_new_one_gets_the_runs_mode(tmp_path):
    run = left_behind_run(tmp_path / "runs", "out", "local", state="succeeded", exit_code=0)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "link").symlink_to(elsewhere)
    report = ["report", run.id, "--runs-dir", str(tmp_path / "runs"), "--html", "--out"]
    refused = CliRunner().invoke(cli, [*report, str(tmp_path / "link")])
    assert refused.exit_code == 2 and "is a symlink" in refused.output, refused.output
    assert list(elsewhere.iterdir()) == []
    made = CliRunner().invoke(cli, [*report, str(tmp_path / "new")])
    assert made.exit_code == 0, made.output
    assert _mode(tmp_path / "new") == 0o700 and _mode(tmp_path / "new" / "report.html") == 0o600


def test_a_failed_tasks_400_mb_log_is_read_from_its_end(tmp_path):
    run = left_behind_run(tmp_path / "runs", "biglog", "local", state="failed", exit_code=3)
    with run.events_path.open("w") as f:
        f.write(json.dumps({"event": "exited", "task": "worker:0", "code": 3, "time": 1.0}) + "\n")
    log = run.dir / "worker-0.log"
    with log.open("wb") as f:
        f.truncate(400 << 20)  # sparse: 400 MB on the file's length, nothing on disk
        f.seek(0, os.SEEK_END)
        f.write(b"".join(b"line %d\n" % i for i in range(100)))
    with cpu_bounded(5):
        page = write_html_report(run).read_text()
    assert "worker:0: the last 20 lines of worker-0.log" in page
    assert "line 99" in page and "line 80" in page and "line 79" not in page
