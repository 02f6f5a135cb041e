"""The benchmark's synchronous modes and its all-reduce options: ``--cross_replica_sync`` (the
step-end barrier of tf_cnn_benchmarks on the PS), ``--gradient_repacking N`` and
``--compact_gradient_transfer`` (packs of float16 gradients under MultiWorkerMirroredStrategy):
flag checks, packing arithmetic against TensorFlow's, the graphs, and two real MWMS workers that
train the same network with and without packing + float16 to the same test accuracy (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import free_port_base, upstream
from tflaunch.models.benchmark_runners.common import bytes_per_pack_for, pack_sizes

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--model", "inception3", "--image_size", "75", "--batch_size", "2"]


def test_pack_sizes_and_bytes_per_pack() -> None:
    sizes = [400, 10, 300, 20, 200, 30, 100]  # creation order; packed from the last
    assert pack_sizes(sizes, 0) == [7]
    assert pack_sizes([], 0) == []
    assert bytes_per_pack_for(sizes, 0) == bytes_per_pack_for(sizes, 1) == 0
    bpp = bytes_per_pack_for(sizes, 3)
    assert bpp == 354  # ceil(1060 / 3)
    # reversed: 100, 30, 200, 20 (350: not over, go on), 300 (650) | 10, 400 (410) | -
    assert pack_sizes(sizes, bpp) == [5, 2]
    assert len(pack_sizes(sizes, bytes_per_pack_for(sizes, 7))) <= 7
    assert pack_sizes([5] * 8, bytes_per_pack_for([5] * 8, 4)) == [3, 3, 2]


def test_pack_sizes_is_tensorflows_grouping() -> None:
    tf = pytest.importorskip("tensorflow")
    from tensorflow.python.distribute import cross_device_utils

    shapes = [[3, 3, 8, 16], [16], [5, 5, 16, 32], [32], [800, 10], [10], [7]]
    tensors = [tf.zeros(s) for s in shapes]
    nbytes = [t.shape.num_elements() * 4 for t in tensors]
    for packs in (0, 2, 3, 4, 10):
        bpp = bytes_per_pack_for(nbytes, packs)
        ours = pack_sizes(nbytes, bpp)
        theirs = cross_device_utils.group_by_size(list(reversed(tensors)), bpp)
        assert ours == [len(p) for p in theirs], packs


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gradient_repacking", "4"], "use --variable_update collective_all_reduce"),
        (["--compact_gradient_transfer"], "use --variable_update collective_all_reduce"),
        (
            ["--variable_update", "collective_all_reduce", "--gradient_repacking", "-1"],
            "--gradient_repacking must not be negative",
        ),
    ],
)
def test_bad_reduction_flags_exit_2(argv, message, capsys) -> None:
    pytest.importorskip("tensorflow")
    from tflaunch.models.benchmark import main

    assert main([*TINY, *argv]) == 2
    assert message in capsys.readouterr().err


def test_boolean_flags_take_absl_spellings() -> None:
    from tflaunch.models.benchmark import build_parser

    parse = build_parser().parse_args
    assert parse([]).cross_replica_sync is False
    assert parse(["--cross_replica_sync"]).cross_replica_sync is True
    assert parse(["--cross_replica_sync=false"]).cross_replica_sync is False
    assert parse(["--compact_gradient_transfer=True"]).compact_gradient_transfer is True
    with pytest.raises(SystemExit):
        parse(["--cross_replica_sync=maybe"])


def _ps_graph(model: str, extra: list[str], workers: int = 3, rank: int = 1):
    """One worker's graph of the benchmark at its smallest: the barrier is the update's, not the
    network's, so the tiny CNN (tests/tiny_cnn.py) stands in for InceptionV3."""
    import tensorflow as tf

    from tflaunch.models.benchmark import build_parser, validate
    from tflaunch.models.benchmark_runners import graph as runner
    from tflaunch.models.cluster import ClusterInfo

    args = build_parser().parse_args(
        ["--model", model, "--image_size", "8", "--batch_size", "2", *extra]
    )
    validate(args)
    hosts = {"ps": ["localhost:1", "localhost:2"], "worker": [f"w:{i}" for i in range(workers)]}
    graph = tf.Graph()
    with graph.as_default():
        ops = runner.WorkerGraph(args, ClusterInfo(hosts, "worker", rank))
    return graph, ops


@pytest.mark.parametrize("update", ["parameter_server", "distributed_replicated"])
def test_cross_replica_sync_adds_the_step_end_barrier(update, tiny_cnn) -> None:
    graph, ops = _ps_graph(tiny_cnn, ["--variable_update", update, "--cross_replica_sync"])
    queues = [op for op in graph.get_operations() if op.type == "FIFOQueueV2"]
    # one queue per worker, shared by name across the workers' graphs, on a PS
    names = sorted(op.get_attr("shared_name").decode() for op in queues)
    assert names == [f"sync_queues_step_end_{i}" for i in range(3)]
    assert all(op.device.startswith("/job:ps/") for op in queues)
    enqueues = [op for op in graph.get_operations() if op.type == "QueueEnqueueV2"]
    dequeues = [op for op in graph.get_operations() if op.type == "QueueDequeueManyV2"]
    assert len(enqueues) == 2 and len(dequeues) == 1  # a token to each other worker; 2 back
    # the tokens go only once this worker's update is done
    for op in enqueues:
        assert ops.update_op.name in [c.name for c in op.control_inputs]
    # the step's fetch waits for the barrier (and the update)
    assert ops.train_op.name == "sync_step"
    waited = upstream(ops.train_op)
    assert {dequeues[0].name, ops.update_op.name} <= waited
    # asynchronous (default): no queue at all
    graph, _ = _ps_graph(tiny_cnn, ["--variable_update", update])
    assert not [op for op in graph.get_operations() if op.type == "FIFOQueueV2"]


def test_one_worker_needs_no_barrier(tiny_cnn) -> None:
    graph, _ = _ps_graph(tiny_cnn, ["--cross_replica_sync"], workers=1, rank=0)
    assert not [op for op in graph.get_operations() if op.type == "FIFOQueueV2"]


@pytest.mark.slow
def test_packed_float16_all_reduce_trains_to_the_same_accuracy(tmp_path) -> None:
    """Two MWMS workers (real processes, gRPC on localhost) train the same net from the same
    weights on the same batches: default all-reduce, then 4 packs in float16, then float16
    buckets in the backward pass's order. The traced step holds one float32 all-reduce of the
    gradients, then 4 float16 ones, then 3 (plus the loss's)."""
    base = free_port_base(2)
    hosts = [f"localhost:{base}", f"localhost:{base + 1}"]
    out = tmp_path / "result.json"
    procs = []
    for i in range(2):
        tf_config = {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": i}}
        env = {**os.environ, "TF_CONFIG": json.dumps(tf_config), "PYTHONPATH": str(ROOT)}
        procs.append(
            subprocess.Popen(
                [sys.executable, "tests/programs/mwms_gradient_reduction.py", "300", str(out)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    plain, packed, bucketed = json.loads(out.read_text())
    assert plain["collectives"] == {"float32": 2}  # the gradients' one pack, the loss
    assert (packed["expected_packs"], packed["collectives"]) == (4, {"float16": 4, "float32": 1})
    # --all_reduce_bucket_mb: 3 float16 buckets in the backward pass's order, one collective each
    assert (bucketed["expected_packs"], bucketed["collectives"]) == (
        3,
        {"float16": 3, "float32": 1},
    )
    assert plain["test_accuracy"] > 0.9
    for other in (packed, bucketed):
        assert abs(other["test_accuracy"] - plain["test_accuracy"]) <= 0.005
        assert other["final_loss"] == pytest.approx(plain["final_loss"], rel=0.1)
