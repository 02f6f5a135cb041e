"""What each task of a local cluster sees on a machine with real NVIDIA GPUs.

    python scripts/gpu_check.py            # needs nvidia-smi, and torch or tensorflow

CI has no GPU, so the tests of GPU placement use a stand-in ``nvidia-smi``; this script is the
check on real cards. It runs ``tflaunch up`` on small local clusters whose files name no GPU
count, so the local backend finds the GPUs itself (``nvidia-smi -L``, within an inherited
``CUDA_VISIBLE_DEVICES``), and each task reports the ``CUDA_VISIBLE_DEVICES`` it got and the
devices its framework then sees (count and UUIDs). It checks that PS see no GPU, that workers
given GPUs see exactly those and no two workers the same, that a machine with fewer GPUs than
workers runs them on CPU and says so, and that a count the file demands and cannot get is an
error (exit 2). Prints one line per task and scenario; exits 1 if a check fails.

The same file is the task program (``--task``): a PS listens on its port (readiness) until
stopped, a worker reports and exits.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPORT = "gpu-check:"


def task() -> None:
    config = json.loads(os.environ["TF_CONFIG"])
    job, index = config["task"]["type"], config["task"]["index"]
    seen = _devices()
    print(
        REPORT,
        json.dumps(
            {"task": f"{job}:{index}", "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), **seen}
        ),
        flush=True,
    )
    if job == "ps":
        port = int(config["cluster"]["ps"][index].rsplit(":", 1)[1])
        server = socket.create_server(("0.0.0.0", port))
        while True:
            server.accept()[0].close()


def _devices() -> dict:
    try:
        import torch

        n = torch.cuda.device_count()
        uuids = [str(torch.cuda.get_device_properties(i).uuid) for i in range(n)]
        return {"framework": f"torch {torch.__version__}", "count": n, "uuids": uuids}
    except ImportError:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        return {"framework": f"tensorflow {tf.__version__}", "count": len(gpus), "uuids": []}


def up(
    workdir: Path, roles: str, extra: str = "", env: dict | None = None
) -> tuple[int, str, dict]:
    cluster = workdir / "c.yaml"
    cluster.write_text(
        f"program: [{sys.executable}, {Path(__file__).resolve()}, --task]\n"
        f"roles: {roles}\n{extra}runs_dir: {workdir / 'runs'}\n"
    )
    env = {**os.environ, **(env or {})}
    done = subprocess.run(
        [sys.executable, "-m", "tflaunch", "up", str(cluster)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    reports = {}
    for line in done.stdout.splitlines():
        if REPORT in line:
            seen = json.loads(line.split(REPORT, 1)[1])
            reports[seen["task"]] = seen
    return done.returncode, done.stdout + done.stderr, reports


def main() -> int:
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True)
    gpus = [line for line in listed.stdout.splitlines() if line.startswith("GPU ")]
    print(f"nvidia-smi -L: {len(gpus)} GPU(s)")
    for line in gpus:
        print("  " + line)
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    failures = []

    def check(what: str, ok: bool) -> None:
        print(f"  {'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failures.append(what)

    n = len(gpus)
    with tempfile.TemporaryDirectory() as tmp:
        scenarios = [
            (f"{n} worker(s), 1 PS, all GPUs found", f"{{ps: 1, worker: {n}}}", "", {}),
            ("1 worker, 1 PS: the worker gets every GPU", "{ps: 1, worker: 1}", "", {}),
            (
                "2 workers, an inherited CUDA_VISIBLE_DEVICES of one GPU: both on CPU, said so",
                "{ps: 1, worker: 2}", "", {"CUDA_VISIBLE_DEVICES": "0"},
            ),
        ]  # fmt: skip
        for i, (title, roles, extra, env) in enumerate(scenarios):
            work = Path(tmp) / f"s{i}"
            work.mkdir()
            started = time.monotonic()
            code, out, seen = up(work, roles, extra, env)
            print(f"\n{title}: exit {code} in {time.monotonic() - started:.1f} s")
            for name, report in sorted(seen.items()):
                print(f"  {name}: CUDA_VISIBLE_DEVICES={report['cvd']!r} -> {report['framework']} "
                      f"sees {report['count']} {report['uuids']}")  # fmt: skip
            check("exit 0", code == 0)
            workers = {k: v for k, v in seen.items() if not k.startswith("ps")}
            check(
                "every PS sees no GPU",
                all(
                    v["count"] == 0 and v["cvd"] == ""
                    for k, v in seen.items()
                    if k.startswith("ps")
                ),
            )
            if i == 0:
                check(
                    f"each of {n} workers sees exactly 1 GPU",
                    all(v["count"] == 1 for v in workers.values()) and len(workers) == n,
                )
                check(
                    "no two workers see the same GPU",
                    len({u for v in workers.values() for u in v["uuids"]}) == n,
                )
            elif i == 1:
                check(f"the worker sees all {n}", [v["count"] for v in workers.values()] == [n])
            else:
                check("both workers on CPU", [v["count"] for v in workers.values()] == [0, 0])
                notice = [line for line in out.splitlines() if "so they run on CPU" in line]
                check("up says why", bool(notice))
                print("  " + (notice[0] if notice else out[-500:]))
        work = Path(tmp) / "demand"
        work.mkdir()
        code, out, _ = up(work, f"{{ps: 1, worker: {n + 1}}}", "placement: {gpus_per_worker: 1}\n")
        print(f"\n{n + 1} workers with gpus_per_worker: 1 written in the file: exit {code}")
        print("  " + " ".join(out.split())[:300])
        check("exit 2, naming the count found", code == 2 and "nvidia-smi -L" in out)
    print(f"\n{len(failures)} check(s) failed" if failures else "\nall checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--task"]:
        task()
    else:
        sys.exit(main())
