"""Pre-flight: the probe program (run here for real, as on a host) and the judgement and table."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import free_port_base
from tflaunch.cluster.config import parse_config
from tflaunch.cluster.placement import make_plan
from tflaunch.cluster.plan import Host
from tflaunch.errors import LaunchError
from tflaunch.launchers.ssh.preflight import (
    PROBE,
    HostReport,
    format_table,
    judge,
    probe_request,
    raise_on_problems,
)


def plan_for(tmp_path: Path, argv: list[str], ports: tuple[int, int] | None = None, gpus=0):
    if ports is None:  # free, and below the ephemeral range where connections take ports
        base = free_port_base()
        ports = (base, base + 10)
    config = parse_config(
        f"program: {{argv: {json.dumps(argv)}, workdir: {tmp_path}}}\n"
        "roles: {ps: 1, worker: 2}\n"
        f"ports: {{ps: {ports[0]}, worker: {ports[1]}}}\n",
        base_dir=str(tmp_path),
    )
    gpu_ids = tuple(str(i) for i in range(gpus))
    hosts = [
        Host("a", "127.0.0.1", "127.0.0.1", gpu_ids),
        Host("b", "127.0.0.2", "127.0.0.2", gpu_source="hosts[1].gpus"),  # gpus: 0 in the file
    ]
    return make_plan(config, hosts)


def probe(request: dict) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(request)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_probe_reports_versions_and_a_present_script(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    plan = plan_for(tmp_path, [sys.executable, "train.py"])
    facts = probe(probe_request(plan, "a", str(tmp_path)))
    assert facts["python"] == sys.version.split()[0]
    assert facts["tflaunch"] and facts["program"] == "train.py"
    assert facts["workdir"] == str(tmp_path)
    assert facts["busy_ports"] == [] and facts["problems"] == []
    assert isinstance(facts["gpus"], int)


def test_probe_finds_busy_ports_missing_scripts_modules_and_foreign_addresses(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    busy = holder.getsockname()[1]
    try:
        plan = plan_for(tmp_path, [sys.executable, "train.py"], ports=(busy, busy + 1))
        facts = probe(probe_request(plan, "a", str(tmp_path)))
        assert busy in facts["busy_ports"]
        assert any("the script train.py is not in" in p for p in facts["problems"])
    finally:
        holder.close()
    module = plan_for(tmp_path, [sys.executable, "-m", "no_such_module_here"])
    facts = probe(probe_request(module, "a", str(tmp_path)))
    assert any("module no_such_module_here is not found" in p for p in facts["problems"])
    request = {**probe_request(module, "a", str(tmp_path / "nope")), "address": "198.18.3.99"}
    facts = probe(request)
    assert any("does not exist" in p for p in facts["problems"])
    assert any("198.18.3.99 is not an address of this host" in p for p in facts["problems"])


def report(plan, host: str, **facts) -> HostReport:
    base = {
        "python": "3.11.7",
        "tflaunch": "0.1.0",
        "tensorflow": "2.21.0",
        "gpus": 0,
        "busy_ports": [],
        "program": "train.py",
    }
    r = HostReport(host, "203.0.113.1", "10.0.0.1", {**base, **facts}, [])
    judge(r, plan, "python3")
    return r


def test_judgement_names_tensorflow_busy_ports_and_gpus(tmp_path):
    plan = plan_for(tmp_path, ["python3", "train.py"], gpus=1)
    assert report(plan, "a", gpus=1).problems == []
    unused = report(plan, "b", gpus=2)  # host b is given no GPUs in the cluster file
    assert unused.problems == []
    assert unused.warnings == [
        "nvidia-smi lists 2 GPU(s) but the cluster file gives the host 0 (hosts[1].gpus), so "
        "its tasks run on CPU; leave its gpus out to use them"
    ]
    missing_tf = report(plan, "a", gpus=1, tensorflow=None).problems
    assert missing_tf[0].startswith("TensorFlow is not installed for python3")
    port = plan.task("worker:0").port
    busy = report(plan, "a", gpus=1, busy_ports=[port]).problems
    assert busy == [
        f"port {port} (planned for worker:0) is already in use; stop what holds it "
        f"(ss -ltnp 'sport = :{port}') or change the base ports under 'ports:'"
    ]
    assert plan.task("worker:0").gpus == ("0",)
    no_gpu = report(plan, "a", gpus=0).problems
    assert no_gpu == [
        "the plan uses GPU(s) 0 but nvidia-smi lists 0; fix the host's 'gpus' in the cluster file"
    ]


def test_table_and_one_error_for_all_problems(tmp_path):
    plan = plan_for(tmp_path, ["python3", "train.py"])
    good = report(plan, "a")
    bad = report(plan, "b", tensorflow=None, busy_ports=[plan.task("worker:1").port])
    table = format_table([good, bad], plan).splitlines()
    header = "HOST CONNECT CLUSTER PYTHON TFLAUNCH TENSORFLOW GPUS PORTS PROGRAM CHECK"
    assert table[0].split() == header.split()
    assert table[1].split()[-1] == "ok"
    assert "MISSING" in table[2] and "(busy)" in table[2] and table[2].endswith("2 problem(s)")
    raise_on_problems([good])
    with pytest.raises(LaunchError) as err:
        raise_on_problems([good, bad])
    message = str(err.value)
    assert message.startswith("pre-flight failed on 1 of 2 hosts; nothing was started.")
    assert message.count("b (203.0.113.1): ") == 2


def test_probe_makes_the_run_dir_and_writes_the_files_from_stdin(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    plan = plan_for(tmp_path, [sys.executable, "train.py"])
    request = probe_request(plan, "a", "work", run_dir="runs/r1/a", files=True)
    (tmp_path / "work").mkdir()
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(request)],
        input=json.dumps({"plan.json": "{}\n", "token": "t"}),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,  # the remote home: relative paths are under it
    )
    facts = json.loads(result.stdout)
    run_dir = tmp_path / "runs" / "r1" / "a"
    assert facts["run_dir"] == str(run_dir) and facts["workdir"] == str(tmp_path / "work")
    assert (run_dir / "plan.json").read_text() == "{}\n"
    assert (run_dir / "token").stat().st_mode & 0o777 == 0o600
