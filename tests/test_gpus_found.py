"""GPUs found on local hosts: ``nvidia-smi -L`` (a stand-in on PATH reporting 2 GPUs, since this
machine has none), narrowed by an inherited CUDA_VISIBLE_DEVICES, unless the file says ``gpus``."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from tests.helpers import FAKE_SMI, fake_cluster, tflaunch
from tflaunch.cli import cli
from tflaunch.cluster.config import parse_config
from tflaunch.launchers.local.backend import LocalBackend, detect_gpus


@pytest.fixture
def smi_path(tmp_path, monkeypatch):
    """PATH with a stand-in nvidia-smi that lists 2 GPUs first."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "nvidia-smi").write_text(FAKE_SMI)
    (folder / "nvidia-smi").chmod(0o755)
    path = f"{folder}{os.pathsep}{os.environ['PATH']}"
    monkeypatch.setenv("PATH", path)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return path


def test_detected_gpus_within_an_inherited_cuda_visible_devices(smi_path):
    assert detect_gpus({}) == (("0", "1"), "nvidia-smi -L (2 found)")
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": "1"})[0] == ("1",)
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": "GPU-bbbb,0"})[0] == ("GPU-bbbb", "0")
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": ""})[0] == ()
    # CUDA stops at the first entry that names no device: -1 hides them all, 7 does not exist
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": "-1,0"})[0] == ()
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": "0,7,1"})[0] == ("0",)


def test_no_nvidia_smi_means_no_gpus_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect_gpus({}) == ((), "none found: no nvidia-smi on PATH")


def test_gpus_0_turns_detection_off_and_plan_says_where_counts_came_from(smi_path, tmp_path):
    found = LocalBackend().hosts(parse_config("program: [p]\n"))
    assert [(h.name, h.gpu_ids) for h in found] == [("localhost", ("0", "1"))]
    off = LocalBackend().hosts(parse_config("program: [p]\nhosts: [{name: localhost, gpus: 0}]\n"))
    assert off[0].gpu_ids == () and off[0].gpu_source == "hosts[0].gpus"
    (tmp_path / "c.yaml").write_text("program: [python3, t.py]\nroles: {ps: 1, worker: 2}\n")
    shown = CliRunner().invoke(cli, ["plan", str(tmp_path / "c.yaml")])
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines()[-1] == "GPUs: 2 on localhost (nvidia-smi -L (2 found))"


def test_too_few_detected_gpus_leave_the_workers_on_cpu_and_say_so(smi_path, tmp_path, monkeypatch):
    # a one-GPU laptop and a two-worker file that names no GPU count: it runs, on CPU, and says so
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    (tmp_path / "c.yaml").write_text("program: [python3, t.py]\nroles: {ps: 1, worker: 2}\n")
    result = CliRunner().invoke(cli, ["plan", str(tmp_path / "c.yaml")])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split()[3] for line in result.output.splitlines()[1:4]}
    assert rows == {"ps:0": "-", "worker:0": "-", "worker:1": "-"}
    last = result.output.splitlines()[-1]
    assert last.startswith(
        "GPUs: 0 on localhost (nvidia-smi -L (2 found), 1 of them in the inherited"
    )
    assert "1 GPU(s) for 2 worker tasks, one each would not go round, so they run on CPU" in last
    assert "set placement.gpus_per_worker" in last


def test_too_few_detected_gpus_for_a_count_the_file_asks_is_a_plan_error(smi_path, tmp_path):
    # gpus_per_worker written in the file is a demand: found GPUs that cannot meet it fail
    (tmp_path / "c.yaml").write_text(
        "program: [python3, t.py]\nroles: {ps: 1, worker: 2}\nplacement: {gpus_per_worker: 2}\n"
    )
    result = CliRunner().invoke(cli, ["plan", str(tmp_path / "c.yaml")])
    assert result.exit_code == 2
    assert (
        "has 2 GPU(s) (nvidia-smi -L (2 found)) but its 2 worker task(s) at 2 each" in result.output
    )
    assert "placement.gpus_per_worker (0: run on CPU)" in result.output


@pytest.mark.slow
def test_local_run_without_gpus_key_gives_each_worker_its_own_detected_gpu(smi_path, tmp_path):
    cluster = fake_cluster(tmp_path)
    result = tflaunch("up", str(cluster), env={"PATH": smi_path})
    assert result.returncode == 0, result.stderr
    assert "ps:0 CUDA_VISIBLE_DEVICES=''" in result.stdout
    assert "worker:0 CUDA_VISIBLE_DEVICES='0'" in result.stdout
    assert "worker:1 CUDA_VISIBLE_DEVICES='1'" in result.stdout


@pytest.mark.slow
def test_local_run_with_one_detected_gpu_for_two_workers_runs_them_on_cpu(smi_path, tmp_path):
    cluster = fake_cluster(tmp_path)
    result = tflaunch("up", str(cluster), env={"PATH": smi_path, "CUDA_VISIBLE_DEVICES": "0"})
    assert result.returncode == 0, result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith("[tflaunch] localhost: nvidia-smi -L (2 found), 1 of them in the ")
    assert "so they run on CPU" in first
    for task in ("ps:0", "worker:0", "worker:1"):
        assert f"{task} CUDA_VISIBLE_DEVICES=''" in result.stdout


SSH_HOSTS = """\
backend: ssh
program: [python3, t.py]
roles: {ps: 1, worker: 2}
placement: {workers_per_host: 1}
hosts:
  - {name: a, address: 10.0.0.1}
  - {name: b, address: 10.0.0.2, gpus: 0}
"""


def _reports(**gpus):
    from tflaunch.launchers.ssh.preflight import HostReport

    return [HostReport(h, h, h, {"gpus": n}, []) for h, n in gpus.items()]


def test_ssh_hosts_without_gpus_in_the_file_get_what_pre_flight_found():
    from tflaunch.cluster.placement import make_plan
    from tflaunch.launchers.ssh.gpus import adopt_found_gpus
    from tflaunch.launchers.ssh.sources import resolve_hosts

    config = parse_config(SSH_HOSTS)
    plan = make_plan(config, resolve_hosts(config))
    adopted, notes = adopt_found_gpus(config, plan, _reports(a=2, b=4))
    assert {t.name: t.gpus for t in adopted.tasks} == {
        "ps:0": (),
        "worker:0": ("0", "1"),  # the only worker on a: all its GPUs
        "worker:1": (),  # b has gpus: 0 in the file, whatever nvidia-smi says
    }
    assert notes == [
        "a: using the 2 GPU(s) nvidia-smi lists there (pre-flight); the cluster file gives "
        "the host none (gpus: 0 keeps it on CPU)"
    ]
    assert adopt_found_gpus(config, plan, _reports(a=0, b=4)) == (plan, [])


def test_pre_flight_gpus_that_do_not_fit_are_a_launch_error():
    from tflaunch.cluster.placement import make_plan
    from tflaunch.errors import LaunchError
    from tflaunch.launchers.ssh.gpus import adopt_found_gpus
    from tflaunch.launchers.ssh.sources import resolve_hosts

    config = parse_config(SSH_HOSTS.replace("workers_per_host: 1", "gpus_per_worker: 3"))
    plan = make_plan(config, resolve_hosts(config))
    with pytest.raises(LaunchError, match="pre-flight found GPUs on hosts the cluster file"):
        adopt_found_gpus(config, plan, _reports(a=2, b=0))


def test_pre_flight_gpus_too_few_for_a_hosts_workers_leave_them_on_cpu():
    from tflaunch.cluster.placement import make_plan
    from tflaunch.launchers.ssh.gpus import adopt_found_gpus
    from tflaunch.launchers.ssh.sources import resolve_hosts

    config = parse_config(SSH_HOSTS.replace("workers_per_host: 1", "workers_per_host: 2"))
    plan = make_plan(config, resolve_hosts(config))
    adopted, notes = adopt_found_gpus(config, plan, _reports(a=1, b=0))
    assert {t.name: t.gpus for t in adopted.tasks} == {"ps:0": (), "worker:0": (), "worker:1": ()}
    assert notes == [
        "a: pre-flight: nvidia-smi lists 1: 1 GPU(s) for 2 worker tasks, one each would not go "
        "round, so they run on CPU; to use the GPUs, lower placement.workers_per_host or the "
        "workers, or set placement.gpus_per_worker"
    ]
