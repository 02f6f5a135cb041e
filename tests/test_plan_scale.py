"""Large clusters: the plan stays linear, and what Linux cannot pass to a process (one argument or
environment string over MAX_ARG_STRLEN) is refused at plan time, before anything starts."""

from __future__ import annotations

import errno
import json
import subprocess
import sys

import pytest
import yaml

from tests.helpers import FAKE_TASK, fake_cluster, tflaunch, wait_until_gone
from tflaunch.cluster.config import parse_config
from tflaunch.cluster.placement import make_plan
from tflaunch.cluster.plan import Host, Plan
from tflaunch.cluster.render import MAX_ARG_STRLEN, render_task, tf_config_text
from tflaunch.errors import PlanError


def big_cluster(tmp_path, nodes: int, **program) -> str:
    """An SSH-style cluster file: ``nodes`` hosts of 8 GPUs, 8 workers each, a PS per 8 nodes."""
    data = {
        "name": "big",
        "backend": "local",
        "program": {"argv": ["python3", "train.py"], **program},
        "roles": {"ps": max(1, nodes // 8), "worker": nodes * 8},
        "placement": {"workers_per_host": 8},
        "hosts": [{"name": f"n{i}", "address": f"10.1.{i // 256}.{i % 256}", "gpus": 8}
                  for i in range(nodes)],
        "runs_dir": str(tmp_path / "runs"),
    }  # fmt: skip
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def workers_plan(workers: int, **program) -> Plan:
    lines = {"argv": ["p"], **program}
    config = parse_config(yaml.safe_dump({"program": lines, "roles": {"ps": 1, "worker": workers}}))
    return make_plan(config, [Host("h", "10.0.0.1", "10.0.0.1")])


def spawn_with_env(key: str, value: str) -> None:
    subprocess.run(["true"], env={key: value}, check=True)


def test_the_limit_is_the_kernels():
    spawn_with_env("X", "a" * (MAX_ARG_STRLEN - 3))  # "X=" + value + NUL: exactly the limit
    with pytest.raises(OSError) as err:
        spawn_with_env("X", "a" * (MAX_ARG_STRLEN - 2))
    assert err.value.errno == errno.E2BIG


def test_tf_config_check_is_exact_at_the_limit():
    """The largest cluster the plan accepts starts; one more worker would not, and is refused."""
    low, high = 1000, 9000  # accepted, refused
    while high - low > 1:
        mid = (low + high) // 2
        try:
            workers_plan(mid)
            low = mid
        except PlanError:
            high = mid
    widest = workers_plan(low).task(f"worker:{low - 1}")
    spawn_with_env("TF_CONFIG", render_task(workers_plan(low), widest).env["TF_CONFIG"])
    refused = workers_plan(high, tf_config=False)  # same cluster, no TF_CONFIG: planned
    with pytest.raises(OSError) as err:
        spawn_with_env("TF_CONFIG", tf_config_text(refused, "worker", high - 1))
    assert err.value.errno == errno.E2BIG


def test_argv_check_counts_the_cluster_lists():
    with pytest.raises(PlanError) as err:
        workers_plan(10000, argv=["p", "--workers={worker_hosts}"], tf_config=False)
    message = str(err.value)
    assert "program.argv item '--workers={worker_hosts}' would be" in message
    assert "131,072 bytes for one argument (MAX_ARG_STRLEN)" in message
    assert "'{cluster_file}'" in message and "in place of {worker_hosts}" in message
    workers_plan(10000, argv=["p", "--cluster={cluster_file}", "{num_workers}"], tf_config=False)


@pytest.mark.parametrize("command", ["validate", "plan", "up"])
def test_tf_config_past_the_limit_is_refused_with_exit_2_before_anything_starts(tmp_path, command):
    path = big_cluster(tmp_path, 1024)  # 8,320 tasks: TF_CONFIG of ~150 KB
    result = tflaunch(command, path, cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    message = result.stderr
    assert "every task's TF_CONFIG would be" in message and "8,320 tasks" in message
    assert "over Linux's limit of 131,072 bytes" in message
    assert "program.tf_config: false" in message and "$TFLAUNCH_CLUSTER_FILE" in message
    assert "Traceback" not in message and result.stdout == ""
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir())  # no run directory, nothing started


def test_cluster_file_mode_plans_big_clusters_linearly(tmp_path):
    program = {"argv": ["python3", "train.py", "{cluster_file}"], "tf_config": False}
    sizes = {}
    for nodes in (256, 1024):
        path = big_cluster(tmp_path, nodes, **program)
        plan_json = tflaunch("plan", "--json", path, cwd=tmp_path).stdout
        sizes[nodes] = len(plan_json)
    assert sizes[1024] / sizes[256] < 4.2  # linear: 4x the tasks, the cluster held once
    # --offline: the file and its plan at scale. This machine's checks would pick 8320 free
    # ports (two thirds of the free-port range) and bind each again to check it, and any port
    # another process takes meanwhile (a parallel test's) fails the check: test_validate_here
    # tests those checks on small files.
    checked = tflaunch("validate", "--offline", path, cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    data = json.loads(plan_json)
    assert len(data["cluster"]["worker"]) == 8192 and "env" not in data["tasks"][0]
    env = tflaunch("render", path, "--task", "worker:8191", "--format", "env").stdout
    assert "TF_CONFIG" not in env
    assert "export TFLAUNCH_CLUSTER_FILE='<run directory>/cluster_spec.json'" in env
    table = tflaunch("plan", path, cwd=tmp_path).stdout.splitlines()
    assert len(table) == 1 + 8320 + 2 and table[-3].startswith("worker:8191")
    assert table[-2].startswith("ports: the ps, worker tasks get free ports")  # no ports: in it
    assert table[-1] == "GPUs: 8 on n0, n1, n2 and 1021 more (hosts[].gpus)"  # one line, not 1024


def test_plan_table_leaves_long_cluster_lists_unexpanded(tmp_path):
    path = big_cluster(tmp_path, 64, argv=["python3", "train.py", "--workers={worker_hosts}"])
    table = tflaunch("plan", path, cwd=tmp_path).stdout.splitlines()
    assert table[1].endswith("python3 train.py '--workers={worker_hosts}'")
    assert table[-1].startswith("{worker_hosts}: 512 addresses, left unexpanded above")
    command = tflaunch("render", path, "--task", "worker:3", "--format", "command").stdout
    assert "--workers=10.1.0.0:2220,10.1.0.0:2221," in command


def test_slurm_node_plans_only_its_own_tasks_and_the_shared_cluster():
    config = parse_config(
        "program: [p]\nroles: {ps: 2, worker: 8}\nplacement: {workers_per_host: 2}\n"
    )
    hosts = [Host(f"n{i}", f"n{i}", f"n{i}", ("0", "1")) for i in range(4)]
    whole = make_plan(config, hosts)
    own = make_plan(config, hosts, only_host="n2")
    assert own.cluster == whole.cluster and own.tasks == whole.tasks_on("n2")
    assert [t.name for t in own.tasks] == ["worker:4", "worker:5"]
    task = own.task("worker:5")
    assert render_task(own, task, "/r") == render_task(whole, task, "/r")


def test_a_small_cluster_runs_through_the_cluster_file(tmp_path):
    cluster = fake_cluster(tmp_path)
    data = yaml.safe_load(cluster.read_text())
    data["program"].update(argv=[sys.executable, str(FAKE_TASK), "{cluster_file}"], tf_config=False)
    cluster.write_text(yaml.safe_dump(data))
    result = tflaunch("up", str(cluster))
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = (tmp_path / "runs").iterdir()
    cluster_file = run / "cluster_spec.json"
    assert f"[worker:1] cluster from file {cluster_file} (also $TFLAUNCH_CLUSTER_FILE: True)" in (
        result.stdout
    )
    assert "[worker:1] all ps reachable at start: True" in result.stdout
    plan = json.loads((run / "plan.json").read_text())
    assert json.loads(cluster_file.read_text()) == {"cluster": plan["cluster"]}
    assert wait_until_gone(str(cluster.parent)) == []
