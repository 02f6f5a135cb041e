"""A stand-in task without TensorFlow, for fast tests of supervision.

Reads its role from TF_CONFIG like a real task; without one (``program.tf_config: false``) it
reads the cluster file named by its first argument (``{cluster_file}``) or by
$TFLAUNCH_CLUSTER_FILE, and its role from $TFLAUNCH_TASK. A PS listens on its port (after
PS_DELAY seconds) and serves forever. A worker checks that every PS accepts connections, prints what it sees, runs
WORK_SECONDS (worker i: WORK_SECONDS + i * WORK_STEP; with RESTART_WORK_SECONDS set, that instead
in every run of the task after its first in the run directory; with FINISH_AT_RESTART=N,
FINISH_WORK_SECONDS (default 0.2) in a run whose restart counters add up to N or more), and exits
with FAIL_CODE if its index is FAIL_INDEX (only in its first FAIL_RUNS runs, counted by
$TFLAUNCH_TASK_RESTARTS and $TFLAUNCH_CLUSTER_RESTARTS, which every task prints at its start).
With WRITE_CHECKPOINT=1 a worker writes a file named after it into $TFLAUNCH_CHECKPOINT_DIR
(made if missing) and prints that directory and its own arguments (``{checkpoint_dir}``).
With TOTAL_IMAGES_PER_SEC set, a worker prints tf_cnn_benchmarks' last line, ``total images/sec: N``
(N = that + its index), after 'done' (what ``tflaunch bench`` reads). With RELEASE_FILE set, a worker works until that file exists (at most RELEASE_WAIT
seconds, default 300) instead of WORK_SECONDS: a test ends the work on cue, not on the clock.
SIGUSR1 prints 'got SIGUSR1'. SPAWN_CHILD=1 makes every task start a long-sleeping child of its own;
SPAWN_DAEMON=1 a child in a session of its own that ignores SIGTERM (what escapes a process-group
teardown).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

signal.signal(signal.SIGUSR1, lambda *_: print("got SIGUSR1", flush=True))
if "TF_CONFIG" in os.environ:
    config = json.loads(os.environ["TF_CONFIG"])
    job, index = config["task"]["type"], config["task"]["index"]
else:
    path = sys.argv[1] if len(sys.argv) > 1 else os.environ["TFLAUNCH_CLUSTER_FILE"]
    with open(path) as f:
        config = json.load(f)
    job, _, number = os.environ["TFLAUNCH_TASK"].partition(":")
    index = int(number)
    same = path == os.environ["TFLAUNCH_CLUSTER_FILE"]
    print(f"cluster from file {path} (also $TFLAUNCH_CLUSTER_FILE: {same})", flush=True)
print(f"{job}:{index} CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}", flush=True)
restarts = sum(int(os.environ.get(f"TFLAUNCH_{k}_RESTARTS", "0")) for k in ("TASK", "CLUSTER"))
print(
    f"{job}:{index} restarts: task {os.environ.get('TFLAUNCH_TASK_RESTARTS')} cluster "
    f"{os.environ.get('TFLAUNCH_CLUSTER_RESTARTS')}",
    flush=True,
)
if os.environ.get("SPAWN_CHILD") == "1":
    child = subprocess.Popen(["sleep", "1000"])
    print(f"child pid {child.pid}", flush=True)
if os.environ.get("SPAWN_DAEMON") == "1":  # leaves the task's group and ignores SIGTERM
    ignore_term = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(1000)"
    )
    marker = os.environ.get("TEST_MARKER", "")
    daemon = subprocess.Popen([sys.executable, "-c", ignore_term, marker], start_new_session=True)
    print(f"daemon pid {daemon.pid}", flush=True)

if job == "ps":
    time.sleep(float(os.environ.get("PS_DELAY", "0")))
    host, port = config["cluster"]["ps"][index].rsplit(":", 1)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, int(port)))
    server.listen()
    print("serving", flush=True)
    while True:
        connection, _ = server.accept()
        connection.close()

reachable = []
for address in config["cluster"].get("ps", []):
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        reachable.append(True)
    except OSError:
        reachable.append(False)
print(f"all ps reachable at start: {all(reachable)}", flush=True)
if os.environ.get("WRITE_CHECKPOINT") == "1":
    checkpoints = os.environ["TFLAUNCH_CHECKPOINT_DIR"]
    os.makedirs(checkpoints, exist_ok=True)
    with open(os.path.join(checkpoints, f"{job}-{index}"), "w") as f:
        f.write("saved\n")
    print(f"checkpoint dir {checkpoints} argv {sys.argv[1:]}", flush=True)
work = os.environ.get("WORK_SECONDS", "1")
if "RESTART_WORK_SECONDS" in os.environ:
    # A file, not the restart counters: every run after the task's first in the run directory.
    ran = os.path.join(os.environ["TFLAUNCH_RUN_DIR"], f".fake-task-{job}-{index}-ran")
    if os.path.exists(ran):
        work = os.environ["RESTART_WORK_SECONDS"]
    open(ran, "w").close()
seconds = float(work) + index * float(os.environ.get("WORK_STEP", "0"))
if "FINISH_AT_RESTART" in os.environ and restarts >= int(os.environ["FINISH_AT_RESTART"]):
    seconds = float(os.environ.get("FINISH_WORK_SECONDS", "0.2"))
if "RELEASE_FILE" in os.environ:  # work until the test says so, however slow the machine
    deadline = time.monotonic() + float(os.environ.get("RELEASE_WAIT", "300"))
    while not os.path.exists(os.environ["RELEASE_FILE"]) and time.monotonic() < deadline:
        time.sleep(0.1)
else:
    time.sleep(seconds)
print("done", flush=True)
if "TOTAL_IMAGES_PER_SEC" in os.environ:
    print(f"total images/sec: {float(os.environ['TOTAL_IMAGES_PER_SEC']) + index:.2f}", flush=True)
failing = str(index) == os.environ.get("FAIL_INDEX") and job == "worker"
if failing and restarts < int(os.environ.get("FAIL_RUNS", "1000000")):
    sys.exit(int(os.environ.get("FAIL_CODE", "3")))
if job == "worker" and os.environ.get("HANG_INDEX") == str(index):
    time.sleep(1000)
