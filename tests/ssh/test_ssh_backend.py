"""The SSH backend end to end: real sshd in network-namespace hosts, real agents and tasks.

Most tests run the stand-in task (tests/programs/fake_task.py) so they take seconds; one runs the
real distributed MNIST (2 PS + 3 workers). Every test checks the hosts' process tables at the end.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.helpers import FAKE_TASK, ROOT, read_until, start_tflaunch, tflaunch
from tests.hosts import ssh_hosts
from tests.ssh.fixtures import (
    left_on_hosts,
    only_run,
    sleeper_cluster,
    ssh_cluster,
    tf1_argv,
    wait_hosts_clean,
)

pytestmark = [pytest.mark.slow, pytest.mark.ssh]
SITE_PACKAGES = Path(__import__("sysconfig").get_paths()["purelib"])


def wait_tasks_gone(host, timeout: float) -> list[str]:
    """Wait until no stand-in task is left on ``host`` (the hosts are this session's alone);
    return those left."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in ssh_hosts.processes_in(host) if "fake_task.py" in p]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def events(run: Path) -> list[dict]:
    path = run / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def assert_nothing_started(tmp_path: Path, hosts) -> None:
    for run in (tmp_path / "runs").iterdir():
        assert not [e for e in events(run) if e.get("event") == "started"]
    assert not list((tmp_path / "remote").rglob("*.log"))
    assert left_on_hosts(hosts) == []


def test_cluster_runs_on_private_addresses_and_logs_come_back(ssh_test_hosts, tmp_path):
    route = subprocess.run(
        ["ip", "route", "get", ssh_test_hosts.host(2).private_address],
        capture_output=True,
        text=True,
    )
    assert route.returncode != 0  # the launcher has no route to the private network
    cluster = ssh_cluster(tmp_path, ssh_test_hosts)
    result = tflaunch("up", str(cluster), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pre-flight:" in result.stderr and "TENSORFLOW" in result.stderr
    assert "uploaded fake_task.py" in result.stderr
    assert "[worker:1] all ps reachable at start: True" in result.stdout
    run = only_run(tmp_path)
    plan = json.loads((run / "plan.json").read_text())
    public, private = f"{ssh_test_hosts.plan.public_net}.", f"{ssh_test_hosts.plan.private_net}."
    for task in plan["tasks"]:
        assert task["cluster_address"].startswith(private)
        assert public not in json.dumps(task)  # public addresses only to connect
    assert all(a.startswith(private) for addrs in plan["cluster"].values() for a in addrs)
    assert {t["workdir"] for t in plan["tasks"]} == {str(tmp_path / "work")}
    for task in plan["tasks"]:
        local_log = run / task["log_name"]
        host_dir = tmp_path / "remote" / run.name / task["host"]
        assert local_log.read_text() == (host_dir / task["log_name"]).read_text()
        assert local_log.read_text()
    assert (run / "worker-2.log").read_text().splitlines()[-1] == "done"
    assert (tmp_path / "work" / "fake_task.py").read_bytes() == FAKE_TASK.read_bytes()
    assert wait_hosts_clean(ssh_test_hosts, 10) == []


def test_default_checkpoint_dir_is_the_run_directory_on_the_hosts(ssh_test_hosts, tmp_path):
    """Without program.checkpoint_dir the tasks get checkpoints/ in the run's directory on the
    hosts (here under the remote home: '~' is expanded there, by each host's agent), not the
    laptop's run directory; {checkpoint_dir} in argv is the same path.

    Also: the file that ssh.upload names is in the workdir itself, which the hosts share with
    this machine; the upload must not truncate it (a plain SFTP put onto itself leaves it
    empty)."""
    import pwd

    remote = f".tflaunch-ckpt-test-{uuid.uuid4().hex[:8]}"
    home = Path(pwd.getpwnam("root").pw_dir)  # the hosts' user (the hosts share this disk)
    (tmp_path / "work").mkdir()
    own = tmp_path / "work" / "fake_task.py"
    own.write_bytes(FAKE_TASK.read_bytes())
    cluster = ssh_cluster(
        tmp_path,
        ssh_test_hosts,
        env={"WRITE_CHECKPOINT": "1"},
        program={"argv": [sys.executable, "fake_task.py", "{checkpoint_dir}"]},
        roles={"ps": 1, "worker": 2},
    )
    data = yaml.safe_load(cluster.read_text())
    data["ssh"].update(remote_runs_dir=f"~/{remote}", upload=[str(own)])
    cluster.write_text(yaml.safe_dump(data))
    shown = tflaunch("plan", str(cluster))
    assert f"checkpoints: ~/{remote}/<run id>/checkpoints on each task's host (the default;" in (
        shown.stdout
    )
    try:
        result = tflaunch("up", str(cluster), timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        run = only_run(tmp_path)
        expected = home / remote / run.name / "checkpoints"
        for index in (0, 1):
            line = f"[worker:{index}] checkpoint dir {expected} argv ['{expected}']"
            assert line in result.stdout, result.stdout
            assert (expected / f"worker-{index}").read_text() == "saved\n"
        assert not (run / "checkpoints").exists()  # nothing on the laptop's run directory path
        assert own.read_bytes() == FAKE_TASK.read_bytes()  # uploaded onto itself, still whole
        plan = json.loads((run / "plan.json").read_text())
        assert plan["program"]["checkpoint_dir"] == f"~/{remote}/{run.name}/checkpoints"
    finally:
        shutil.rmtree(home / remote, ignore_errors=True)
    assert wait_hosts_clean(ssh_test_hosts, 10) == []


def test_cluster_through_a_jump_host(ssh_test_hosts, tmp_path):
    """Hosts known by their private addresses only, reached through host 1 (ProxyJump)."""
    jump = ssh_test_hosts.host(1)
    cluster = ssh_cluster(
        tmp_path, ssh_test_hosts, roles={"ps": 1, "worker": 2},
        ssh={"jump_host": f"root@{jump.public_address}:22"},
    )  # fmt: skip
    data = yaml.safe_load(cluster.read_text())
    data["hosts"] = [
        {"name": h.name, "connect": h.private_address, "address": h.private_address}
        for h in ssh_test_hosts.hosts[1:]
    ]
    cluster.write_text(yaml.safe_dump(data))
    result = tflaunch("up", str(cluster), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    address = ssh_test_hosts.host(2).private_address
    assert f"host2  {address}  {address}" in result.stderr  # pre-flight row, via the jump
    assert "[worker:1] all ps reachable at start: True" in result.stdout
    assert (only_run(tmp_path) / "worker-1.log").read_text().splitlines()[-1] == "done"
    assert wait_hosts_clean(ssh_test_hosts, 10) == []


def start_and_wait_ready(cluster: Path) -> tuple[subprocess.Popen, Path]:
    proc = start_tflaunch("up", str(cluster))
    read_until(proc.stdout, "cluster ready", timeout=60)
    return proc, cluster.parent


def test_worker_killed_on_host2_ends_cluster_with_report(ssh_test_hosts, tmp_path):
    cluster = ssh_cluster(tmp_path, ssh_test_hosts, env={"WORK_SECONDS": "120"})
    proc, _ = start_and_wait_ready(cluster)
    try:
        run = only_run(tmp_path)
        started = {e["task"]: e for e in events(run) if e.get("event") == "started"}
        assert started["worker:1"]["host"] == "host2"
        killed_at = time.monotonic()
        # The hosts share the PID namespace: this is a kill on host 2 of its worker.
        subprocess.run(["kill", "-KILL", str(started["worker:1"]["pid"])], check=True)
        _, stderr = proc.communicate(timeout=30)
        assert time.monotonic() - killed_at < 10
        assert proc.returncode != 0
        assert "worker:1 on host2 exited with code 137 (SIGKILL)" in stderr
    finally:
        if proc.poll() is None:
            proc.kill()
    assert wait_hosts_clean(ssh_test_hosts, 30) == []


def test_sigint_leaves_no_task_on_any_host(ssh_test_hosts, tmp_path):
    cluster = ssh_cluster(tmp_path, ssh_test_hosts, env={"WORK_SECONDS": "120"})
    proc, _ = start_and_wait_ready(cluster)
    assert left_on_hosts(ssh_test_hosts)  # tasks are running
    proc.send_signal(signal.SIGINT)
    stopped_at = time.monotonic()
    try:
        proc.communicate(timeout=40)
        assert proc.returncode == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    assert wait_hosts_clean(ssh_test_hosts, max(1.0, 30 - (time.monotonic() - stopped_at))) == []


def test_killed_launcher_leaves_no_task_on_any_host(ssh_test_hosts, tmp_path):
    cluster = ssh_cluster(tmp_path, ssh_test_hosts, env={"WORK_SECONDS": "120"})
    proc, _ = start_and_wait_ready(cluster)
    proc.kill()  # SIGKILL: no teardown by the launcher; the agents see their input close
    killed_at = time.monotonic()
    proc.communicate(timeout=10)
    assert wait_hosts_clean(ssh_test_hosts, max(1.0, 30 - (time.monotonic() - killed_at))) == []


def test_cut_link_leaves_no_task_on_any_host(ssh_test_hosts, tmp_path):
    cluster = ssh_cluster(tmp_path, ssh_test_hosts, env={"WORK_SECONDS": "120"})
    proc, _ = start_and_wait_ready(cluster)
    try:
        ssh_hosts.cut_launcher_link(ssh_test_hosts)
        cut_at = time.monotonic()
        assert wait_hosts_clean(ssh_test_hosts, 30) == []
        assert time.monotonic() - cut_at < 30
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode != 0
        assert "stopped answering" in stderr, stderr
    finally:
        ssh_hosts.restore_launcher_link(ssh_test_hosts)
        if proc.poll() is None:
            proc.kill()


CHATTY_TASK = """
import json, os, socket, threading, time
config = json.loads(os.environ["TF_CONFIG"])
job, index = config["task"]["type"], config["task"]["index"]
if job == "ps":
    host, port = config["cluster"]["ps"][index].rsplit(":", 1)
    server = socket.create_server((host, int(port)))
    threading.Thread(target=lambda: [server.accept()[0].close() for _ in iter(int, 1)],
                     daemon=True).start()
line = f"{job}:{index} " + "x" * 1000
while True:  # about 1 MB/s of output per task
    for _ in range(100):
        print(line, flush=True)
    time.sleep(0.1)
"""


def test_cut_link_with_chatty_tasks_leaves_no_task(ssh_test_hosts, tmp_path):
    """Output keeps flowing towards a launcher that is gone: the agent must not block on it."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "chatty.py").write_text(CHATTY_TASK)
    cluster = ssh_cluster(
        tmp_path, ssh_test_hosts, ssh={"upload": []},
        program={"argv": [sys.executable, "chatty.py"], "workdir": str(work)},
    )  # fmt: skip
    proc, _ = start_and_wait_ready(cluster)
    drain = [threading.Thread(target=lambda s=s: [None for _ in s], daemon=True)
             for s in (proc.stdout, proc.stderr)]  # fmt: skip
    for thread in drain:
        thread.start()
    try:
        time.sleep(3)
        ssh_hosts.cut_launcher_link(ssh_test_hosts)
        cut_at = time.monotonic()
        assert wait_hosts_clean(ssh_test_hosts, 30) == []
        assert time.monotonic() - cut_at < 30
    finally:
        ssh_hosts.restore_launcher_link(ssh_test_hosts)
        proc.kill()
        proc.wait(timeout=30)


# ---- pre-flight: one clear error, exit 2, nothing started anywhere --------------------------


def assert_preflight_error(result, *needles: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr


def test_unreachable_host_is_a_preflight_error(ssh_test_hosts, tmp_path):
    cluster = ssh_cluster(tmp_path, ssh_test_hosts)
    data = yaml.safe_load(cluster.read_text())
    ghost = ssh_test_hosts.ghost
    data["hosts"].append(
        {"name": "ghost", "connect": ghost.public_address, "address": ghost.private_address}
    )
    data["placement"] = {"workers_per_host": 1}
    data["roles"]["worker"] = 4
    cluster.write_text(yaml.safe_dump(data))
    result = tflaunch("up", str(cluster), timeout=60)
    assert_preflight_error(result, f"ghost ({ghost.public_address}:22): no answer within 2 s")
    assert_nothing_started(tmp_path, ssh_test_hosts)


def test_wrong_key_is_a_preflight_error(ssh_test_hosts, tmp_path):
    key = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    cluster = ssh_cluster(tmp_path, ssh_test_hosts, ssh={"identity_file": str(key)})
    result = tflaunch("up", str(cluster), timeout=60)
    assert_preflight_error(result, "cannot connect to 3 of 3 hosts", f"refused {key}")
    assert_nothing_started(tmp_path, ssh_test_hosts)


def test_unknown_host_keys_refused_then_accept_new_records_them(ssh_test_hosts, tmp_path):
    known = tmp_path / "fresh_known_hosts"
    cluster = ssh_cluster(tmp_path, ssh_test_hosts, ssh={"known_hosts": str(known)})
    result = tflaunch("up", str(cluster), timeout=60)
    assert_preflight_error(result, "host key unknown", "ssh-keyscan", "accept-new")
    assert not known.exists()
    assert_nothing_started(tmp_path, ssh_test_hosts)
    data = yaml.safe_load(cluster.read_text())
    data["ssh"]["host_key_policy"] = "accept-new"
    cluster.write_text(yaml.safe_dump(data))
    result = tflaunch("up", str(cluster), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("recorded the new host key") == 3
    assert sorted(line.split()[0] for line in known.read_text().splitlines()) == [
        h.public_address for h in ssh_test_hosts.hosts
    ]


def test_tensorflow_missing_on_a_host_is_a_preflight_error(ssh_test_hosts, tmp_path):
    host2 = ssh_test_hosts.host(2)
    hidden = tuple(
        str(p) for p in [SITE_PACKAGES / "tensorflow", *SITE_PACKAGES.glob("tensorflow*.dist-info")]
    )
    ssh_hosts.start_sshd(host2, hide_paths=hidden)  # host 2's Python now has no TensorFlow
    try:
        probe = subprocess.run(
            [
                "ssh",
                "-i",
                str(ssh_test_hosts.client_key),
                "-o",
                "BatchMode=yes",
                "-o",
                f"UserKnownHostsFile={ssh_test_hosts.known_hosts}",
                f"root@{host2.public_address}",
                sys.executable,
                "-c",
                "'import tensorflow as tf; print(tf.__version__)'",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "No module named 'tensorflow'" in probe.stderr  # honestly missing there
        cluster = ssh_cluster(tmp_path, ssh_test_hosts)
        result = tflaunch("up", str(cluster), timeout=60)
        assert_preflight_error(
            result,
            "pre-flight failed on 1 of 3 hosts",
            f"host2 ({host2.public_address}): TensorFlow is not installed",
        )
        assert "MISSING" in result.stderr  # the table row of host 2
        assert_nothing_started(tmp_path, ssh_test_hosts)
    finally:
        ssh_hosts.start_sshd(host2)


def test_busy_port_is_a_preflight_error(ssh_test_hosts, tmp_path):
    cluster = ssh_cluster(tmp_path, ssh_test_hosts)
    port = yaml.safe_load(cluster.read_text())["ports"]["worker"]
    host3 = ssh_test_hosts.host(3)
    holder = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            host3.namespace,
            sys.executable,
            "-c",
            "import socket, sys, time; s = socket.socket(); "
            f"s.bind(('{host3.private_address}', {port})); s.listen(); print('bound', flush=True); "
            "time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "bound"
        result = tflaunch("up", str(cluster), timeout=60)
        assert_preflight_error(
            result,
            f"host3 ({host3.public_address}): port {port} (planned for worker:2) is already in use",
        )
        for run in (tmp_path / "runs").iterdir():
            assert not [e for e in events(run) if e.get("event") == "started"]
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert wait_hosts_clean(ssh_test_hosts, 10) == []


def test_missing_program_is_a_preflight_error(ssh_test_hosts, tmp_path):
    cluster = ssh_cluster(tmp_path, ssh_test_hosts, ssh={"upload": []})
    (tmp_path / "work").mkdir()
    result = tflaunch("up", str(cluster), timeout=60)
    assert_preflight_error(
        result,
        "pre-flight failed on 3 of 3 hosts",
        f"the script fake_task.py is not in {tmp_path / 'work'}",
    )
    assert_nothing_started(tmp_path, ssh_test_hosts)


# ---- hostile values -----------------------------------------------------------------------


def test_hostile_host_name_and_argument_run_as_plain_data(ssh_test_hosts, tmp_path):
    tag = uuid.uuid4().hex
    hostile = f"a'; touch /tmp/pwned-{tag}"
    cluster = ssh_cluster(tmp_path, ssh_test_hosts, roles={"ps": 1, "worker": 1})
    data = yaml.safe_load(cluster.read_text())
    data["hosts"] = [{**data["hosts"][0], "name": hostile}]
    data["program"]["argv"] += [hostile]
    cluster.write_text(yaml.safe_dump(data))
    result = tflaunch("up", str(cluster), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    run = only_run(tmp_path)
    assert {e["host"] for e in events(run) if e.get("event") == "started"} == {hostile}
    assert not Path(f"/tmp/pwned-{tag}").exists()
    assert wait_hosts_clean(ssh_test_hosts, 10) == []


def test_hostile_workdir_starts_nothing(ssh_test_hosts, tmp_path):
    tag = uuid.uuid4().hex
    hostile = f"/tmp/a'; touch /tmp/pwned-{tag}; '"
    cluster = ssh_cluster(
        tmp_path, ssh_test_hosts, ssh={"upload": []}, program={"workdir": hostile}
    )
    result = tflaunch("up", str(cluster), timeout=60)
    assert_preflight_error(result, "does not exist")
    assert not Path(f"/tmp/pwned-{tag}").exists()
    assert_nothing_started(tmp_path, ssh_test_hosts)


# ---- the real thing: distributed MNIST ----------------------------------------------------


def test_mnist_2ps_3workers_on_private_addresses(ssh_test_hosts, tmp_path):
    pytest.importorskip("tensorflow")
    root = ROOT
    cluster = ssh_cluster(
        tmp_path,
        ssh_test_hosts,
        name="ssh-mnist",
        program={
            "argv": [
                sys.executable,
                "-m",
                "tflaunch.models.mnist",
                "--train_steps",
                "30",
                "--log_every",
                "10",
            ],
            "workdir": str(root),
        },
        ssh={"upload": []},
        supervision={"heartbeat_timeout": 20},
    )
    result = tflaunch("up", str(cluster), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "test accuracy:" in result.stdout
    run = only_run(tmp_path)
    plan = json.loads((run / "plan.json").read_text())
    assert [f"{t['job']}:{t['index']}" for t in plan["tasks"]] == [
        "ps:0",
        "ps:1",
        "worker:0",
        "worker:1",
        "worker:2",
    ]
    public, private = f"{ssh_test_hosts.plan.public_net}.", f"{ssh_test_hosts.plan.private_net}."
    assert all(a.startswith(private) for addrs in plan["cluster"].values() for a in addrs)
    assert public not in json.dumps(plan["cluster"])
    assert "test accuracy:" in (run / "worker-0.log").read_text()
    assert f"serving at {private}" in (run / "ps-1.log").read_text()
    assert wait_hosts_clean(ssh_test_hosts, 10) == []


def test_any_program_traced_from_the_leaders_host(ssh_test_hosts, tmp_path):
    """up --trace of a plain TF1 program (no tflaunch import) on hosts whose profiler ports the
    launcher cannot reach: the capture runs on worker 0's host, and the merged trace, its
    summary and every host's notes come back into the local run directory. A program that is
    not Python ends with the one "no trace because" line and its own exit code."""
    pytest.importorskip("tensorflow")
    sleeper = sleeper_cluster(tmp_path, ssh_test_hosts)
    result = tflaunch("up", str(sleeper), "--trace", "5", timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert [x for x in result.stdout.splitlines() if "no trace" in x] == [
        "no trace because no task ran Python (program 'sleep'): the trace hook works only in "
        "Python programs that import TensorFlow"
    ]
    cluster = ssh_cluster(
        tmp_path / "tf1",
        ssh_test_hosts,
        name="ssh-traced",
        program={"argv": tf1_argv(600), "workdir": str(tmp_path)},
        roles={"ps": 1, "worker": 2},
        ssh={"upload": []},
        supervision={"heartbeat_timeout": 20},
    )
    result = tflaunch("up", str(cluster), "--trace", "100:10", timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "no trace" not in result.stdout + result.stderr, result.stdout[-3000:]
    run = only_run(tmp_path / "tf1")
    plan = json.loads((run / "plan.json").read_text())
    assert len({t["host"] for t in plan["tasks"]}) > 1  # the capture crossed hosts
    trace = json.loads((run / "trace" / "trace.json").read_text())
    names = {
        e["args"]["name"].split()[0] for e in trace["traceEvents"] if e["name"] == "process_name"
    }
    assert names == {"ps:0", "worker:0", "worker:1"}
    for task in ("worker-0", "worker-1"):
        assert (run / "trace" / "tasks" / f"{task}.tf").exists()
    assert json.loads((run / "trace" / "verdict.json").read_text())["ok"]
    assert (run / "trace" / "trace_summary.json").exists()
    log = (run / "trace" / "capture.log").read_text()
    assert "capturing" in log
    # Each host has its own run directory: worker:0's host holds the merged trace, and the
    # profiles the other hosts' servers saved there were copied to it before the merge.
    hosts = {f"{t['job']}:{t['index']}": t["host"] for t in plan["tasks"]}
    leader, other = hosts["worker:0"], hosts["worker:1"]
    assert leader != other
    remote = tmp_path / "tf1" / "remote" / run.name
    assert (remote / leader / "trace" / "trace.json").exists()  # merged there, then fetched
    host, port = plan["cluster"]["worker"][1].rsplit(":", 1)
    name = f"{host}_{int(port) + 10000}.xplane.pb"
    saved = list((remote / other / "trace" / "raw").glob(f"plugins/profile/*/{name}"))
    moved = list((remote / leader / "trace" / "raw").glob(f"plugins/profile/*/{name}"))
    assert len(saved) == 1 and len(moved) == 1, (saved, moved)
    assert f"copied {saved[0]} -> {moved[0]}" in log
    assert "TASK" in result.stdout and "ui.perfetto.dev" in result.stdout
    assert wait_hosts_clean(ssh_test_hosts, 10) == []


# ---- a host that stops answering ------------------------------------------------------------


def test_lost_host_that_answers_again_gets_a_new_agent_and_the_cluster_restarts(
    ssh_test_hosts, tmp_path
):
    """host2 drops off the launcher's network for a while (its tasks still reach the others):
    with ssh.host_wait the other hosts stop their tasks, host2's agent stops its own on
    its heartbeat timeout, and once host2 answers again the whole cluster starts again."""
    cluster = ssh_cluster(
        tmp_path,
        ssh_test_hosts,
        # the first run outlasts the cut; the restarted one only has to finish
        env={"WORK_SECONDS": "20", "RESTART_WORK_SECONDS": "1"},
        ssh={"host_wait": 60},
        supervision={"restart": {"ps": "exit-code", "backoff": 0.5}},
    )
    proc, _ = start_and_wait_ready(cluster)
    host2 = ssh_test_hosts.host(2)
    try:
        ssh_hosts.cut_host_link(host2)
        seen = read_until(proc.stdout, "host2 was lost", timeout=30)
        # still cut off, host2's agent stops its own tasks once its heartbeat times out
        assert wait_tasks_gone(host2, 30) == []
        ssh_hosts.restore_host_link(host2)
        seen += read_until(proc.stdout, "host2 answers again", timeout=60)
        seen += read_until(proc.stdout, "succeeded", timeout=90)
        assert proc.wait(timeout=60) == 0, seen[-3000:] + proc.stderr.read()[-3000:]
    finally:
        ssh_hosts.restore_host_link(host2)
        if proc.poll() is None:
            proc.kill()
    assert "waiting up to 60 s (ssh.host_wait)" in seen
    assert "restarts: host2 was lost 1 time(s); the cluster restarted 1 time(s)" in seen
    evs = events(only_run(tmp_path))
    assert [e["host"] for e in evs if e["event"] == "host_lost"] == ["host2"]
    assert [e["host"] for e in evs if e["event"] == "host_back"] == ["host2"]
    for task in ("ps:0", "ps:1", "worker:0", "worker:1", "worker:2"):
        assert len([e for e in evs if e["event"] == "started" and e["task"] == task]) == 2, task
    assert wait_hosts_clean(ssh_test_hosts, 30) == []


def test_lost_host_still_silent_after_host_wait_fails_the_run_naming_it(ssh_test_hosts, tmp_path):
    cluster = ssh_cluster(
        tmp_path,
        ssh_test_hosts,
        env={"WORK_SECONDS": "120"},
        ssh={"host_wait": 14},
        supervision={"restart": {"ps": "exit-code"}},
    )
    proc, _ = start_and_wait_ready(cluster)
    host2 = ssh_test_hosts.host(2)
    try:
        ssh_hosts.cut_host_link(host2)
        cut_at = time.monotonic()
        _, stderr = proc.communicate(timeout=90)
        elapsed = time.monotonic() - cut_at
        # host2's agent hears nothing and stops its tasks; the others are stopped by the launcher
        assert wait_hosts_clean(ssh_test_hosts, 30) == []
    finally:
        ssh_hosts.restore_host_link(host2)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "host host2 did not answer again within 14 s (ssh.host_wait)" in stderr
    assert "Its tasks (ps:1, worker:1) are stopped by its agent" in stderr
    assert "restarts: host2 was lost 1 time(s)" in stderr
    assert elapsed < 6 + 14 + 20
