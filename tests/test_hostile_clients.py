"""Hostile clients against the real detached-SSH coordinator process (the Slurm job's coordinator
uses the same listener, tests/test_rendezvous.py), with a real agent joining at the same time:
each client is refused, the agent joins and the run succeeds."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.helpers import fake_cluster, wait_until_gone
from tflaunch.cluster.config import load_config
from tflaunch.launch import plan_cluster
from tflaunch.runtime.rendezvous import Rendezvous, publish, read_published
from tflaunch.runtime.run import Run

ON_HOST = "tflaunch.launchers.ssh.on_host"


def _send(port: int, payload: bytes, pause: float = 0.0) -> None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            for i in range(0, len(payload), 1 if pause else len(payload) or 1):
                sock.sendall(payload[i : i + (1 if pause else len(payload))])
                time.sleep(pause)
            time.sleep(1)
    except OSError:
        pass  # cut off by the coordinator: the point


@pytest.mark.slow
def test_detached_coordinator_refuses_hostile_clients_while_the_agent_joins(tmp_path):
    config = load_config(fake_cluster(tmp_path, env={"WORK_SECONDS": "1"}))
    plan = plan_cluster(config)
    run = Run.create(tmp_path / "runs", "hostile")
    run.write_plan(plan)
    publish(run.dir, Rendezvous.ahead())  # what the launcher hands every host
    coordinator = subprocess.Popen(
        [
            sys.executable,
            "-m",
            ON_HOST,
            "coordinate",
            "--run-dir",
            str(run.dir),
            "--run-id",
            run.id,
            "--listen",
            "127.0.0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not read_published(run.dir).port and time.monotonic() < deadline:
            time.sleep(0.1)
        port = read_published(run.dir).port
        hostile = [
            json.dumps({"hello": "localhost", "token": "é"}).encode() + b"\n",
            b"[]\n",
            b"42\n",
            b"x" * (1 << 20),
            json.dumps({"hello": "localhost", "token": "0" * 32}).encode() + b"\n",
        ]
        threads = [threading.Thread(target=_send, args=(port, p)) for p in hostile]
        threads.append(threading.Thread(target=_send, args=(port, b'{"hello": "local', 0.5)))
        for thread in threads:
            thread.start()
        time.sleep(0.5)  # the hostile clients are connected when the agent comes
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                ON_HOST,
                "agent",
                "--run-dir",
                str(run.dir),
                "--host",
                "localhost",
                "--address",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        output, _ = coordinator.communicate(timeout=90)
        agent.wait(timeout=30)
    finally:
        coordinator.kill()
    assert coordinator.returncode == 0, output
    record = run.record()
    assert record.state == "succeeded", record
    assert "succeeded: 3 tasks" in output
    assert wait_until_gone(str(tmp_path), timeout=10) == []
