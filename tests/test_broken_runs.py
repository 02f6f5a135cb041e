"""Broken runs are rows, never tracebacks (issue 39): stamps no calendar holds, a detached SSH
run without its plan.json, and detached runs whose hosts accept a connection but never speak,
listed by ``status`` and pruned around by ``prune``."""

from __future__ import annotations

import json
import socket
import time

import pytest
from click.testing import CliRunner

from tests.helpers import free_port_base, left_behind_run, tflaunch
from tflaunch.cli import cli
from tflaunch.launchers.ssh.details import SshDetails
from tflaunch.runtime.run import Run
from tflaunch.text import local_time, usable_time
from tflaunch.tools.runs import PROBE_DEADLINE_S

BAD_STAMPS = {"inf": "1e400", "nan": "NaN", "past": "-1e18", "future": "1e18"}


def _with_started(run: Run, literal: str) -> None:
    """run.json with ``started`` written as the JSON literal (1e400 reads back as infinity)."""
    data = json.loads(run.meta_path.read_text())
    data["started"] = "STAMP"
    run.meta_path.write_text(json.dumps(data).replace('"STAMP"', literal))


def _strict_json(text: str):
    def refuse(token: str):
        raise AssertionError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_time_no_calendar_holds_is_no_time():
    for value in (float("inf"), float("nan"), -1e18, 1e18, "yesterday", True, None):
        assert usable_time(value) is None and local_time(value) == "-", value
    assert usable_time(1_700_000_000) == 1.7e9 and local_time(0.0) != "-"


def _stamped_runs(runs):
    for name, literal in BAD_STAMPS.items():
        run = left_behind_run(runs, name, "local", started=1.0, state="failed", exit_code=1)
        run.update_meta(ended=2.0)
        _with_started(run, literal)
    return left_behind_run(runs, "good", "local", started=time.time() - 60, state="failed")


def test_status_and_the_html_report_list_runs_whose_stamps_are_out_of_range(tmp_path):
    runs = tmp_path / "runs"
    good = _stamped_runs(runs)
    table = CliRunner().invoke(cli, ["status", "--runs-dir", str(runs)])
    assert table.exit_code == 0, table.output
    rows = {line.split()[1]: line.split() for line in table.output.splitlines()[1:]}
    for name in BAD_STAMPS:
        assert rows[name][2:6] == ["local", "failed", "-", "-"], rows[name]
    assert rows["good"][4] != "-" and good.id in table.output
    listed = CliRunner().invoke(cli, ["status", "--runs-dir", str(runs), "--json"])
    assert listed.exit_code == 0, listed.output
    by_name = {row["name"]: row for row in _strict_json(listed.output)}
    assert all(by_name[n]["started"] is None for n in BAD_STAMPS)
    for name in BAD_STAMPS:
        (found,) = [p for p in runs.iterdir() if p.name.startswith(name + "-")]
        html = CliRunner().invoke(cli, ["report", found.name, "--html", "--runs-dir", str(runs)])
        assert html.exit_code == 0, (name, html.output, html.exception)


def _plan_less_detached_run(runs) -> Run:
    run = left_behind_run(runs, "planless", "ssh", started=time.time() - 600, state="running")
    run.update_part(SshDetails, detached=True, ssh_coordinator="h", ssh_coordinator_pid=1)
    run.plan_path.unlink()
    return run


def test_a_detached_run_without_its_plan_is_unreadable_and_prune_goes_on(tmp_path):
    runs = tmp_path / "runs"
    planless = _plan_less_detached_run(runs)
    done = [
        left_behind_run(runs, f"done{i}", "local", started=1000.0 + i, state="failed")
        for i in range(2)
    ]
    listed = CliRunner().invoke(cli, ["status", "--runs-dir", str(runs)])
    assert listed.exit_code == 0, listed.output
    assert f"{planless.id}: unreadable: no plan.json" in listed.output
    alone = CliRunner().invoke(cli, ["status", planless.id, "--runs-dir", str(runs)])
    assert alone.exit_code == 0 and alone.output.startswith(
        f"run {planless.id}: unreadable: no plan.json"
    ), alone.output
    as_json = CliRunner().invoke(cli, ["status", planless.id, "--runs-dir", str(runs), "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.output)["state"] == "unreadable"

    dry = CliRunner().invoke(
        cli, ["prune", "--older-than", "1s", "--runs-dir", str(runs), "--dry-run"]
    )
    assert dry.exit_code == 0, dry.output
    assert f"kept {planless.id}: unreadable: no plan.json" in dry.output
    assert all(f"would remove {run.id}" in dry.output for run in done)
    pruned = CliRunner().invoke(cli, ["prune", "--older-than", "1s", "--runs-dir", str(runs)])
    assert pruned.exit_code == 0, pruned.output
    assert [p.name for p in runs.iterdir()] == [planless.id]


@pytest.fixture
def hung_host():
    """A port that accepts connections (the kernel completes them) and never says a word."""
    port = free_port_base(1)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        yield port


def test_twenty_detached_runs_on_hosts_that_never_speak_cost_the_list_one_deadline(
    tmp_path, hung_host
):
    """Each run's hosts would cost their 10 s connect timeout, one after another (200 s); asked
    at once under one deadline, the list is out a few seconds after it starts. A timed
    behaviour: measured against the same command over an empty runs dir (its start-up)."""
    runs = tmp_path / "runs"
    (tmp_path / "known_hosts").write_text("")
    options = {
        "user": "nobody",
        "port": hung_host,
        "connect_timeout": 10.0,
        "known_hosts": str(tmp_path / "known_hosts"),
    }
    for i in range(20):
        run = left_behind_run(runs, f"hung{i}", "ssh", started=time.time() - i, state="running")
        run.update_part(
            SshDetails,
            detached=True,
            ssh_coordinator="h",
            ssh_coordinator_pid=1,
            ssh_options=options,
            ssh_hosts={"h": {"workdir": "/tmp", "run_dir": f"/tmp/{run.id}"}},
        )
        plan = json.loads(run.plan_path.read_text())
        plan["hosts"][0]["connect_address"] = "127.0.0.1"
        run.plan_path.write_text(json.dumps(plan))
    begun = time.monotonic()
    empty = tflaunch("status", "--runs-dir", str(tmp_path / "empty"), timeout=60)
    start_up = time.monotonic() - begun
    begun = time.monotonic()
    listed = tflaunch("status", "--runs-dir", str(runs), "--json", timeout=60)
    took = time.monotonic() - begun
    assert empty.returncode == 0 and listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert len(rows) == 20
    for row in rows:
        assert row["state"] == "unknown", row
        assert f"no answer within {PROBE_DEADLINE_S:g} s" in row["problem"], row
    assert took - start_up < 10.0, f"status took {took:.1f} s, {start_up:.1f} s to start"
