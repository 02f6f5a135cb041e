"""tflaunch.models.cluster (every program's cluster resolution), the model registry, and the
cluster file's TensorFlow ClusterResolver.

The resolution and the registry are pure Python and tested without TensorFlow; the resolver is
compared with TensorFlow's own TFConfigClusterResolver on the same cluster and task, and one slow
test trains a TF2 ParameterServerStrategy whose cluster comes only from a file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import tflaunch, wait_until_gone, write_cluster
from tflaunch.models import registry
from tflaunch.models.cluster import (
    ClusterError,
    ClusterInfo,
    add_cluster_flags,
    cluster_from_args,
    parse_task,
)

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1", "p:2"]}


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_cluster_flags(parser)
    return parser.parse_args(list(argv))


def _file(tmp_path: Path, cluster: object = CLUSTER, name: str = "cluster.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"cluster": cluster}))
    return str(path)


def _tf_config(job: str, index: int, cluster: dict = CLUSTER) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})


# --- resolution: every source, one result ------------------------------------------------------


def test_flags_file_and_tf_config_describe_the_same_task(tmp_path):
    flags = _args(
        "--job_name=worker", "--task_index=1", "--ps_hosts=p:1,p:2", "--worker_hosts=w:1,w:2",
        "--chief_hosts=c:1",
    )  # fmt: skip
    from_flags = cluster_from_args(flags, {})
    from_file = cluster_from_args(
        _args("--cluster_file", _file(tmp_path)), {"TFLAUNCH_TASK": "worker:1"}
    )
    from_tf_config = cluster_from_args(_args(), {"TF_CONFIG": _tf_config("worker", 1)})
    expected = ClusterInfo(CLUSTER, "worker", 1)
    assert from_flags == from_file == from_tf_config == expected
    assert (from_file.source, from_file.cluster_file) == (
        f"the cluster file {tmp_path / 'cluster.json'}",
        str(tmp_path / "cluster.json"),
    )
    assert from_tf_config.cluster_file is None


def test_rank_order_chief_first_and_the_chief_role():
    info = ClusterInfo(CLUSTER, "worker", 1)
    assert info.training_tasks == [("chief", 0), ("worker", 0), ("worker", 1)]
    assert (info.rank, info.num_training_tasks, info.num_ps, info.is_chief) == (2, 3, 2, False)
    assert ClusterInfo(CLUSTER, "chief", 0).is_chief
    assert ClusterInfo({"worker": ["w:1"], "ps": ["p:1"]}, "worker", 0).is_chief
    assert not ClusterInfo(CLUSTER, "ps", 0).is_training_task
    assert info.jobs("chief", "worker") == {"chief": ["c:1"], "worker": ["w:1", "w:2"]}
    assert (info.name, info.device) == ("worker:1", "/job:worker/task:1")
    for rank, (job, index) in enumerate(info.training_tasks):
        assert ClusterInfo(CLUSTER, job, index).rank == rank
    with pytest.raises(ValueError, match="ps:0 is not a training task"):
        _ = ClusterInfo(CLUSTER, "ps", 0).rank


def test_the_file_comes_from_the_environment_and_the_task_from_flags_or_environment(tmp_path):
    environ = {"TFLAUNCH_CLUSTER_FILE": _file(tmp_path), "TFLAUNCH_TASK": "ps:1"}
    assert cluster_from_args(_args(), environ) == ClusterInfo(CLUSTER, "ps", 1)
    flags = _args("--job_name=chief", "--task_index=0")
    assert cluster_from_args(flags, environ) == ClusterInfo(CLUSTER, "chief", 0)


def test_precedence_flags_then_cluster_file_then_tf_config(tmp_path):
    environ = {
        "TF_CONFIG": _tf_config("worker", 0, {"worker": ["x:1"]}),
        "TFLAUNCH_TASK": "worker:0",
    }
    file_flag = _args("--cluster_file", _file(tmp_path))
    assert cluster_from_args(file_flag, environ).cluster == CLUSTER
    hosts = _args("--cluster_file", _file(tmp_path), "--job_name=worker", "--worker_hosts=f:1")
    assert cluster_from_args(hosts, environ).cluster == {"worker": ["f:1"]}
    assert cluster_from_args(_args(), environ).cluster == {"worker": ["x:1"]}
    assert cluster_from_args(_args(), {}) is None


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (["--worker_hosts=a:1"], {}, "without --job_name"),
        (["--job_name=worker"], {}, "the cluster is empty"),
        (["--job_name=ps", "--ps_hosts=a:1"], {}, "no worker or chief task"),
        (["--job_name=worker", "--task_index=2", "--worker_hosts=a:1,a:2"], {},
         "index must be 0..1"),
        (["--job_name=chief", "--chief_hosts=a:1,a:2"], {}, "at most one chief"),
        ([], {"TF_CONFIG": "{not json"}, "TF_CONFIG is not a valid cluster description"),
        ([], {"TF_CONFIG": json.dumps({"cluster": CLUSTER})}, 'TF_CONFIG has no "task"'),
        ([], {"TF_CONFIG": json.dumps({"cluster": {"worker": "a:1"}, "task": {"type": "worker"}})},
         "lists of host:port"),
        ([], {"TF_CONFIG": _tf_config("master", 0)}, "unknown job 'master'"),
    ],
)  # fmt: skip
def test_bad_descriptions_say_where_and_what(argv, environ, message):
    with pytest.raises(ClusterError, match=re.escape(message)):
        cluster_from_args(_args(*argv), environ)


def test_bad_cluster_files_and_tasks(tmp_path):
    good = _file(tmp_path)
    (tmp_path / "bad.json").write_text("{")
    cases = [
        (str(tmp_path / "missing.json"), "worker:0", "cannot read the cluster file"),
        (str(tmp_path / "bad.json"), "worker:0", "is not JSON"),
        (good, "", "gives the cluster but not this task"),
        (good, "worker", "is not a task; expected job:index"),
        (good, "worker:7", "task worker:7 is not in the cluster"),
        (_file(tmp_path, {"worker": [1, 2]}, "numbers.json"), "worker:0", "lists of host:port"),
    ]
    for path, task, message in cases:
        with pytest.raises(ClusterError, match=re.escape(message)):
            cluster_from_args(_args("--cluster_file", path), {"TFLAUNCH_TASK": task})
    assert parse_task(" chief:0 ") == ("chief", 0)


def test_resolution_imports_no_tensorflow():
    probe = (
        "import sys, tflaunch.models.cluster, tflaunch.models.registry\n"
        "print('tensorflow' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert result.stdout.strip() == "False"


def test_cluster_file_run_of_1_ps_and_2_workers_through_tflaunch_up(tmp_path):
    """Each task's cluster comes from the cluster file tflaunch writes (--cluster_file
    {cluster_file}, no TF_CONFIG) and its task from $TFLAUNCH_TASK: issue 11 end to end. The
    program is the stand-in tflaunch.models.smoke, which resolves its cluster through this module
    as mnist.py and pss.py do (MNIST's own training is tests/test_mnist.py's)."""
    argv = [sys.executable, "-m", "tflaunch.models.smoke", "--cluster_file", "{cluster_file}"]
    argv += ["--steps", "3", "--step-seconds", "0.1"]
    program = {"argv": argv, "env": {"TEST_MARKER": str(tmp_path)}, "tf_config": False}
    config = write_cluster(tmp_path / "cluster.yaml", program)
    result = tflaunch("up", str(config), cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    cluster_file = re.escape(str(run / "cluster_spec.json"))
    for task in ("ps:0", "worker:0", "worker:1"):
        line = rf"^\[{task}\]\s+{task}: cluster from the cluster file {cluster_file} \(ps 1, worker 2\)"
        assert re.search(line, result.stdout, re.M), result.stdout[-3000:]
    assert "[worker:0] worker:0: reached all 1 PS" in result.stdout
    assert "[worker:1] worker:1 done" in result.stdout
    assert wait_until_gone(str(tmp_path)) == []


# --- the model registry --------------------------------------------------------------------------


def test_registry_main_names_are_tf_cnn_benchmarks_and_old_names_are_aliases():
    assert registry.model_names() == ("inception3", "resnet50", "mnist")
    assert registry.model_names(benchmark=True) == ("inception3", "resnet50")
    assert registry.model_names(aliases=True) == ("inception3", "resnet50", "mnist", "inception_v3")
    assert registry.get_model_spec("inception_v3") is registry.get_model_spec("inception3")
    assert registry.get_model_spec("inception_v3", benchmark=True).name == "inception3"
    assert all(alias not in registry.MODELS for alias in registry.ALIASES)
    assert all(name in registry.MODELS for name in registry.ALIASES.values())


def test_registry_refuses_unknown_names_listing_names_and_aliases():
    with pytest.raises(registry.UnknownModelError) as error:
        registry.get_model_spec("vgg16")
    assert str(error.value) == (
        "unknown --model 'vgg16'; choose one of: inception3, resnet50, mnist "
        "(aliases: inception_v3)"
    )
    with pytest.raises(registry.UnknownModelError, match="not a CNN the benchmark trains"):
        registry.get_model_spec("mnist", benchmark=True)


def test_placement_report_and_benchmark_take_the_registry_names():
    from click.testing import CliRunner

    from tflaunch.tools.placement_command import placement

    result = CliRunner().invoke(placement, ["--model", "vgg16"])
    assert result.exit_code == 2
    assert "'inception3', 'resnet50', 'mnist', 'inception_v3'" in result.output


# --- the TensorFlow resolver ---------------------------------------------------------------------


@pytest.fixture
def tf():
    return pytest.importorskip("tensorflow")


def _tf_config_resolver(tf, monkeypatch, job: str | None, index: int | None, cluster=CLUSTER):
    document: dict = {"cluster": cluster}
    if job is not None:
        document["task"] = {"type": job, "index": index}
    monkeypatch.setenv("TF_CONFIG", json.dumps(document))
    return tf.distribute.cluster_resolver.TFConfigClusterResolver()


@pytest.mark.parametrize(
    ("job", "index", "cluster"),
    [
        ("worker", 1, CLUSTER),
        ("chief", 0, CLUSTER),
        ("ps", 1, CLUSTER),
        ("worker", 0, {"worker": ["only:1"]}),
    ],
)
def test_resolver_answers_as_tf_config_resolver(tf, monkeypatch, tmp_path, job, index, cluster):
    from tflaunch.models.cluster_file_resolver import ClusterFileResolver

    ours = ClusterFileResolver(_file(tmp_path, cluster), job, index)
    theirs = _tf_config_resolver(tf, monkeypatch, job, index, cluster)
    assert ours.cluster_spec().as_dict() == theirs.cluster_spec().as_dict()
    assert (ours.task_type, ours.task_id, ours.rpc_layer) == (
        theirs.task_type,
        theirs.task_id,
        theirs.rpc_layer,
    )
    assert ours.master() == theirs.master()
    assert ours.master(rpc_layer="grpc") == theirs.master(rpc_layer="grpc")
    if "ps" in cluster:
        assert ours.master("ps", 0) == theirs.master("ps", 0) == "p:1"


def test_resolver_reads_file_and_task_from_the_environment(tf, monkeypatch, tmp_path):
    from tflaunch.models.cluster_file_resolver import ClusterFileResolver

    monkeypatch.setenv("TFLAUNCH_CLUSTER_FILE", _file(tmp_path))
    monkeypatch.setenv("TFLAUNCH_TASK", "worker:1")
    resolver = ClusterFileResolver(rpc_layer="grpc")
    assert (resolver.task_type, resolver.task_id, resolver.master()) == ("worker", 1, "grpc://w:2")
    training = ClusterFileResolver(jobs=("chief", "worker"))
    assert training.cluster_spec().as_dict() == {"chief": ["c:1"], "worker": ["w:1", "w:2"]}
    assert ClusterFileResolver(task_type="ps", task_id=0).master() == "p:1"
    monkeypatch.delenv("TFLAUNCH_TASK")
    assert ClusterFileResolver().task_type is None  # as TF_CONFIG without a task
    with pytest.raises(ClusterError, match="task worker:5 is not in the cluster file"):
        ClusterFileResolver(task_type="worker", task_id=5)
    monkeypatch.delenv("TFLAUNCH_CLUSTER_FILE")
    with pytest.raises(ClusterError, match="no cluster file"):
        ClusterFileResolver()


def test_resolver_for_any_source_answers_as_tf_config_resolver(tf, monkeypatch, tmp_path):
    from tflaunch.models.cluster_file_resolver import (
        ClusterFileResolver,
        StaticClusterResolver,
        resolver_for,
    )

    theirs = _tf_config_resolver(tf, monkeypatch, "worker", 1)
    from_tf_config = cluster_from_args(_args(), os.environ)
    from_file = cluster_from_args(
        _args("--cluster_file", _file(tmp_path), "--job_name=worker", "--task_index=1"), {}
    )
    for info in (from_tf_config, from_file):
        ours = resolver_for(info)
        assert ours.cluster_spec().as_dict() == theirs.cluster_spec().as_dict()
        assert (ours.task_type, ours.task_id, ours.master()) == ("worker", 1, theirs.master())
        # This machine's devices, as TFConfigClusterResolver counts them (SimpleClusterResolver
        # would report none, and MultiWorkerMirroredStrategy would leave a GPU unused).
        assert ours.num_accelerators() == theirs.num_accelerators()
    assert type(resolver_for(from_tf_config)) is StaticClusterResolver
    assert type(resolver_for(from_file)) is ClusterFileResolver
    training = resolver_for(from_tf_config, rpc_layer="grpc", jobs=("chief", "worker"))
    assert sorted(training.cluster_spec().jobs) == ["chief", "worker"]
    assert training.master() == "grpc://w:2"


@pytest.mark.slow  # one process: 2 PS and 2 worker servers in-process, the chief coordinating
def test_parameter_server_strategy_trains_from_a_cluster_file(tmp_path):
    import socket

    sockets = [socket.socket() for _ in range(5)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    hosts = [f"127.0.0.1:{sock.getsockname()[1]}" for sock in sockets]
    for sock in sockets:
        sock.close()
    path = _file(tmp_path, {"chief": hosts[:1], "worker": hosts[1:3], "ps": hosts[3:]})
    program = ROOT / "tests" / "programs" / "ps_strategy_from_cluster_file.py"
    environ = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    result = subprocess.run(
        [sys.executable, str(program), path],
        capture_output=True,
        text=True,
        timeout=180,
        env={**environ, "TFLAUNCH_TASK": "chief:0"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("ps-strategy: ")]
    report = json.loads(line.split(": ", 1)[1])
    assert report["task"] == ["chief", 0]
    assert [d.split("/device")[0] for d in report["devices"]] == [
        "/job:ps/replica:0/task:0",
        "/job:ps/replica:0/task:1",
    ]
    assert report["last_loss"] < report["first_loss"] / 10
