"""The smaller messages of issue 40, each saying what is true: report --html without matplotlib,
up --detach's help on batch backends, status of a run whose run.json is corrupt, an ambiguous run
id, a backend no installed package provides, and the status line drawn with the step just
printed, not the one before."""

from __future__ import annotations

import io
import json
import sys

from click.testing import CliRunner

from tests.helpers import left_behind_run
from tflaunch.cli import cli
from tflaunch.cluster.config import parse_config
from tflaunch.errors import ConfigError
from tflaunch.runtime.statusline import StatusLine
from tflaunch.tools.report_html import write_html_report


def test_report_html_without_matplotlib_says_so_not_that_sampling_was_off(tmp_path, monkeypatch):
    run = left_behind_run(tmp_path / "runs", "html", "local", state="succeeded", exit_code=0)
    sample = {"time": 1.0, "host": "h", "node": {"cpu_percent": 5}, "tasks": {}}
    (run.dir / "samples-h.jsonl").write_text(
        "".join(json.dumps({**sample, "time": float(i)}) + "\n" for i in range(5))
    )
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    page = write_html_report(run).read_text()
    assert "No resource plots: the plots need matplotlib" in page
    assert "sample_interval: 0" not in page


def test_up_help_says_detach_returns_at_submission_on_batch_backends():
    shown = CliRunner().invoke(cli, ["up", "--help"], terminal_width=200)
    assert "once the job is submitted" in " ".join(shown.output.split())


def test_status_of_a_run_whose_run_json_is_corrupt_says_so(tmp_path):
    run = left_behind_run(tmp_path / "runs", "bad", "local", state="running")
    run.meta_path.write_text("{not json")
    shown = CliRunner().invoke(cli, ["status", "--runs-dir", str(tmp_path / "runs"), run.id])
    assert f"run {run.id}: unreadable: " in shown.output, shown.output
    assert "backend None" not in shown.output


def test_an_ambiguous_run_prefix_lists_the_runs_it_matches_only(tmp_path):
    runs = tmp_path / "runs"
    matching = [left_behind_run(runs, "alpha", "local", state="succeeded") for _ in range(2)]
    other = left_behind_run(runs, "beta", "local", state="succeeded")
    shown = CliRunner().invoke(cli, ["status", "--runs-dir", str(runs), "alpha"])
    assert shown.exit_code == 2, shown.output
    assert "is ambiguous" in shown.output and "it starts 2 run ids" in shown.output
    assert all(run.id in shown.output for run in matching) and other.id not in shown.output


def test_a_backend_no_installed_package_provides_says_where_backends_come_from():
    try:
        parse_config("backend: lsf\nprogram: [p]\n")
    except ConfigError as err:
        message = str(err)
    else:
        raise AssertionError("backend: lsf was accepted")
    assert "expected one of 'local', 'slurm', 'ssh'" in message
    assert "packages installed here" in message and "tflaunch.backends" in message


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_status_line_is_drawn_with_the_step_just_printed(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    said = {"step": 0}
    out = Terminal()
    line = StatusLine(out, lambda: f"status at step {said['step']}")
    try:
        said["step"] = 7
        line.write("[worker:0] step 7", redraw=True)
        after = out.getvalue().split("[worker:0] step 7", 1)[1]
        assert "status at step 7" in after
    finally:
        line.stop()
