"""The many-core lab: 16+ namespace hosts with cores of their own, links shaped to 1 and 10 Gb/s,
ours against tf_cnn_benchmarks in the same synchronous (or asynchronous) mode.

    sudo python benchmarks/manycore_lab.py --peer DIR/tf_cnn_benchmarks [--tools DIR]
        [--results benchmarks/results/manycore_lab.json] [--budget 540] [--grid headline]
        [--repeats 2] [--only KEY-SUBSTRING,...] [--phase calibrate|sweep|all|report]

Every host is a network namespace held by a sleeping process (``os.unshare``; no ``ip netns``
needed), joined to one bridge by a veth pair with ``tbf`` at both ends (as
``tests/hosts/ssh_hosts.py shape`` does: every host an R NIC, full duplex), and owns
``cores // hosts`` cores: each task is started in its host's namespace (``os.setns``) bound to
them (``sched_setaffinity``), with ``--num_intra_threads`` as many. PS tasks get hosts of their
own. ``ip`` and ``tc`` come from ``--tools`` (carried binaries and their libraries) or PATH.

calibrate (once per results file): a lone worker per model (compute per step on one host's
cores); ``tflaunch.models.netbench`` between two hosts unshaped (one gRPC stream's CPU-bound
rate, and a PS loaded by 4 workers: the PS's capacity beyond one stream) and at each rate (the
link); stored under "calibration".
sweep: the grid's points not yet measured ``--repeats`` times, in order, each a fresh cluster
(PS, workers; ``--peer``'s ``tf_cnn_benchmarks.py`` for the peer's rows), until ``--budget``
seconds are spent: a later call goes on where this one stopped. Every run is appended to the
results file as it ends (img/s: worker 0's ``total images/sec``, or the peer's error line).
report: the table per (model, rate, mode), with ``tflaunch model``'s prediction.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.manycore_report import CAR, DAR, DR, PS, report  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "manycore_lab.json"
BRIDGE = "mclab0"
SUBNET = "10.91"
SHAPER_LATENCY = "50ms"  # as tests/hosts/ssh_hosts.py
SEGMENT_BYTES = 65536
PS_PORT, WORKER_PORT, CONTROLLER_PORT = 5000, 5001, 5002


@dataclasses.dataclass(frozen=True)
class Point:
    """One row: who runs (ours or the peer), the cluster and the mode."""

    side: str  # "ours" | "peer"
    model: str
    rate: str
    workers: int
    ps: int
    update: str
    sync: bool
    options: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        mode = "sync" if self.sync else "async"
        opts = " ".join(self.options)
        return (
            f"{self.side} {self.model} {self.rate} W{self.workers} P{self.ps} {self.update} "
            f"{mode}{' ' + opts if opts else ''}"
        )


def headline_grid(ps_count: int = 2) -> list[Point]:
    """The rows the issue asks for first: 16 workers at 1 Gb/s, then 10 Gb/s, InceptionV3, sync
    mode on both sides (our best candidates and the peer's settings), then async, then 8 and
    4 workers, then ResNet-50."""
    rows: list[Point] = []
    for model in ("inception3", "resnet50"):
        for w in (16, 8, 4):
            p = ps_count
            for rate in ("1gbit", "10gbit"):
                rows += [
                    Point("ours", model, rate, w, 0, CAR, True, ("--gradient_repacking=4", "--compact_gradient_transfer")),  # noqa: E501
                    Point("peer", model, rate, w, p, PS, True, ("--staged_vars",)),
                    Point("ours", model, rate, w, p, PS, True, ("--staged_vars", "--variable_placement=lpt")),  # noqa: E501
                    Point("ours", model, rate, w, 0, CAR, True),
                    # its collective_all_reduce stops at once without a spec (ValueError)
                    Point("peer", model, rate, w, 0, CAR, True, ("--all_reduce_spec=collective",)),
                    Point("peer", model, rate, w, p, PS, True),
                    Point("peer", model, rate, w, p, DR, True),
                    Point("peer", model, rate, w, 0, DAR, True, ("--all_reduce_spec=xring",)),
                    Point("peer", model, rate, w, p, DAR, True, ("--all_reduce_spec=pscpu",)),
                    Point("ours", model, rate, w, p, PS, True, ("--variable_placement=lpt",)),
                    Point("ours", model, rate, w, 0, CAR, True, ("--gradient_repacking=4",)),
                    Point("ours", model, rate, w, 0, CAR, True, ("--compact_gradient_transfer",)),
                    Point("peer", model, rate, w, p, PS, False, ("--staged_vars",)),
                    Point("ours", model, rate, w, p, PS, False, ("--staged_vars", "--variable_placement=lpt")),  # noqa: E501
                ]  # fmt: skip
    # each setting at both rates before the next setting: a short call still compares rates
    order = {pt: i for i, pt in enumerate(rows)}
    per_rate = len(rows) // 6 // 2
    return sorted(rows, key=lambda pt: (order[pt] // (2 * per_rate), order[pt] % per_rate, pt.rate))


BUCKETED = ("--all_reduce_bucket_mb=6", "--compact_gradient_transfer")
PACKED = ("--gradient_repacking=4", "--compact_gradient_transfer")


def linklimit_grid(ps_count: int = 2) -> list[Point]:
    """Issue 42's rows, for a lab of 16 cores: 8 workers, then 4, at 1 Gb/s, InceptionV3.
    Synchronous first, ours' all-reduce overlapping the backward pass (6 MB float16 buckets,
    about 8 of InceptionV3's 47.6 MB: the wire's bytes x sqrt(a collective's fixed cost / the
    backward pass), with about 5 ms a collective and 0.43 s of backward pass on one core)
    beside today's packs, then every
    setting of the peer like for like (its collective_all_reduce with a spec, distributed
    all-reduce xring and pscpu, distributed_replicated, parameter_server with and without staged
    variables) and ours' PS, staged and past the barrier (``--per_variable_sync``); then
    asynchronous: PS and distributed_replicated on both sides."""
    rows: list[Point] = []
    model, rate, p = "inception3", "1gbit", ps_count
    for w in (8, 4):
        rows += [
            Point("ours", model, rate, w, 0, CAR, True, BUCKETED),
            Point("ours", model, rate, w, 0, CAR, True, PACKED),
            Point("peer", model, rate, w, 0, CAR, True, ("--all_reduce_spec=collective",)),
            Point("peer", model, rate, w, 0, DAR, True, ("--all_reduce_spec=xring",)),
            Point("peer", model, rate, w, p, DAR, True, ("--all_reduce_spec=pscpu",)),
            Point("peer", model, rate, w, p, PS, True, ("--staged_vars",)),
            Point("ours", model, rate, w, p, PS, True, ("--staged_vars", "--variable_placement=lpt")),  # noqa: E501
            Point("ours", model, rate, w, p, PS, True, ("--per_variable_sync", "--variable_placement=lpt")),  # noqa: E501
            Point("peer", model, rate, w, p, DR, True),
            Point("peer", model, rate, w, p, PS, True),
            Point("ours", model, rate, w, p, PS, True, ("--variable_placement=lpt",)),
            Point("peer", model, rate, w, p, PS, False, ("--staged_vars",)),
            Point("ours", model, rate, w, p, PS, False, ("--staged_vars", "--variable_placement=lpt")),  # noqa: E501
            Point("peer", model, rate, w, p, PS, False),
            Point("ours", model, rate, w, p, PS, False, ("--variable_placement=lpt",)),
            Point("peer", model, rate, w, p, DR, False),
            Point("ours", model, rate, w, 0, CAR, True, ("--all_reduce_bucket_mb=16", "--compact_gradient_transfer")),  # noqa: E501
            Point("ours", model, rate, w, 0, CAR, True),
        ]  # fmt: skip
    return rows


GRIDS = {"headline": headline_grid, "linklimit": linklimit_grid}


# --- hosts -----------------------------------------------------------------------------------

CLONE_NEWNET = 0x40000000
# A namespace's holder: a new network namespace (os.unshare from Python 3.12, libc's before) that
# lives as long as this process sleeps.
HOLDER = (
    "import ctypes, os, time\n"
    "if hasattr(os, 'unshare'): os.unshare(os.CLONE_NEWNET)\n"
    "elif ctypes.CDLL(None, use_errno=True).unshare(0x40000000): raise OSError(ctypes.get_errno(), 'unshare')\n"  # noqa: E501
    "print('in', flush=True)\n"
    "time.sleep(86400)\n"
)


def setns_net(fd: int) -> None:
    """Join the network namespace open at ``fd`` (os.setns from Python 3.12, libc's before)."""
    if hasattr(os, "setns"):
        os.setns(fd, CLONE_NEWNET)
        return
    import ctypes

    if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")


class Lab:
    """Namespace hosts on one bridge, each with its own cores."""

    def __init__(self, count: int, tools: Path | None, per: int | None = None) -> None:
        self.count = count
        self.tools = tools
        cores = sorted(os.sched_getaffinity(0))
        per = per or max(1, len(cores) // count)
        if per * count > len(cores):
            raise SystemExit(
                f"{count} hosts of {per} core(s) need {per * count} cores; {len(cores)} here"
            )
        self.cores = [cores[i * per : (i + 1) * per] or cores for i in range(count)]
        self.holders: list[subprocess.Popen] = []

    def address(self, host: int) -> str:
        return f"{SUBNET}.0.{host + 1}"

    def _tool(self, name: str) -> tuple[list[str], dict]:
        env = dict(os.environ)
        if self.tools:
            env["LD_LIBRARY_PATH"] = str(self.tools / "lib")
            return [str(self.tools / name)], env
        return [name], env

    def run(self, host: int | None, *argv: str, check: bool = True) -> str:
        """``ip``/``tc`` in the root namespace (host None) or a host's."""
        cmd, env = self._tool(argv[0])
        proc = subprocess.run(
            [*cmd, *argv[1:]],
            env=env,
            text=True,
            capture_output=True,
            preexec_fn=None if host is None else self._enter(host, cores=False),
        )
        if check and proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def _enter(self, host: int, cores: bool = True):
        path = f"/proc/{self.holders[host].pid}/ns/net"
        mine = self.cores[host]

        def enter() -> None:
            fd = os.open(path, os.O_RDONLY)
            setns_net(fd)
            os.close(fd)
            if cores:
                os.sched_setaffinity(0, mine)

        return enter

    def setup(self) -> None:
        self.teardown_links()
        self.run(None, "ip", "link", "add", BRIDGE, "type", "bridge")
        self.run(None, "ip", "link", "set", BRIDGE, "up")
        for h in range(self.count):
            holder = subprocess.Popen(
                [sys.executable, "-c", HOLDER],
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            assert holder.stdout is not None and holder.stdout.readline().strip() == "in"
            self.holders.append(holder)
            outer, inner = f"mcl{h}", f"mcl{h}x"
            self.run(None, "ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            self.run(None, "ip", "link", "set", inner, "netns", str(holder.pid))
            self.run(None, "ip", "link", "set", outer, "master", BRIDGE)
            self.run(None, "ip", "link", "set", outer, "up")
            self.run(h, "ip", "link", "set", "lo", "up")
            self.run(h, "ip", "link", "set", inner, "name", "eth0")
            self.run(h, "ip", "addr", "add", f"{self.address(h)}/16", "dev", "eth0")
            self.run(h, "ip", "link", "set", "eth0", "up")
        print(f"lab: {self.count} hosts, {len(self.cores[0])} cores each, on {BRIDGE}", flush=True)

    def shape(self, rate: str | None) -> None:
        """tbf at both ends of every host's link (None: unshaped)."""
        for h in range(self.count):
            for host, dev in ((h, "eth0"), (None, f"mcl{h}")):
                self.run(host, "tc", "qdisc", "del", "dev", dev, "root", check=False)
                if rate is None:
                    continue
                bits = parse_rate(rate)
                burst = min(max(2 * SEGMENT_BYTES, bits // 8 // 1000), 2**31 // 8)
                for limit in ("gso_max_size", "gro_max_size"):
                    self.run(host, "ip", "link", "set", dev, limit, str(SEGMENT_BYTES))
                self.run(
                    host, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                    f"{bits}bit", "burst", str(burst), "latency", SHAPER_LATENCY,
                )  # fmt: skip
        print(f"lab: links {'shaped to ' + rate if rate else 'unshaped'}", flush=True)

    def spawn(self, host: int, argv: list[str], env: dict, log: Path, cwd: Path = ROOT):
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            preexec_fn=self._enter(host),
            start_new_session=True,
        )

    def teardown_links(self) -> None:
        self.run(None, "ip", "link", "del", BRIDGE, check=False)
        for h in range(self.count):
            self.run(None, "ip", "link", "del", f"mcl{h}", check=False)

    def teardown(self) -> None:
        for holder in self.holders:
            holder.kill()
            holder.wait()
        self.holders.clear()
        self.teardown_links()


def parse_rate(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", text.strip().lower())
    if not m:
        raise SystemExit(f"a rate like 1gbit or 500mbit, not {text!r}")
    return int(float(m.group(1)) * {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[m.group(2)])


# --- one cluster run -------------------------------------------------------------------------


def task_env(cores: int) -> dict:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(
            p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p
        ),  # fmt: skip
        PYTHONUNBUFFERED="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        TF_USE_LEGACY_KERAS="1",  # the peer's models import tf.keras layers (Keras 2)
        OMP_NUM_THREADS=str(cores),
    )
    return env


def ours_argv(a, pt: Point, cores: int) -> list[str]:
    argv = [
        sys.executable, "-m", "tflaunch.models.benchmark", "--model", pt.model,
        "--batch_size", str(a.batch), "--num_batches", str(a.steps),
        "--num_warmup_batches", str(a.warmup), "--display_every", str(a.steps),
        "--data_format", "NHWC", "--variable_update", pt.update,
        "--num_intra_threads", str(cores), "--num_inter_threads", "2",
    ]  # fmt: skip
    if pt.sync and pt.update != CAR:
        argv.append("--cross_replica_sync")
    return argv + list(pt.options)


def peer_argv(a, pt: Point, cores: int) -> list[str]:
    return [
        sys.executable, str(a.peer / "tf_cnn_benchmarks.py"), "--model", pt.model,
        "--batch_size", str(a.batch), "--num_batches", str(a.steps),
        "--num_warmup_batches", str(a.warmup), "--display_every", str(a.steps),
        "--data_format", "NHWC", "--device", "cpu", "--local_parameter_device", "cpu",
        "--variable_update", pt.update, f"--cross_replica_sync={pt.sync}",
        "--num_intra_threads", str(cores), "--num_inter_threads", "2", *pt.options,
    ]  # fmt: skip


TOTAL = re.compile(r"^total images/sec: ([\d.]+)", re.M)
ERROR = re.compile(r"^(\w*(Error|Exception)\b.*|.*error: .*)$", re.M)


def run_point(a, lab: Lab, pt: Point, logs: Path) -> dict:
    """One cluster of ``pt``: PS on hosts 0..P-1, workers after them (a controller after those
    for the peer's distributed_all_reduce). Returns the record."""
    cores = len(lab.cores[0])
    ps = [f"{lab.address(h)}:{PS_PORT}" for h in range(pt.ps)]
    workers = [f"{lab.address(pt.ps + i)}:{WORKER_PORT}" for i in range(pt.workers)]
    hosts_needed = pt.ps + pt.workers + (1 if pt.update == DAR else 0)
    if hosts_needed > lab.count:
        return {"error": f"needs {hosts_needed} hosts, the lab has {lab.count}"}
    base = peer_argv(a, pt, cores) if pt.side == "peer" else ours_argv(a, pt, cores)
    flags = ["--ps_hosts", ",".join(ps), "--worker_hosts", ",".join(workers)]
    if pt.update == DAR:
        controller = f"{lab.address(pt.ps + pt.workers)}:{CONTROLLER_PORT}"
        flags += ["--controller_host", controller]
    env = task_env(cores)
    cwd = a.peer if pt.side == "peer" else ROOT
    procs, names = [], []
    tasks = [("ps", i, i) for i in range(pt.ps)]
    tasks += [("worker", i, pt.ps + i) for i in range(pt.workers)]
    if pt.update == DAR:
        tasks.append(("controller", 0, pt.ps + pt.workers))
    tag = re.sub(r"[^A-Za-z0-9]+", "_", pt.key)
    for job, index, host in tasks:
        log = logs / f"{tag}-{job}{index}.log"
        argv = [*base, *flags, "--job_name", job, "--task_index", str(index)]
        procs.append(lab.spawn(host, argv, env, log, cwd))
        names.append((job, index, log))
    # Wait for the workers, or in the peer's distributed_all_reduce for its controller alone:
    # there the workers only serve (like the PS) until stopped.
    ends = ("controller",) if pt.update == DAR else ("worker",)
    finishers = [(p, n) for p, n in zip(procs, names, strict=True) if n[0] in ends]
    deadline = time.monotonic() + a.run_timeout
    timed_out = False
    for p, _ in finishers:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    first = next(n for n in names if n[0] == ("controller" if pt.update == DAR else "worker"))
    text = first[2].read_text(errors="replace")
    m = TOTAL.findall(text)
    if m and not timed_out:
        return {"img_s": float(m[-1])}
    why = "timeout" if timed_out else "no total"
    errors = []
    for _, _, log in names:
        found = ERROR.findall(log.read_text(errors="replace"))
        errors += [e[0].strip()[:300] for e in found]
    return {"error": f"{why}: {errors[-1] if errors else text.strip()[-300:]}"}


# --- calibration -----------------------------------------------------------------------------


def lone_worker(a, lab: Lab, model: str, logs: Path) -> float:
    cores = len(lab.cores[0])
    pt = Point("ours", model, "-", 1, 0, CAR, False)
    log = logs / f"lone-{model}.log"
    argv = ours_argv(a, pt, cores)
    argv[argv.index("--num_batches") + 1] = str(max(a.steps, 10))
    p = lab.spawn(0, argv, task_env(cores), log)
    p.wait(timeout=a.run_timeout)
    m = re.search(r"^worker images/sec: ([\d.]+)", log.read_text(), re.M)
    if not m:
        raise SystemExit(f"lone worker failed: {log.read_text()[-2000:]}")
    return float(m.group(1))


def netbench(a, lab: Lab, workers: int, ps_model: str, logs: Path, tag: str) -> dict:
    cores = len(lab.cores[0])
    cluster = {
        "ps": [f"{lab.address(0)}:{PS_PORT}"],
        "worker": [f"{lab.address(1 + i)}:{WORKER_PORT}" for i in range(workers)],
    }
    procs = []
    for job, index, host in [("ps", 0, 0)] + [("worker", i, 1 + i) for i in range(workers)]:
        env = task_env(cores)
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": job, "index": index}}
        )  # fmt: skip
        argv = [
            sys.executable, "-m", "tflaunch.models.netbench", "--sizes",
            "1024,1048576,16777216,67108864", "--ps_model", ps_model, "--max_seconds", "1",
        ]  # fmt: skip
        procs.append(lab.spawn(host, argv, env, logs / f"netbench-{tag}-{job}{index}.log"))
    for p in procs[1:]:
        p.wait(timeout=a.run_timeout)
    os.killpg(procs[0].pid, signal.SIGKILL)
    procs[0].wait()
    text = (logs / f"netbench-{tag}-worker0.log").read_text()
    m = re.search(r"^netbench-result: (.*)$", text, re.M)
    if not m:
        raise SystemExit(f"netbench {tag} failed: {text[-2000:]}")
    return json.loads(m.group(1))


def calibrate(a, lab: Lab, store: dict, logs: Path) -> None:
    cal = store.setdefault("calibration", {})
    cal["cores_per_host"] = len(lab.cores[0])
    cal["hosts"] = lab.count
    for model in a.models:
        if f"lone_{model}" not in cal:
            cal[f"lone_{model}"] = lone_worker(a, lab, model, logs)
            print(f"calibrate: lone {model} worker {cal[f'lone_{model}']:.2f} img/s", flush=True)
            save(a, store)
    if "netbench_unshaped" not in cal:
        lab.shape(None)
        cal["netbench_unshaped"] = netbench(a, lab, 4, "inception_v3", logs, "unshaped")
        save(a, store)
    # A PS's capacity grows with the streams it serves (its cores share them), so the PS test
    # also runs at the grid's largest worker count that fits: the model takes the load nearest
    # each row's (loaded_ps_rate).
    fanin = min(max(pt.workers for pt in GRIDS[a.grid](a.ps_count)), lab.count - 1)
    if fanin > 4 and f"netbench_fanin_{fanin}" not in cal:
        lab.shape(None)
        cal[f"netbench_fanin_{fanin}"] = netbench(a, lab, fanin, "inception_v3", logs, "fanin")
        save(a, store)
    for rate in a.rates:
        if f"netbench_{rate}" not in cal:
            lab.shape(rate)
            cal[f"netbench_{rate}"] = netbench(a, lab, 1, "none", logs, rate)
            save(a, store)


# --- sweep -----------------------------------------------------------------------------------


def save(a, store: dict) -> None:
    a.results.parent.mkdir(parents=True, exist_ok=True)
    a.results.write_text(json.dumps(store, indent=1) + "\n")
    if os.environ.get("OUT"):  # the lent machine's way back
        Path(os.environ["OUT"], a.results.name).write_text(json.dumps(store, indent=1) + "\n")


def wanted(a, store: dict, pt: Point) -> bool:
    runs = [r for r in store.get("runs", []) if r["key"] == pt.key]
    if any("error" in r for r in runs) and not any("img_s" in r for r in runs):
        return False  # a setting that fails is named once with its error, not retried
    return sum("img_s" in r for r in runs) < a.repeats


def sweep(a, lab: Lab, store: dict, logs: Path, started: float) -> None:
    grid = [pt for pt in GRIDS[a.grid](a.ps_count) if pt.model in a.models and pt.rate in a.rates]
    if a.only:
        grid = [pt for pt in grid if any(s in pt.key for s in a.only)]
    shaped = None
    for repeat in range(a.repeats):
        for pt in grid:
            if not wanted(a, store, pt):
                continue
            done = sum("img_s" in r for r in store.get("runs", []) if r["key"] == pt.key)
            if done > repeat:
                continue
            spent = time.monotonic() - started
            if spent + a.run_estimate > a.budget:
                print(f"budget: {spent:.0f} s spent; stopping before {pt.key}", flush=True)
                return
            if shaped != pt.rate:
                lab.shape(pt.rate)
                shaped = pt.rate
            t0 = time.monotonic()
            record = run_point(a, lab, pt, logs)
            record.update(key=pt.key, **dataclasses.asdict(pt), seconds=time.monotonic() - t0)
            store.setdefault("runs", []).append(record)
            save(a, store)
            figure = f"{record['img_s']:.2f} img/s" if "img_s" in record else record["error"]
            print(f"[{spent + record['seconds']:.0f} s] {pt.key}: {figure}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peer", type=Path, help="tf_cnn_benchmarks' folder (fetched, not committed)")
    p.add_argument("--tools", type=Path, default=None, help="ip, tc and lib/ (else PATH)")
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--logs", type=Path, default=Path("/tmp/manycore-lab-logs"))
    p.add_argument("--hosts", type=int, default=18, help="16 workers and 2 PS")
    p.add_argument("--ps-count", type=int, default=2, help="PS hosts in the PS rows")
    p.add_argument(
        "--cores-per-host", type=int, default=None, help="default: this machine's cores // hosts"
    )
    p.add_argument("--models", default="inception3,resnet50")
    p.add_argument("--rates", default="1gbit,10gbit")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--budget", type=float, default=540.0, help="seconds for this call")
    p.add_argument("--run-estimate", type=float, default=75.0, help="seconds one run may take")
    p.add_argument("--run-timeout", type=float, default=180.0)
    p.add_argument("--only", default=None, help="comma-separated substrings of row keys")
    p.add_argument(
        "--grid",
        choices=sorted(GRIDS),
        default="headline",
        help="headline: 16, 8, 4 workers at 1 and 10 Gb/s (issue 32); linklimit: 8 and 4 "
        "workers at 1 Gb/s with every peer setting and the overlapped all-reduce (issue 42)",
    )
    p.add_argument("--phase", choices=("calibrate", "sweep", "all", "report"), default="all")
    a = p.parse_args()
    started = time.monotonic()
    a.models = a.models.split(",")
    a.rates = a.rates.split(",")
    a.only = a.only.split(",") if a.only else None
    store = json.loads(a.results.read_text()) if a.results.exists() else {}
    store.setdefault(
        "settings", {"batch": a.batch, "steps": a.steps, "warmup": a.warmup, "image": "default"}
    )
    if a.phase == "report":
        report(a, store)
        return 0
    if os.geteuid() != 0:
        print("error: the lab makes namespaces and shapes links: run it as root", file=sys.stderr)
        return 2
    if a.peer is None or not (a.peer / "tf_cnn_benchmarks.py").exists():
        print("error: --peer DIR must hold tf_cnn_benchmarks.py", file=sys.stderr)
        return 2
    a.peer = a.peer.resolve()
    a.logs.mkdir(parents=True, exist_ok=True)
    lab = Lab(a.hosts, a.tools.resolve() if a.tools else None, a.cores_per_host)
    cal = store.get("calibration", {})
    if cal and (cal.get("cores_per_host"), cal.get("hosts")) != (len(lab.cores[0]), lab.count):
        print(
            f"error: {a.results} was calibrated with {cal.get('hosts')} hosts of "
            f"{cal.get('cores_per_host')} core(s); this lab has {lab.count} of "
            f"{len(lab.cores[0])}. Pass --hosts/--cores-per-host to match, or another --results.",
            file=sys.stderr,
        )
        return 2
    try:
        lab.setup()
        if a.phase in ("calibrate", "all"):
            calibrate(a, lab, store, a.logs)
        if a.phase in ("sweep", "all"):
            sweep(a, lab, store, a.logs, started)
    finally:
        lab.teardown()
    report(a, store)
    return 0


if __name__ == "__main__":
    sys.exit(main())
