"""``tflaunch tune``'s calibration probe: every task of the cluster file's own plan runs this in
place of the program, so that calibration is bound exactly as the real run binds its tasks
(same hosts, same ``placement.cpus_per_task`` cores), yet each worker computes alone.

    python -m tflaunch.models.tune_probe --job {job_name} --index {task_index} --port {port} \
        --chief 0|1 --run N [--variables] -- PROGRAM ARGV...

* A PS (or any task outside the training tasks) listens on its port, so that the agent sees it
  ready and starts the workers, and waits until it is stopped: it holds its cores' slot and
  computes nothing.
* The first N training tasks (the chief, then the workers) run the program as a lone process:
  without TF_CONFIG, ``$TFLAUNCH_CLUSTER_FILE``, ``$TFLAUNCH_TASK`` and the TF1 cluster flags,
  so ``tflaunch.models.benchmark`` trains as one process (no PS, no peers). N = 1: a lone worker;
  N = W: W lone workers at once, the contention input of the performance model.
* The other training tasks exit 0 at once.

* ``--report``: every task runs the program as the cluster file has it (TF_CONFIG and flags
  kept): ``tune --verify``'s runs of a setting, whose figures come back as below.

Every task first prints ``tune-probe: {"task": ..., "cores": C, "cpus": [...], "host": H,
"kernel": boot id, "host_cores": N}``: the cores it may use, those its host lets tasks use (its
agent's), and the machine it is on. A training task that ran the program (``tflaunch.models.
benchmark``) prints ``tune-result: {"images_per_sec": {...}, "step_times": [...]}``: the
benchmark's own ``--result_json`` document (the figures and the timed steps), read back from a
file of the task's host and relayed on the one channel every backend brings back, the task's
output. With ``--variables``, the first training task's result also has ``"variables": [[name,
shape, dtype size], ...]``: the benchmark's ``--result_variables`` (the model built once more in
a graph in the benchmark's own process, nothing computed), so that the launcher needs no
TensorFlow, and no process of its own, to size the model's variables.
``--print-variables MODEL:CLASSES`` alone prints ``tune-variables: [[name, shape, dtype size],
...]`` and nothing else (tune's path where no benchmark ran: a traced program).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

PROBE_PREFIX = "tune-probe: "
VARIABLES_PREFIX = "tune-variables: "
RESULT_PREFIX = "tune-result: "
CLUSTER_ENV = ("TF_CONFIG", "TFLAUNCH_CLUSTER_FILE", "TFLAUNCH_TASK")
# Flags of models.cluster.add_cluster_flags: each takes a value.
CLUSTER_FLAGS = (
    "--job_name",
    "--task_index",
    "--ps_hosts",
    "--worker_hosts",
    "--chief_hosts",
    "--cluster_file",
)
TRAINING_JOBS = ("chief", "worker")


def lone_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` without the TF1 cluster flags (``--flag value`` and ``--flag=value``)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in CLUSTER_FLAGS:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def rank(job: str, index: int, chief: int) -> int | None:
    """The training rank (chief first), or None for a task that does not train."""
    if job == "chief":
        return index
    if job == "worker":
        return chief + index
    return None


def hold_port(port: int) -> None:
    """Listen on ``port`` and accept (and close) connections until SIGTERM."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", port))
        sock.listen(64)
        sock.settimeout(0.5)
        while not stop:
            try:
                conn, _ = sock.accept()
                conn.close()
            except TimeoutError:
                continue
            except OSError:
                time.sleep(0.1)


def where(task: str) -> dict:
    """What this task runs on: its cores, its host, and its kernel (tasks in network namespaces
    or containers of one machine share the kernel's boot id, and so its cores)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            kernel = f.read().strip()
    except OSError:
        kernel = socket.gethostname()
    cpus = sorted(os.sched_getaffinity(0))
    try:  # the agent that started this task: the cores its host lets tasks use
        host_cores = len(os.sched_getaffinity(os.getppid()))
    except OSError:
        host_cores = os.cpu_count() or len(cpus)
    return {
        "task": task,
        "cores": len(cpus),
        "cpus": cpus,
        "host": socket.gethostname(),
        "kernel": kernel,
        "host_cores": host_cores,
    }


def run_reporting(
    argv: Sequence[str], env: dict[str, str] | None = None, variables: bool = False
) -> int:
    """Run the benchmark with ``--result_json`` to a file of this host and print its figures
    and timed steps (and with ``variables``, the model's variables) as one ``tune-result:``
    line."""
    fd, path = tempfile.mkstemp(prefix="tune-result-", suffix=".json")
    os.close(fd)
    try:
        extra = ["--result_variables"] if variables else []
        code = subprocess.call([*argv, "--result_json", path, *extra], env=env)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if code == 0 and text:
            document = json.loads(text)
            result = {
                "images_per_sec": document["images_per_sec"],
                "step_times": document["timing"]["step_times"],
            }
            if variables:
                result["variables"] = document["variables"]
            print(RESULT_PREFIX + json.dumps(result), flush=True)
        return code
    finally:
        os.unlink(path)


def print_variables(spec_text: str) -> None:
    """The model's trainable variables as the launcher's placement arithmetic wants them."""
    from tflaunch.models.placement import trainable_rows
    from tflaunch.models.registry import get_model_spec

    model, _, classes = spec_text.partition(":")
    spec = get_model_spec(model)
    num_classes = spec.default_num_classes if spec.fixed_num_classes else int(classes or 1001)
    rows = trainable_rows(lambda: spec.build(num_classes, "NHWC"))
    print(VARIABLES_PREFIX + json.dumps(rows), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tflaunch.models.tune_probe")
    p.add_argument("--print-variables", default=None, metavar="MODEL:CLASSES")
    p.add_argument("--job")
    p.add_argument("--index", type=int)
    p.add_argument("--port", type=int)
    p.add_argument("--chief", type=int, default=0, help="1 when the cluster has a chief")
    p.add_argument("--run", type=int, default=1, help="training tasks that run the program")
    p.add_argument("--report", action="store_true", help="every task runs the program as is")
    p.add_argument(
        "--variables", action="store_true", help="the first training task reports the variables"
    )
    p.add_argument("program", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.print_variables:
        print_variables(args.print_variables)
        return 0
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program or args.job is None or args.index is None:
        p.error("give --job, --index and the program after --")
    print(PROBE_PREFIX + json.dumps(where(f"{args.job}:{args.index}")), flush=True)
    r = rank(args.job, args.index, args.chief)
    if args.report:  # a setting's real run: every task as the file has it
        return subprocess.call(program) if r is None else run_reporting(program)
    if r is None:
        hold_port(args.port)
        return 0
    if r >= args.run:
        return 0
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_ENV}
    return run_reporting(lone_argv(program), env=env, variables=r == 0 and args.variables)


if __name__ == "__main__":
    sys.exit(main())
