"""Spot workers that come back: during a provisioned run, one worker's instance is terminated
through the EC2 API (moto's server); tflaunch sees it from the provider, creates a replacement of
the same host name, role and type (mapped onto the same namespace test host by the test-only
address map), prepares it as at the start and restarts the cluster from its checkpoints, within
``supervision.restart.max_cluster_restarts`` — or, when the host's roles restart alone (``scope:
task``, a ParameterServerStrategy worker), its tasks alone while the rest keeps training. Nothing
is left running afterwards."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cloud.fixtures import cloud_cluster, instances
from tests.helpers import FAKE_PSS, read_until, start_tflaunch
from tflaunch.launchers.ssh.section import SshSection


def terminate_host(endpoint: str, host: str) -> str:
    """Terminate the running instance that is ``host`` (as AWS reclaiming a spot instance)."""
    import boto3

    (victim,) = [
        i
        for i in instances(endpoint, ("running",))
        if {t["Key"]: t["Value"] for t in i["Tags"]}["tflaunch:host"] == host
    ]
    client = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)
    client.terminate_instances(InstanceIds=[victim["InstanceId"]])
    return victim["InstanceId"]


def events_of(tmp_path: Path) -> list[dict]:
    (run,) = (p for p in (tmp_path / "runs").iterdir() if not p.name.startswith("."))
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def spot_cluster(tmp_path, hosts, endpoint, monkeypatch, **overrides) -> Path:
    import yaml

    cluster = cloud_cluster(tmp_path, hosts, endpoint, monkeypatch, **overrides)
    data = yaml.safe_load(cluster.read_text())
    data["ssh"]["provision"]["spot_workers"] = True
    cluster.write_text(yaml.safe_dump(data))
    return cluster


def lost_host_cluster(tmp_path, hosts, endpoint, monkeypatch, restart: dict) -> Path:
    """Spot instances for a detached run that loses one: a PS and three workers, one on each
    instance (worker:2 alone on worker-3), restarted as ``restart`` says. The first run
    outlasts the loss and the replacement; a restarted task only has to finish."""
    return spot_cluster(
        tmp_path,
        hosts,
        endpoint,
        monkeypatch,
        env={"WORK_SECONDS": "20", "RESTART_WORK_SECONDS": "1"},
        roles={"ps": 1, "worker": 3},
        supervision={"finish_timeout": 300, "restart": restart},
    )


def pss_spot_cluster(
    tmp_path, hosts, endpoint, monkeypatch, steps: int, worker: dict, hold: Path | None = None
) -> Path:
    """ParameterServerStrategy's shape on the three instances: chief and PS on worker-1,
    worker:0 on worker-2, worker:1 on worker-3; ``worker``: the workers' restart policy. The
    program is tests/programs/fake_pss.py, tflaunch.models.pss's TensorFlow-free stand-in (the
    launcher's spot replacement is the subject; the real PSS restart is tests/test_restart_tf.py's).
    Steps are slowed (0.05 s each, set by the chief) so that an instance can be lost
    mid-training; once the whole cluster was restarted ($TFLAUNCH_CLUSTER_RESTARTS > 0) the
    resumed training runs at full speed: it only has to finish. With ``hold``, the chief goes on
    past ``steps`` until that file exists (the test makes it once it has seen what it waits for)."""
    pss = (
        'delay=0.05; [ "$TFLAUNCH_CLUSTER_RESTARTS" -gt 0 ] 2>/dev/null && delay=0; '
        'exec "$0" "$1" --train_steps "$2" --step_delay "$delay" '
        '--checkpoint_steps 50 --checkpoint_dir "$3" --hold_file "$4"'
    )
    argv = ["sh", "-c", pss, sys.executable, str(FAKE_PSS), str(steps), "{checkpoint_dir}"]
    argv.append(str(hold or ""))
    return spot_cluster(
        tmp_path,
        hosts,
        endpoint,
        monkeypatch,
        program={"argv": argv, "env": {"TEST_MARKER": str(tmp_path)}},  # the workdir: tmp
        roles={"ps": 1, "worker": 2, "chief": 1},
        supervision={
            "success": "chief",
            "ready_timeout": 180,
            "heartbeat": 1,
            "heartbeat_timeout": 20,
            "grace_period": 5,
            "restart": {
                "worker": worker,
                "ps": "exit-code",
                "chief": "exit-code",
                "max_cluster_restarts": 1,
                "backoff": 0.5,
            },  # fmt: skip
        },
    )


def up_reclaiming_worker_3(
    cluster: Path, endpoint: str, hold: Path | None = None
) -> tuple[str, str, str, str]:
    """``up --down`` of a :func:`pss_spot_cluster` whose worker-3 instance is reclaimed once the
    chief saved a checkpoint, until the run succeeds: what was printed up to that checkpoint,
    the reclaimed instance's id, what was printed after, and the launcher's stderr. With
    ``hold`` (the cluster's), the chief is let finish once worker:1 runs again on the new
    instance."""
    proc = start_tflaunch("up", str(cluster), "--down")
    try:
        saved = read_until(proc.stdout, "[chief:0]  saved checkpoint", timeout=300)
        old = terminate_host(endpoint, "worker-3")
        seen = ""
        if hold is not None:  # worker:1 serves again (after its restart there was announced)
            seen = read_until(proc.stdout, "restarting its tasks (worker:1)", timeout=400)
            seen += read_until(proc.stdout, "[worker:1] serving", timeout=400)
            hold.touch()
        seen += read_until(proc.stdout, "succeeded", timeout=400)
        assert proc.wait(timeout=120) == 0, proc.stderr.read()[-3000:]
        err = proc.stderr.read()
    finally:
        proc.kill()
    return saved, old, seen, err


@pytest.mark.slow
@pytest.mark.ssh
def test_a_reclaimed_spot_worker_is_replaced_and_training_resumes(
    ssh_test_hosts, tmp_path, clean_region, monkeypatch
):
    worker = {"policy": "on-failure", "scope": "cluster"}  # its loss restarts the cluster
    cluster = pss_spot_cluster(tmp_path, ssh_test_hosts, clean_region, monkeypatch, 600, worker)
    saved, old, seen, err = up_reclaiming_worker_3(cluster, clean_region)
    step = int(re.findall(r"at global step (\d+)", saved)[-1])
    assert step > 0
    resumed = re.search(r"resumed from .* at global step (\d+)", seen)
    assert resumed and int(resumed.group(1)) > 0, seen[-3000:]
    (replaced,) = [e for e in events_of(tmp_path) if e["event"] == "instance_replaced"]
    assert replaced["host"] == "worker-3" and replaced["old"] == old
    assert replaced["new"] != old
    assert f"replaced instance of worker-3: {old} (ended) -> {replaced['new']}" in err
    assert instances(clean_region, ("pending", "running")) == []


@pytest.mark.slow
@pytest.mark.ssh
def test_a_reclaimed_task_scoped_worker_restarts_alone_on_its_replacement(
    ssh_test_hosts, tmp_path, clean_region, monkeypatch
):
    """A ParameterServerStrategy worker restarts alone (its default scope, task): the chief and
    the PS keep training while worker-3's instance is replaced; its worker starts there again.
    The stand-in's chief trains until worker:1 runs again (the hold file), then finishes."""
    worker = {"policy": "exit-code"}  # a lost host counts as a preemption
    hold = tmp_path / "release-the-chief"
    cluster = pss_spot_cluster(
        tmp_path, ssh_test_hosts, clean_region, monkeypatch, 100, worker, hold
    )
    _, old, seen, err = up_reclaiming_worker_3(cluster, clean_region, hold)
    evs = events_of(tmp_path)
    (replaced,) = [e for e in evs if e["event"] == "instance_replaced"]
    assert (replaced["host"], replaced["old"]) == ("worker-3", old) and replaced["new"] != old
    assert not [e for e in evs if e["event"] == "cluster_restarting"]
    (restarting,) = [e for e in evs if e["event"] == "restarting"]
    assert (restarting["task"], restarting["cause"]) == ("worker:1", "host_lost")
    started = [e["task"] for e in evs if e["event"] == "started"]
    assert sorted(started) == ["chief:0", "ps:0", "worker:0", "worker:1", "worker:1"], started
    assert [e["task"] for e in evs if e["event"] == "running_again"] == ["worker:1"]
    assert "resumed from" not in seen  # the chief never restarted
    assert f"its instance {old} is terminated, says ec2); creating a replacement spot " in seen
    assert "then restarting its tasks (worker:1) there alone" in seen
    assert f"replaced instance of worker-3: {old} (ended) -> {replaced['new']}" in err
    assert "restarts: worker:1 restarted 1 time(s) (failures: lost); worker-3 was lost" in seen
    assert instances(clean_region, ("pending", "running")) == []


@pytest.mark.slow
@pytest.mark.ssh
def test_past_the_restart_limit_a_reclaimed_worker_fails_the_run(
    ssh_test_hosts, tmp_path, clean_region, monkeypatch
):
    cluster = spot_cluster(
        tmp_path,
        ssh_test_hosts,
        clean_region,
        monkeypatch,
        env={"WORK_SECONDS": "120"},
        supervision={
            "restart": {
                "worker": {"policy": "on-failure", "scope": "cluster"},
                "max_cluster_restarts": 0,
            }
        },
    )
    proc = start_tflaunch("up", str(cluster), "--down")
    try:
        read_until(proc.stdout, "[worker:2]", timeout=120)
        old = terminate_host(clean_region, "worker-2")
        code = proc.wait(timeout=120)
        err = proc.stderr.read()
    finally:
        proc.kill()
    assert code != 0
    assert f"host worker-2 was lost: its instance {old} is terminated, says ec2." in err, err[
        -3000:
    ]
    assert "supervision.restart.max_cluster_restarts (0)" in err
    assert "terminating 3 instance(s)" in err
    assert instances(clean_region, ("pending", "running")) == []
    assert not [e for e in events_of(tmp_path) if e["event"] == "instance_replaced"]


@pytest.mark.slow
@pytest.mark.ssh
def test_a_detached_runs_lost_instance_is_replaced_by_the_laptops_watcher(
    ssh_test_hosts, tmp_path, clean_region, monkeypatch
):
    """``up --detach``: the coordinator on worker-1 has no cloud credentials; the watcher that
    ``up`` leaves on the laptop sees worker-3's instance end, tells the coordinator, replaces and
    prepares the instance, and its new agent joins: worker:2 restarts alone there."""
    import time

    restart = {"worker": "on-failure"}
    cluster = lost_host_cluster(tmp_path, ssh_test_hosts, clean_region, monkeypatch, restart)
    run = detached_run_losing(tmp_path, cluster, clean_region, "worker-3")
    meta, evs, old = run.meta, run.events, run.old
    watch_log = (tmp_path / "runs" / run.id / "watch.log").read_text()
    assert meta["state"] == "succeeded", (meta.get("message"), watch_log[-3000:])
    (replaced,) = [e for e in evs if e["event"] == "instance_replaced"]
    assert (replaced["host"], replaced["old"]) == ("worker-3", old) and replaced["new"] != old
    assert not [e for e in evs if e["event"] == "cluster_restarting"]
    (restarting,) = [e for e in evs if e["event"] == "restarting"]
    assert (restarting["task"], restarting["cause"]) == ("worker:2", "host_lost")
    assert f"worker-3 was lost (its instance {old} is terminated, says ec2)" in watch_log
    assert run.down.returncode == 0, run.down.stderr
    assert instances(clean_region, ("pending", "running")) == []
    time.sleep(1)
    assert not running(run.first["ssh_watcher_pid"]), "the watcher is still running"


def running(pid: int) -> bool:
    """``pid`` runs (a zombie that nobody reaped yet does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_a_detached_runs_coordinator_runs_on_an_on_demand_instance_when_there_is_one(tmp_path):
    """``spot_workers`` makes the worker hosts spot: a dedicated PS's on-demand instance takes
    the coordinator, so that every spot instance can be replaced while the run goes on; with
    every instance spot it is the first host, and ``up`` says what its loss does."""
    from tests.cloud.fixtures import provision_config
    from tflaunch.cluster.placement import make_plan
    from tflaunch.launchers.clouds import provider_for
    from tflaunch.launchers.clouds.provisioning import candidate_hosts, planned_instances
    from tflaunch.launchers.ssh.cloud import coordinator_host

    def where(extra: str, spot: bool, watched: bool = True) -> tuple[str, str]:
        more = "    spot_workers: true\n" if spot else ""
        config = provision_config(tmp_path, extra, more=more)
        provider = provider_for(config.section(SshSection).provision, print)
        plan = make_plan(config, candidate_hosts(provider, config))
        return coordinator_host(planned_instances(provider, config, plan), plan, watched)

    dedicated = "roles: {ps: 1, worker: 2}\nplacement: {ps: dedicated}\n"
    assert where(dedicated, spot=True) == (
        "ps-1",
        "an on-demand instance, so that each spot one (worker-1, worker-2) can be replaced "
        "while the run goes on",
    )
    assert where(dedicated, spot=False) == ("worker-1", "the first host")
    colocated = "roles: {ps: 1, worker: 2}\n"
    assert where(colocated, spot=True) == (
        "worker-1",
        "the first host: every instance is spot; if its instance ends, the watcher replaces it "
        "and starts the run again there from its checkpoints (a cluster restart)",
    )
    assert (
        "the run fails (without a restart policy nothing replaces it)"
        in (where(colocated, spot=True, watched=False)[1])
    )


@dataclasses.dataclass(frozen=True)
class LostHostRun:
    """A detached run that lost an instance, followed to its end: its id, what ``up`` said,
    run.json at the start and at the end, its events, the lost instance's id, ``down``'s result."""

    id: str
    said: str
    first: dict
    meta: dict
    events: list[dict]
    old: str
    down: subprocess.CompletedProcess


def detached_run_losing(
    tmp_path: Path, cluster: Path, endpoint: str, host: str, after: float = 0.0
) -> LostHostRun:
    """``up --detach --down`` of ``cluster``, then ``host``'s instance terminated (``after``
    seconds later); followed with 'status' (which mirrors the hosts) until the run ended, then
    'down'."""
    import time

    from tests.helpers import tflaunch

    runs = str(tmp_path / "runs")
    started = tflaunch("up", str(cluster), "--detach", "--down", timeout=180)
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    run_id = started.stdout.strip().splitlines()[-1]
    run_dir = tmp_path / "runs" / run_id
    meta_path = run_dir / "run.json"
    first = json.loads(meta_path.read_text())
    try:
        time.sleep(after)
        old = terminate_host(endpoint, host)
        deadline = time.monotonic() + 300
        while json.loads(meta_path.read_text()).get("ended") is None:
            assert time.monotonic() < deadline, (run_dir / "watch.log").read_text()
            tflaunch("status", run_id, "--run-dir", runs, timeout=120)  # mirrors the hosts
            time.sleep(3)
        meta = json.loads(meta_path.read_text())
        evs = events_of(tmp_path)
    finally:
        down = tflaunch("down", run_id, "--run-dir", runs, timeout=120)
    return LostHostRun(run_id, started.stderr, first, meta, evs, old, down)


def coordinators_host_lost(tmp_path, hosts, endpoint, monkeypatch, max_cluster_restarts: int):
    """A detached run on three spot instances (so its coordinator is on worker-1) whose
    worker-1 is terminated mid-run; waits for the run's end (mirrored by 'status'), then
    'down'. run.json at the start and at the end, the events, watch.log, and what ``up`` said."""
    import time

    restart = {"worker": "on-failure", "max_cluster_restarts": max_cluster_restarts}
    cluster = lost_host_cluster(tmp_path, hosts, endpoint, monkeypatch, restart)
    run = detached_run_losing(tmp_path, cluster, endpoint, "worker-1", after=3)  # the tasks run
    assert run.down.returncode == 0, run.down.stderr
    assert instances(endpoint, ("pending", "running")) == []
    time.sleep(1)
    assert not running(run.first["ssh_watcher_pid"]), "the watcher is still running"
    assert not run_processes(run.id, str(tmp_path)), "processes of the run still run"
    watch_log = (tmp_path / "runs" / run.id / "watch.log").read_text()
    return run.first, run.meta, run.events, watch_log, run.old, run.said


@pytest.mark.slow
@pytest.mark.ssh
def test_a_detached_run_goes_on_when_its_coordinators_instance_ends(
    ssh_test_hosts, tmp_path, clean_region, monkeypatch
):
    """Every instance is spot, so the coordinator runs on the first host, worker-1. Its instance
    is terminated mid-run: the watcher stops the other hosts' agents, replaces the instance,
    starts a new coordinator there (counting a cluster restart) and new agents everywhere; the
    run completes with exit 0, and afterwards nothing of it runs."""
    first, meta, evs, watch_log, old, said = coordinators_host_lost(
        tmp_path, ssh_test_hosts, clean_region, monkeypatch, max_cluster_restarts=2
    )
    assert (
        "detached: the coordinator runs on worker-1 (the first host: every instance is spot; if "
        "its instance ends, the watcher replaces it and starts the run again there from its "
        "checkpoints (a cluster restart))" in said
    )
    assert meta["state"] == "succeeded", (meta.get("message"), watch_log[-3000:])
    assert meta["exit_code"] == 0
    assert meta["ssh_coordinator"] == "worker-1"
    assert meta["ssh_coordinator_pid"] != first["ssh_coordinator_pid"]
    (replaced,) = [e for e in evs if e["event"] == "instance_replaced"]
    assert (replaced["host"], replaced["old"]) == ("worker-1", old) and replaced["new"] != old
    (restarting,) = [e for e in evs if e["event"] == "cluster_restarting"]
    assert (restarting["host"], restarting["generation"]) == ("worker-1", 1)
    # the old coordinator was ended before its agents: it saw no failure, stopped nothing
    assert not [e for e in evs if e["event"] == "failed"], evs
    assert [e["event"] for e in evs].count("stopping_cluster") == 1, evs
    started_tasks = sorted(e["task"] for e in evs if e["event"] == "started")
    assert started_tasks == sorted(2 * ["ps:0", "worker:0", "worker:1", "worker:2"]), evs
    # the new agents count the cluster restart ($TFLAUNCH_CLUSTER_RESTARTS)
    generations = sorted(e.get("generation", 0) for e in evs if e["event"] == "started")
    assert generations == 4 * [0] + 4 * [1], evs
    assert f"worker-1 was lost (its instance {old} is terminated, says ec2) and ran the " in (
        watch_log
    )
    assert "(cluster restart 1 of at most 2)" in watch_log


@pytest.mark.slow
@pytest.mark.ssh
def test_past_the_limit_a_detached_run_fails_when_its_coordinators_instance_ends(
    ssh_test_hosts, tmp_path, clean_region, monkeypatch
):
    """``max_cluster_restarts: 0``: the coordinator's host lost ends the run at once, failed,
    naming the instance and the limit; the other hosts' agents are stopped."""
    _, meta, evs, watch_log, old, _ = coordinators_host_lost(
        tmp_path, ssh_test_hosts, clean_region, monkeypatch, max_cluster_restarts=0
    )
    assert (meta["state"], meta["exit_code"]) == ("failed", 1), meta
    assert meta["message"] == (
        f"worker-1 was lost (its instance {old} is terminated, says ec2), and with it the run's "
        "coordinator. Not restarted: the cluster was restarted 0 time(s), the limit of "
        "supervision.restart.max_cluster_restarts (0)"
    )
    assert meta["message"] in watch_log
    assert [e["event"] for e in evs][-2:] == ["host_lost", "failed"], evs
    assert not [e for e in evs if e["event"] == "instance_replaced"]


def run_processes(run_id: str, marker: str) -> list[str]:
    """The run's processes still running on this machine (the namespace hosts share its
    processes): command lines that name the run (coordinators, agents), or tasks, whose
    environment holds the test's marker."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        line = " ".join(proc.info["cmdline"] or [])
        try:
            task = proc.environ().get("TEST_MARKER") == marker
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            task = False
        if run_id in line or task:
            found.append(line)
    return found


def test_a_coordinator_lost_while_it_ended_the_run_does_not_start_it_again(tmp_path):
    """The watcher reads the run's end every few seconds; a coordinator's host lost in between
    has already stopped the cluster (the mirrored events say so): the run is not started again."""
    from types import SimpleNamespace

    from tflaunch.launchers.ssh.watch import CoordinatorRestart
    from tflaunch.runtime import protocol
    from tflaunch.runtime.run import Run

    run = Run.create(tmp_path, "r")
    restart = SimpleNamespace(run=run)

    def add(*events: protocol.Event) -> None:
        with run.events_path.open("a") as f:
            f.writelines(json.dumps(e.wire()) + "\n" for e in events)

    add(protocol.CoordinatorStarted(hosts=["worker-1", "worker-2"]))
    assert not CoordinatorRestart.ending(restart)  # training
    add(protocol.StoppingCluster())
    assert CoordinatorRestart.ending(restart)  # tearing down: the run was over
    add(protocol.CoordinatorStarted(hosts=["worker-1", "worker-2"]))
    assert not CoordinatorRestart.ending(restart)  # a coordinator started again since

    def agent(host: str, event: protocol.Event) -> None:
        with run.events_path.open("a") as f:
            f.write(json.dumps({"host": host, **event.wire()}) + "\n")

    agent("worker-2", protocol.AgentExit())  # one host's agent (its instance was replaced)
    agent("worker-2", protocol.AgentStarted(pid=7))
    agent("worker-1", protocol.AgentExit())
    assert not CoordinatorRestart.ending(restart)
    agent("worker-2", protocol.AgentExit())  # every task exited: no stopping, the agents end
    assert CoordinatorRestart.ending(restart)


@pytest.mark.slow
@pytest.mark.ssh
def test_a_detached_benchmarks_own_trace_reaches_the_laptop_from_a_worker_away_from_the_coordinator(
    ssh_test_hosts, tmp_path, clean_region, monkeypatch
):
    """up --detach --trace of tflaunch.models.benchmark (its own trace hooks: worker:0 captures
    and merges) on a dedicated PS and a spot worker: the coordinator runs on the PS's on-demand
    instance (ps-1, namespace host1), worker:0 on worker-1 (host2), each with its own run
    directory. No window opens (the step pattern matches none of its lines), yet worker-1's agent
    is asked for its files on worker:0's in-program note, sends the trace over its connection at
    its end, the verdict names it, and 'tflaunch trace RUN' on the laptop shows it."""
    pytest.importorskip("tensorflow")
    from tests.helpers import tflaunch
    from tests.ssh.fixtures import cli, wait_ended
    from tflaunch.launchers.clouds.ec2.provider import ADDRESS_MAP_ENV

    argv = [sys.executable, "-m", "tflaunch.models.benchmark", "--model", "inception3"]
    argv += ["--image_size", "75", "--batch_size", "2", "--num_batches", "8"]
    argv += ["--num_warmup_batches", "2", "--display_every", "4"]
    cluster = spot_cluster(
        tmp_path,
        ssh_test_hosts,
        clean_region,
        monkeypatch,
        program={"argv": argv, "env": {"TEST_MARKER": str(tmp_path)}},
        roles={"ps": 1, "worker": 1},
        placement={"ps": "dedicated"},
        # a step pattern the benchmark's lines never match: the launcher's window never opens
        supervision={
            "ready_timeout": 240,
            "heartbeat": 1,
            "heartbeat_timeout": 20,
            "step_pattern": r"\btrained step (\d+)",
        },
    )
    host1, host2, _ = ssh_test_hosts.hosts
    mapping = {
        name: {"connect": h.public_address, "address": h.private_address}
        for name, h in (("ps-1", host1), ("worker-1", host2))
    }
    (tmp_path / "addresses.json").write_text(json.dumps(mapping))
    monkeypatch.setenv(ADDRESS_MAP_ENV, str(tmp_path / "addresses.json"))
    started = tflaunch("up", str(cluster), "--detach", "--down", "--trace", "2:3", timeout=300)
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    assert "detached: the coordinator runs on ps-1 (an on-demand instance" in started.stderr
    run_id = started.stdout.strip().splitlines()[-1]
    run = tmp_path / "runs" / run_id
    try:
        status = wait_ended(tmp_path, run_id, 400)
        assert f"run {run_id}: succeeded" in status, status + (run / "console.log").read_text()
        shown = cli(tmp_path, "trace", run_id)
    finally:
        down = cli(tmp_path, "down", run_id)
    assert down.returncode == 0, down.stderr
    assert shown.returncode == 0, shown.stdout + shown.stderr + (run / "console.log").read_text()
    plan = json.loads((run / "plan.json").read_text())
    hosts = {f"{t['job']}:{t['index']}": t["host"] for t in plan["tasks"]}
    assert hosts == {"ps:0": "ps-1", "worker:0": "worker-1"}
    trace = json.loads((run / "trace" / "trace.json").read_text())
    names = {
        e["args"]["name"].split()[0] for e in trace["traceEvents"] if e["name"] == "process_name"
    }
    assert names == {"ps:0", "worker:0"}
    # written by worker:0 on worker-1, sent over its agent's link to the coordinator on ps-1
    remote = tmp_path / "remote" / run_id
    written = remote / "worker-1" / "trace" / "trace.json"
    assert (remote / "ps-1" / "trace" / "trace.json").read_bytes() == written.read_bytes()
    sent = [
        e
        for e in map(json.loads, (run / "events.jsonl").read_text().splitlines())
        if e.get("event") == "trace_sent" and e.get("host") == "worker-1"
    ]
    assert len(sent) == 1 and "trace.json" in sent[0]["files"], sent
    ok, line = json.loads((run / "trace" / "verdict.json").read_text()).values()
    assert ok and line == f"trace: {remote / 'ps-1' / 'trace' / 'trace.json'}"
    assert f"[tflaunch] {line}" in (run / "console.log").read_text()
    assert "worker:0" in shown.stdout and "ps:0" in shown.stdout
    assert instances(clean_region, ("pending", "running")) == []
