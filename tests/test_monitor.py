"""Resource sampling: process trees with their children, the node, the sampler thread, the files,
and a real 1 PS + 2 worker run (stand-in tasks) that leaves samples for every task and node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from tests.helpers import (
    FAKE_TASK,
    tflaunch,
    traffic_cluster,
    up_detached,
    wait_until_gone,
    write_cluster,
)
from tests.hosts import ssh_hosts
from tflaunch.cluster.supervision import Supervision
from tflaunch.runtime import monitor
from tflaunch.runtime.monitor import (
    MAX_SAMPLES_PER_SECOND,
    NET_FIELDS,
    SampleLog,
    Sampler,
    TreeSampler,
    cluster_sample_interval,
    is_task_process,
    latest_samples,
    process_tree,
    read_samples,
)
from tflaunch.runtime.protocol import Sample

ssh_test_hosts = ssh_hosts.ssh_test_hosts  # the session fixture (skips without root)


def spawn_python(code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
    )


def kill_tree(proc: subprocess.Popen) -> None:
    for child in psutil.Process(proc.pid).children(recursive=True):
        child.kill()
    proc.kill()
    proc.wait(timeout=5)


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def test_process_tree_holds_children_and_grandchildren():
    parent = spawn_python("""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c",
            "import subprocess, time; subprocess.Popen(['sleep', '60']); print('up', flush=True); time.sleep(60)"],
            stdout=sys.stdout)
        time.sleep(60)
        """)
    try:
        assert parent.stdout.readline().strip() == "up"
        trees, parents = process_tree([parent.pid])
        expected = {parent.pid} | {
            c.pid for c in psutil.Process(parent.pid).children(recursive=True)
        }
        assert set(trees[parent.pid]) == expected and len(expected) == 3
        assert parents[parent.pid] == psutil.Process().pid
    finally:
        kill_tree(parent)


def test_tree_cpu_includes_a_busy_child_and_memory_and_threads_add_up():
    parent = spawn_python("""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        print("up", flush=True)
        time.sleep(60)
        """)
    try:
        assert parent.stdout.readline().strip() == "up"
        (child,) = psutil.Process(parent.pid).children()
        sampler = TreeSampler()
        first = sampler.sample({"task": parent.pid})
        assert first["tasks"]["task"]["cpu_percent"] is None  # no interval yet
        before = cpu_seconds(child.pid) + cpu_seconds(parent.pid)
        started = time.time()
        time.sleep(1.0)
        sample = sampler.sample({"task": parent.pid})["tasks"]["task"]
        used = cpu_seconds(child.pid) + cpu_seconds(parent.pid) - before
        expected = 100 * used / (time.time() - started)
        assert sample["procs"] == 2
        assert sample["cpu_percent"] > 5  # the busy child, not the sleeping parent
        assert abs(sample["cpu_percent"] - expected) < max(5.0, 0.2 * expected)
        rss = sum(psutil.Process(p).memory_info().rss for p in (parent.pid, child.pid))
        assert abs(sample["rss"] - rss) < 2 * 1024 * 1024
        assert sample["threads"] == psutil.Process(parent.pid).num_threads() + child.num_threads()
    finally:
        kill_tree(parent)


def test_a_task_that_exits_while_it_is_sampled_is_left_out_not_sampled_at_zero_bytes(
    monkeypatch,
):
    """A task can exit between the sampler's status read and its memory read: /proc then has a
    zombie's zero bytes (seen under load: worker:1 at rss 0). It has ended: no record, as for a
    zombie found as one."""

    real = psutil.Process

    class ExitingNow:
        def __init__(self, pid: int) -> None:
            self._process = real(pid)

        def __getattr__(self, name: str):
            return getattr(self._process, name)

        def memory_info(self):
            return self._process.memory_info()._replace(rss=0)

    monkeypatch.setattr("tflaunch.runtime.monitor.psutil.Process", ExitingNow)
    assert TreeSampler().sample({"task": os.getpid()})["tasks"] == {}


def assert_child_counted_once(
    pid: int, start_cpu: float, total: float, burned: float, within: float
):
    """The samples' CPU (``total``) is the parent's own growth since ``start_cpu`` plus its
    reaped child's ``burned`` seconds (as its reaped time says), counted once."""
    times = psutil.Process(pid).cpu_times()
    child_cpu = times.children_user + times.children_system
    assert burned - 0.05 < child_cpu < 1.0
    expected = child_cpu + cpu_seconds(pid) - start_cpu
    assert abs(total - expected) < within, (total, expected)


ZOMBIE_PARENT = """
    import os, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c",
        "import time\\nend = time.process_time() + 0.3\\n"
        "while time.process_time() < end: pass\\nprint(flush=True)\\ninput()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
    print("burned", flush=True)
    input()
    child.stdin.close()  # the child's input() ends: it exits
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, still unreaped
    print("zombie", flush=True)
    input()
    child.wait()
    print("reaped", flush=True)
    input()
    """


@pytest.mark.parametrize("race", [False, True], ids=["reaped-after-the-read", "reaped-in-between"])
def test_a_child_seen_live_then_exited_then_reaped_counts_once(race, monkeypatch):
    """The child is sampled while it burns, then after it exited (a zombie: no memory, its times
    unread), then after its parent reaped it: the parent's reaped time then holds all of it, and
    what the first sample counted comes off. ``reaped-in-between``: the second sample's scan
    still lists the child, but its parent reaped it before the sample read the parent (the scan
    is the one taken at the zombie stage), so the parent's growth comes a sample before the
    child leaves the tree and what it owes is taken off a sample later."""
    parent = spawn_python(ZOMBIE_PARENT)
    try:
        sampler = TreeSampler()
        last = sampler.sample({"task": parent.pid})["time"]
        start_cpu = cpu_seconds(parent.pid)
        total, stale = 0.0, None
        for cue, answer in ((None, "burned"), ("go", "zombie"), ("go", "reaped")):
            if cue:
                parent.stdin.write(cue + "\n")
                parent.stdin.flush()
            assert parent.stdout.readline().strip() == answer
            if answer == "zombie" and race:
                stale = process_tree([parent.pid])
                continue
            if stale is not None:
                monkeypatch.setattr(monitor, "process_tree", lambda roots, scan=stale: scan)
            samples = [sampler.sample({"task": parent.pid})]
            if stale is not None:
                monkeypatch.undo()
                time.sleep(0.01)  # an interval for the next sample's rate
                samples.append(sampler.sample({"task": parent.pid}))
            for sample in samples:
                record = sample["tasks"]["task"]
                if answer == "zombie":
                    assert record["procs"] == 1  # the zombie is not a live process of the tree
                total += record["cpu_percent"] / 100 * (sample["time"] - last)
                last = sample["time"]
        assert_child_counted_once(parent.pid, start_cpu, total, burned=0.3, within=0.05)
    finally:
        kill_tree(parent)


def test_a_short_lived_child_between_samples_counts_once():
    """A child that burns 0.4 s and is reaped: counted while it lives or after, never twice."""
    parent = spawn_python("""
        import subprocess, sys, time
        input()
        subprocess.run([sys.executable, "-c",
            "import time\\nend = time.process_time() + 0.4\\nwhile time.process_time() < end: pass"])
        print("reaped", flush=True)
        time.sleep(60)
        """)
    try:
        sampler = TreeSampler()
        sampler.sample({"task": parent.pid})
        start_cpu = cpu_seconds(parent.pid)
        parent.stdin.write("go\n")
        parent.stdin.flush()
        total, last = 0.0, time.time()
        reaped = threading.Event()
        threading.Thread(
            target=lambda: (parent.stdout.readline(), reaped.set()), daemon=True
        ).start()
        deadline = time.monotonic() + 30
        while not reaped.is_set() and time.monotonic() < deadline:
            time.sleep(0.1)
            sample = sampler.sample({"task": parent.pid})
            total += sample["tasks"]["task"]["cpu_percent"] / 100 * (sample["time"] - last)
            last = sample["time"]
        time.sleep(0.1)
        sample = sampler.sample({"task": parent.pid})
        total += sample["tasks"]["task"]["cpu_percent"] / 100 * (sample["time"] - last)
        assert_child_counted_once(parent.pid, start_cpu, total, burned=0.4, within=0.1)
    finally:
        kill_tree(parent)


def test_node_sample_has_cpu_memory_and_counters_of_every_interface():
    sampler = TreeSampler()
    assert sampler.sample({})["node"]["cpu_percent"] is None
    time.sleep(0.2)
    node = sampler.sample({})["node"]
    assert 0 <= node["cpu_percent"] <= 100
    assert 0 < node["mem_used"] < node["mem_total"]
    assert set(node["net"]) == set(psutil.net_io_counters(pernic=True))
    assert all(set(counts) == set(NET_FIELDS) for counts in node["net"].values())
    assert node["net"]["lo"]["bytes_sent"] <= psutil.net_io_counters(pernic=True)["lo"].bytes_sent


def test_ended_task_drops_out_of_the_sample():
    sampler = TreeSampler()
    proc = subprocess.Popen(["sleep", "60"])
    assert "t" in sampler.sample({"t": proc.pid})["tasks"]
    proc.kill()
    proc.wait()
    assert sampler.sample({"t": proc.pid})["tasks"] == {}


def test_sampler_thread_samples_at_once_at_its_interval_and_once_more_when_stopped():
    events, lock = [], threading.Lock()

    def emit(event):
        with lock:
            events.append((time.monotonic(), event))

    started = time.monotonic()
    sampler = Sampler(0.2, dict, emit)
    sampler.start()
    time.sleep(1.05)
    stopping = time.monotonic()
    sampler.stop()
    assert time.monotonic() - stopping < 1
    assert all(isinstance(e, Sample) for _, e in events)
    assert events[0][0] - started < 0.2
    assert 5 <= len(events) <= 8
    assert events[-1][0] >= stopping  # the final sample
    assert sampler.cpu_seconds > 0


def test_sample_interval_zero_turns_sampling_off():
    assert Sampler.from_supervision(Supervision(sample_interval=0), dict, lambda e: None) is None


def test_sample_log_roundtrip_and_a_line_cut_short(tmp_path):
    log = SampleLog(tmp_path)
    for i in range(3):
        log.write(
            "node-a",
            {
                "event": "sample",
                "time": 10.0 + i,
                "node": {"cpu_percent": i},
                "tasks": {"ps:0": {"pid": 5, "rss": i}},
            },
        )
    log.write("node/b", {"event": "sample", "time": 11.5, "node": {}, "tasks": {}})
    log.close()
    with (tmp_path / "samples-node-a.jsonl").open("a") as f:
        f.write('{"time": 99, "host": "node-a", "no')  # a crash mid-line
    samples = read_samples(tmp_path)
    assert [s["time"] for s in samples["node-a"]] == [10.0, 11.0, 12.0]
    assert samples["node/b"][0]["host"] == "node/b"
    assert (tmp_path / "samples-node_b.jsonl").exists()
    latest = latest_samples(tmp_path)
    assert latest["node-a"]["tasks"]["ps:0"]["rss"] == 2 and latest["node/b"]["time"] == 11.5


def test_is_task_process_checks_task_name_and_tf_config():
    env = {"TFLAUNCH_TASK": "worker:3", "TF_CONFIG": '{"x": 1}'}
    proc = subprocess.Popen(["sleep", "60"], env=env)
    try:
        time.sleep(0.1)
        assert is_task_process(proc.pid, "worker:3", {"TF_CONFIG": '{"x": 1}'})
        assert not is_task_process(proc.pid, "worker:3", {"TF_CONFIG": '{"x": 2}'})  # another run
        assert not is_task_process(proc.pid, "worker:1", {"TF_CONFIG": '{"x": 1}'})
        # a run whose tasks read the cluster file: the file's path tells runs apart
        assert not is_task_process(
            proc.pid, "worker:3", {"TF_CONFIG": '{"x": 1}', "TFLAUNCH_CLUSTER_FILE": "/r/c.json"}
        )
    finally:
        proc.kill()
        proc.wait()
    assert not is_task_process(proc.pid, "worker:3", {"TF_CONFIG": '{"x": 1}'})


def test_ps_and_two_workers_leave_samples_for_every_task_and_node(tmp_path):
    cluster = traffic_cluster(
        tmp_path, 1_000_000, ALLOC_MB="40", BURN_SECONDS="0.5", HOLD_SECONDS="1"
    )
    result = tflaunch("up", str(cluster))
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = (tmp_path / "runs").iterdir()
    samples = read_samples(run)
    assert set(samples) == {"node-a", "node-b"}
    hosts = {"ps:0": "node-b", "worker:0": "node-a", "worker:1": "node-a"}
    for task, host in hosts.items():
        seen = [s["tasks"][task] for s in samples[host] if task in s["tasks"]]
        assert len(seen) >= 3, task
        assert all(u["rss"] > 5_000_000 and u["threads"] >= 1 for u in seen)
        assert not any(task in s["tasks"] for h, ss in samples.items() if h != host for s in ss)
    workers = [s["tasks"]["worker:0"] for s in samples["node-a"] if "worker:0" in s["tasks"]]
    assert max(u["rss"] for u in workers) > 40 * 1024 * 1024  # the 40 MB ballast
    assert max(u["procs"] for u in workers) == 2  # the burning child, counted in its tree
    for records in samples.values():
        assert records[0]["tasks"] == {} and records[-1]["tasks"] == {}  # before and after
        assert all("lo" in r["node"]["net"] for r in records)
    events = (run / "events.jsonl").read_text()
    assert '"sample"' not in events  # samples have their own files
    assert wait_until_gone(str(tmp_path)) == []


def test_sampling_off_writes_no_samples(tmp_path):
    program = {"argv": [sys.executable, str(FAKE_TASK)], "env": {"WORK_SECONDS": "0.2"}}
    cluster = write_cluster(tmp_path / "cluster.yaml", program, supervision={"sample_interval": 0})
    assert tflaunch("up", str(cluster)).returncode == 0
    (run,) = (tmp_path / "runs").iterdir()
    assert not list(run.glob("samples-*"))
    report = tflaunch("report", str(run))
    assert report.returncode == 2
    assert "has no resource samples" in report.stderr and "sample_interval" in report.stderr


def test_status_shows_live_cpu_rss_and_uptime_then_watch_ends_with_the_run(tmp_path):
    cluster = traffic_cluster(tmp_path, 0, BURN_SECONDS="3", HOLD_SECONDS="3")
    runs = str(tmp_path / "runs")
    run_id = up_detached(cluster)
    try:
        status = tflaunch("status", run_id, "--run-dir", runs)
        lines = status.stdout.splitlines()
        header = next(line for line in lines if line.startswith("TASK"))
        assert header.split() == [
            *("TASK", "HOST", "STATE", "PID", "CPU%", "RSS", "UPTIME", "EXIT", "RESTARTS")
        ]
        rows = {
            line.split()[0]: line.split() for line in lines if line.startswith(("ps:", "worker:"))
        }
        for task in ("ps:0", "worker:0", "worker:1"):
            row = rows[task]
            assert row[2] in ("running", "ready")
            assert float(row[4]) >= 0 and float(row[5]) > 5 and row[6] == "MiB"
            assert row[7].endswith("s")
        watch = tflaunch(
            "status", run_id, "--run-dir", runs, "--watch", "--interval", "0.5", timeout=60
        )
        assert watch.returncode == 0
        assert watch.stdout.count(f"run {run_id}:") >= 2
        assert f"run {run_id}: succeeded" in watch.stdout.split("TASK")[-2]
    finally:
        tflaunch("down", run_id, "--run-dir", runs)
    assert wait_until_gone(str(tmp_path)) == []


def test_status_of_a_task_elsewhere_comes_from_the_latest_sample(tmp_path):
    """A task whose pid is not that task on this machine (another node): the samples speak."""
    program = {"argv": [sys.executable, str(FAKE_TASK)]}
    cluster = write_cluster(tmp_path / "cluster.yaml", program, roles={"ps": 1, "worker": 1})
    plan = json.loads(tflaunch("plan", "--json", str(cluster)).stdout)
    run = tmp_path / "runs" / "remote-run"
    run.mkdir(parents=True)
    (run / "plan.json").write_text(json.dumps(plan))
    (run / "run.json").write_text(json.dumps({"state": "running", "backend": "local"}))
    now = time.time()
    events = [
        {"event": "started", "task": "ps:0", "pid": 1, "time": now - 75},
        {"event": "ready", "task": "ps:0", "time": now - 74},
        {"event": "started", "task": "worker:0", "pid": 1, "time": now - 70},
        {"event": "exited", "task": "worker:0", "code": 0, "time": now - 1},
    ]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    log = SampleLog(run)
    log.write(
        "localhost",
        {
            "time": now - 2,
            "node": {},
            "tasks": {
                "ps:0": {"pid": 1, "cpu_percent": 12.5, "rss": 300 * 1024 * 1024, "threads": 9}
            },
        },
    )
    log.close()
    status = tflaunch("status", "remote-run", "--run-dir", str(tmp_path / "runs"))
    assert status.returncode == 0, status.stderr
    rows = {
        line.split()[0]: line.split()
        for line in status.stdout.splitlines()
        if line.startswith(("ps:", "worker:"))
    }
    # ps:0 has run 75 s, plus however long this loaded machine took to answer 'status'
    ran = [f"1m{75 + s - 60:02d}s" for s in range(int(time.time() - now) + 2)]
    assert rows["ps:0"][2:7] == ["ready", "1", "12.5", "300.0", "MiB"]
    assert rows["ps:0"][7] in ran and rows["ps:0"][8:] == ["-", "-"]
    assert rows["worker:0"][2:] == ["exited", "1", "-", "-", "-", "0", "-"]


@pytest.mark.slow
@pytest.mark.ssh
def test_ssh_agents_sample_their_own_nodes_and_samples_reach_the_launcher(ssh_test_hosts, tmp_path):
    """Agents on SSH test hosts (network namespaces): each host's samples arrive in the local
    run directory, with that host's tasks and the counters of its own interfaces."""
    from tests.ssh.fixtures import ssh_cluster, wait_hosts_clean

    cluster = ssh_cluster(
        tmp_path, ssh_test_hosts, env={"WORK_SECONDS": "2"}, supervision={"sample_interval": 0.3}
    )
    result = tflaunch("up", str(cluster), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = (tmp_path / "runs").iterdir()
    plan = json.loads((run / "plan.json").read_text())
    samples = read_samples(run)
    assert set(samples) == {t["host"] for t in plan["tasks"]}
    root_interfaces = set(psutil.net_io_counters(pernic=True))
    for host, records in samples.items():
        sampled = {name for r in records for name in r["tasks"]}
        assert sampled == {f"{t['job']}:{t['index']}" for t in plan["tasks"] if t["host"] == host}
        interfaces = set(records[-1]["node"]["net"])
        assert "lo" in interfaces and interfaces != root_interfaces  # the host's own namespace
        assert not (tmp_path / "remote" / run.name / host / f"samples-{host}.jsonl").exists()
    assert wait_hosts_clean(ssh_test_hosts, 10) == []


def test_big_clusters_sample_less_often_so_the_coordinator_keeps_up():
    assert cluster_sample_interval(1.0, 3) == 1.0
    assert cluster_sample_interval(1.0, MAX_SAMPLES_PER_SECOND) == 1.0
    assert cluster_sample_interval(1.0, 4096) == 4096 / MAX_SAMPLES_PER_SECOND == 8.0
    assert cluster_sample_interval(20.0, 4096) == 20.0  # a slower setting stands
    assert cluster_sample_interval(0.0, 4096) == 0.0  # off stays off
