"""tflaunch.models.benchmark: pure parts, flag errors, tiny single-process runs, and 1 PS + 2 workers
through `tflaunch up` under collective_all_reduce (slow; the graph modes' clusters are
tests/test_transfers.py's and tests/test_trace.py's)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import (
    check_benchmark_totals,
    tensorflow_module,
    tiny_benchmark_argv,
    tiny_tfrecords,
    up_tensorflow_cluster,
    wait_until_gone,
)
from tflaunch.models.benchmark_runners.common import (
    BenchmarkError,
    perf_line,
    perf_stats,
    should_display,
    timed_loop,
)
from tflaunch.models.cluster import ClusterInfo

ROOT = Path(__file__).resolve().parent.parent
PROGRESS = re.compile(r"^\d+\timages/sec: [\d.]+ \+/- [\d.]+ \(jitter = [\d.]+\)$", re.M)
TOTAL = re.compile(r"^total images/sec: ([\d.]+)$", re.M)
TINY = ["--model", "inception3", "--image_size", "75", "--batch_size", "2"]


# --- pure parts --------------------------------------------------------------------------------


def _resolve(argv: list[str], tf_config: str | None = None) -> ClusterInfo | None:
    """The benchmark's cluster from its command line and a TF_CONFIG, as main() resolves it."""
    from tflaunch.models.benchmark import build_parser, resolve_cluster

    environ = {"TF_CONFIG": tf_config} if tf_config else {}
    return resolve_cluster(build_parser().parse_args(argv), environ)


def test_cluster_from_flags() -> None:
    argv = ["--job_name", "worker", "--task_index", "1", "--ps_hosts", "h:1,h:2"]
    info = _resolve([*argv, "--worker_hosts", "h:3,h:4,h:5"])
    assert info == ClusterInfo({"ps": ["h:1", "h:2"], "worker": ["h:3", "h:4", "h:5"]}, "worker", 1)
    assert (info.num_ps, info.num_training_tasks, info.rank, info.is_training_task) == (
        2,
        3,
        1,
        True,
    )


def test_cluster_from_tf_config_puts_the_chief_first() -> None:
    tf_config = json.dumps(
        {
            "cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1"]},
            "task": {"type": "worker", "index": 1},
        }
    )
    info = _resolve([], tf_config)
    assert info.training_tasks == [("chief", 0), ("worker", 0), ("worker", 1)]
    assert info.rank == 2
    assert _resolve([]) is None


def test_an_evaluator_has_no_part(capsys) -> None:
    from tflaunch.models.benchmark import run

    tf_config = json.dumps(
        {"cluster": {"worker": ["w:1"]}, "task": {"type": "evaluator", "index": 0}}
    )
    info = _resolve([], tf_config)
    assert (info.job_name, info.is_training_task) == ("evaluator", False)
    assert run(None, info) == 0  # type: ignore[arg-type]
    assert "has no part in the benchmark" in capsys.readouterr().out


def test_flags_win_over_tf_config() -> None:
    tf_config = json.dumps({"cluster": {"worker": ["x:1"]}, "task": {"type": "worker", "index": 0}})
    info = _resolve(["--job_name", "ps", "--ps_hosts", "h:1", "--worker_hosts", "h:2"], tf_config)
    assert info.job_name == "ps" and info.cluster["worker"] == ["h:2"]


@pytest.mark.parametrize(
    ("tf_config", "message"),
    [
        ("{not json", "not a valid cluster description"),
        ('{"cluster": {"worker": ["a:1"]}}', 'no "task"'),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}', "not in"),
        ('{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}}', "no worker"),
    ],
)
def test_bad_cluster_descriptions(tf_config: str, message: str) -> None:
    with pytest.raises(BenchmarkError, match=message):
        _resolve([], tf_config)


def test_perf_stats_as_tf_cnn_benchmarks() -> None:
    # Rates 10, 20, 20 images/sec at batch 10: mean over times, std error and 1.4826 * MAD.
    mean, uncertainty, jitter = perf_stats(10, [1.0, 0.5, 0.5])
    assert mean == pytest.approx(10 / (2 / 3))
    assert uncertainty == pytest.approx(4.714045 / 3**0.5, rel=1e-6)
    assert jitter == 0.0
    assert perf_line(7, 10, [1.0, 0.5, 0.5]) == "7\timages/sec: 15.0 +/- 2.7 (jitter = 0.0)"


def test_display_first_and_every_nth_step() -> None:
    assert [s for s in range(1, 31) if should_display(s, 10)] == [1, 10, 20, 30]
    assert [s for s in range(1, 4) if should_display(s, 0)] == [1]


def test_timed_loop_times_only_the_steps_after_the_barrier() -> None:
    events: list[str] = []
    lines: list[str] = []
    counter = iter(range(100))

    def step() -> float:
        events.append("step")
        return float(next(counter))

    timing = timed_loop(step, 2, 5, 4, 2, lambda: events.append("barrier"), lines.append)
    assert events == ["step", "step", "barrier"] + ["step"] * 5
    assert (len(timing.warmup_times), len(timing.step_times)) == (2, 5)
    assert timing.elapsed >= sum(timing.step_times)
    assert timing.final_loss == 6.0
    assert [line.split("\t")[0] for line in lines] == ["Step", "1", "2", "4"]


def test_placement_choices_are_the_placement_modules() -> None:
    from tflaunch.models.benchmark import build_parser
    from tflaunch.models.placement_math import STRATEGIES

    for strategy in STRATEGIES:
        assert build_parser().parse_args(["--variable_placement", strategy]).variable_placement
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--variable_placement", "random"])


# --- flag errors (exit 2, one message) -----------------------------------------------------------

pytestmark = tensorflow_module()  # TensorFlow imported in the tests that run it


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "vgg16"], "unknown --model 'vgg16'"),
        (["--model", "inception3", "--image_size", "64"], "smallest input it accepts is 75x75"),
        (["--batch_size", "0"], "--batch_size must be at least 1"),
        (["--data_format", "NCHW"], "NCHW needs a GPU"),
        (["--local_parameter_device", "gpu"], "no GPU is visible"),
        (["--data_dir", "/nonexistent/dir"], "no TFRecord shards"),
    ],
)
def test_bad_flags_exit_2_with_a_message(argv, message, capsys) -> None:
    import tensorflow as tf

    from tflaunch.models.benchmark import main

    if ("NCHW" in argv or "gpu" in argv) and tf.config.list_physical_devices("GPU"):
        pytest.skip("a GPU is visible: NCHW is allowed here")
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_graph_modes_refuse_a_cluster_without_ps(capsys, monkeypatch) -> None:
    from tflaunch.models.benchmark import main

    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 0}}
        ),
    )
    assert main([*TINY, "--variable_update", "parameter_server"]) == 2
    assert "needs at least one PS task" in capsys.readouterr().err


# --- tiny single-process runs ----------------------------------------------------------------------


def _run_single(extra: list[str], tmp_path: Path, capsys) -> dict:
    from tflaunch.models.benchmark import main

    result = tmp_path / "result.json"
    argv = [*TINY, "--num_batches", "3", "--num_warmup_batches", "1", "--display_every", "2"]
    assert main([*argv, *extra, "--result_json", str(result)]) == 0
    out = capsys.readouterr().out
    assert len(PROGRESS.findall(out)) == 2  # steps 1 and 2
    (total,) = TOTAL.findall(out)
    document = json.loads(result.read_text())
    # printed with two decimals: equal to the document within the rounding
    assert float(total) == pytest.approx(document["images_per_sec"]["total"], abs=0.006)
    assert len(document["timing"]["step_times"]) == 3
    assert document["cluster"] == {"num_ps": 0, "num_workers": 1, "task": "local"}
    assert document["timing"]["final_loss"] > 0
    return document


def test_single_process_synthetic(tmp_path, capsys) -> None:
    document = _run_single(["--optimizer", "momentum"], tmp_path, capsys)
    assert document["settings"]["data_dir"] is None


@pytest.fixture(scope="module")
def tfrecord_dir(tmp_path_factory) -> Path:
    from tflaunch.models.data.imagenet import list_shards

    out = tiny_tfrecords(tmp_path_factory.mktemp("tfrecords"))
    assert [Path(p).name for p in list_shards(str(out))] == [
        "train-00000-of-00003",
        "train-00001-of-00003",
        "train-00002-of-00003",
    ]
    return out


def test_tfrecords_round_trip(tfrecord_dir) -> None:
    from tflaunch.models.data.imagenet import list_shards, make_dataset

    images, labels = next(iter(make_dataset(list_shards(str(tfrecord_dir)), 4, 75)))
    assert images.shape == (4, 75, 75, 3)
    assert float(images.numpy().min()) >= -1.0 and float(images.numpy().max()) <= 1.0
    assert set(labels.numpy().tolist()) <= {1, 2, 3, 4, 5}


def test_single_process_tfrecords(tfrecord_dir, tmp_path, capsys, tiny_cnn) -> None:
    """The input pipeline, not the network, is the subject: the tiny CNN (tests/tiny_cnn.py)
    reads the shards (InceptionV3 trains in one process above)."""
    net = ["--model", tiny_cnn, "--image_size", "8"]
    document = _run_single([*net, "--data_dir", str(tfrecord_dir)], tmp_path, capsys)
    assert document["settings"]["data_dir"] == str(tfrecord_dir)


# --- a cluster through `tflaunch up` (slow) ------------------------------------------------------
# The graph modes' clusters carry these checks of the totals too: parameter_server on synthetic
# data with 2 PS is tests/test_trace.py's traced run, distributed_replicated on TFRecords one of
# tests/test_transfers.py's ordered-transfer runs. Here the eager mode, collective_all_reduce.


@pytest.mark.slow
def test_collective_all_reduce_from_a_cluster_file(tfrecord_dir, tmp_path) -> None:
    """The cluster only from the cluster file tflaunch writes ({cluster_file}, no TF_CONFIG):
    MultiWorkerMirroredStrategy over the two workers through ClusterFileResolver (the PS left
    out by its jobs filter, idle), reading TFRecords, and every worker prints the same total,
    the sum of both workers' own figures. (This one run was two: collective_all_reduce on
    TFRecords through TF_CONFIG, and on synthetic data from the cluster file; the single-process
    runs above read both sources.)"""
    argv = [sys.executable, "-m", "tflaunch.models.benchmark", *TINY, "--num_batches", "2"]
    argv += ["--num_warmup_batches", "1", "--variable_update", "collective_all_reduce"]
    argv += ["--cluster_file", "{cluster_file}", "--data_dir", str(tfrecord_dir)]
    argv += ["--result_json", str(tmp_path / "{job_name}-{task_index}.json")]
    result = up_tensorflow_cluster(tmp_path, {"argv": argv, "tf_config": False}, 400)
    (run,) = (tmp_path / "runs").iterdir()
    cluster_file = run / "cluster_spec.json"
    for task in ("ps:0", "worker:0", "worker:1"):
        line = (
            rf"^\[{task}\]\s+{task}: cluster from the cluster file {re.escape(str(cluster_file))}$"
        )
        assert re.search(line, result.stdout, re.M), result.stdout[-3000:]
    assert "collective_all_reduce: worker 1 of 2, PS tasks unused" in result.stdout
    check_benchmark_totals(result.stdout, tmp_path, num_ps=1)
    docs = [json.loads((tmp_path / f"worker-{i}.json").read_text()) for i in (0, 1)]
    assert [d["settings"]["data_dir"] for d in docs] == [str(tfrecord_dir)] * 2
    assert wait_until_gone(str(tmp_path)) == []


@pytest.mark.slow
def test_bf16_mixed_precision_is_opt_in_and_trains(tmp_path) -> None:
    """--mixed_precision bf16 (a per-process graph option, so in its own process), on the tiny
    CNN (tests/tiny_cnn.py: convolutions and a matrix product, what the option rewrites)."""
    result_json = tmp_path / "r.json"
    argv = tiny_benchmark_argv(["--mixed_precision", "bf16"], tiny_cnn=True)
    done = subprocess.run([*argv, "--result_json", str(result_json)], cwd=ROOT, text=True,
                          capture_output=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    document = json.loads(result_json.read_text())
    assert document["settings"]["mixed_precision"] == "bf16"
    assert math.isfinite(document["timing"]["final_loss"])
    from tflaunch.models.benchmark import build_parser

    assert build_parser().parse_args([]).mixed_precision == "none"  # float32 unless asked
