"""A run's liveness is its launcher's identity (machine, PID namespace, pid, start time), never a
hostname and pid: a second "machine" here is a second PID namespace with the same hostname
(``unshare --pid --fork --mount-proc``), as two containers sharing a runs directory are."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from tests.helpers import (
    ROOT,
    gone_launcher,
    in_second_pid_namespace,
    left_behind_run,
    live_detached_run,
    tflaunch,
)
from tflaunch.runtime.identity import Launcher, machine_id
from tflaunch.runtime.run import Run


def test_an_identity_round_trips_through_run_json_and_a_tag():
    me = Launcher.current()
    assert me.host == socket.gethostname() and me.pid == os.getpid()
    assert Launcher.from_dict(me.to_dict()) == me
    assert Launcher.from_tag(me.tag()) == me
    assert me.alive() is True and me.here


def test_what_is_not_an_identity_is_none():
    me = Launcher.current()
    assert Launcher.from_tag(f"{me.host}:{me.pid}:{int(me.started)}") is None  # an older tag
    assert Launcher.from_tag("garbage") is None
    assert Launcher.from_tag("h:x:1:m") is None
    for bad in ({**me.to_dict(), "pid": "1"}, {**me.to_dict(), "machine": "a b"}, [], None):
        assert Launcher.from_dict(bad) is None


def test_a_gone_process_is_dead_here_and_another_machines_is_unknown():
    gone = gone_launcher()
    assert gone.alive() is False
    reused = Launcher(gone.host, gone.machine, os.getpid(), gone.started)  # our pid, not our start
    assert reused.alive() is False
    elsewhere = Launcher(socket.gethostname(), f"{machine_id()}0", os.getpid(), gone.started)
    assert elsewhere.alive() is None and "another machine" in elsewhere.describe()


def test_run_create_names_its_launcher_before_anything_else(tmp_path):
    run = Run.create(tmp_path, "r")
    record = run.record()
    assert record.state == "created" and record.launcher == Launcher.current()
    assert record.created is not None and record.name == "r"


def test_a_run_of_another_machine_is_unknown_kept_by_prune_and_removed_only_by_rm_force(tmp_path):
    runs = tmp_path / "runs"
    other = Launcher(socket.gethostname(), "another-boot/4026531836", os.getpid(), 1.0)
    run = left_behind_run(runs, "far", "local", started=time.time() - 60, state="running")
    run.update_meta(launcher=other)
    listed = tflaunch("status", "--runs-dir", str(runs), "--json")
    (row,) = json.loads(listed.stdout)
    assert row["state"] == "unknown", row
    assert "another machine or container: another-boot/4026531836" in row["problem"]
    kept = tflaunch("prune", "--older-than", "0s", "--runs-dir", str(runs))
    assert f"kept {run.id}: cannot tell whether it still runs" in kept.stdout
    refused = tflaunch("rm", run.id, "--runs-dir", str(runs))
    assert refused.returncode == 2 and f"run {run.id} may still be running" in refused.stderr
    assert "--force" in refused.stderr and run.dir.is_dir()
    forced = tflaunch("rm", "--force", run.id, "--runs-dir", str(runs))
    assert forced.returncode == 0 and not run.dir.exists(), forced.stderr


LAUNCHER = """
import sys, time
from tflaunch.runtime.run import Run
run = Run.create(sys.argv[1], "waiting")
print(run.id, flush=True)
time.sleep(120)  # a launcher waiting for its instances
"""


def test_a_created_run_is_live_while_its_launcher_runs_and_lost_after(tmp_path):
    runs = tmp_path / "runs"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(runs)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        run_id = launcher.stdout.readline().strip()
        refused = tflaunch("rm", run_id, "--runs-dir", str(runs))
        assert refused.returncode == 2, refused.stderr
        assert f"run {run_id} is still running (state created)" in refused.stderr
        kept = tflaunch("prune", "--older-than", "0s", "--runs-dir", str(runs))
        assert f"kept {run_id}: still running" in kept.stdout
        assert (runs / run_id).is_dir()
    finally:
        launcher.kill()
        launcher.wait()
    listed = json.loads(tflaunch("status", "--runs-dir", str(runs), "--json").stdout)
    assert [r["state"] for r in listed] == ["lost"]
    assert tflaunch("rm", run_id, "--runs-dir", str(runs)).returncode == 0
    assert not (runs / run_id).exists()


def test_rm_and_prune_from_a_second_pid_namespace_refuse_a_live_run(tmp_path, second_pid_namespace):
    with live_detached_run(tmp_path) as (runs, run_id):
        listed = in_second_pid_namespace("status", "--runs-dir", str(runs), "--json")
        (row,) = json.loads(listed.stdout)
        assert row["state"] == "unknown", row
        assert (
            f"pid {json.loads((runs / run_id / 'run.json').read_text())['launcher']['pid']}"
            in (row["problem"])
        )
        shown = in_second_pid_namespace("status", run_id, "--runs-dir", str(runs))
        assert f"run {run_id}: unknown (backend local)" in shown.stdout, shown.stderr
        assert "state unknown: its launcher is pid " in shown.stdout
        refused = in_second_pid_namespace("rm", run_id, "--runs-dir", str(runs))
        assert refused.returncode == 2 and f"run {run_id} may still be running" in refused.stderr
        kept = in_second_pid_namespace("prune", "--older-than", "0s", "--runs-dir", str(runs))
        assert f"kept {run_id}: cannot tell whether it still runs" in kept.stdout
        down = in_second_pid_namespace("down", run_id, "--runs-dir", str(runs))
        assert down.returncode == 2 and "which this machine cannot see" in down.stderr
        assert (runs / run_id / "run.json").is_file()
        here = json.loads(tflaunch("status", "--runs-dir", str(runs), "--json").stdout)
        assert [r["state"] for r in here] == ["running"]  # as this machine sees it
