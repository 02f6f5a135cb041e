"""Detached SSH runs: the tasks outlive the launcher and its link; status/logs/down reconnect."""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers import tflaunch
from tests.hosts import ssh_hosts
from tests.ssh.fixtures import (
    cli,
    left_on_hosts,
    sleeper_cluster,
    ssh_cluster,
    tf1_argv,
    wait_ended,
    wait_hosts_clean,
)

pytestmark = [pytest.mark.slow, pytest.mark.ssh]


def detach(cluster) -> str:
    result = tflaunch("up", "--detach", str(cluster), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "detached: the coordinator runs on host1" in result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_detached_run_finishes_without_the_launcher(ssh_test_hosts, tmp_path):
    cluster = ssh_cluster(tmp_path, ssh_test_hosts, env={"WORK_SECONDS": "6"})
    run_id = detach(cluster)
    # The launcher has exited; the cluster runs on (coordinator on host 1, agents, tasks).
    running = left_on_hosts(ssh_test_hosts)
    assert any("tflaunch.launchers.ssh.on_host coordinate" in p for p in running)
    assert any("fake_task.py" in p for p in running)
    status = cli(tmp_path, "status", run_id)
    assert status.returncode == 0, status.stderr
    assert "detached: coordinator on host1" in status.stdout
    assert "worker:2" in status.stdout and "host3" in status.stdout
    logs = cli(tmp_path, "logs", "-f", run_id)
    assert logs.returncode == 0, logs.stderr
    assert "[worker:2] done" in logs.stdout and "[worker:0] done" in logs.stdout
    status = cli(tmp_path, "status", run_id)
    assert f"run {run_id}: succeeded" in status.stdout
    run_dir = tmp_path / "runs" / run_id
    assert (run_dir / "worker-1.log").read_text().splitlines()[-1] == "done"
    assert "succeeded: 5 tasks on 3 host(s)" in (run_dir / "console.log").read_text()
    assert wait_hosts_clean(ssh_test_hosts, 15) == []


def test_detached_run_survives_a_cut_link_and_down_stops_it(ssh_test_hosts, tmp_path):
    cluster = ssh_cluster(tmp_path, ssh_test_hosts, env={"WORK_SECONDS": "600"})
    run_id = detach(cluster)
    ssh_hosts.cut_launcher_link(ssh_test_hosts)
    try:
        time.sleep(10)  # longer than supervision.heartbeat_timeout (6 s)
    finally:
        ssh_hosts.restore_launcher_link(ssh_test_hosts)
    tasks = [p for p in left_on_hosts(ssh_test_hosts) if "fake_task.py" in p]
    assert len(tasks) == 5  # 2 PS + 3 workers still running
    stopped_at = time.monotonic()
    down = cli(tmp_path, "down", run_id)
    assert down.returncode == 0, down.stderr
    assert f"run {run_id} is down (state: stopped)" in down.stdout
    assert wait_hosts_clean(ssh_test_hosts, max(1.0, 30 - (time.monotonic() - stopped_at))) == []
    status = cli(tmp_path, "status", run_id)
    assert f"run {run_id}: stopped" in status.stdout


def test_detached_run_traces_any_program_with_profiles_sent_between_hosts(ssh_test_hosts, tmp_path):
    """up --detach --trace of a plain TF1 program (1 PS, 2 workers on 3 hosts, each host with
    its own run directory): the capture runs beside the coordinator on host1, each task's
    profiler saves on its own host, the agents send those profiles over their connections, the
    merge runs on host1 and the laptop copies the trace back. A program that is not Python ends
    with the same one line as attached."""
    pytest.importorskip("tensorflow")
    sleeper = sleeper_cluster(tmp_path, ssh_test_hosts)
    result = tflaunch("up", "--detach", str(sleeper), "--trace", "5", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    run_id = result.stdout.strip().splitlines()[-1]
    wait_ended(tmp_path / "sleep", run_id, 60)
    shown = cli(tmp_path / "sleep", "trace", run_id)
    why = (
        "no trace because no task ran Python (program 'sleep'): the trace hook works only in "
        "Python programs that import TensorFlow"
    )
    assert shown.returncode == 2 and why in shown.stderr, shown.stdout + shown.stderr
    assert f"[tflaunch] {why}" in (tmp_path / "sleep" / "runs" / run_id / "console.log").read_text()

    cluster = ssh_cluster(
        tmp_path / "tf1",
        ssh_test_hosts,
        name="ssh-detached-traced",
        program={"argv": tf1_argv(600), "workdir": str(tmp_path)},
        roles={"ps": 1, "worker": 2},
        ssh={"upload": []},
        supervision={"heartbeat_timeout": 20},
    )
    result = tflaunch("up", "--detach", str(cluster), "--trace", "100:10", timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    run_id = result.stdout.strip().splitlines()[-1]
    status = wait_ended(tmp_path / "tf1", run_id, 300)
    assert f"run {run_id}: succeeded" in status, status
    shown = cli(tmp_path / "tf1", "trace", run_id)
    run = tmp_path / "tf1" / "runs" / run_id
    assert shown.returncode == 0, shown.stdout + shown.stderr + (run / "console.log").read_text()
    trace = json.loads((run / "trace" / "trace.json").read_text())
    names = {
        e["args"]["name"].split()[0] for e in trace["traceEvents"] if e["name"] == "process_name"
    }
    assert names == {"ps:0", "worker:0", "worker:1"}
    plan = json.loads((run / "plan.json").read_text())
    hosts = {f"{t['job']}:{t['index']}": t["host"] for t in plan["tasks"]}
    assert hosts["worker:1"] != "host1"  # its profile is saved away from the coordinator
    # worker:1's profile: saved in its own host's run directory, sent to host1's over the
    # agent's connection (events.jsonl says so), merged there, copied back here.
    address = plan["cluster"]["worker"][1]
    host, port = address.rsplit(":", 1)
    name = f"{host}_{int(port) + 10000}.xplane.pb"
    remote = tmp_path / "tf1" / "remote" / run_id
    saved = list((remote / hosts["worker:1"] / "trace" / "raw").glob(f"plugins/profile/*/{name}"))
    moved = list((remote / "host1" / "trace" / "raw").glob(f"plugins/profile/*/{name}"))
    assert len(saved) == 1 and len(moved) == 1, (saved, moved)
    assert saved[0].read_bytes() == moved[0].read_bytes()
    sent = [
        e
        for e in map(json.loads, (run / "events.jsonl").read_text().splitlines())
        if e.get("event") == "trace_sent" and e.get("host") == hosts["worker:1"]
    ]
    assert len(sent) == 1 and any(f.endswith(name) for f in sent[0]["files"]), sent
    assert list((run / "trace" / "raw").glob(f"plugins/profile/*/{name}"))
    assert json.loads((run / "trace" / "verdict.json").read_text())["ok"]
    assert "worker:1" in (run / "progress.jsonl").read_text()  # steps/s for status, report
    assert wait_hosts_clean(ssh_test_hosts, 15) == []
