"""What the registries' entry-point scans cost, and what caching them once a process saves.

Two registries scan entry points, both a ``tflaunch.cluster.registry.Registry`` cached once a
process: the backends' (``tflaunch.cluster.backends.BACKENDS``) and the clouds'
(``tflaunch.launchers.clouds.CLOUDS``, which ``status --cloud`` asks once per run directory, ``down`` and ``gc`` once per provider
lookup). Each scan reads every installed package's metadata, so its cost grows with the venv.

Measured in this process, same run, medians of --repeats:

- one uncached scan (``entry_points(group=...)``) against one cached ``providers()`` call;
- ``status --cloud``'s account listing (``listing.accounts``) over --runs run directories that
  each recorded an EC2 account, with the scan uncached (as before) and cached (now).

And, in fresh processes (as a command runs): the backend registry's first call (built-in folders
imported, entry points scanned) and its second (cached).

Usage: python benchmarks/registry_scan.py [--runs 50] [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import entry_points
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FRESH = """
import time
from tflaunch.cluster import backends
a = time.perf_counter(); backends.BACKENDS.specs(); b = time.perf_counter(); backends.BACKENDS.specs()
c = time.perf_counter()
print((b - a) * 1e3, (c - b) * 1e3)
"""


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def make_runs(root: Path, count: int) -> None:
    from tflaunch.launchers.clouds.records import access_part
    from tflaunch.runtime.run import Run

    for i in range(count):
        run = Run.create(root, f"r{i}")
        run.update_meta(run_id=run.id, backend="ssh", state="succeeded")
        access = {"region": f"eu-west-{i % 3}", "profile": None, "endpoint_url": None}
        run.update_part(access_part("ec2"), ec2={**access, "network": f"sg-{i}"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    import tflaunch.launchers.clouds as clouds
    from tflaunch.launchers.clouds import listing

    registry = clouds.CLOUDS
    scan = median_ms(lambda: list(entry_points(group="tflaunch.clouds")), args.repeats)
    registry.specs()
    hit = median_ms(registry.specs, args.repeats)
    print(f"one entry-point scan:           {scan:8.3f} ms")
    print(f"providers(), cached:            {hit:8.3f} ms   ({scan / hit:,.0f}x)")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_runs(root, args.runs)
        registry.specs = registry.scan  # type: ignore[method-assign]  # the bare scan: "before"
        try:
            before = median_ms(lambda: listing.accounts(root, None), args.repeats)
        finally:
            del registry.specs
        after = median_ms(lambda: listing.accounts(root, None), args.repeats)
    print(f"accounts() over {args.runs} runs, scan uncached: {before:8.1f} ms")
    print(
        f"accounts() over {args.runs} runs, scan cached:   {after:8.1f} ms   ({before / after:.1f}x)"
    )

    firsts, seconds = [], []
    for _ in range(max(3, args.repeats // 3)):
        out = subprocess.run(
            [sys.executable, "-c", FRESH],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        ).stdout.split()
        firsts.append(float(out[0]))
        seconds.append(float(out[1]))
    first, second = statistics.median(firsts), statistics.median(seconds)
    print(f"backend registry, fresh process: first call {first:.1f} ms, second {second:.4f} ms")


if __name__ == "__main__":
    main()
