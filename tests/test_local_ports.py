"""Local runs pick free ports unless the file pins them (issue 40): two runs of one example at
once both succeed; a pinned port that is taken stops the start naming its holder's pid and
command."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import yaml

from tests.helpers import ROOT, free_port_base, start_tflaunch, tflaunch
from tflaunch.cluster.config import parse_config
from tflaunch.cluster.placement import make_plan
from tflaunch.cluster.plan import Host
from tflaunch.launchers.local.backend import LocalBackend


def smoke_example(tmp_path: Path) -> Path:
    """examples/smoke.yaml as it ships (no ports:), run by this Python."""
    data = yaml.safe_load((ROOT / "examples" / "smoke.yaml").read_text())
    assert "ports" not in data
    data["program"]["argv"][0] = sys.executable
    data["runs_dir"] = str(tmp_path / "runs")
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_two_runs_of_the_smoke_example_at_once_both_succeed(tmp_path):
    path = smoke_example(tmp_path)
    runs = [start_tflaunch("up", str(path)) for _ in range(2)]
    results = [proc.communicate(timeout=180) for proc in runs]
    for proc, (out, err) in zip(runs, results, strict=True):
        assert proc.returncode == 0, out[-2000:] + err[-2000:]
        assert "succeeded" in out
    ports = [
        json.loads(plan.read_text())["cluster"]["ps"]
        for plan in sorted((tmp_path / "runs").glob("*/plan.json"))
    ]
    assert len(ports) == 2 and ports[0] != ports[1]


def test_only_the_jobs_the_file_leaves_out_get_free_ports():
    config = parse_config("program: [p]\nroles: {ps: 2, worker: 2}\nports: {ps: 3000}\n")
    plan = make_plan(config, [Host("localhost", "localhost", "localhost")])
    chosen = LocalBackend().choose_ports(config, plan)
    assert [t.port for t in chosen.tasks if t.job == "ps"] == [3000, 3001]
    workers = [t for t in chosen.tasks if t.job == "worker"]
    assert len({t.port for t in workers}) == 2 and all(t.port != 2220 for t in workers)
    assert chosen.cluster["worker"] == tuple(f"localhost:{t.port}" for t in workers)
    assert chosen.cluster["ps"] == plan.cluster["ps"]
    pinned = parse_config("program: [p]\nports: {ps: 3000, worker: 3100, chief: 3200}\n")
    whole = make_plan(pinned, [Host("localhost", "localhost", "localhost")])
    assert LocalBackend().choose_ports(pinned, whole) is whole


def test_plan_says_up_picks_free_ports(tmp_path):
    shown = tflaunch("plan", str(smoke_example(tmp_path)))
    assert shown.returncode == 0, shown.stderr
    assert "ports: the ps, worker tasks get free ports of this machine at each 'up'" in shown.stdout


def test_a_pinned_port_that_is_taken_names_its_holder(tmp_path):
    path = smoke_example(tmp_path)
    data = yaml.safe_load(path.read_text())
    base = free_port_base()
    data["ports"] = {"ps": base, "worker": base + 10}
    path.write_text(yaml.safe_dump(data))
    with socket.socket() as holder:
        holder.bind(("", base))
        holder.listen()
        for command in ("validate", "up"):
            result = tflaunch(command, str(path))
            assert result.returncode == 2, result.stdout
            assert f"port {base} on localhost is already in use by pid {os.getpid()} (" in (
                result.stderr
            )
