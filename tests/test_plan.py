"""The plan: golden files for `plan --json` and `render`, and exact placement rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.golden import assert_golden
from tests.helpers import cpu_bounded
from tflaunch.cli import cli
from tflaunch.cluster.config import parse_config
from tflaunch.cluster.placement import make_plan
from tflaunch.cluster.plan import Host, Plan
from tflaunch.cluster.render import render_task
from tflaunch.errors import PlanError

GOLDEN = Path(__file__).parent / "golden" / "plan"
CASES = sorted(p.stem for p in GOLDEN.glob("*.yaml"))
RENDER_TASK = {"chief_evaluator": "chief:0"}


def check_golden(path: Path, text: str) -> None:
    assert_golden(path, text.replace(str(GOLDEN), "<golden>"))


@pytest.mark.parametrize("case", CASES)
def test_plan_json_golden(case):
    result = CliRunner().invoke(cli, ["plan", "--json", str(GOLDEN / f"{case}.yaml")])
    assert result.exit_code == 0, result.output
    check_golden(GOLDEN / f"{case}.plan.json", result.output)


@pytest.mark.parametrize("case", CASES)
def test_render_golden(case):
    task = RENDER_TASK.get(case, "worker:1")
    out = []
    for fmt in ("tf_config", "cluster_spec", "env", "command"):
        result = CliRunner().invoke(
            cli, ["render", str(GOLDEN / f"{case}.yaml"), "--task", task, "--format", fmt]
        )
        assert result.exit_code == 0, result.output
        out.append(f"--- {fmt} ({task})\n{result.output}")
    check_golden(GOLDEN / f"{case}.render.txt", "".join(out))


def test_plan_table_shows_every_task():
    result = CliRunner().invoke(cli, ["plan", str(GOLDEN / "uneven.yaml")])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0].split() == ["TASK", "HOST", "ADDRESS", "GPU_IDS", "COMMAND"]
    assert any(line.startswith("worker:4  cpu-only") for line in lines)
    assert len(lines) == 1 + 2 + 5 + 3 + 1  # and the line that says 'up' picks free ports
    assert lines[-3:] == [  # where each host's GPU count came from
        "GPUs: 4 on gpu4 (hosts[0].gpus)",
        "GPUs: 2 on gpu2 (hosts[1].gpus)",
        "GPUs: 0 on cpu-only (none: 3 local hosts share this machine's GPUs; give each its gpus)",
    ]


def plan_of(text: str, hosts=None) -> Plan:
    config = parse_config(text)
    from tflaunch.cluster.placement import hosts_from_config

    return make_plan(config, hosts or hosts_from_config(config))


def test_gpu_policy():
    plan = plan_of((GOLDEN / "uneven.yaml").read_text())
    gpus = {
        t.name: (t.host, t.gpus, render_task(plan, t).env["CUDA_VISIBLE_DEVICES"])
        for t in plan.tasks
    }
    assert gpus == {
        "ps:0": ("gpu4", (), ""),
        "ps:1": ("gpu2", (), ""),
        "worker:0": ("gpu4", ("0",), "0"),
        "worker:1": ("gpu4", ("1",), "1"),
        "worker:2": ("gpu2", ("0",), "0"),
        "worker:3": ("gpu2", ("1",), "1"),
        "worker:4": ("cpu-only", (), ""),
    }


def test_one_worker_per_host_takes_all_gpus_and_slurm_given_ids_are_used():
    text = "program: [p]\nroles: {ps: 1, worker: 2}\nplacement: {workers_per_host: 1}\n"
    hosts = [Host("n1", "n1", "n1", ("2", "3")), Host("n2", "n2", "n2", ("5",))]
    plan = plan_of(text, hosts)
    assert [(t.name, t.gpus) for t in plan.tasks] == [
        ("ps:0", ()),
        ("worker:0", ("2", "3")),
        ("worker:1", ("5",)),
    ]


def test_ports_skip_taken_ports_on_a_crowded_host():
    plan = plan_of((GOLDEN / "crowded.yaml").read_text())
    ports = [t.port for t in plan.tasks]
    assert ports[:3] == [2230, 2231, 2232]
    assert ports[3:] == [2220, 2221, 2222, 2223, 2224, 2225, 2226, 2227, 2228, 2229, 2233, 2234]


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "program: [p]\nroles: {worker: 5}\nhosts: [a, b]\nplacement: {workers_per_host: 2}\n",
            "too few host slots: 5 worker tasks (chief, workers and evaluator count) need 3 host(s) at 2 per host, but 2 worker host(s) are given (4 slots)",
        ),
        (
            "program: [p]\nroles: {ps: 3, worker: 2}\nhosts: [a, b, c]\nplacement: {ps: dedicated}\n",
            "too few hosts: dedicated PS need one host each, so 3 PS + 1 worker host(s) need 4 hosts, but 3 are given",
        ),
        (
            "program: [p]\nroles: {ps: 3, worker: 2}\nhosts: [a, b]\nplacement: {ps_per_host: 1}\n",
            "too many co-located PS: 3 PS at most 1 per host need 3 worker host(s), but the workers use 2",
        ),
        (
            "program: [p]\nroles: {worker: 3}\nhosts: [{name: a, gpus: 2}]\n",
            "host 'a' has 2 GPU(s) (hosts[0].gpus) but its 3 worker task(s) at 1 each need 3",
        ),
        ("program: [p, '{nope}']\n", "uses the unknown placeholder {nope}"),
        (
            "program: [p]\nroles: {ps: 2}\nports: {ps: 65535}\n",
            "no free port for ps:1 on localhost",
        ),
    ],
)
def test_placement_errors_state_the_counts(text, message):
    with pytest.raises(PlanError) as err:
        plan_of(text)
    assert message in str(err.value)


@settings(max_examples=150, deadline=None)
@given(
    ps=st.integers(0, 6),
    workers=st.integers(1, 12),
    chief=st.integers(0, 1),
    n_hosts=st.integers(1, 5),
    per_host=st.one_of(st.none(), st.integers(1, 6)),
    gpus=st.lists(st.integers(0, 4), min_size=5, max_size=5),
    shared_address=st.booleans(),
)
def test_plans_never_collide_and_are_deterministic(
    ps, workers, chief, n_hosts, per_host, gpus, shared_address
):
    text = f"program: [p]\nroles: {{ps: {ps}, worker: {workers}, chief: {chief}}}\n" + (
        f"placement: {{workers_per_host: {per_host}}}\n" if per_host else ""
    )
    hosts = [
        Host(
            f"h{i}",
            "127.0.0.1" if shared_address else f"h{i}",
            f"h{i}",
            tuple(str(g) for g in range(gpus[i])),
        )
        for i in range(n_hosts)
    ]
    try:
        plan = plan_of(text, hosts)
    except PlanError:
        return
    addresses = [t.address for t in plan.tasks if t.address]
    assert len(addresses) == len(set(addresses))
    for host in hosts:  # no GPU handed out twice on a host
        used = [g for t in plan.tasks if t.host == host.name for g in t.gpus]
        assert len(used) == len(set(used))
    assert plan == plan_of(text, hosts)
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert [t.name for t in plan.tasks if t.job == "ps"] == [f"ps:{i}" for i in range(ps)]
    assert all(
        render_task(plan, t).env["CUDA_VISIBLE_DEVICES"] == "" for t in plan.tasks if t.job == "ps"
    )


def _ports_by_search_from_the_base(plan_text: str, hosts: list[Host]) -> dict[str, int]:
    """The quadratic reference: each task searches up from its job's base port."""
    plan = plan_of(plan_text, hosts)
    config = parse_config(plan_text)
    taken: dict[str, set[int]] = {}
    ports = {}
    for task in plan.tasks:
        if task.job == "evaluator":
            continue
        used = taken.setdefault(task.cluster_address, set())
        port = getattr(config.ports, task.job)
        while port in used:
            port += 1
        used.add(port)
        ports[task.name] = port
    return ports


@settings(max_examples=40, deadline=None)
@given(
    ps=st.integers(0, 12),
    workers=st.integers(1, 12),
    chief=st.integers(0, 1),
    bases=st.lists(st.integers(2200, 2215), min_size=3, max_size=3),
    n_hosts=st.integers(1, 3),
    shared_address=st.booleans(),
)
def test_linear_port_assignment_matches_the_search_from_the_base(
    ps, workers, chief, bases, n_hosts, shared_address
):
    text = (
        f"program: [p]\nroles: {{ps: {ps}, worker: {workers}, chief: {chief}}}\n"
        f"ports: {{ps: {bases[0]}, worker: {bases[1]}, chief: {bases[2]}}}\n"
    )
    hosts = [Host(f"h{i}", "a" if shared_address else f"h{i}", f"h{i}") for i in range(n_hosts)]
    try:
        plan = plan_of(text, hosts)
    except PlanError:
        return
    got = {t.name: t.port for t in plan.tasks if t.port is not None}
    assert got == _ports_by_search_from_the_base(text, hosts)


def test_port_assignment_is_linear():
    """1,000 PS and 1,000 workers from one base on one address: each worker's search from the
    base would pass every port taken before it."""
    text = "program: [p]\nroles: {ps: 1000, worker: 1000}\nports: {ps: 3000, worker: 3000}\n"
    with cpu_bounded(5):
        plan = plan_of(text, [Host("h", "a", "h")])
    assert sorted(t.port for t in plan.tasks) == list(range(3000, 5000))


def test_ports_past_65535_are_a_plan_error():
    with pytest.raises(PlanError, match="no free port for worker:1 on h: counting up"):
        plan_of("program: [p]\nroles: {ps: 0, worker: 2}\nports: {worker: 65535}\n", [Host("h", "a", "h")])  # fmt: skip


def test_a_plan_holds_the_cluster_once():
    """3,000 tasks whose argv lists every worker: the plan stays small (before the linear plan,
    every task's TF_CONFIG and argv held the whole cluster: ~170 MB)."""
    text = "program: [p, '{worker_hosts}']\nroles: {ps: 1, worker: 3000}\n"
    plan = plan_of(text, [Host("h", "a", "h")])
    assert len(plan.to_json()) < 1 << 20


def test_cpus_per_task_gives_each_task_on_a_host_its_own_core_slots(tmp_path) -> None:
    from tflaunch.cluster.config import load_config
    from tflaunch.cluster.placement import cpu_list

    path = tmp_path / "c.yaml"
    path.write_text(
        "name: pin\nprogram: [python3, t.py]\nroles: {ps: 2, worker: 4}\n"
        "placement: {cpus_per_task: 3}\n"
    )
    hosts = [Host("a", "10.0.0.1", "10.0.0.1"), Host("b", "10.0.0.2", "10.0.0.2")]
    plan = make_plan(load_config(path), hosts)
    slots = {t.name: (t.host, t.cpus) for t in plan.tasks}
    # Plan order (PS first) on each host: a holds ps:0, worker:0, worker:1; b the others.
    assert slots == {
        "ps:0": ("a", (0, 1, 2)),
        "ps:1": ("b", (0, 1, 2)),
        "worker:0": ("a", (3, 4, 5)),
        "worker:1": ("a", (6, 7, 8)),
        "worker:2": ("b", (3, 4, 5)),
        "worker:3": ("b", (6, 7, 8)),
    }
    assert Plan.from_dict(plan.to_dict()) == plan
    assert cpu_list((3, 4, 5, 9)) == "3-5,9" and cpu_list(()) == "-"
    table = CliRunner().invoke(cli, ["plan", str(path)]).output.splitlines()
    assert table[0].split()[:5] == ["TASK", "HOST", "ADDRESS", "GPU_IDS", "CPUS"]
    path.write_text("name: pin\nprogram: [python3, t.py]\nroles: {ps: 1, worker: 1}\n")
    unpinned = make_plan(load_config(path), hosts)
    assert all(t.cpus == () for t in unpinned.tasks)
    assert all("cpus" not in t for t in unpinned.to_dict()["tasks"])  # plan.json as before


def test_checkpoint_dir_stays_a_path_of_the_hosts_over_ssh_and_the_agent_resolves_it(
    tmp_path, monkeypatch
):
    """Over SSH the checkpoint directory is a path of the hosts: '~' and relative paths are not
    resolved on the laptop but by each host's agent (home: where sshd starts it); the default
    is checkpoints/ in the run's directory on the hosts. Locally nothing changes."""
    from tflaunch import launch
    from tflaunch.cluster.placement import on_this_host
    from tflaunch.runtime.run import Run

    hosts = [Host("a", "10.0.0.1", "10.0.0.1")]
    ssh_hosts = "hosts: [{name: a, address: 10.0.0.1}]\nssh: {remote_runs_dir: remote-runs}\n"

    def plan_of(text: str, run_dir: str | None = None) -> Plan:
        config = parse_config(text, source=str(tmp_path / "c.yaml"), base_dir=str(tmp_path))
        return make_plan(config, hosts, run_dir)

    ssh = "backend: ssh\nroles: {ps: 0, worker: 1}\n" + ssh_hosts
    program = "program: {argv: [p, '{checkpoint_dir}'], workdir: proj%s}\n"
    chosen = plan_of(program % ", checkpoint_dir: ckpt" + ssh).program.checkpoint_dir
    assert chosen == "proj/ckpt"  # relative to the workdir, itself relative to the remote home
    assert plan_of(program % ", checkpoint_dir: '~/ckpt'" + ssh).program.checkpoint_dir == (
        "~/ckpt"
    )
    config = parse_config(program % "" + ssh, source=str(tmp_path / "c.yaml"))
    run = Run("r-1", tmp_path / "runs" / "r-1")
    assert launch.tasks_run_dir(config, run) == "~/remote-runs/r-1"
    default = make_plan(config, hosts, launch.tasks_run_dir(config, run))
    assert default.program.checkpoint_dir == "~/remote-runs/r-1/checkpoints"
    assert "checkpoints: ~/remote-runs/<run id>/checkpoints on each task's host" in (
        launch.checkpoints_line(config, launch.plan_cluster(config))
    )

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)  # an agent's working directory: the remote home
    resolved = on_this_host(default)
    assert resolved.program.checkpoint_dir == str(tmp_path / "home/remote-runs/r-1/checkpoints")
    view = render_task(resolved, resolved.tasks[0], tmp_path / "runs" / "r-1")
    assert view.argv[1] == view.env["TFLAUNCH_CHECKPOINT_DIR"] == resolved.program.checkpoint_dir
    relative = on_this_host(plan_of(program % ", checkpoint_dir: ckpt" + ssh))
    assert relative.program.checkpoint_dir == str(tmp_path / "proj" / "ckpt")
    url = plan_of(program % ", checkpoint_dir: 's3://b/ckpt'" + ssh)
    assert on_this_host(url) is url

    local = "program: {argv: [p]}\nroles: {ps: 0, worker: 1}\n"
    config = parse_config(local, source=str(tmp_path / "c.yaml"))
    assert launch.tasks_run_dir(config, run) == str(run.dir)
    assert launch.checkpoints_line(config, launch.plan_cluster(config)) is None
    here = make_plan(config, hosts, run.dir)
    assert here.program.checkpoint_dir == str(run.dir / "checkpoints")
    assert on_this_host(here) is here
