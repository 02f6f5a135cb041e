"""Staged variables and ordered transfers (models/bench/transfers.py), the transfer figures of a
trace (tflaunch/trace/transfers.py) and the model's overlap term: pure parts, the graphs the
benchmark builds (the chained order is in them), and real runs through the local backend and,
slow and with the ``ssh`` marker, the SSH backend."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tests.helpers import (
    check_benchmark_totals,
    tiny_benchmark_argv,
    tiny_tfrecords,
    up_tensorflow_cluster,
    wait_until_gone,
)
from tflaunch.tools import perfmodel
from tflaunch.trace import transfers as tt
from tflaunch.trace.format import Event, TaskTrace, merge

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--model", "inception3", "--image_size", "75", "--batch_size", "2"]
MS = 1_000_000


# --- pure parts --------------------------------------------------------------------------------


def test_kendall_tau() -> None:
    assert tt.kendall_tau([0, 1, 2, 3]) == 1.0
    assert tt.kendall_tau([3, 2, 1, 0]) == -1.0
    assert tt.kendall_tau([0, 2, 1, 3]) == pytest.approx(4 / 6)
    assert math.isnan(tt.kendall_tau([5]))


def test_step_spread() -> None:
    s = tt.step_spread([100.0, 100.0, 200.0, 200.0])
    assert s == {
        "steps": 4,
        "mean_ms": 150.0,
        "cv": pytest.approx(50 / 150),
        "min_ms": 100.0,
        "max_ms": 200.0,
    }
    assert tt.step_spread([]) == {"steps": 0}


def _worker(arrival_ranks: list[int], compute_from_ms: float) -> TaskTrace:
    """One 100 ms step: receives of variables (rank r) arriving at 10 + 10 i ms in the order
    given, compute from ``compute_from_ms`` to 90 ms, and a receive of something else."""
    t = 1_700_000_000_000 * MS
    events = [Event("python3", "step", "step", t, 100 * MS, {"step_num": 7})]
    for i, rank in enumerate(arrival_ranks):
        name = f"read_{rank}_S{100 + i}"
        events.append(
            Event(
                "tf_Compute/1", f"recv {name}", "recv_wait", t, (10 + 10 * i) * MS, {"tensor": name}
            )
        )
    events.append(
        Event("tf_Compute/2", "recv other_S1", "recv_wait", t, 99 * MS, {"tensor": "other_S1"})
    )
    start = int(compute_from_ms * MS)
    events.append(Event("tf_Compute/3", "conv", "compute", t + start, 90 * MS - start))
    return TaskTrace("worker:0", "h", events, t)


ORDER = {
    "variable_update": "parameter_server",
    "transfer_order": "tic",
    "staged_vars": False,
    "variables": [
        {"name": f"v{r}", "bytes": 4, "consumption_rank": r, "send_rank": r, "reads": [f"read_{r}"]}
        for r in range(4)
    ],
}


def test_report_compares_arrival_with_consumption_and_measures_overlap() -> None:
    # in consumption order; compute from 20 ms: receives outstanding 0-40 ms, 20 of them computing
    report = tt.transfer_report(merge([_worker([0, 1, 2, 3], 20)]), ORDER)
    (row,) = report["steps"]
    assert row["task"] == "worker:0" and row["step"] == 7 and row["received"] == 4
    assert row["kendall_tau"] == 1.0
    assert row["comm_ms"] == pytest.approx(40.0)  # only the variables' receives count
    assert row["overlap"] == pytest.approx(0.5)
    assert report["spread"]["steps"] == 1 and report["spread"]["mean_ms"] == pytest.approx(100)
    assert report["order"]["transfer_order"] == "tic"
    # reversed arrival, compute only after every variable is in: no overlap
    (row,) = tt.transfer_report(merge([_worker([3, 2, 1, 0], 40)]), ORDER)["steps"]
    assert row["kendall_tau"] == -1.0 and row["overlap"] == pytest.approx(0.0)


def test_report_without_an_order_file_keeps_overlap_and_spread(tmp_path) -> None:
    trace = merge([_worker([0, 1, 2, 3], 20)])
    report = tt.transfer_report(trace, None)
    (row,) = report["steps"]
    assert row["kendall_tau"] is None and row["received"] == 0
    assert row["comm_ms"] == pytest.approx(99.0)  # every receive
    lines = tt.report_lines(report)
    assert any("arrival order not compared" in line for line in lines)
    (tmp_path / tt.ORDER_FILE).write_text(json.dumps(ORDER))
    paths = tt.write_report(trace, tmp_path)
    written = json.loads(paths[0].read_text())
    assert written["steps"][0]["kendall_tau"] == 1.0
    text = paths[1].read_text()
    assert "TAU (ARRIVAL~USE)" in text and "OVERLAP %" in text and "CV" in text


def test_model_overlap_term() -> None:
    # pull, compute, push; ordered: the forward third beside the pull once the first bucket is
    # in; staged: the next pull beside compute and push
    assert perfmodel.worker_cycle(1.0, 0.01, 0.3) == pytest.approx(1.61)
    assert perfmodel.worker_cycle(0.9, 0.01, 0.3, 0.05) == pytest.approx(0.01 + 0.35 + 0.6 + 0.3)
    assert perfmodel.worker_cycle(0.3, 0.01, 0.8, 0.05) == pytest.approx(0.01 + 0.8 + 0.2 + 0.8)
    assert perfmodel.worker_cycle(1.0, 0.01, 0.3, staged=True) == pytest.approx(1.31)
    link = perfmodel.Link(1e-4, 1e7)
    assert perfmodel.first_bucket_s(link, 8_000_000, 4) == pytest.approx(1e-4 + 0.2)
    inputs = perfmodel.Inputs(
        1.0, 2, (("a", (1000, 1000), 4), ("b", (1000, 1000), 4)), link, nic=False
    )
    plain = perfmodel.predict(inputs, 1, 1, "parameter_server")
    overlapped = perfmodel.predict(inputs, 1, 1, "parameter_server", overlap=True, buckets=4)
    comm = 2 * 1e-4 + 2 * 8e6 / 1e7  # one worker, one PS: no queueing
    assert plain.step_s == pytest.approx(1.0 + comm)
    first = 1e-4 + 2e6 / 1e7
    assert overlapped.step_s == pytest.approx(2e-4 + max(0.8, first + 1 / 3) + 2 / 3 + 0.8)


# --- graphs ------------------------------------------------------------------------------------


def _graph(extra: list[str], ps: int = 2, model: str | None = None):
    """One worker's graph: of InceptionV3, or of ``model`` at 8 px (the ``tiny_cnn`` fixture's,
    where the property is each variable's and not the network's)."""
    pytest.importorskip("tensorflow")
    import tensorflow as tf

    from tflaunch.models.benchmark import build_parser, validate
    from tflaunch.models.benchmark_runners import graph as runner
    from tflaunch.models.cluster import ClusterInfo

    net = TINY if model is None else ["--model", model, "--image_size", "8", "--batch_size", "2"]
    args = build_parser().parse_args([*net, *extra])
    validate(args)
    hosts = {"ps": [f"localhost:{i + 1}" for i in range(ps)], "worker": ["localhost:9"]}
    info = ClusterInfo(hosts, "worker", 0)
    graph = tf.Graph()
    with graph.as_default():
        ops = runner.WorkerGraph(args, info)
    return graph, ops


def _reads(graph, ops) -> dict[int, object]:
    return {i: graph.get_operation_by_name(names[0]) for i, names in ops.read_names.items()}


def test_tic_chains_the_reads_bucket_by_bucket_in_consumption_order() -> None:
    graph, ops = _graph(["--transfer_order", "tic", "--transfer_buckets", "4"])
    plan = ops.plan
    assert len(plan.buckets) == 4 and sorted(plan.order) == list(range(len(plan.names)))
    # the first layer's weights are sent first, the classifier's last
    assert plan.names[plan.order[0]].endswith("conv2d_1/conv/kernel:0")
    assert "predictions" in plan.names[plan.order[-1]]
    reads = _reads(graph, ops)
    for b, bucket in enumerate(plan.buckets):
        for i in bucket:
            read = reads[i]
            assert read.type == "ReadVariableOp" and read.device.startswith("/job:ps/")
            gates = [c.name for c in read.control_inputs]
            assert gates == ([] if b == 0 else [f"transfer_bucket_{b - 1}_arrived"])
    for b in range(len(plan.buckets) - 1):
        arrived = graph.get_operation_by_name(f"transfer_bucket_{b}_arrived")
        assert arrived.device.startswith("/job:worker/task:0")
        # it waits for every tensor of its bucket to be on the worker
        carried = {c.inputs[0].op.name for c in arrived.control_inputs}
        assert carried == {reads[i].name for i in plan.buckets[b]}
    # the forward pass consumes the new reads; the model's own reads are left without consumers
    conv1 = reads[plan.order[0]].outputs[0].consumers()[0]
    assert conv1.type == "Identity" and conv1.device.startswith("/job:worker")
    assert any(c.type == "Conv2D" for c in conv1.outputs[0].consumers())
    stale = [
        op
        for op in graph.get_operations()
        if op.type == "ReadVariableOp"
        and op.name.startswith("Conv2D")
        and op.outputs[0].consumers()
    ]
    assert stale == []


def test_none_leaves_the_graph_as_it_was(tiny_cnn) -> None:
    graph, ops = _graph([], model=tiny_cnn)
    assert not [op for op in graph.get_operations() if op.name.startswith("transfer_")]
    assert ops.prime is None
    assert len(ops.read_names) == len(ops.plan.names)  # still known: for the trace's order


def test_staged_vars_put_each_steps_read_for_the_next(tiny_cnn) -> None:
    graph, ops = _graph(["--staged_vars"], model=tiny_cnn)
    stages = [op for op in graph.get_operations() if op.type == "Stage"]
    unstages = [op for op in graph.get_operations() if op.type == "Unstage"]
    n = len(ops.plan.names)
    assert len(unstages) == n and len(stages) == 2 * n  # the step's puts and the first ones
    assert all(op.device.startswith("/job:worker/task:0") for op in stages + unstages)
    step_puts = {op.name for op in ops.train_op.control_inputs if op.type == "Stage"}
    assert len(step_puts) == n
    assert {op.name for op in ops.prime.control_inputs} == {s.name for s in stages} - step_puts
    # the forward pass computes with the staged value; the put carries a fresh read from the PS
    kernel = next(
        i for i, name in enumerate(ops.plan.names) if name.endswith("conv1/conv/kernel:0")
    )
    read = _reads(graph, ops)[kernel]
    assert read.device.startswith("/job:ps/") and not read.control_inputs
    (put,) = read.outputs[0].consumers()
    assert put.type == "Stage" and put.name in step_puts


def test_distributed_replicated_pulls_in_buckets_after_the_update(tiny_cnn) -> None:
    extra = ["--variable_update", "distributed_replicated", "--transfer_order", "tic"]
    graph, ops = _graph([*extra, "--transfer_buckets", "3"], model=tiny_cnn)
    assert len(ops.plan.buckets) == 2
    reads = _reads(graph, ops)
    first = ops.plan.buckets[0]
    later = ops.plan.buckets[1]
    assert all([c.type for c in reads[i].control_inputs] == ["NoOp"] for i in first)  # the update
    for i in later:
        gates = sorted(c.name for c in reads[i].control_inputs)
        assert "transfer_bucket_0_arrived" in gates and len(gates) == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--staged_vars", "--variable_update", "distributed_replicated"], "--staged_vars"),
        (
            ["--transfer_order", "tic", "--variable_update", "collective_all_reduce"],
            "collective_all_reduce does not use",
        ),
        (["--transfer_buckets", "0"], "--transfer_buckets must be at least 1"),
    ],
)
def test_bad_transfer_flags_exit_2(argv, message, capsys) -> None:
    from tflaunch.models.benchmark import main

    assert main([*TINY, *argv]) == 2
    assert message in capsys.readouterr().err


# --- real runs ---------------------------------------------------------------------------------


# The distributed_replicated run is also the benchmark's graph-mode cluster on TFRecords
# (tests/test_benchmark.py's before), with two workers whose totals are checked; the other,
# parameter_server over 2 PS on InceptionV3 (190 variables in 8 buckets, transfer order tic), is
# tests/test_trace.py's traced run, which carries its checks (it was a run here, "ps-tic"). Where
# the mode and not the network is the subject, the tiny CNN (tests/tiny_cnn.py: 6 variables; a
# step moves 14 KB, not 95 MB). Staging is each worker's own: one PS and one worker.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "roles", "real_data"),
    [
        (
            ["--staged_vars", "--transfer_order", "tac", "--transfer_buckets", "3"],
            {"ps": 1, "worker": 1},
            False,
        ),
        (
            ["--variable_update", "distributed_replicated", "--transfer_order", "tic"]
            + ["--transfer_buckets", "3"],
            {"ps": 1, "worker": 2},
            True,
        ),
    ],
    ids=["ps-staged-tac-tiny", "replicated-tic-tfrecords-tiny"],
)
def test_ordered_and_staged_runs_through_the_local_backend(
    extra, roles, real_data, tmp_path_factory, tmp_path
) -> None:
    argv = [*extra, "--result_json", str(tmp_path / "{job_name}-{task_index}.json")]
    if real_data:
        argv += ["--data_dir", str(tiny_tfrecords(tmp_path_factory.mktemp("tfrecords")))]
    program = {
        "argv": tiny_benchmark_argv(argv, tiny_cnn=True),
        "env": {"PYTHONPATH": str(ROOT)},
    }
    result = up_tensorflow_cluster(tmp_path, program, 600, roles=roles)
    order = extra[extra.index("--transfer_order") + 1]
    assert f"transfer order {order}: 6 variables in 2 buckets" in result.stdout
    totals = re.findall(r"^\[worker:\d\]\s+total images/sec: ([\d.]+)$", result.stdout, re.M)
    assert len(totals) == roles["worker"] and float(totals[0]) > 0
    if roles["worker"] == 2:
        check_benchmark_totals(result.stdout, tmp_path, num_ps=roles["ps"])
    if "--staged_vars" in extra:
        assert "staged variables:" in result.stdout
    assert wait_until_gone(str(tmp_path)) == []


def test_gradient_order_on_the_ps_per_worker_step() -> None:
    """Gradients of one step (one step id) arriving last layer first: tau +1 against backward
    order; a second step in consumption order: -1; the mean over both is 0."""
    t = 1_700_000_000_000 * MS
    events = []
    for step_id, arrival in ((11, [3, 2, 1, 0]), (12, [0, 1, 2, 3])):
        for i, rank in enumerate(arrival):
            name = f"grad_{rank}_S{i}"
            events.append(
                Event(
                    "tf_Compute/1",
                    f"recv {name}",
                    "recv_wait",
                    t,
                    (5 + i) * MS,
                    {"tensor": name, "step_id": step_id},
                )
            )
    order = {
        **ORDER,
        "variables": [
            {**v, "gradients": [f"grad_{v['consumption_rank']}"]} for v in ORDER["variables"]
        ],
    }
    trace = merge([_worker([0, 1, 2, 3], 20), TaskTrace("ps:0", "h", events, t)])
    grads = tt.transfer_report(trace, order)["gradients"]
    assert grads == {"ps:0": {"steps": 2, "kendall_tau_backward": 0.0}}
    lines = tt.report_lines(tt.transfer_report(trace, order))
    assert any(
        line.startswith("gradients at ps:0: arrival against backward order") for line in lines
    )
