"""Traces: the merge and summary of per-task events (pure), the CLI, and a real 2 PS + 2 worker
benchmark run under ``tflaunch up --trace`` (slow)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.helpers import check_benchmark_totals, tflaunch, wait_until_gone, write_cluster
from tflaunch.cli import cli
from tflaunch.trace import format as tr
from tflaunch.trace import request as req
from tflaunch.trace import transfers as tt

ROOT = Path(__file__).resolve().parent.parent
MS = 1_000_000  # ns


def _task(task: str, offset_ms: float, steps: int = 3) -> tr.TaskTrace:
    """A worker whose steps are 100 ms: 40 compute, 10 send, 30 waiting on a receive, 20 idle."""
    t = int(1_700_000_000_000 * MS + offset_ms * MS)
    events = []
    for i in range(steps):
        s = t + i * 100 * MS
        events += [
            tr.Event("python3", "step", "step", s, 100 * MS, {"step_num": i + 1}),
            tr.Event("tf_Compute/1", "recv w", "recv_wait", s, 30 * MS),
            tr.Event("tf_Compute/1", "conv", "compute", s + 30 * MS, 25 * MS),
            tr.Event("tf_Compute/2", "conv2", "compute", s + 40 * MS, 30 * MS),  # overlaps conv
            tr.Event("tf_Compute/1", "grad_S1", "communication", s + 70 * MS, 10 * MS),
            tr.Event("python3", "RunGraph", "runtime", s + 1 * MS, 1 * MS),
        ]
    return tr.TaskTrace(task, "10.0.0.1", events, t)


def _ps() -> tr.TaskTrace:
    t = int(1_700_000_000_000 * MS)
    events = [
        tr.Event("tf_Compute/9", "apply", "compute", t + i * 50 * MS, 5 * MS) for i in range(6)
    ]
    events.append(tr.Event("tf_Compute/9", "recv g", "recv_wait", t, 300 * MS))
    return tr.TaskTrace("ps:0", "10.0.0.2", events, t + 2 * MS)


def test_window_parsing_and_profiler_ports() -> None:
    assert req.parse_window("5") == req.TraceWindow(req.DEFAULT_FIRST_STEP, 5)
    assert req.parse_window("10:3") == req.TraceWindow(10, 3)
    for bad in ("", "x", "0", "1:0", "1:2:3", "-1:4"):
        with pytest.raises(req.TraceError, match="--trace"):
            req.parse_window(bad)
    assert req.profiler_port(2220, 10000) == 12220
    assert req.profiler_port(60000, 10000) == 50000


def test_one_request_from_the_options_to_the_agents() -> None:
    """up's options parse once into a TraceRequest; the tasks' environment and a detached run's
    arguments carry the same request."""
    steps = req.TraceRequest.from_options(Path("/r/trace"), "5", None, None, 10500)
    assert steps == req.TraceRequest(Path("/r/trace"), 10500, req.TraceWindow(2, 5))
    assert req.TraceRequest.from_env(steps.to_env()) == steps
    assert steps.argv() == ["--trace", "2:5", "--trace-port-offset", "10500"]
    timed = req.TraceRequest.from_options(Path("/r/trace"), None, "2m", "3s")
    assert (timed.at_s, timed.for_s, timed.window) == (120.0, 3.0, None)
    assert req.TraceRequest.from_env(timed.to_env()) == timed
    again = req.TraceRequest.from_options(Path("/r/trace"), None, *timed.argv()[1:4:2])
    assert again == timed
    assert req.TraceRequest.from_env({"TFLAUNCH_TRACE_DIR": "/r/trace"}) is None  # no hook
    for steps, at, length in (("5", "1m", None), (None, None, "3s")):
        with pytest.raises(req.TraceError, match="--trace"):
            req.TraceRequest.from_options(Path("t"), steps, at, length)


def test_merge_makes_one_process_per_task_on_one_time_axis() -> None:
    trace = tr.merge([_ps(), _task("worker:1", 20), _task("worker:0", 0)])
    json.loads(json.dumps(trace))  # valid JSON as written
    procs = {
        e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"
    }
    assert procs == {1: "worker:0 (10.0.0.1)", 2: "worker:1 (10.0.0.1)", 3: "ps:0 (10.0.0.2)"}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert min(e["ts"] for e in spans) == 0.0
    first_w1_step = min(e["ts"] for e in spans if e["pid"] == 2 and e["cat"] == "step")
    assert first_w1_step == pytest.approx(20_000.0)  # microseconds from the earliest event
    threads = {
        (e["pid"], e["args"]["name"]): e["tid"]
        for e in trace["traceEvents"]
        if e["name"] == "thread_name"
    }
    assert threads[(1, "python3")] == 1  # the step row comes first
    assert trace["otherData"]["profile_start_skew_ms"] == pytest.approx(20.0)


def test_summary_splits_each_step_into_compute_communication_wait_and_idle() -> None:
    summary = tr.summarize(tr.merge([_task("worker:0", 0), _ps()]))
    w = summary["worker:0"]
    assert (w["steps"], w["own_steps"]) == (3, True)
    assert w["per_step_ms"] == pytest.approx(
        {"total": 100, "compute": 40, "communication": 10, "recv_wait": 30, "idle": 20}
    )
    ps = summary["ps:0"]  # its window is the workers' steps: 300 ms, 3 steps served
    assert (ps["steps"], ps["own_steps"]) == (3, False)
    assert ps["per_step_ms"] == pytest.approx(
        {"total": 100, "compute": 10, "communication": 0, "recv_wait": 90, "idle": 0}
    )
    lines = tr.summary_lines(summary)
    assert lines[0].split()[:3] == ["TASK", "STEPS", "STEP"]
    assert lines[2].startswith("ps:0") and "3 served" in lines[2]


def test_merge_without_events_is_an_error() -> None:
    with pytest.raises(req.TraceError, match="no events"):
        tr.merge([tr.TaskTrace("ps:0", "h", [])])


def test_trace_command_summarises_and_draws(tmp_path) -> None:
    run = tmp_path / "runs" / "r1"
    (run / "trace").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    tr.write_outputs(tr.merge([_task("worker:0", 0), _task("worker:1", 30), _ps()]), run / "trace")
    result = CliRunner().invoke(cli, ["trace", "r1", "--run-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert "worker:1  3" in result.output and "ui.perfetto.dev" in result.output
    png = run / "trace" / "trace.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((run / "trace" / "trace_summary.json").read_text())["worker:0"]["steps"] == 3


def test_trace_command_without_a_trace_says_how_to_make_one(tmp_path) -> None:
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "run.json").write_text("{}")
    result = CliRunner().invoke(cli, ["trace", "r1", "--run-dir", str(tmp_path / "runs")])
    assert result.exit_code == 2
    assert "--trace STEPS" in result.output


def test_up_refuses_a_bad_trace_window(tmp_path) -> None:
    cluster = write_cluster(tmp_path / "c.yaml", {"argv": [sys.executable, "-c", "pass"]})
    result = CliRunner().invoke(cli, ["up", str(cluster), "--trace", "zero"])
    assert result.exit_code == 2
    assert "--trace 'zero'" in result.output
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_two_ps_two_workers_give_one_merged_trace_the_transfer_report_and_the_totals(
    tmp_path,
) -> None:
    """The benchmark (2 PS, 2 workers; staged variables, transfer order tic) under --trace: one
    merged trace with kernels on every task and the workers' steps overlapping, and from the same
    trace the transfer report (arrival order against use, overlap, spread). The same run is the
    graph runner's parameter_server cluster over 2 PS on InceptionV3 (its transfer plan and the
    workers' totals), which test_transfers.py ran as a cluster of its own (ps-tic: the same but
    unstaged and untraced; ordered reads without staging stay in its graph tests and its
    distributed_replicated run). One TensorFlow cluster for what were three."""
    pytest.importorskip("tensorflow")
    argv = [sys.executable, "-m", "tflaunch.models.benchmark", "--model", "inception3"]
    argv += ["--image_size", "75", "--batch_size", "2", "--num_batches", "6"]
    argv += ["--num_warmup_batches", "1", "--display_every", "3"]
    argv += ["--staged_vars", "--transfer_order", "tic"]
    argv += ["--result_json", str(tmp_path / "{job_name}-{task_index}.json")]
    program = {"argv": argv, "env": {"TEST_MARKER": str(tmp_path)}}
    cluster = write_cluster(
        tmp_path / "cluster.yaml", program, roles={"ps": 2, "worker": 2},
        supervision={"ready_timeout": 240},
    )  # fmt: skip
    result = tflaunch("up", str(cluster), "--trace", "2:3", cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "TASK" in result.stdout and "ui.perfetto.dev" in result.stdout  # summary, how to open
    # the graph runner's parameter_server cluster: its transfer plan, staging and totals
    assert "transfer order tic: 190 variables in 8 buckets" in result.stdout
    assert "staged variables:" in result.stdout
    totals = re.findall(r"^\[worker:\d\]\s+total images/sec: ([\d.]+)$", result.stdout, re.M)
    assert len(totals) == 2 and float(totals[0]) > 0
    check_benchmark_totals(result.stdout, tmp_path, num_ps=2)
    run = next((tmp_path / "runs").iterdir())
    trace_dir = run / "trace"
    trace = json.loads((trace_dir / "trace.json").read_text())
    names = {
        e["args"]["name"].split()[0]: e["pid"]
        for e in trace["traceEvents"]
        if e["name"] == "process_name"
    }
    assert set(names) == {"worker:0", "worker:1", "ps:0", "ps:1"}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for task, pid in names.items():  # every task has kernels on its own threads
        mine = [e for e in spans if e["pid"] == pid]
        assert any(e["cat"] == "compute" for e in mine), task
        assert any(e["cat"] in ("communication", "recv_wait") for e in mine), task
    steps = tr.step_windows(trace)
    assert len(steps["worker:0"]) >= 2 and len(steps["worker:1"]) >= 2
    w0 = (steps["worker:0"][0][1], steps["worker:0"][-1][2])
    w1 = (steps["worker:1"][0][1], steps["worker:1"][-1][2])
    assert max(w0[0], w1[0]) < min(w0[1], w1[1]), "the workers' traced steps overlap in time"
    summary = json.loads((trace_dir / "trace_summary.json").read_text())
    assert set(summary) == {"worker:0", "worker:1", "ps:0", "ps:1"}
    assert summary["ps:0"]["per_step_ms"]["compute"] > 0
    assert (trace_dir / "trace.png").exists()

    # the transfer report of the same trace
    assert "transfers (parameter_server, order tic, staged yes, 190 variables):" in result.stdout
    assert re.search(r"^step time over \d+ worker steps: mean [\d.]+ ms, CV", result.stdout, re.M)
    report = json.loads((trace_dir / tt.REPORT_JSON).read_text())
    rows = report["steps"]
    assert {r["task"] for r in rows} == {"worker:0", "worker:1"}
    for r in rows:
        assert r["received"] == 190  # every trainable variable, every step
        assert -1.0 <= r["kendall_tau"] <= 1.0 and 0.0 <= r["overlap"] <= 1.0
        assert r["step_ms"] > 0 and r["comm_ms"] > 0
    # buckets in consumption order: arrival agrees with consumption far more than chance
    assert min(r["kendall_tau"] for r in rows) > 0.5
    assert report["spread"]["steps"] == len(rows) and report["spread"]["cv"] >= 0
    again = tflaunch("trace", run.name, "--run-dir", str(tmp_path / "runs"), cwd=ROOT)
    assert again.returncode == 0 and "TAU (ARRIVAL~USE)" in again.stdout
    assert wait_until_gone(str(tmp_path)) == []
