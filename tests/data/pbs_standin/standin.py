"""Stand-ins for PBS's qsub, qstat, qdel and pbsdsh: a one-machine PBS whose jobs really run.

A job's state lives in ``$PBS_STANDIN_SPOOL/<n>/``. ``qsub`` copies the script there and starts a
runner in a session of its own, as a MOM would: it runs the script under bash with PBS's
variables (``PBS_JOBID``, ``PBS_NODEFILE`` listing ``$PBS_STANDIN_NODES``, default this machine's
name), output to ``#PBS -o``, then ends whatever of the job's process group is left (SIGTERM, 5 s,
SIGKILL) and records ``Exit_status`` (256 + N for a signal N; 271 after ``qdel``). ``qdel``
sends SIGTERM to the job's process group. ``pbsdsh`` runs its command once per node of the node
file, with ``PBS_VNODENUM``. ``qsub`` refuses queues other than ``workq`` and ``batch``, as PBS
refuses unknown ones. Walltimes are not enforced. Standard library only.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

KILL_DELAY = 5.0
QUEUES = ("workq", "batch")


def spool() -> Path:
    return Path(os.environ["PBS_STANDIN_SPOOL"])


def put(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def get(job: Path, name: str, default: str = "") -> str:
    try:
        return (job / name).read_text()
    except FileNotFoundError:
        return default


def job_dir(job_id: str) -> Path | None:
    number = job_id.split(".")[0]
    job = spool() / number
    return job if number.isdigit() and (job / "state").exists() else None


def qsub(argv: list[str]) -> int:
    script = Path(argv[-1])
    text = script.read_text()
    options = re.findall(r"^#PBS\s+(-\w)\s+(\S+)", text, re.M)
    queue = next((v for k, v in options if k == "-q"), "workq")
    if queue not in QUEUES:
        print(f"qsub: Unknown queue MSG=requested queue not found: {queue}", file=sys.stderr)
        return 1
    resources = ",".join(v for k, v in options if k == "-l")
    count = int((re.search(r"nodes=(\d+)", resources) or [0, "1"])[1])
    names = os.environ.get("PBS_STANDIN_NODES", socket.gethostname()).split()
    if count > len(names):
        print(f"qsub: Job exceeds queue resource limits (nodes={count})", file=sys.stderr)
        return 1
    root = spool()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "counter.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        number = 1 + int(get(root, "counter", "0") or 0)
        put(root / "counter", str(number))
    job = root / str(number)
    job.mkdir()
    put(job / "script", text)
    put(job / "nodefile", "".join(f"{n}\n" for n in names[:count]))
    put(job / "output", next((v for k, v in options if k == "-o"), str(job / "out")))
    put(job / "workdir", os.getcwd())
    put(job / "state", "Q")
    subprocess.Popen(
        [sys.executable, __file__, "run", str(job)],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    print(f"{number}.standin")
    return 0


def group_left(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            left.append(int(stat.parent.name))
    return left


def run(job: Path) -> None:
    job_id = f"{job.name}.standin"
    env = {**os.environ, "PBS_JOBID": job_id, "PBS_NODEFILE": str(job / "nodefile")}
    env["PBS_O_WORKDIR"] = get(job, "workdir")
    with open(get(job, "output"), "a") as out:
        proc = subprocess.Popen(
            ["bash", str(job / "script")],
            cwd=env["PBS_O_WORKDIR"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    put(job / "pgid", str(proc.pid))
    put(job / "state", "R")
    code = proc.wait()
    deadline = None
    while group_left(proc.pid):  # what the script left: the MOM ends the job's processes
        if deadline is None:
            deadline = time.monotonic() + KILL_DELAY
            if not (job / "deleted").exists():
                os.killpg(proc.pid, signal.SIGTERM)
        elif time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(0.1)
    status = 271 if (job / "deleted").exists() else 256 - code if code < 0 else code
    put(job / "exit", str(status))
    put(job / "state", "F")


def qstat(argv: list[str]) -> int:
    job = job_dir(argv[-1])
    if job is None:
        print(f"qstat: Unknown Job Id {argv[-1]}", file=sys.stderr)
        return 153
    state = get(job, "state")
    names = get(job, "nodefile").split()
    lines = [f"Job Id: {job.name}.standin", f"    job_state = {state}"]
    lines += [f"    exec_host = {'+'.join(n + '/0' for n in names)}"] if state != "Q" else []
    lines += [f"    Exit_status = {get(job, 'exit')}"] if state == "F" else []
    print("\n".join(lines))
    return 0


def qdel(argv: list[str]) -> int:
    job = job_dir(argv[-1])
    if job is None or get(job, "state") == "F":
        print(f"qdel: Unknown Job Id {argv[-1]}", file=sys.stderr)
        return 153
    put(job / "deleted", str(time.time()))
    pgid = get(job, "pgid")
    if pgid:
        try:
            os.killpg(int(pgid), signal.SIGTERM)
        except ProcessLookupError:
            pass
    return 0


def pbsdsh(argv: list[str]) -> int:
    command = [a for a in argv if a != "-u"]
    nodes = list(dict.fromkeys(Path(os.environ["PBS_NODEFILE"]).read_text().split()))
    procs = [
        subprocess.Popen(command, env={**os.environ, "PBS_VNODENUM": str(i), "PBS_TASKNUM": str(i)})
        for i in range(len(nodes))
    ]
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    what, args = sys.argv[1], sys.argv[2:]
    if what == "run":
        run(Path(args[0]))
    else:
        sys.exit({"qsub": qsub, "qstat": qstat, "qdel": qdel, "pbsdsh": pbsdsh}[what](args))
