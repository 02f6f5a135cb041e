"""Readiness is the task's own: a PS is ready when its process (or a child) listens on its port,
not when anything answers there (real processes, local backend, stand-in tasks)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import psutil
import yaml

from tests.helpers import fake_cluster, read_until, start_tflaunch, wait_until_gone
from tflaunch.runtime import procs


def test_tree_listens_sees_a_child_listener_and_not_a_foreign_one():
    with socket.socket() as foreign:
        foreign.bind(("127.0.0.1", 0))
        foreign.listen()
        port = foreign.getsockname()[1]
        parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert not procs.tree_listens(parent.pid, port)
            assert f"pid {psutil.Process().pid} ({psutil.Process().name()})" in procs.listeners(
                port
            )
        finally:
            parent.kill()
            parent.wait()
    serve = (
        "import socket, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import socket, time; s = socket.socket(); "
        's.bind(("127.0.0.1", 0)); s.listen(); print(s.getsockname()[1], flush=True); '
        "time.sleep(30)'])\n"
        "child.wait()\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", serve], stdout=subprocess.PIPE, text=True)
    try:
        port = int(parent.stdout.readline())
        assert procs.tree_listens(parent.pid, port)  # the listener is the task's child
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()


def test_foreign_listener_on_the_ps_port_between_check_and_bind_fails_naming_the_port(tmp_path):
    # The PS waits 3 s before it binds: the busy-port check has passed, the port is free, and
    # this test takes it as soon as the PS has started.
    cluster = fake_cluster(tmp_path, env={"PS_DELAY": "3"})
    port = yaml.safe_load(cluster.read_text())["ports"]["ps"]
    proc = start_tflaunch("up", str(cluster))
    with socket.socket() as foreign:
        try:
            read_until(proc.stdout, "[ps:0]", timeout=30)
            foreign.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            foreign.bind(("127.0.0.1", port))
            foreign.listen()
            taken = time.monotonic()
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode != 0
    assert time.monotonic() - taken < 20
    assert f"ps:0: port {port} on localhost answers, but not from ps:0" in err, err
    assert "pid " in err and "took it after the busy-port check" in err
    assert "cluster ready" not in out + err
    (run,) = (tmp_path / "runs").iterdir()
    evs = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert not [e for e in evs if e["event"] in ("ready", "cluster_ready")]
    assert not [e for e in evs if e["event"] == "started" and e["task"].startswith("worker")]
    assert wait_until_gone(str(cluster.parent)) == []
