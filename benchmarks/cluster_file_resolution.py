"""What a program pays to find its place in a 4,096-node x 8-GPU cluster through a cluster file.

Writes a tflaunch cluster file of 4,096 x 8 workers and 512 PS (33,280 tasks) to a temporary
folder, then, as task worker:32767 ($TFLAUNCH_TASK), times:

1. ``tflaunch.models.cluster.resolve_cluster`` (read and check the file; no TensorFlow), the mean of
   10 runs;
2. with ``--tf``, ``ClusterFileResolver()`` plus ``cluster_spec()`` and ``master()``: what a TF2
   strategy asks of it.

It also prints the file's size and the size TF_CONFIG would have (Linux refuses a single
environment string over 128 KiB), and the process's peak RSS.

    python benchmarks/cluster_file_resolution.py [--tf]
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tflaunch.models.cluster import resolve_cluster  # noqa: E402

NODES, GPUS, PS_EVERY = 4096, 8, 8
TASK = "worker:32767"


def cluster() -> dict[str, list[str]]:
    hosts = [f"node{n:04d}.cluster.example" for n in range(NODES)]
    return {
        "ps": [f"{host}:2230" for host in hosts[::PS_EVERY]],
        "worker": [f"{host}:{2220 + gpu}" for host in hosts for gpu in range(GPUS)],
    }


def main() -> None:
    spec = cluster()
    tasks = sum(len(hosts) for hosts in spec.values())
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "cluster.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"cluster": spec}, f)
        job, index = TASK.split(":")
        tf_config = json.dumps({"cluster": spec, "task": {"type": job, "index": int(index)}})
        print(
            f"{tasks} tasks; cluster file {os.path.getsize(path) / 1024:.0f} KiB; "
            f"TF_CONFIG would be {len(tf_config) / 1024:.0f} KiB (limit 128 KiB)"
        )
        environ = {"TFLAUNCH_CLUSTER_FILE": path, "TFLAUNCH_TASK": TASK}
        start = time.perf_counter()
        for _ in range(10):
            info = resolve_cluster(environ=environ)
        print(f"resolve_cluster: {(time.perf_counter() - start) * 100:.1f} ms (rank {info.rank})")
        if "--tf" in sys.argv[1:]:
            os.environ.update(environ)
            from tflaunch.models.cluster_file_resolver import ClusterFileResolver

            start = time.perf_counter()
            resolver = ClusterFileResolver()
            workers = resolver.cluster_spec().num_tasks("worker")
            master = resolver.master(rpc_layer="grpc")
            elapsed = (time.perf_counter() - start) * 1000
            print(f"ClusterFileResolver + cluster_spec() + master(): {elapsed:.0f} ms ", end="")
            print(f"({workers} workers; {master})")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MB" + (" (TensorFlow imported)" if "--tf" in sys.argv else ""))


if __name__ == "__main__":
    main()
