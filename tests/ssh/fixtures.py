"""What the SSH tests share: the test hosts' session fixture, cluster files for them, and waiting
for their process tables to empty. ``conftest.py`` re-exports the fixtures; tests import the
helpers from here (never from another test module)."""

from __future__ import annotations

import random
import shutil
import sys
import time
from pathlib import Path

import yaml

from tests.helpers import FAKE_TASK, ROOT, checkout_python, tflaunch
from tests.hosts import ssh_hosts

ssh_test_hosts = ssh_hosts.ssh_test_hosts  # the session fixture (skips without root)


def ssh_cluster(
    tmp_path: Path, hosts, name: str = "ssh-test", env: dict | None = None, **overrides
) -> Path:
    """An ssh cluster file for the test hosts: fake task uploaded into a fresh workdir."""
    known = tmp_path / "known_hosts"
    if not known.exists():
        shutil.copy(hosts.known_hosts, known)
    base = random.randint(20000, 32000)  # below the ephemeral range (32768-)
    data = {
        "name": name,
        "backend": "ssh",
        "program": {
            "argv": [sys.executable, "fake_task.py"],
            "workdir": str(tmp_path / "work"),
            "env": {"TEST_MARKER": str(tmp_path), **(env or {})},
        },
        "roles": {"ps": 2, "worker": 3},
        "ports": {"ps": base, "worker": base + 100},
        "supervision": {
            "grace_period": 2,
            "ready_timeout": 60,
            "heartbeat": 1,
            "heartbeat_timeout": 6,
        },
        "runs_dir": str(tmp_path / "runs"),
        "hosts": hosts.cluster_hosts(),
        "ssh": hosts.ssh_section(
            checkout_python(tmp_path),
            tmp_path / "remote",
            known,
            connect_timeout=2,
            upload=[str(FAKE_TASK)],
        ),
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def left_on_hosts(hosts) -> list[str]:
    return [f"{h.name}: {p}" for h in hosts.hosts for p in ssh_hosts.processes_in(h)]


def wait_hosts_clean(hosts, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not left_on_hosts(hosts):
            return []
        time.sleep(0.2)
    return left_on_hosts(hosts)


def tf1_argv(steps: int) -> list[str]:
    """The plain TF1 between-graph program (no tflaunch import), with its cluster flags."""
    program = ROOT / "tests" / "programs" / "tf1_between_graph.py"
    argv = [sys.executable, str(program), "--train_steps", str(steps)]
    for flag in ("job_name", "task_index", "ps_hosts", "worker_hosts"):
        argv += [f"--{flag}", "{" + flag + "}"]
    return argv


def sleeper_cluster(tmp_path: Path, hosts) -> Path:
    """The traced-program tests' two folders (``sleep``, ``tf1``) and, in ``sleep``, a cluster
    file of two workers running ``sleep 1``: a program that is not Python."""
    for folder in ("sleep", "tf1"):
        (tmp_path / folder).mkdir()
    return ssh_cluster(
        tmp_path / "sleep",
        hosts,
        program={"argv": ["sleep", "1"], "workdir": str(tmp_path)},
        roles={"ps": 0, "worker": 2},
        ssh={"upload": []},
    )


def only_run(tmp_path: Path) -> Path:
    (run,) = (tmp_path / "runs").iterdir()
    return run


def cli(tmp_path, *args: str, timeout: float = 120):
    return tflaunch(*args, "--run-dir", str(tmp_path / "runs"), timeout=timeout)


def wait_ended(tmp_path, run_id: str, timeout: float) -> str:
    """``status`` once the detached run ended (each call copies the run back)."""
    deadline = time.monotonic() + timeout
    while True:
        status = cli(tmp_path, "status", run_id)
        first = status.stdout.splitlines()[0]
        ended = "exit code" in first and not any(
            f": {s} " in first for s in ("running", "starting")
        )
        if ended or time.monotonic() > deadline:
            return status.stdout
        time.sleep(2)
