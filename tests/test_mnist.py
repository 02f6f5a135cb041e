"""models/mnist.py and models/data/digits.py: pure parts in-process, and real clusters as subprocesses.

The end-to-end test starts real TensorFlow tasks on free loopback ports: it describes a cluster
with a chief, a worker and an evaluator through TF_CONFIG and starts the worker only after the
chief has finished training (the case that hangs a naive MonitoredTrainingSession program). The
default 1 PS + 2 worker run from flags, trained to >90 % accuracy, is tests/test_local_tf.py's
(examples/local.yaml through tflaunch: the same three tasks).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import LazyModule, logged_accuracy, tensorflow_module
from tflaunch.models.cluster import ClusterInfo
from tflaunch.models.data import digits

tf = LazyModule("tensorflow")
mnist = LazyModule("tflaunch.models.mnist")  # imports tensorflow
pytestmark = tensorflow_module()

REPO = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- flags and cluster


def test_defaults_and_flag_validation():
    args = mnist.parse_args([])
    assert (args.train_steps, args.batch_size, args.data_format) == (200, 50, "NHWC")
    assert args.variable_placement == "round_robin" and args.data_dir is None
    with pytest.raises(SystemExit) as exit_info:
        mnist.parse_args(["--train_steps", "0"])
    assert exit_info.value.code == 2
    assert mnist.parse_args(["--variable_placement", "partitioned"]).variable_placement
    with pytest.raises(SystemExit):
        mnist.parse_args(["--variable_placement", "random"])
    with pytest.raises(SystemExit):
        mnist.parse_args(["--data_format", "NCWH"])
    with pytest.raises(mnist.UsageError, match="drop rate"):
        mnist.parse_args(["--dropout", "1.0"])


def _flags(*argv: str) -> argparse.Namespace:
    return mnist.parse_args(list(argv))


def test_cluster_from_flags_without_chief_makes_worker_0_chief():
    args = _flags(
        "--job_name=worker", "--task_index=1", "--ps_hosts=a:1,b:2",
        "--worker_hosts=a:3, b:4", "--chief_hosts=",
    )  # fmt: skip
    info = mnist.resolve_cluster(args, {})
    assert info.cluster == {"ps": ["a:1", "b:2"], "worker": ["a:3", "b:4"]}
    assert (info.name, info.device, info.num_training_tasks) == (
        "worker:1",
        "/job:worker/task:1",
        2,
    )
    assert not info.is_chief
    assert ClusterInfo(info.cluster, "worker", 0).is_chief


def test_cluster_from_flags_with_chief():
    args = _flags("--job_name=chief", "--ps_hosts=a:1", "--worker_hosts=a:3", "--chief_hosts=a:2")
    info = mnist.resolve_cluster(args, {})
    assert info.is_chief and info.num_training_tasks == 2
    assert not ClusterInfo(info.cluster, "worker", 0).is_chief


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ps_hosts=a:1", "--worker_hosts=a:2"], "without --job_name"),
        (["--job_name=worker", "--worker_hosts=a:2"], "no ps task"),
        (["--job_name=ps", "--ps_hosts=a:1"], "no worker or chief"),
        (["--job_name=worker", "--task_index=2", "--ps_hosts=a:1", "--worker_hosts=a:2,a:3"],
         "index must be 0..1"),
        (["--job_name=chief", "--ps_hosts=a:1", "--chief_hosts=a:2,a:3"], "at most one chief"),
    ],
)  # fmt: skip
def test_bad_cluster_flags_are_usage_errors(argv, message):
    with pytest.raises(mnist.UsageError, match=message):
        mnist.resolve_cluster(_flags(*argv), {})


def _tf_config(cluster: dict, task_type: str, index: int) -> dict[str, str]:
    return {
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})
    }


def test_cluster_from_tf_config_and_environment_left_as_found(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "something else")
    cluster = {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]}
    info = mnist.resolve_cluster(_flags(), _tf_config(cluster, "worker", 1))
    assert info.cluster == cluster and info.name == "worker:1" and not info.is_chief
    assert info.num_training_tasks == 3
    assert os.environ["TF_CONFIG"] == "something else"
    evaluator = mnist.resolve_cluster(_flags(), _tf_config(cluster, "evaluator", 0))
    assert evaluator.job_name == "evaluator" and not evaluator.is_chief


def test_flags_win_over_tf_config():
    tf_config = _tf_config({"worker": ["x:1"], "ps": ["x:2"]}, "worker", 0)
    args = _flags("--job_name=ps", "--ps_hosts=a:1", "--worker_hosts=a:2")
    assert mnist.resolve_cluster(args, tf_config).cluster == {"ps": ["a:1"], "worker": ["a:2"]}


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({}, "no cluster"),
        ({"TF_CONFIG": "{not json"}, "TF_CONFIG is not a valid cluster description"),
        ({"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"], "ps": ["a:2"]}})}, 'no "task"'),
        (_tf_config({"worker": ["a:1"]}, "worker", 0), "no ps task"),
    ],
)
def test_bad_tf_config_is_a_usage_error(environ, message):
    with pytest.raises(mnist.UsageError, match=message):
        mnist.resolve_cluster(_flags(), environ)


def test_nchw_needs_a_gpu():
    with pytest.raises(mnist.UsageError, match="CPU convolutions support only NHWC"):
        mnist.check_data_format("NCHW", [])
    mnist.check_data_format("NCHW", ["/physical_device:GPU:0"])
    mnist.check_data_format("NHWC", [])


def test_main_refuses_nchw_on_this_cpu_only_machine_with_exit_2(capsys):
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("a GPU is visible: NCHW is allowed here")
    code = mnist.main(
        ["--job_name=worker", "--ps_hosts=localhost:1", "--worker_hosts=localhost:2",
         "--data_format=NCHW"]
    )  # fmt: skip
    assert code == 2
    assert "--data_format NCHW needs a GPU" in capsys.readouterr().err


def test_main_reports_missing_cluster_and_data_with_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert mnist.main([]) == 2
    assert "no cluster" in capsys.readouterr().err
    code = mnist.main(
        ["--job_name=worker", "--ps_hosts=localhost:1", "--worker_hosts=localhost:2",
         f"--data_dir={tmp_path}"]
    )  # fmt: skip
    assert code == 2
    assert "train-images-idx3-ubyte" in capsys.readouterr().err


# ----------------------------------------------------------------------------- graph


def _graph(job: str, compute_device: str, data_format: str = "NHWC", train: bool = True):
    cluster = {"ps": ["h:1", "h:2"], "worker": ["h:3", "h:4"]}
    info = ClusterInfo(cluster, job, 0)
    return mnist.build_graph(info, _flags(), compute_device, data_format, train)


def _variable_devices(handles) -> dict[str, str]:
    with handles.graph.as_default():
        return {v.op.name: v.device for v in tf.compat.v1.global_variables()}


def test_graph_is_the_deep_mnist_net_with_variables_round_robin_on_the_ps():
    handles = _graph("worker", "/job:worker/task:1")
    with handles.graph.as_default():
        shapes = {v.op.name: v.shape.as_list() for v in tf.compat.v1.trainable_variables()}
    assert shapes == {
        "conv1/weights": [5, 5, 1, 32], "conv1/biases": [32],
        "conv2/weights": [5, 5, 32, 64], "conv2/biases": [64],
        "fc1/weights": [3136, 1024], "fc1/biases": [1024],
        "fc2/weights": [1024, 10], "fc2/biases": [10],
    }  # fmt: skip
    devices = _variable_devices(handles)
    assert {d for d in devices.values()} == {"/job:ps/task:0", "/job:ps/task:1"}
    assert handles.loss.device == "/job:worker/task:1"
    assert handles.train_op is not None


def test_evaluator_and_nchw_graphs_place_shared_variables_like_the_training_graph():
    trainer = _variable_devices(_graph("worker", "/job:worker/task:0"))
    evaluator = _variable_devices(_graph("evaluator", "/job:ps/task:0", train=False))
    nchw = _variable_devices(_graph("worker", "/job:worker/task:0", "NCHW"))
    assert evaluator == {name: trainer[name] for name in evaluator}
    assert "workers_done" in evaluator and "global_step" in evaluator
    assert nchw == trainer


def test_batches_cover_each_epoch_once():
    images = np.arange(10, dtype=np.float32).reshape(10, 1, 1, 1)
    labels = np.arange(10)
    stream = mnist.batches(images, labels, 3, np.random.RandomState(0))
    epoch = [next(stream) for _ in range(3)]  # 3 full batches; the last odd one is skipped
    seen = np.concatenate([y for _, y in epoch])
    assert len(set(seen.tolist())) == 9
    assert all(np.array_equal(x.reshape(-1), y) for x, y in epoch)
    tiny = mnist.batches(images[:2], labels[:2], 50, np.random.RandomState(0))
    assert len(next(tiny)[1]) == 2  # batch larger than the data: the whole set


def test_watchdog_ends_a_stuck_process_with_exit_1():
    code = (
        "import time; from tflaunch.models.mnist import Watchdog; w = Watchdog('worker:7')\n"
        "with w.phase('connecting to nowhere', 0.5, '--startup_timeout_secs'): time.sleep(60)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "worker:7: error: connecting to nowhere did not finish within 0.5 s" in done.stderr


# ----------------------------------------------------------------------------- data


def _idx_bytes(array: np.ndarray) -> bytes:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(
        f">{array.ndim}I", *array.shape
    )
    return header + array.astype(np.uint8).tobytes()


def _write_idx_set(directory: Path, gz: bool, dotted: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.RandomState(3)
    arrays = {
        "train-images-idx3-ubyte": rng.randint(0, 256, (6, 28, 28)),
        "train-labels-idx1-ubyte": rng.randint(0, 10, 6),
        "t10k-images-idx3-ubyte": rng.randint(0, 256, (4, 28, 28)),
        "t10k-labels-idx1-ubyte": rng.randint(0, 10, 4),
    }
    for name, array in arrays.items():
        name = name.replace("-idx", ".idx") if dotted else name
        data = _idx_bytes(array)
        if gz:
            (directory / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (directory / name).write_bytes(data)
    return arrays


@pytest.mark.parametrize(("gz", "dotted"), [(False, False), (True, False), (True, True)])
def test_mnist_idx_files_load_scaled_to_0_1(tmp_path, gz, dotted):
    arrays = _write_idx_set(tmp_path, gz, dotted)
    data = digits.load_data(tmp_path)
    assert data.train_images.shape == (6, 28, 28, 1) and data.test_images.shape == (4, 28, 28, 1)
    assert data.train_images.dtype == np.float32
    np.testing.assert_allclose(
        data.train_images[..., 0] * 255, arrays["train-images-idx3-ubyte"], atol=1e-3
    )
    np.testing.assert_array_equal(data.test_labels, arrays["t10k-labels-idx1-ubyte"])
    assert data.train_labels.dtype == np.int64


def test_read_idx_keeps_declared_type_and_shape(tmp_path):
    path = tmp_path / "floats.idx"
    values = np.arange(6, dtype=">f4").reshape(2, 3)
    path.write_bytes(
        struct.pack(">BBBB", 0, 0, 0x0D, 2) + struct.pack(">2I", 2, 3) + values.tobytes()
    )
    np.testing.assert_array_equal(digits.read_idx(path), values)


def test_bad_idx_files_raise_data_errors(tmp_path):
    (tmp_path / "junk").write_bytes(b"PK\x03\x04 not idx")
    with pytest.raises(digits.DataError, match="not an IDX file"):
        digits.read_idx(tmp_path / "junk")
    truncated = _idx_bytes(np.zeros((3, 28, 28)))[:-10]
    (tmp_path / "short").write_bytes(truncated)
    with pytest.raises(digits.DataError, match="truncated or corrupt"):
        digits.read_idx(tmp_path / "short")


def test_npz_in_keras_layout_loads(tmp_path):
    rng = np.random.RandomState(0)
    np.savez(
        tmp_path / "mnist.npz",
        x_train=rng.randint(0, 256, (5, 28, 28)).astype(np.uint8),
        y_train=np.arange(5),
        x_test=rng.randint(0, 256, (2, 28, 28)).astype(np.uint8),
        y_test=np.array([7, 9]),
    )
    data = digits.load_mnist_dir(tmp_path)
    assert data.train_images.shape == (5, 28, 28, 1)
    assert data.train_images.min() >= 0.0 and data.train_images.max() <= 1.0
    assert data.test_labels.tolist() == [7, 9]


def test_npz_missing_arrays_and_missing_files_say_what_is_expected(tmp_path):
    np.savez(tmp_path / "mnist.npz", x_train=np.zeros((1, 28, 28)))
    with pytest.raises(digits.DataError, match="lacks the arrays y_train, x_test, y_test"):
        digits.load_mnist_dir(tmp_path)
    with pytest.raises(digits.DataError, match="not a directory"):
        digits.load_mnist_dir(tmp_path / "nope")


def test_sklearn_digits_become_mnist_like_28x28_with_a_fixed_split():
    data = digits.load_data(None)
    assert data.train_images.shape == (1497, 28, 28, 1)
    assert data.test_images.shape == (300, 28, 28, 1)
    assert data.train_images.dtype == np.float32
    assert data.train_images.min() == 0.0 and data.train_images.max() == pytest.approx(1.0)
    assert set(np.unique(data.test_labels)) == set(range(10))
    border = np.concatenate([data.train_images[:, :4], data.train_images[:, -4:]], axis=1)
    assert border.max() == 0.0  # digits sit in the central 20x20 box, as in MNIST
    again = digits.load_data(None)
    np.testing.assert_array_equal(again.test_labels, data.test_labels)


def test_resize_matches_tensorflow_bilinear():
    images = np.random.RandomState(1).rand(3, 8, 8)
    ours = digits.resize_images(images, 20)
    theirs = tf.image.resize(images[..., np.newaxis], [20, 20], method="bilinear").numpy()
    np.testing.assert_allclose(ours, theirs[..., 0], atol=1e-5)


# ----------------------------------------------------------------------------- real clusters


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class Tasks:
    """Real mnist.py processes, each in its own session, logging to files; stop() kills them all."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], env_extra: dict[str, str] | None = None) -> None:
        env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
        env.update(PYTHONUNBUFFERED="1", **(env_extra or {}))
        with open(self.log_dir / f"{name}.log", "wb") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "tflaunch.models.mnist", *argv],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def wait(self, name: str, deadline: float) -> int:
        try:
            return self.procs[name].wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} did not exit in time; its log:\n{self.log(name)[-3000:]}")

    def wait_for_output(self, name: str, text: str, deadline: float) -> None:
        while text not in self.log(name):
            if self.procs[name].poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{name} never printed {text!r}; its log:\n{self.log(name)[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


def _digits_as_mnist_files(directory: Path) -> Path:
    """scikit-learn's digits written as gzipped MNIST IDX files (uint8, 28x28)."""
    directory.mkdir()
    data = digits.load_data(None)
    files = {
        "train-images-idx3-ubyte": np.round(data.train_images[..., 0] * 255),
        "train-labels-idx1-ubyte": data.train_labels,
        "t10k-images-idx3-ubyte": np.round(data.test_images[..., 0] * 255),
        "t10k-labels-idx1-ubyte": data.test_labels,
    }
    for name, array in files.items():
        (directory / f"{name}.gz").write_bytes(gzip.compress(_idx_bytes(array)))
    return directory


@pytest.mark.slow
def test_tf_config_cluster_with_chief_evaluator_and_a_worker_that_starts_after_training(tmp_path):
    ps, chief, worker = (f"localhost:{port}" for port in _free_ports(3))
    cluster = {"chief": [chief], "worker": [worker], "ps": [ps]}
    data_dir = _digits_as_mnist_files(tmp_path / "mnist")  # the --data_dir path, end to end
    argv = [
        "--train_steps=30",
        "--log_every=10",
        "--eval_interval_secs=3",
        f"--data_dir={data_dir}",
    ]
    tasks = Tasks(tmp_path)
    try:
        for job in ("ps", "chief", "evaluator"):
            tasks.start(job, argv, _tf_config(cluster, job, 0))
        deadline = time.monotonic() + 180
        tasks.wait_for_output("chief", "test accuracy:", deadline)
        assert tasks.procs["chief"].poll() is None  # waits for the worker that has not started
        tasks.start("worker", argv, _tf_config(cluster, "worker", 0))
        assert tasks.wait("worker", deadline) == 0, tasks.log("worker")
        assert tasks.wait("chief", deadline) == 0, tasks.log("chief")
        assert tasks.wait("evaluator", deadline) == 0, tasks.log("evaluator")
        assert "session ready at global step 30" in tasks.log("worker")  # no extra update
        assert re.search(r"^steps/sec: 0\.00$", tasks.log("worker"), flags=re.MULTILINE)
        assert "all 2 training task(s) finished" in tasks.log("chief")
        assert 0.0 <= logged_accuracy(tasks.log("chief"), "test") <= 1.0
        assert re.search(r"evaluator:0: global step 3\d: test-set accuracy", tasks.log("evaluator"))
        assert f"MNIST IDX files in {data_dir}: 1497 train / 300 test images" in tasks.log("chief")
    finally:
        tasks.stop()
