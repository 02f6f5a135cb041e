"""``report --out`` writes as run files are written (issue 39): no symlink followed, whole
files renamed into place, and a file there that is not tflaunch's report replaced only with
--force; its own report files (summary, plots, page) are replaced without asking."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tests.helpers import left_behind_run
from tflaunch.cli import cli


def _run(tmp_path):
    run = left_behind_run(tmp_path / "runs", "out", "local", state="succeeded", exit_code=0)
    sample = {"time": 1.0, "host": "h", "node": {"cpu_percent": 5}, "tasks": {}}
    (run.dir / "samples-h.jsonl").write_text(json.dumps(sample) + "\n")
    return run


def _report(tmp_path, run, out, *extra: str):
    argv = ["report", run.id, "--runs-dir", str(tmp_path / "runs"), "--html", "--out", str(out)]
    return CliRunner().invoke(cli, [*argv, *extra])


def test_report_out_replaces_its_own_files_and_no_one_elses_without_force(tmp_path):
    run = _run(tmp_path)
    out = tmp_path / "shared"
    first = _report(tmp_path, run, out)
    assert first.exit_code == 0, first.output
    written = sorted(p.name for p in out.iterdir())
    assert {"report.html", "summary.json", "summary.txt"} <= set(written)
    again = _report(tmp_path, run, out)  # its own files: replaced without asking
    assert again.exit_code == 0, again.output
    assert sorted(p.name for p in out.iterdir()) == written  # no temporary left behind

    (out / "summary.txt").write_text("my notes\n")
    refused = _report(tmp_path, run, out)
    assert refused.exit_code == 2 and "summary.txt exists and was not written by tflaunch" in (
        refused.output
    )
    assert (out / "summary.txt").read_text() == "my notes\n"
    forced = _report(tmp_path, run, out, "--force")
    assert forced.exit_code == 0 and (out / "summary.txt").read_text().startswith(f"run {run.id}")


def test_a_symlink_planted_in_report_out_is_never_written_through(tmp_path):
    run = _run(tmp_path)
    out = tmp_path / "shared"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (out / "report.html").symlink_to(victim)
    refused = _report(tmp_path, run, out)
    assert refused.exit_code == 2 and "report.html is a symlink" in refused.output
    assert victim.read_text() == "keep me" and (out / "report.html").is_symlink()
    forced = _report(tmp_path, run, out, "--force")
    assert forced.exit_code == 0, forced.output
    assert victim.read_text() == "keep me" and not (out / "report.html").is_symlink()
