"""Restart decisions (tflaunch/runtime/restart.py) and the stall watchdog's rules (tflaunch/runtime/stall.py)."""

from __future__ import annotations

import pytest

from tflaunch.cluster.config import parse_config
from tflaunch.cluster.supervision import Restart, RoleRestart
from tflaunch.errors import ConfigError
from tflaunch.runtime.restart import LOST, STALLED, Failure, RestartBook, restartable
from tflaunch.runtime.stall import StallWatch


def book(**roles) -> RestartBook:
    limits = {k: roles.pop(k) for k in list(roles) if not isinstance(roles[k], RoleRestart)}
    return RestartBook(Restart(**roles, **limits))


@pytest.mark.parametrize(
    ("policy", "code", "cause", "expected"),
    [
        ("never", 137, "exited", False),
        ("on-failure", 1, "exited", True),
        ("exit-code", 1, "exited", False),
        ("exit-code", 2, "exited", False),
        ("exit-code", 137, "exited", True),
        ("exit-code", 143, "exited", True),
        ("exit-code", 143, STALLED, True),
        ("exit-code", 0, STALLED, True),
        ("exit-code", 0, LOST, True),
        ("never", 0, LOST, False),
    ],
)
def test_restartable(policy, code, cause, expected):
    assert restartable(policy, Failure("worker:1", code, cause)) is expected


def test_worker_restarts_alone_with_doubling_backoff_until_its_limit():
    b = book(worker=RoleRestart("on-failure", max_restarts=2), backoff=1.5, backoff_max=2.0)
    first = b.decide(Failure("worker:1", 137))
    second = b.decide(Failure("worker:1", 1))
    third = b.decide(Failure("worker:1", 137))
    assert (first.action, first.delay, first.count) == ("restart_task", 1.5, 1)
    assert (second.action, second.delay, second.count) == ("restart_task", 2.0, 2)
    assert third.action == "fail"
    assert "supervision.restart.worker.max_restarts (2)" in third.reason
    assert b.history("worker:1") == "137 (SIGKILL), 1, 137 (SIGKILL)"
    assert b.summary() == [
        "worker:1 restarted 2 time(s) (failures: 137 (SIGKILL), 1, 137 (SIGKILL))"
    ]


def test_a_lost_host_restarts_its_tasks_alone_only_when_every_one_may():
    b = book(worker=RoleRestart("exit-code", max_restarts=1), ps=RoleRestart("exit-code"))
    alone = b.decide_host_lost("h2", ["worker:1", "worker:2"])
    assert (alone.action, alone.delay, alone.count) == ("restart_task", 0.0, 1)
    assert (b.task_restarts, b.run_task_restarts, b.cluster_restarts) == (
        {"worker:1": 1, "worker:2": 1},
        2,
        0,
    )
    assert b.decide_host_lost("h1", ["ps:0", "worker:0"]).action == "restart_cluster"
    refused = b.decide_host_lost("h2", ["worker:1", "worker:2"])
    assert refused.action == "fail"
    assert refused.reason.startswith("worker:1: it was restarted 1 time(s), the limit of ")
    assert "supervision.restart.worker.max_restarts (1)" in refused.reason
    assert b.history("worker:1") == "lost, lost"
    assert "h2 was lost 2 time(s)" in b.summary()
    # a role that never restarts, or restarts the cluster: the cluster restarts
    never = book(ps=RoleRestart("exit-code"))
    assert never.decide_host_lost("h2", ["worker:1"]).action == "restart_cluster"
    scoped = book(worker=RoleRestart("on-failure", scope="cluster"))
    assert scoped.decide_host_lost("h2", ["worker:1"]).action == "restart_cluster"


def test_ps_and_chief_restart_the_cluster_within_the_cluster_bound():
    b = book(ps=RoleRestart("exit-code"), chief=RoleRestart("on-failure"), max_cluster_restarts=1)
    assert b.decide(Failure("ps:1", 137)).action == "restart_cluster"
    refused = b.decide(Failure("chief:0", 1))
    assert refused.action == "fail"
    assert "max_cluster_restarts (1)" in refused.reason
    assert b.summary()[-1] == "the cluster restarted 1 time(s)"


def test_scope_overrides_the_role_default_and_the_run_bound_counts_all_tasks():
    b = book(
        worker=RoleRestart("on-failure", scope="cluster"),
        evaluator=RoleRestart("on-failure"),
        max_restarts=1,
    )
    assert b.decide(Failure("worker:0", 1)).action == "restart_cluster"
    assert b.decide(Failure("evaluator:0", 1)).action == "restart_task"
    assert "supervision.restart.max_restarts (1)" in b.decide(Failure("evaluator:0", 1)).reason


def test_exit_code_policy_refuses_exit_1_and_says_why():
    decision = book(worker=RoleRestart("exit-code")).decide(Failure("worker:0", 1))
    assert decision.action == "fail"
    assert "128+N" in decision.reason


def test_cluster_file_shorthand_and_typo():
    config = parse_config(
        "program: [x]\nsupervision:\n  restart: {worker: on-failure, ps: {policy: exit-code, max_restarts: 1}}\n"
    )
    restart = config.supervision.restart
    assert restart.worker == RoleRestart("on-failure")
    assert (restart.scope_of("ps"), restart.scope_of("worker"), restart.enabled) == (
        "cluster",
        "task",
        True,
    )
    with pytest.raises(ConfigError, match="did you mean 'exit-code'"):
        parse_config("program: [x]\nsupervision: {restart: {worker: exitcode}}\n")
    with pytest.raises(ConfigError, match="step_pattern: 'step' has no group"):
        parse_config("program: [x]\nsupervision: {step_pattern: step}\n")


def test_stall_without_steps_is_silence():
    watch = StallWatch(10, r"\bstep[ :=]+(\d+)")
    watch.watch("worker:0", now=0)
    watch.output("worker:0", "loading data", now=5)
    assert watch.stalled(now=14) == []
    assert watch.stalled(now=15) == [("worker:0", "no output for 10 s")]
    assert watch.stalled(now=30) == []  # reported once


def test_stall_with_steps_is_no_step_progress_despite_output():
    watch = StallWatch(10, r"\bstep[ :=]+(\d+)")
    watch.watch("chief:0", now=0)
    watch.output("chief:0", "global step 20: loss 0.3", now=2)
    for t in range(3, 13):
        watch.output("chief:0", "global step 20: retrying", now=t)  # output, but no progress
    assert watch.stalled(now=12) == [("chief:0", "no step progress for 10 s (last step 20)")]


def test_stall_off_and_forgotten_tasks():
    off = StallWatch(0, r"step (\d+)")
    off.watch("worker:0", now=0)
    assert off.stalled(now=1e9) == []
    watch = StallWatch(1, r"step (\d+)")
    watch.watch("worker:0", now=0)
    watch.forget("worker:0")
    assert watch.stalled(now=5) == []
