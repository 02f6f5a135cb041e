"""Staged variables and ordered transfers against today's default, on SSH test hosts whose private
links are shaped like NICs of one rate (``tc tbf`` at both ends of each host's private veth).

The cluster: 2 workers and ``--ps`` dedicated PS, one task per host (``placement.ps: dedicated``),
all through ``tflaunch up`` on the SSH backend; ``tflaunch.models.benchmark`` in
``parameter_server`` mode, synthetic data. Every setting runs ``--repeats`` times, interleaved
(A, B, C, A, B, C, ...) so that the shared machine's noise hits all of them alike. Per setting:

* mean step time (over every timed step of both workers), its coefficient of variation across
  steps and workers, and total images/sec (the benchmark's ``total images/sec``);
* from one extra traced run of the setting (``tflaunch up --trace``; profiling slows the steps,
  so its times are not in the figures above): the share of the worker's communication that
  overlapped its computation and Kendall's tau of arrival order against consumption order
  (``tflaunch trace``'s figures, tflaunch.trace.transfers);
* the ratio of its img/s to the first setting's (the default), with the min-max over repeats;
* ``tflaunch model``'s prediction (tflaunch.tools.perfmodel) without and with overlap, from the
  compute time per step and the shaped link.

Needs root (namespaces, tc). Holds the SSH test hosts' lock for the whole measurement (with the
defaults about 16 runs of a minute or two), so that every repeat sees the same hosts. Usage::

    python benchmarks/transfer_order.py [--rate 1gbit] [--repeats 3] [--model inception3]
        [--batch_size 2] [--num_batches 10] [--ps 2] [--placement greedy]
        [--settings none staged tic staged+tic]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import checkout_python  # noqa: E402
from tests.hosts import ssh_hosts  # noqa: E402
from tflaunch.trace import transfers as trace_transfers  # noqa: E402

SETTINGS = {
    "none": [],
    "staged": ["--staged_vars"],
    "tic": ["--transfer_order", "tic"],
    "tac": ["--transfer_order", "tac"],
    "staged+tic": ["--staged_vars", "--transfer_order", "tic"],
}
WORKERS = 2


def tbf_args(rate: str) -> list[str]:
    """``tbf`` as a NIC of ``rate``: a burst of at least one GSO segment (64 KiB) or 4 ms of
    the rate, a queue of 50 ms."""
    bits = _rate_bits(rate)
    burst = max(256 * 1024, int(bits / 8 * 0.004))
    return ["tbf", "rate", rate, "burst", str(burst), "latency", "50ms"]


def _rate_bits(rate: str) -> float:
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    for suffix, scale in units.items():
        if rate.endswith(suffix):
            return float(rate[: -len(suffix)]) * scale
    raise SystemExit(f"--rate {rate!r}: give it as tc does, e.g. 1gbit or 500mbit")


def shape(hosts: ssh_hosts.TestHosts, rate: str) -> None:
    """Both ends of every host's private veth: the host's egress (eth1 in its namespace) and its
    ingress (the root-namespace end on the private bridge)."""
    for host in hosts.hosts:
        qdisc = tbf_args(rate)
        subprocess.run(
            ["ip", "netns", "exec", host.namespace, "tc", "qdisc", "replace", "dev", "eth1"]
            + ["root", *qdisc],
            check=True,
        )
        subprocess.run(
            ["tc", "qdisc", "replace", "dev", host.private_veth, "root", *qdisc], check=True
        )


def cluster_file(work: Path, hosts: ssh_hosts.TestHosts, args, name: str, extra: list[str]) -> Path:
    base = random.randint(20000, 32000)
    results = work / "results" / name
    argv = [sys.executable, "-m", "tflaunch.models.benchmark", "--model", args.model]
    argv += ["--batch_size", str(args.batch_size), "--num_batches", str(args.num_batches)]
    argv += ["--num_warmup_batches", str(args.num_warmup_batches), "--display_every", "5"]
    argv += ["--variable_update", "parameter_server", "--variable_placement", args.placement]
    argv += extra
    argv += ["--result_json", str(results / "{job_name}-{task_index}.json")]
    data = {
        "name": f"transfers-{name.replace('+', '-')}",
        "backend": "ssh",
        "program": {"argv": argv, "workdir": str(ROOT), "env": {"PYTHONPATH": str(ROOT)}},
        "roles": {"ps": args.ps, "worker": WORKERS},
        "placement": {"ps": "dedicated", "workers_per_host": 1},
        "ports": {"ps": base, "worker": base + 100},
        "supervision": {"grace_period": 2, "ready_timeout": 600},
        "runs_dir": str(work / "runs"),
        "hosts": hosts.cluster_hosts(WORKERS + args.ps),
        "ssh": hosts.ssh_section(checkout_python(work, ROOT), work / "remote"),
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_once(cluster: Path, results: Path, trace: bool, work: Path) -> dict:
    """One ``tflaunch up``; the workers' result documents (and the transfer report if traced)."""
    if results.exists():
        for old in results.iterdir():
            old.unlink()
    results.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "tflaunch", "up", str(cluster)]
    if trace:
        argv += ["--trace", "3:3"]
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=1500, env=_env())
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{cluster.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    docs = [json.loads((results / f"worker-{i}.json").read_text()) for i in range(WORKERS)]
    out = {"docs": docs, "wall_s": wall}
    if trace:
        reports = sorted((work / "remote").glob(f"*/trace/{trace_transfers.REPORT_JSON}"))
        newest = max(reports, key=lambda p: p.stat().st_mtime) if reports else None
        out["transfers"] = json.loads(newest.read_text()) if newest else None
        summaries = newest.parent / "trace_summary.json" if newest else None
        out["summary"] = json.loads(summaries.read_text()) if summaries else None
    return out


def _env() -> dict:
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT)}


def figures(runs: list[dict], batch_size: int) -> dict:
    """Mean step time, CV across steps and workers, total img/s (mean and per repeat)."""
    steps = [t for r in runs for d in r["docs"] for t in d["timing"]["step_times"]]
    mean = statistics.fmean(steps)
    totals = [r["docs"][0]["images_per_sec"]["total"] for r in runs]
    return {
        "step_s": mean,
        "cv": statistics.pstdev(steps) / mean,
        "img_s": statistics.fmean(totals),
        "img_s_runs": totals,
    }


def traced_figures(run: dict | None) -> dict:
    if not run or not run.get("transfers"):
        return {}
    rows = [r for r in run["transfers"]["steps"] if r["overlap"] is not None]
    taus = [r["kendall_tau"] for r in rows if r["kendall_tau"] is not None]
    workers = [s for t, s in (run.get("summary") or {}).items() if t.startswith("worker")]
    compute = [s["per_step_ms"]["compute"] for s in workers]
    step = [s["per_step_ms"]["total"] for s in workers]
    return {
        "overlap": statistics.fmean(r["overlap"] for r in rows) if rows else None,
        "tau": statistics.fmean(taus) if taus else None,
        "compute_ms": statistics.fmean(compute) if compute else None,
        "traced_step_ms": statistics.fmean(step) if step else None,
    }


def model_variables(model: str) -> tuple:
    """(name, shape, dtype size) of the model's trainable variables, as ``tflaunch model``
    sizes them (one TensorFlow graph build)."""
    from tflaunch.models.registry import get_model_spec
    from tflaunch.tools.placement_command import model_variables as variables

    return tuple(
        (v.name, tuple(v.shape), v.dtype_size) for v in variables(get_model_spec(model), 1001)
    )


def prediction(args, compute_s: float, overlap: bool, staged: bool = False) -> float:
    """tflaunch model's img/s for the cluster with this compute per step and the shaped link."""
    from tflaunch.tools import perfmodel

    inputs = perfmodel.Inputs(
        compute_s,
        args.batch_size,
        model_variables(args.model),
        perfmodel.Link(args.link_latency_us * 1e-6, _rate_bits(args.rate) / 8),
    )
    return perfmodel.predict(
        inputs, WORKERS, args.ps, "parameter_server", args.placement, overlap=overlap, staged=staged
    ).images_per_sec


def _run_line(result: dict, args) -> str:
    """One run as it finishes: img/s, step time and CV, and the traced figures if any."""
    f = figures([result], args.batch_size)
    line = f"{f['img_s']:6.3f} img/s, step {f['step_s']:.2f} s, CV {100 * f['cv']:.1f} %"
    t = traced_figures(result)
    if t.get("overlap") is not None:
        line += f", overlap {100 * t['overlap']:.0f} %"
    if t.get("tau") is not None:
        line += f", tau {t['tau']:+.2f}"
    if t.get("compute_ms") is not None:
        line += f", compute {t['compute_ms']:.0f} of {t['traced_step_ms']:.0f} ms"
    return line + f" ({result['wall_s']:.0f} s)"


def _measure(work: Path, hosts, args, name: str, is_trace: bool) -> dict:
    cluster = cluster_file(work, hosts, args, name, SETTINGS[name])
    try:
        return run_once(cluster, work / "results" / name, is_trace, work)
    except RuntimeError as exc:  # the shared machine: say so, try once more
        print(f"{name}: a run failed, trying again ({str(exc)[-300:]!r})", flush=True)
        return run_once(cluster, work / "results" / name, is_trace, work)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="inception3")
    parser.add_argument("--batch_size", type=int, default=2)
    parser.add_argument("--num_batches", type=int, default=10)
    parser.add_argument("--num_warmup_batches", type=int, default=3)
    parser.add_argument("--ps", type=int, default=2)
    parser.add_argument(
        "--placement",
        default="greedy",
        help="--variable_placement of every setting (round robin would put every weight of "
        "InceptionV3 on PS 0: one PS link would carry it all)",
    )
    parser.add_argument(
        "--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS)[:3] + ["staged+tic"]
    )
    parser.add_argument("--no-trace", action="store_true", help="skip the traced run per setting")
    parser.add_argument(
        "--link-latency-us", type=float, default=200.0, help="the link latency the model assumes"
    )
    parser.add_argument("--json", default=None, help="write every figure here")
    args = parser.parse_args()
    problem = ssh_hosts.missing_requirements()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="tfl-transfers-"))
    runs: dict[str, list[dict]] = {s: [] for s in args.settings}
    traced: dict[str, dict] = {}
    rounds = args.repeats + (0 if args.no_trace else 1)
    trace_round = min(1, args.repeats)  # after the first timed round: early, in case of trouble
    # the whole measurement on the same hosts
    with ssh_hosts.session(WORKERS + args.ps, timeout=3 * 3600) as hosts:
        shape(hosts, args.rate)
        for round_ in range(rounds):
            for name in args.settings:
                is_trace = not args.no_trace and round_ == trace_round
                result = _measure(work, hosts, args, name, is_trace)
                if is_trace:
                    traced[name] = result
                else:
                    runs[name].append(result)
                kind = "traced" if is_trace else f"repeat {len(runs[name])}"
                print(f"{name:<12} {kind:<9} {_run_line(result, args)}", flush=True)
    report(args, runs, traced)
    return 0


def report(args, runs: dict[str, list[dict]], traced: dict[str, dict]) -> None:
    rows = {name: figures(r, args.batch_size) for name, r in runs.items() if r}
    base = rows[args.settings[0]]["img_s"]
    print(
        f"\n{args.model}, batch {args.batch_size}, {WORKERS} workers + {args.ps} dedicated PS, "
        f"{args.placement} placement, links {args.rate}, {args.repeats} repeats interleaved, "
        f"{args.num_batches} timed steps"
    )
    head = (
        "setting",
        "step s",
        "CV %",
        "img/s",
        "runs",
        "x default",
        "overlap %",
        "tau",
        "model img/s",
    )
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    compute_s = None
    out = {}
    for name, f in rows.items():
        t = traced_figures(traced.get(name))
        if name == args.settings[0] and t.get("compute_ms"):
            # profiling slows every kernel: scale the traced compute by untraced/traced step
            compute_s = t["compute_ms"] / t["traced_step_ms"] * f["step_s"]
        # staged (alone or with tic: staged values are for the next step, their order is
        # free): assumption 8's staged cycle; tic alone: communication beside computation.
        staged = name.startswith("staged")
        overlapped = name != "none" and not staged
        model = prediction(args, compute_s, overlapped, staged) if compute_s else None
        cells = (
            name,
            f"{f['step_s']:.2f}",
            f"{100 * f['cv']:.1f}",
            f"{f['img_s']:.2f}",
            ", ".join(f"{x:.2f}" for x in f["img_s_runs"]),
            f"{f['img_s'] / base:.2f}",
            "-" if t.get("overlap") is None else f"{100 * t['overlap']:.0f}",
            "-" if t.get("tau") is None else f"{t['tau']:+.2f}",
            "-" if model is None else f"{model:.2f}",
        )
        print("| " + " | ".join(cells) + " |")
        out[name] = {**f, **t, "model_img_s": model}
    if compute_s:
        print(
            f"model inputs: compute {compute_s * 1e3:.0f} ms per step (the traced default "
            f"run's compute per worker step), link {args.rate}, latency {args.link_latency_us:.0f} µs"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    sys.exit(main())
