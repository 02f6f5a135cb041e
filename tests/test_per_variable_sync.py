"""``--per_variable_sync``: synchronous parameter_server steps without the step-end barrier, each
variable applied once (the mean of every worker's gradient) and released on its own. The flag
checks, synchronous semantics on a real in-process cluster (tests/programs/per_variable_sync.py:
a PS and two workers, five steps equal to SGD on the mean gradient), and the benchmark's graph."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers import free_port_base, run_program
from tflaunch.models.benchmark_runners.common import BenchmarkError

TINY = ["--model", "inception3", "--image_size", "75", "--batch_size", "2"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--per_variable_sync"], "give --variable_update parameter_server --cross_replica_sync"),
        (
            ["--variable_update", "distributed_replicated", "--cross_replica_sync"]
            + ["--per_variable_sync"],
            "give --variable_update parameter_server",
        ),
        (
            ["--cross_replica_sync", "--per_variable_sync", "--staged_vars"],
            "drop --staged_vars and --transfer_order",
        ),
    ],
)
def test_bad_per_variable_sync_flags(argv, message) -> None:
    from tflaunch.models.benchmark import build_parser, validate

    with pytest.raises(BenchmarkError, match=message):
        validate(build_parser().parse_args([*TINY, *argv]))


def test_each_step_applies_the_mean_of_every_workers_gradient_once(tmp_path) -> None:
    pytest.importorskip("tensorflow")
    out = tmp_path / "sync.json"
    run_program("tests/programs/per_variable_sync.py", str(free_port_base(3)), "5", str(out))
    result = json.loads(out.read_text())
    for got, want in zip(result["weights"], result["reference"], strict=True):
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-6)
    # moved away from the start: five steps of the mean, not nothing
    assert np.abs(np.array(result["reference"][0])).sum() > 0
    # each worker reads through its own token queue per variable; no step-end barrier
    expected = sorted(f"sync_release/{v}/{w}" for v in ("w", "b") for w in (0, 1))
    assert result["queues_0"] == result["queues_1"] == expected


def test_the_benchmarks_graph_has_no_step_end_barrier(tiny_cnn) -> None:
    """The chief's and another worker's graph, of the tiny CNN (tests/tiny_cnn.py): the queues
    and accumulators are per variable, whatever the network."""
    import tensorflow as tf

    from tests.tiny_cnn import TRAINABLE
    from tflaunch.models.benchmark import build_parser, validate
    from tflaunch.models.benchmark_runners import graph as runner
    from tflaunch.models.cluster import ClusterInfo

    hosts = {"ps": ["localhost:1", "localhost:2"], "worker": ["w:0", "w:1", "w:2"]}
    for rank in (0, 1):
        argv = ["--model", tiny_cnn, "--image_size", "8", "--batch_size", "2"]
        args = build_parser().parse_args([*argv, "--cross_replica_sync", "--per_variable_sync"])
        validate(args)
        graph = tf.Graph()
        with graph.as_default():
            ops = runner.WorkerGraph(args, ClusterInfo(hosts, "worker", rank))
        types = [op.type for op in graph.get_operations()]
        names = [op.get_attr("shared_name").decode() for op in graph.get_operations()
                 if op.type == "FIFOQueueV2"]  # fmt: skip
        assert not [n for n in names if n.startswith("sync_queues_step_end")]
        # a token queue per variable of the model and worker
        assert len(names) == 3 * TRAINABLE
        assert {n.rsplit("/", 1)[1] for n in names} == {"0", "1", "2"}
        assert (
            types.count("ResourceConditionalAccumulator") + types.count("ConditionalAccumulator")
            == TRAINABLE
        )
        assert ops.local_step is not None
        assert (ops.sync_prime is not None) == (rank == 0)  # the chief applies and releases
        takes = [t for t in types if "TakeGradient" in t]
        assert len(takes) == (TRAINABLE if rank == 0 else 0)
