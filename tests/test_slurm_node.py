"""Inside the allocation: hosts and GPUs from Slurm's environment.

These are the pure parts of launchers/slurm/node.py (the agents' hello: tests/test_rendezvous.py); the end-to-end tests run them under Slurm.
The environments below are what Slurm sets in a step (values seen on the test cluster).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from tflaunch.cluster.config import parse_config
from tflaunch.cluster.plan import Host
from tflaunch.cluster.render import render_task
from tflaunch.launchers.slurm.node import (
    Node,
    allocation_hosts,
    allocation_nodes,
    node_gpu_ids,
    requeue_rule,
    too_many_requeues,
)
from tflaunch.launchers.slurm.script import Layout, layout
from tflaunch.runtime.run import Run


def config(**sections):
    data = {"name": "t", "backend": "slurm", "program": ["python3", "train.py"]}
    data.update(sections)
    return parse_config(yaml.safe_dump(data), source="cluster.yaml", base_dir="/tmp")


def node(cfg, env: dict, name: str) -> Node:
    job = layout(cfg)
    _, ps_nodes = allocation_nodes(env, job)
    return Node(
        config=cfg,
        job=job,
        run=Run("r", Path("/tmp/r")),
        name=name,
        procid=0,
        job_id="7",
        gpu_ids=node_gpu_ids(env, job, name in ps_nodes),
        env=env,
    )


def test_gpu_ids_come_from_slurm() -> None:
    job = Layout(1, 0, 2)
    assert node_gpu_ids({"CUDA_VISIBLE_DEVICES": "2,3"}, job, ps_node=False) == ("2", "3")
    assert node_gpu_ids({"CUDA_VISIBLE_DEVICES": ""}, job, ps_node=False) == ()
    assert node_gpu_ids({}, job, ps_node=False) == ("0", "1")  # Slurm set nothing: all of them
    assert node_gpu_ids({"CUDA_VISIBLE_DEVICES": "0"}, job, ps_node=True) == ()


def test_hosts_from_the_node_list_in_slurm_order() -> None:
    env = {"SLURM_JOB_NODELIST": "nid0[0007-0009]"}
    hosts = allocation_hosts(env, Layout(3, 0, 1), {"nid00008": ("1",)})
    assert hosts == [
        Host("nid00007", "nid00007", "nid00007", ("0",)),
        Host("nid00008", "nid00008", "nid00008", ("1",)),
        Host("nid00009", "nid00009", "nid00009", ("0",)),
    ]


def test_workers_split_the_gpus_slurm_gave_their_node() -> None:
    cfg = config(
        roles={"ps": 1, "worker": 4}, placement={"workers_per_host": 2}, slurm={"gpus_per_node": 2}
    )
    env = {"SLURM_JOB_NODELIST": "gpu-[1-2]", "CUDA_VISIBLE_DEVICES": "2,3"}
    plan = node(cfg, env, "gpu-2").plan()
    gpus = {t.name: (t.host, render_task(plan, t).env["CUDA_VISIBLE_DEVICES"]) for t in plan.tasks}
    assert gpus["worker:2"] == ("gpu-2", "2") and gpus["worker:3"] == ("gpu-2", "3")
    assert gpus["ps:0"] == ("gpu-1", "")


def test_every_node_plans_the_same_cluster() -> None:
    cfg = config(roles={"ps": 2, "worker": 3}, slurm={"gpus_per_node": 1})
    nodes = [
        node(cfg, {"SLURM_JOB_NODELIST": "n[1-3]", "CUDA_VISIBLE_DEVICES": cvd}, name)
        for name, cvd in (("n1", "0"), ("n2", "3"), ("n3", "1"))
    ]
    plans = [n.plan() for n in nodes]
    assert plans[0].cluster == plans[1].cluster == plans[2].cluster
    tf_configs = [{t.name: render_task(p, t).env["TF_CONFIG"] for t in p.tasks} for p in plans]
    assert tf_configs[0] == tf_configs[1] == tf_configs[2]
    # each node's own worker gets that node's GPU
    assert [p.task(f"worker:{i}").gpus for i, p in enumerate(plans)] == [("0",), ("3",), ("1",)]
    # a joining node plans the same cluster and only its own tasks
    own = [n.own_plan() for n in nodes]
    assert all(p.cluster == plans[0].cluster for p in own)
    assert [p.tasks for p in own] == [p.tasks_on(n.name) for p, n in zip(plans, nodes, strict=True)]


def test_heterogeneous_job_puts_ps_on_the_ps_component() -> None:
    cfg = config(
        roles={"ps": 1, "worker": 2}, placement={"ps": "dedicated"}, slurm={"gpus_per_node": 1}
    )
    env = {
        "SLURM_JOB_NODELIST": "node[1-3]",
        "SLURM_JOB_NODELIST_HET_GROUP_0": "node[2-3]",
        "SLURM_JOB_NODELIST_HET_GROUP_1": "node1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    plan = node(cfg, env, "node1").plan()
    assert {t.name: t.host for t in plan.tasks} == {
        "ps:0": "node1",
        "worker:0": "node2",
        "worker:1": "node3",
    }
    assert render_task(plan, plan.task("ps:0")).env["CUDA_VISIBLE_DEVICES"] == ""
    assert plan.task("worker:0").gpus == ("0",)


def test_requeue_rule_counts_slurms_restarts_against_the_limit() -> None:
    cfg = config(slurm={"signal": "USR1@120", "requeue": 2, "checkpoint_wait": 20})
    first = requeue_rule(cfg, 0)
    assert (first.after, first.note, first.refused) == (20, "requeue 1 of at most 2", "")
    assert requeue_rule(cfg, 1).note == "requeue 2 of at most 2"
    assert "requeued 2 time(s), the limit of slurm.requeue (2)" in requeue_rule(cfg, 2).refused
    assert requeue_rule(config(slurm={"signal": "USR1@120"}), 0) is None
    assert too_many_requeues(cfg, 2, "7") is None
    assert "Slurm job 7 was requeued 3 time(s) (SLURM_RESTART_COUNT), more than slurm.requeue" in (
        too_many_requeues(cfg, 3, "7")
    )
    # without slurm.requeue, a job Slurm requeued on its own does not start again
    assert "more than slurm.requeue allows (0)" in too_many_requeues(config(), 1, "7")
