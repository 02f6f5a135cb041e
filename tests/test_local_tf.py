"""End to end on the local backend where TensorFlow is the subject: the README's MNIST example
(real TensorFlow tasks, slow), and TensorFlow's own reading of the TF_CONFIG every task gets."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

from tests.helpers import (
    FAKE_TASK,
    LazyModule,
    assert_kill_ends_cluster,
    logged_accuracy,
    read_until,
    start_tflaunch,
    tensorflow_module,
    tflaunch,
    wait_until_gone,
    write_cluster,
)
from tflaunch.tools.report import PLOTS

tf = LazyModule("tensorflow")
pytestmark = tensorflow_module()
ROOT = Path(__file__).resolve().parent.parent
REPORT_ENV = Path(__file__).resolve().parent / "programs" / "report_env.py"
MIB = 1024 * 1024


def test_example_local_trains_to_90_percent_leaves_samples_and_a_report_and_nothing_else(
    tmp_path,
):
    """The README's first command: examples/local.yaml, here on free ports. The local backend's
    one MNIST run also carries the resource report's check (it was tests/test_report.py's own
    MNIST run): every task is sampled with TensorFlow's memory and threads, and the report has
    its plots and totals."""
    example = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
    example["program"]["env"] = {"TEST_MARKER": str(tmp_path)}
    cluster = write_cluster(
        tmp_path / "local.yaml",
        example["program"],
        name=example["name"],
        roles=example["roles"],
        supervision={"sample_interval": 0.5},
    )
    result = tflaunch("up", str(cluster), cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    accuracy = [
        float(line.rsplit(":", 1)[1])
        for line in result.stdout.splitlines()
        if line.startswith("[worker:0] test accuracy:")
    ]
    assert accuracy and accuracy[0] > 0.9, result.stdout[-2000:]
    assert "[worker:1] train accuracy:" in result.stdout

    (run,) = (tmp_path / "runs").iterdir()
    # models/mnist.py's own promises on this cluster (tests/test_mnist.py started the same three
    # tasks from their flags without tflaunch to check them): both workers learn the digits, the
    # chief alone evaluates the test set, each reports its steps, and the PS never exits by itself.
    chief, other = ((run / f"worker-{i}.log").read_text() for i in (0, 1))
    assert logged_accuracy(chief, "train") > 0.9 and logged_accuracy(other, "train") > 0.9
    assert logged_accuracy(chief, "test") > 0.9 and "test accuracy:" not in other
    for log in (chief, other):
        assert re.search(r"^steps/sec: [0-9.]+$", log, flags=re.MULTILINE)
        assert re.search(r"step \d+ \(global \d+\): loss [0-9.]+, train accuracy", log)
    assert "exited by itself" not in result.stdout + result.stderr
    report = tflaunch("report", str(run))
    assert report.returncode == 0, report.stderr
    data = json.loads((run / "summary.json").read_text())
    assert set(data["tasks"]) == {"ps:0", "worker:0", "worker:1"}
    for name, task in data["tasks"].items():
        assert task["rss_peak"] > 200 * MIB, name  # TensorFlow is loaded
        assert task["threads_peak"] > 10, name
        assert task["cpu_percent_peak"] > 10, name
    assert data["nodes"]["localhost"]["interfaces"]["lo"]["packets_sent"] > 0
    assert all((run / name).stat().st_size > 10_000 for name in PLOTS)
    assert wait_until_gone(str(tmp_path)) == []


def test_tf_config_resolves_to_the_plan_and_a_killed_worker_ends_the_cluster(tmp_path, monkeypatch):
    """Every task's TF_CONFIG as the task received it (report_env.py in front of the stand-in
    task) is read by TensorFlow's own TFConfigClusterResolver as the plan says: in this process,
    one TensorFlow import instead of one per task. Then a killed worker ends the cluster."""
    argv = [sys.executable, str(REPORT_ENV), sys.executable, str(FAKE_TASK)]
    cluster = write_cluster(
        tmp_path / "cluster.yaml",
        {"argv": argv, "env": {"TEST_MARKER": str(tmp_path), "WORK_SECONDS": "120"}},
        roles={"ps": 1, "worker": 2, "chief": 1},
    )
    plan = json.loads(tflaunch("plan", "--json", str(cluster)).stdout)
    proc = start_tflaunch("up", str(cluster))
    try:
        seen = ""
        while seen.count("REPORT_ENV CUDA_VISIBLE_DEVICES=") < 4:
            seen += read_until(proc.stdout, "REPORT_ENV CUDA_VISIBLE_DEVICES=", timeout=60)
        received: dict[str, dict[str, str]] = {}
        for line in seen.splitlines():
            task, _, said = line.partition("]")
            if said.strip().startswith("REPORT_ENV "):
                key, _, value = said.strip().removeprefix("REPORT_ENV ").partition("=")
                received.setdefault(task.lstrip("["), {})[key] = value
        for task in plan["tasks"]:
            got = received[f"{task['job']}:{task['index']}"]
            monkeypatch.setenv("TF_CONFIG", got["TF_CONFIG"])
            resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
            assert resolver.cluster_spec().as_dict() == {
                j: list(a) for j, a in plan["cluster"].items()
            }
            assert (resolver.task_type, resolver.task_id) == (task["job"], task["index"])
        assert received["ps:0"]["CUDA_VISIBLE_DEVICES"] == "''"  # exported, and empty

        assert_kill_ends_cluster(proc, str(tmp_path))
    finally:
        proc.kill()
    assert wait_until_gone(str(tmp_path)) == []
