"""``tflaunch status`` without a run id, ``rm`` and ``prune``: real runs of the local backend
(stand-in tasks), beside run directories of the other backends as they are left behind."""

from __future__ import annotations

import json
import os
import time

import pytest
from click.testing import CliRunner

from tests.helpers import (
    cpu_bounded,
    cpu_seconds,
    left_behind_run,
    live_detached_run,
    tflaunch,
)
from tflaunch.cli import cli
from tflaunch.launchers.slurm.script import SlurmDetails
from tflaunch.runtime.run import Outcome, Run
from tflaunch.tools.runs import parse_age


@pytest.fixture
def runs(tmp_path):
    """Three runs of three backends: a succeeded local run that restarted once, a Slurm run
    whose job was never submitted (lost), and an SSH run whose coordinator died (lost)."""
    runs = tmp_path / "runs"
    now = time.time()
    done = left_behind_run(runs, "done", "local", started=now - 300, state="running")
    with done.events_path.open("w") as f:
        f.write(json.dumps({"event": "restarting", "task": "worker:0", "code": 1}) + "\n")
    done.finish(Outcome(0, "ok"))
    done.update_meta(ended=now - 240)
    left_behind_run(runs, "queued", "slurm", started=now - 200, state="submitted")
    left_behind_run(runs, "dead", "ssh", started=now - 100, state="running")
    return runs


def test_status_lists_runs_of_every_backend_newest_first_as_json(runs):
    result = CliRunner().invoke(cli, ["status", "--runs-dir", str(runs), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["name"], r["backend"], r["state"]) for r in rows] == [
        ("dead", "ssh", "lost"),
        ("queued", "slurm", "lost"),
        ("done", "local", "succeeded"),
    ]
    done = rows[2]
    assert done["duration"] == pytest.approx(60, abs=1)
    assert (done["tasks"], done["restarts"], done["exit_code"]) == (1, 1, 0)
    assert rows[0]["duration"] is None and rows[0]["exit_code"] is None


def test_status_table_shows_the_last_20_unless_all(tmp_path):
    runs = tmp_path / "runs"
    for i in range(22):
        left_behind_run(runs, f"r{i}", "local", started=1000.0 + i, state="failed", exit_code=1)
    table = CliRunner().invoke(cli, ["status", "--runs-dir", str(runs)]).output.splitlines()
    assert table[0].split()[:4] == ["RUN", "NAME", "BACKEND", "STATE"]
    assert table[1].split()[1:4] == ["r21", "local", "failed"] and len(table) == 22
    assert table[-1] == "(2 older run(s) not shown; --all shows every run)"
    every = CliRunner().invoke(cli, ["status", "--runs-dir", str(runs), "--all"]).output
    assert len(every.splitlines()) == 23 and " r0 " in every


def test_status_of_an_empty_runs_dir_says_how_to_start(tmp_path):
    result = CliRunner().invoke(cli, ["status", "--runs-dir", str(tmp_path / "none")])
    assert result.exit_code == 0 and "no runs under" in result.output


def test_rm_and_prune_remove_ended_and_lost_runs(runs):
    dead = next(p for p in runs.iterdir() if p.name.startswith("dead"))
    result = CliRunner().invoke(cli, ["rm", dead.name[:8], "--runs-dir", str(runs)])
    assert result.exit_code == 0 and not dead.exists(), result.output
    dry = CliRunner().invoke(
        cli, ["prune", "--older-than", "220s", "--runs-dir", str(runs), "--dry-run"]
    )
    assert "would remove done-" in dry.output and len(list(runs.iterdir())) == 2
    pruned = CliRunner().invoke(cli, ["prune", "--older-than", "220s", "--runs-dir", str(runs)])
    assert pruned.exit_code == 0, pruned.output
    assert [p.name.split("-")[0] for p in runs.iterdir()] == [
        "queued"
    ]  # lost 200 s ago: younger than 220 s


def test_prune_age_needs_a_unit_it_knows():
    assert parse_age("7d") == 7 * 86400 and parse_age("90") == 90
    result = CliRunner().invoke(cli, ["prune", "--older-than", "soon"])
    assert result.exit_code == 2 and "--older-than 'soon' is not an age" in result.output


def test_live_detached_run_is_listed_running_and_refused_by_rm_and_prune(tmp_path):
    with live_detached_run(tmp_path) as (runs, run_id):
        listed = tflaunch("status", "--runs-dir", str(runs), "--json")
        (row,) = json.loads(listed.stdout)
        assert (row["id"], row["state"], row["tasks"]) == (run_id, "running", 3)
        refused = tflaunch("rm", run_id, "--runs-dir", str(runs))
        assert refused.returncode == 2
        assert f"run {run_id} is still running (state running)" in refused.stderr
        kept = tflaunch("prune", "--older-than", "0s", "--runs-dir", str(runs))
        assert f"kept {run_id}: still running" in kept.stdout and (runs / run_id).is_dir()
    assert not (runs / run_id).exists()


def test_a_run_whose_backend_cannot_be_asked_is_listed_unknown_and_kept(
    runs, monkeypatch, tmp_path
):
    run = left_behind_run(runs, "elsewhere", "slurm", started=time.time(), state="running")
    run.update_part(SlurmDetails, job_id=42)
    monkeypatch.setenv("PATH", str(tmp_path))  # no squeue here
    table = CliRunner().invoke(cli, ["status", "--runs-dir", str(runs)]).output.splitlines()
    assert table[1].split()[1:4] == ["elsewhere", "slurm", "unknown"]
    assert "state unknown: 'squeue' was not found" in table[-1]
    pruned = CliRunner().invoke(cli, ["prune", "--older-than", "0s", "--runs-dir", str(runs)])
    assert (
        "kept elsewhere-" in pruned.output and "cannot tell whether it still runs" in pruned.output
    )


def _broken(runs, name: str) -> Run:
    """A run directory whose run.json is about to be replaced by something that is not one."""
    run = Run.create(runs, name, run_id=f"{name}-20000101-000000-0000")
    run.meta_path.unlink()
    return run


@pytest.fixture
def broken_runs(runs):
    """Beside the three good runs: run.json a FIFO, a link to /dev/zero, garbage, a sparse
    2 GiB file, a record of the wrong types, a dangling link; a good run.json with a FIFO for
    its plan, and one with a link to /dev/zero for its events."""
    os.mkfifo(_broken(runs, "fifo").meta_path)
    _broken(runs, "zero").meta_path.symlink_to("/dev/zero")
    _broken(runs, "garbage").meta_path.write_bytes(b"\x00\xff{garbage")
    with _broken(runs, "huge").meta_path.open("wb") as f:
        f.truncate(2 << 30)
    _broken(runs, "typed").meta_path.write_text('{"started": "yesterday", "hosts": 3}')
    _broken(runs, "dangling").meta_path.symlink_to(runs / "nowhere")
    plan = left_behind_run(runs, "fifoplan", "local", started=time.time() - 50, state="failed")
    plan.plan_path.unlink()
    os.mkfifo(plan.plan_path)
    events = left_behind_run(runs, "zeroevents", "local", started=time.time() - 40, state="failed")
    events.events_path.symlink_to("/dev/zero")
    return runs


UNREADABLE_WHY = {
    "fifo": "run.json is a FIFO, not a regular file",
    "zero": "run.json is a symlink",
    "garbage": "run.json is not JSON",
    "huge": "run.json is 2048.0 MiB, more than the 16.0 MiB",
    "typed": "run.json is not a run record: started is 'yesterday'; hosts is 3",
    "dangling": "run.json is a symlink",
    "fifoplan": "plan.json is a FIFO, not a regular file",
    "zeroevents": "events.jsonl is a symlink",
}


def test_status_lists_the_good_runs_and_one_unreadable_row_per_broken_one_in_2s(broken_runs):
    with cpu_bounded(2.0):  # a FIFO read would hang instead: pytest's timeout catches that
        result = CliRunner().invoke(cli, ["status", "--runs-dir", str(broken_runs), "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["id"].split("-")[0]: r for r in json.loads(result.output)}
    assert {rows[n]["state"] for n in ("done", "queued", "dead")} == {"succeeded", "lost"}
    for name, why in UNREADABLE_WHY.items():
        assert rows[name]["state"] == "unreadable", rows[name]
        assert why in rows[name]["problem"], (name, rows[name]["problem"])
    table = CliRunner().invoke(cli, ["status", "--runs-dir", str(broken_runs)]).output
    assert "fifo-20000101-000000-0000: unreadable: " in table and " succeeded " in table


def test_status_as_a_process_lists_broken_runs_dir_within_2s(broken_runs, tmp_path):
    """The process's CPU time measured against the same command's over an empty runs dir (the
    interpreter's start and imports). A hang on the FIFO would run into the 30 s timeout."""
    begun = cpu_seconds()
    empty = tflaunch("status", "--runs-dir", str(tmp_path / "empty"), timeout=30)
    start_up = cpu_seconds() - begun
    begun = cpu_seconds()
    listed = tflaunch("status", "--runs-dir", str(broken_runs), timeout=30)
    used = cpu_seconds() - begun
    assert empty.returncode == 0 and listed.returncode == 0, listed.stderr
    assert used - start_up < 2.0, f"status used {used:.1f} s of CPU, {start_up:.1f} s to start"
    assert listed.stdout.count(": unreadable: ") == len(UNREADABLE_WHY)
