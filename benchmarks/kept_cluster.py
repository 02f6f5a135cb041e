"""Seconds of ``tflaunch up --keep`` that makes a cluster, next to one that reuses it.

EC2 is moto's server (the stand-in the tests use); the instances it "creates" are mapped onto the
SSH namespace test hosts (tests/hosts/ssh_hosts.py; needs root) by the test-only address map, so
what is timed is tflaunch's own work: for the first ``up``, creating the security group and
instances, waiting for them to run and accept SSH, syncing ``ssh.sync`` and running the setup
lines; for the second, finding the kept instances, syncing nothing (one file changed) and skipping
setup (``setup_once``). Real EC2 adds about a minute of instance start and SSH wait to the first
only. The setup line stands for installing requirements (``--setup-seconds``, default 3).

Each repeat: ``down --cluster``, then a making ``up --keep`` and a reusing ``up --keep`` of a
one-instance cluster whose program is the stand-in task (tests/programs/fake_task.py). Medians
over ``--repeats``. Usage (as root)::

    python benchmarks/kept_cluster.py [--repeats 3] [--setup-seconds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.cloud.fixtures import kept_cluster  # noqa: E402
from tests.hosts import ssh_hosts  # noqa: E402


def tflaunch(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "tflaunch", *args], capture_output=True, text=True, timeout=300
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"tflaunch {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return seconds, done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--setup-seconds", type=float, default=3.0)
    args = parser.parse_args()
    problem = ssh_hosts.missing_requirements()
    if problem:
        print(f"cannot run: {problem}", file=sys.stderr)
        return 2
    from moto.server import ThreadedMotoServer

    os.environ.update(
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
        AWS_EC2_METADATA_DISABLED="true", PYTHONPATH=str(ROOT),
    )  # fmt: skip
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = "http://{}:{}".format(*server.get_host_and_port())
    work = Path(tempfile.mkdtemp(prefix="kept-bench-"))
    making, reusing = [], []
    try:
        with ssh_hosts.session(3) as hosts:  # no test session tears them down meanwhile
            # moto's instances are mapped onto the test hosts (cloud_cluster sets the map)
            cluster = kept_cluster(work, hosts, endpoint, pytest.MonkeyPatch(), args.setup_seconds)
            runs = str(work / "runs")
            for repeat in range(args.repeats):
                # A new instance's disk is empty; the test host standing in keeps its files.
                shutil.rmtree(work / "work", ignore_errors=True)
                first, made = tflaunch("up", str(cluster), "--keep")
                assert "creating 1 instance(s)" in made.stderr, made.stderr
                (work / "src" / "notes.txt").write_text(f"{repeat + 1}\n")
                second, reused = tflaunch("up", str(cluster), "--keep")
                assert "none created" in reused.stderr, reused.stderr
                assert "instances accepting SSH" not in reused.stderr
                tflaunch("down", "--cluster", "cloud-test", "--run-dir", runs)
                making.append(first)
                reusing.append(second)
                print(f"repeat {repeat + 1}: making {first:.2f} s, reusing {second:.2f} s")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    make, reuse = statistics.median(making), statistics.median(reusing)
    print(
        f"up --keep, medians of {args.repeats} (setup line {args.setup_seconds:g} s): making the "
        f"cluster {make:.2f} s, reusing it {reuse:.2f} s ({reuse / make:.2f} of the first)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
