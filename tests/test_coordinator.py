"""The coordinator's policy, driven by fake agent links: no subprocesses, no sockets.

A FakeLink plays an agent: it sends the events a script gives it and, told to stop, reports its
still-running tasks as exited by SIGTERM and closes, as a real agent's teardown does."""

from __future__ import annotations

import io

import pytest

from tests.coordinator_fakes import FakeLink
from tflaunch.cluster.config import parse_config
from tflaunch.cluster.placement import make_plan
from tflaunch.cluster.plan import Host
from tflaunch.runtime.coordinator import coordinate
from tflaunch.runtime.run import Run


def started(*tasks: str) -> list[dict]:
    return [{"event": "started", "task": t, "pid": 100 + i} for i, t in enumerate(tasks)]


@pytest.fixture
def cluster(tmp_path):
    config = parse_config(
        "program: [p]\nroles: {ps: 1, worker: 2}\nplacement: {workers_per_host: 1}\n"
        "hosts: [a, b]\nsupervision: {finish_timeout: 1, heartbeat: 0.2}\n"
    )
    plan = make_plan(config, [Host("a", "10.0.0.1", "10.0.0.1"), Host("b", "10.0.0.2", "10.0.0.2")])
    return plan, Run.create(tmp_path / "runs", "t")


def run_with(cluster, script_a: list[dict], script_b: list[dict]):
    plan, run = cluster
    links = [FakeLink("a", ["ps:0", "worker:0"], script_a), FakeLink("b", ["worker:1"], script_b)]
    out = io.StringIO()
    outcome = coordinate(plan, run, links, out=out)
    return outcome, links, run, out.getvalue()


def test_success_stops_the_ps_and_records_the_end(cluster):
    a = started("ps:0", "worker:0") + [
        {"event": "ready", "task": "ps:0"},
        {"event": "exited", "task": "worker:0", "code": 0},
    ]
    b = started("worker:1") + [{"event": "exited", "task": "worker:1", "code": 0}]
    outcome, links, run, out = run_with(cluster, a, b)
    assert outcome.code == 0 and outcome.state == "succeeded"
    assert all({"cmd": "stop", "reason": "the run is ending"} in link.sent for link in links)
    assert all(link.closed for link in links)
    record = run.record()
    assert (record.state, record.exit_code) == ("succeeded", 0)
    assert "cluster ready" in out
    kinds = [e["event"] for e in run.events()]
    assert kinds.count("cluster_ready") == 1 and kinds.count("exited") == 3


def test_a_failing_worker_fails_the_run_with_one_report(cluster):
    a = started("ps:0", "worker:0") + [{"event": "ready", "task": "ps:0"}]
    b = started("worker:1") + [
        {"event": "output", "task": "worker:1", "line": "Traceback: boom"},
        {"event": "exited", "task": "worker:1", "code": 3},
    ]
    outcome, links, run, _ = run_with(cluster, a, b)
    assert outcome.code == 3 and not outcome.interrupted
    assert outcome.message.startswith("worker:1 on b exited with code 3.")
    assert "Traceback: boom" in outcome.message and "worker-1.log" in outcome.message
    assert all(any(c.get("cmd") == "stop" for c in link.sent) for link in links)
    assert run.record().state == "failed"
    failed = [e for e in run.events() if e["event"] == "failed"]
    assert [(e["task"], e["code"]) for e in failed] == [("worker:1", 3)]


def test_a_ps_exiting_by_itself_is_a_failure(cluster):
    a = started("ps:0", "worker:0") + [{"event": "exited", "task": "ps:0", "code": 0}]
    outcome, *_ = run_with(cluster, a, started("worker:1"))
    assert outcome.code == 1 and "ps:0 on a exited by itself" in outcome.message


def test_signal_codes_are_named(cluster):
    b = started("worker:1") + [{"event": "exited", "task": "worker:1", "code": 137}]
    outcome, *_ = run_with(cluster, started("ps:0", "worker:0"), b)
    assert outcome.code == 137 and "137 (SIGKILL)" in outcome.message


def test_a_lost_agent_fails_the_run(cluster):
    b = started("worker:1") + [{"event": "link_closed"}]
    outcome, *_ = run_with(cluster, started("ps:0", "worker:0"), b)
    assert outcome.code == 1 and "lost the agent on b while worker:1" in outcome.message


def test_an_agent_error_fails_the_run_with_its_code(cluster):
    a = [{"event": "error", "code": 2, "message": "port 2230 on a is already in use"}]
    outcome, *_ = run_with(cluster, a, [])
    assert outcome.code == 2 and outcome.message == "a: port 2230 on a is already in use"


def test_workers_left_running_after_the_chief_finished_fail_after_finish_timeout(cluster):
    a = started("ps:0", "worker:0") + [{"event": "exited", "task": "worker:0", "code": 0}]
    outcome, *_ = run_with(cluster, a, started("worker:1"))
    assert (
        outcome.code == 1
        and "worker:1 on b was still running 1 s after worker:0" in outcome.message
    )


MALFORMED = [
    {"event": "trace_note", "name": 5},
    {"event": "trace_note", "text": ["x"]},
    {"event": "trace_note", "dir": {"a": 1}},
    {"event": "trace_file", "path": None},
    {"event": "trace_file", "offset": "0"},
    {"event": "trace_file", "size": 1.5},
    {"event": "trace_file", "data": 7},
    {"event": "trace_sent", "files": [1, 2]},
    {"event": "trace_sent", "files": "a"},
    {"event": "trace_sent", "bytes": True},
    {"event": "trace_sent", "error": 3},
    {"event": "started", "task": "worker:1", "pid": "1"},
    {"event": "exited", "task": "worker:1", "code": float("nan")},
]


@pytest.mark.parametrize("message", MALFORMED, ids=lambda m: f"{m['event']}-{list(m)[-1]}")
def test_a_malformed_message_closes_its_link_and_the_run_ends_in_its_true_state(cluster, message):
    """Every field of an agent's message is checked: a bad one closes that agent's link with
    one line, never crashes the coordinator; b's work was done, so the run still succeeds."""
    a = started("ps:0", "worker:0") + [
        {"event": "ready", "task": "ps:0"},
        {"event": "exited", "task": "worker:0", "code": 0},
    ]
    b = started("worker:1") + [{"event": "exited", "task": "worker:1", "code": 0}, message]
    outcome, links, run, out = run_with(cluster, a, b)
    assert outcome.code == 0 and run.record().state == "succeeded", out
    field = list(message)[-1]
    assert f"b: closed its agent's link: a malformed message ({message['event']}.{field}" in out
    assert links[1].closed


class ClosingLink(FakeLink):
    """A link whose close ends its stream, as a real one does."""

    def close(self, timeout: float) -> None:
        if not self.closed:
            self.closed = True
            self._emit({"event": "link_closed"})


def test_a_malformed_message_from_a_host_still_working_fails_the_run_naming_it(cluster):
    plan, run = cluster
    a = started("ps:0", "worker:0") + [{"event": "ready", "task": "ps:0"}]
    b = started("worker:1") + [{"event": "trace_file", "offset": -1.5}]
    links = [FakeLink("a", ["ps:0", "worker:0"], a), ClosingLink("b", ["worker:1"], b)]
    out = io.StringIO()
    outcome = coordinate(plan, run, links, out=out)
    assert outcome.code == 1 and "lost the agent on b while worker:1" in outcome.message
    assert "malformed message (trace_file.offset: expected int, got -1.5)" in out.getvalue()
    assert run.record().state == "failed"


def test_a_malformed_line_in_events_jsonl_hides_only_itself(tmp_path):
    from tflaunch.runtime import protocol

    lines = [
        {"event": "started", "task": "w", "pid": 1, "time": 1.0},
        {"event": "started", "task": 5},
        {"event": "exited", "task": "w", "code": 0, "time": "later", "host": ["x"]},
    ]
    kept = list(protocol.records(lines))
    assert [r.event.NAME for r in kept] == ["started", "exited"]
    assert kept[1].time is None and kept[1].host is None
