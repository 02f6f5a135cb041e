"""`tflaunch report RUN --html`: one self-contained page, opened in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import skip_or_fail

from tflaunch.runtime.run import Run
from tflaunch.tools.report_html import write_html_report

FAKE = Path(__file__).parent / "programs" / "fake_task.py"
SECTIONS = ("Run", "Tasks", "Timeline", "Plots", "Resources", "Files")


def _run_cluster(tmp_path: Path, fail: bool) -> Path:
    """A real local run of stand-in tasks: worker 1 fails once and is restarted, or for good."""
    restart = "" if fail else "  restart: {worker: on-failure}\n"
    (tmp_path / "c.yaml").write_text(
        "name: html\nbackend: local\n"
        f"program:\n  argv: [{sys.executable}, {FAKE}]\n"
        '  env: {WORK_SECONDS: "1", FAIL_INDEX: "1", FAIL_CODE: "3", FAIL_RUNS: "1"}\n'
        "roles: {ps: 1, worker: 2}\nports: {ps: 24230, worker: 24220}\n"
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
