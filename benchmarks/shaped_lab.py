"""The seeds' PS-vs-all-reduce and placement experiments on shaped links, with the model beside.

    sudo python benchmarks/shaped_lab.py --out DIR [--hosts 6] [--rates 1gbit,10gbit]
        [--models inception3,resnet50] [--repeats 3] [--phase calibrate|sweep|report|all]
        [--batch 2] [--image 75] [--steps 8] [--warmup 2] [--grid full|core]
        [--points W:P:ps|dr|car:PLACEMENT,...] [--own-cores]

N SSH test hosts (tests/hosts/ssh_hosts.py, holding its lock for the whole run) have their
private links shaped to each rate in turn (``tbf`` on both ends: every host has an R NIC). The
cluster runs over SSH with dedicated PS hosts (``placement.ps: dedicated``: W worker hosts, P PS
hosts), ``tflaunch.models.benchmark`` at a small batch of small images, so that at 1 Gb/s moving
the model's variables costs much more than computing a step, and at 10 Gb/s (which TensorFlow's
gRPC cannot fill on these cores) compute and gRPC's own CPU cost dominate.

calibrate: per model a lone worker (no cluster, same flags) gives the compute per step; per rate
``tflaunch netbench`` (1 PS + 1 worker on two shaped hosts) gives the link; ``tflaunch model
--save`` turns both into ``DIR/inputs-<model>-<rate>.json``.
sweep: every grid point (the list ``POINTS``: workers, PS, variable update, placement) at every
rate, ``--repeats`` times, repeat-major across rates and models (the hosts are re-shaped between
rates; ``--grid core`` the shorter ``CORE``, ``--points`` any list, e.g. 8 workers on a
many-core machine with ``--hosts 12 --own-cores``), through ``tflaunch bench``'s runner (the same
path as ``tflaunch up``). Measurements are
appended to ``DIR/measurements.json`` as they come, so a sweep can be run a repeat at a time
(``--repeats 1`` three times) and still reports every repeat.
report: per model and rate the CSCS table (mean, spread, n) with ``tflaunch model``'s prediction
and its error beside each row, the median absolute error, the model's recommended P/placement
against the measured best, and ``DIR/lab-<model>.png``: img/s against workers per variable update
(best P/placement at each W), one panel per rate, with the model's line beside. Needs no hosts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import checkout_python  # noqa: E402
from tests.hosts import ssh_hosts  # noqa: E402
from tflaunch.tools import bench_sweep as bench  # noqa: E402
from tflaunch.tools import perfmodel as pm  # noqa: E402
from tflaunch.tools.bench_results import Point  # noqa: E402
from tflaunch.tools.perfmodel_inputs import load_inputs  # noqa: E402
from tflaunch.tools.perfmodel_text import error_pct  # noqa: E402

PS, DR, CAR = "parameter_server", "distributed_replicated", "collective_all_reduce"
# (workers, PS, variable update, placement): the grid that completes on 2 shared cores. Cut from
# the full W 1..3 x P 1..3 x 4 placements x 3 updates: P above W (bench skips those), greedy
# (between round robin and LPT for these models), and most P x placement pairs at 3 workers.
POINTS = {
    "inception3": [
        (1, 1, PS, "round_robin"),
        (2, 1, PS, "round_robin"),
        (2, 2, PS, "round_robin"),
        (2, 2, PS, "lpt"),
        (2, 2, PS, "partitioned"),
        (3, 1, PS, "round_robin"),
        (3, 2, PS, "lpt"),
        (3, 3, PS, "round_robin"),
        (3, 3, PS, "lpt"),
        (2, 2, DR, "lpt"),
        (3, 2, DR, "lpt"),
        (2, 0, CAR, "-"),
        (3, 0, CAR, "-"),
    ],
    "resnet50": [
        (1, 1, PS, "round_robin"),
        (2, 2, PS, "round_robin"),
        (2, 2, PS, "lpt"),
        (3, 2, PS, "lpt"),
        (2, 0, CAR, "-"),
        (3, 0, CAR, "-"),
    ],
}

# The points repeated when time is short (--grid core): placement at 2 PS, 1..3 PS at W = 3 and
# the PS-vs-all-reduce crossover, InceptionV3 only.
CORE = {"inception3": [p for p in POINTS["inception3"] if p[2] != DR and p[:2] != (3, 3)]}
CORE["inception3"].append((3, 3, PS, "lpt"))


@dataclasses.dataclass(frozen=True)
class LabPoint:
    model: str
    rate: str
    workers: int
    ps: int
    update: str
    placement: str

    @property
    def key(self) -> str:
        return (
            f"{self.model}-{self.rate}-w{self.workers}-ps{self.ps}-{self.update}-{self.placement}"
        )


def tflaunch(*args: str) -> str:
    """Run a tflaunch command; print its own lines (not the tasks'); fail loudly."""
    cmd = [sys.executable, "-m", "tflaunch", *args]
    print("$ tflaunch " + " ".join(args), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
    for line in proc.stdout.splitlines():
        if not line.startswith("["):
            print(line, flush=True)
    if proc.returncode != 0:
        print(proc.stdout[-3000:] + proc.stderr[-3000:], flush=True)
        raise SystemExit(f"tflaunch {args[0]} failed with {proc.returncode}")
    return proc.stdout


def bench_argv(a: argparse.Namespace, model: str, placement: str) -> list[str]:
    argv = [
        sys.executable, "-m", "tflaunch.models.benchmark", "--model", model,
        "--batch_size", str(a.batch), "--image_size", str(a.image), "--num_batches", str(a.steps),
        "--num_warmup_batches", str(a.warmup), "--data_format", "NHWC",
        "--display_every", str(a.steps),
    ]  # fmt: skip
    if placement != "-":
        argv += ["--variable_placement", placement]
    return argv


def cluster_file(
    a: argparse.Namespace, hosts: ssh_hosts.TestHosts, path: Path, argv: list[str]
) -> Path:
    data = {
        "name": path.stem,
        "backend": "ssh",
        "program": {"argv": argv, "workdir": str(ROOT)},
        "roles": {"ps": 1, "worker": 1},
        "placement": {"ps": "dedicated"},
        "ports": {"ps": 23000, "worker": 23100},
        "supervision": {"grace_period": 2, "ready_timeout": 300, "finish_timeout": 900},
        "runs_dir": str(a.out / "runs"),
        "hosts": hosts.cluster_hosts(),
        "ssh": hosts.ssh_section(checkout_python(a.out, ROOT), a.out / "remote"),
    }
    path.write_text(yaml.safe_dump(data))
    return path


def lone_worker(a: argparse.Namespace, model: str) -> float:
    """img/s of one worker without a cluster (the model's compute), median of 2 runs."""
    rates = []
    for _ in range(2):
        out = subprocess.run(
            bench_argv(a, model, "-"), cwd=ROOT, text=True, capture_output=True, check=False
        )
        m = re.search(r"^worker images/sec: ([\d.]+)$", out.stdout, re.M)
        if not m:
            raise SystemExit(
                f"lone {model} worker failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}"
            )
        rates.append(float(m.group(1)))
    print(f"lone {model} worker: {rates} img/s", flush=True)
    return statistics.median(rates)


def calibrate(a: argparse.Namespace, hosts: ssh_hosts.TestHosts) -> None:
    computes = {m: lone_worker(a, m) for m in a.models}
    nb = cluster_file(a, hosts, a.out / "netbench.yaml", [sys.executable, "-c", "pass"])
    for rate in a.rates:
        ssh_hosts.shape(hosts, rate)
        out = tflaunch("netbench", str(nb), "--sizes", "1K,1M,16M,64M", "--ps-model", "none")
        run = re.search(r"wrote (\S+)/netbench\.json", out).group(1)
        for model in a.models:
            tflaunch(
                "model", "--netbench", run, "--compute-img-s", str(computes[model]),
                "--batch-size", str(a.batch), "--model", model, "--workers", a.worker_counts,
                "--ps", "1-3", "--save", str(a.out / f"inputs-{model}-{rate}.json"),
                *([] if a.own_cores else ["--shared-cores"]),  # hosts share this machine's cores
            )  # fmt: skip


def sweep(a: argparse.Namespace, hosts: ssh_hosts.TestHosts) -> None:
    store = a.out / "measurements.json"
    done = json.loads(store.read_text()) if store.exists() else []
    first = 1 + max((m["repeat"] for m in done), default=0)
    earlier = len(done)
    runners: dict[tuple[str, str, str], bench.Runner] = {}
    grid = a.points or (CORE if a.grid == "core" else POINTS)
    points = [
        LabPoint(model, rate, *p)
        for rate in a.rates
        for model in a.models
        for p in grid.get(model, [])
    ]
    total, started = len(points) * a.repeats, time.monotonic()
    for repeat in range(first, first + a.repeats):
        for rate in a.rates:
            ssh_hosts.shape(hosts, rate)
            for lp in (p for p in points if p.rate == rate):
                key = (lp.model, lp.rate, lp.placement)
                if key not in runners:
                    name = f"{lp.model}-{lp.rate}-{lp.placement}"
                    argv = bench_argv(a, lp.model, lp.placement)
                    cluster = cluster_file(a, hosts, a.out / f"{name}.yaml", argv)
                    runners[key] = bench.cluster_runner(
                        bench.Sweep(
                            name,
                            cluster,
                            (1,),
                            None,
                            (PS,),
                            ("synthetic",),
                            None,
                            1,
                            a.out / "bench" / name,
                        )  # fmt: skip
                    )
                m = runners[key](Point(lp.workers, lp.ps, lp.update, False), repeat)
                done.append(
                    {**dataclasses.asdict(lp), "repeat": repeat, "img_s": m.images_per_sec,
                     "exit_code": m.exit_code, "run_id": m.run_id}
                )  # fmt: skip
                store.write_text(json.dumps(done, indent=1))
                n = len(done) - earlier
                print(
                    f"[{n}/{total}] r{repeat} {lp.key}: {m.images_per_sec} img/s "
                    f"({time.monotonic() - started:.0f} s)",
                    flush=True,
                )


# --- report ------------------------------------------------------------------------------------


def rows_of(a: argparse.Namespace) -> dict[LabPoint, list[float]]:
    measured: dict[LabPoint, list[float]] = {}
    for m in json.loads((a.out / "measurements.json").read_text()):
        lp = LabPoint(m["model"], m["rate"], m["workers"], m["ps"], m["update"], m["placement"])
        measured.setdefault(lp, [])
        if m["img_s"] is not None:
            measured[lp].append(m["img_s"])
    return measured


def predict(inputs: pm.Inputs, lp: LabPoint) -> pm.Prediction:
    placement = "round_robin" if lp.placement == "-" else lp.placement
    return pm.predict(inputs, lp.workers, lp.ps, lp.update, placement)


def report(a: argparse.Namespace) -> None:
    measured = rows_of(a)
    summary = {}
    for model in a.models:
        for rate in a.rates:
            path = a.out / f"inputs-{model}-{rate}.json"
            points = sorted(
                (lp for lp in measured if lp.model == model and lp.rate == rate),
                key=lambda lp: (lp.workers, lp.update, lp.ps, lp.placement),
            )
            if not points or not path.exists():
                continue
            inputs = load_inputs(path)
            print(
                f"\n## {model} at {rate}: compute {inputs.compute_s * 1e3:.0f} ms/step of "
                f"{inputs.batch_size}, link {inputs.link.bandwidth / 1e6:.0f} MB/s "
                f"{inputs.link.latency_s * 1e3:.1f} ms, {inputs.model_bytes / 1e6:.1f} MB"
            )
            print(
                "| workers | PS | variable update | placement | n | img/s | ± sd | model | error |"
            )
            print("|---|---|---|---|---|---|---|---|---|")
            errors = []
            for lp in points:
                values = measured[lp]
                pred = predict(inputs, lp)
                if not values:
                    print(f"| {lp.workers} | {lp.ps} | {lp.update} | {lp.placement} | 0 | failed |")
                    continue
                mean = statistics.fmean(values)
                sd = statistics.stdev(values) if len(values) > 1 else 0.0
                err = error_pct(pred.images_per_sec, mean)
                errors.append(abs(err))
                print(
                    f"| {lp.workers} | {lp.ps or '-'} | {lp.update} | {lp.placement} | "
                    f"{len(values)} | {mean:.2f} | {sd:.2f} | {pred.images_per_sec:.2f} "
                    f"({pred.bound}) | {err:+.1f} % |"
                )
            if errors:
                worst = max(errors)
                print(
                    f"\nmedian absolute error {statistics.median(errors):.1f} % over "
                    f"{len(errors)} rows, largest {worst:.1f} %"
                )
                summary[f"{model}-{rate}"] = {
                    "median_abs_error": statistics.median(errors),
                    "max_abs_error": worst,
                    "rows": len(errors),
                }
            print_recommendation(inputs, points, measured)
        plot(a, model, measured)
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))


def print_recommendation(inputs, points, measured) -> None:
    """Per worker count, the measured best against the point the model ranks first among the
    measured ones (and where the measured best's mean stands against it)."""
    for w in sorted({lp.workers for lp in points}):
        here = [lp for lp in points if lp.workers == w and measured[lp]]
        if len(here) < 2:
            continue
        mean = {lp: statistics.fmean(measured[lp]) for lp in here}
        best = max(here, key=mean.get)
        chosen = max(here, key=lambda lp: predict(inputs, lp).images_per_sec)
        gap = 100 * (mean[best] - mean[chosen]) / mean[best]
        print(
            f"{w} workers: measured best {best.update} P={best.ps} {best.placement} "
            f"{mean[best]:.2f} img/s; model picks {chosen.update} P={chosen.ps} "
            f"{chosen.placement}, measured {mean[chosen]:.2f} ({gap:.1f} % below the best)"
        )


def plot(a: argparse.Namespace, model: str, measured) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [r for r in a.rates if any(lp.model == model and lp.rate == r for lp in measured)]
    if not rates:
        return
    fig, axes = plt.subplots(1, len(rates), figsize=(5.5 * len(rates), 4), squeeze=False)
    for ax, rate in zip(axes[0], rates, strict=True):
        inputs_path = a.out / f"inputs-{model}-{rate}.json"
        inputs = load_inputs(inputs_path) if inputs_path.exists() else None
        for update, colour in ((PS, "C0"), (DR, "C1"), (CAR, "C2")):
            here = [lp for lp in measured if lp.model == model and lp.rate == rate]
            here = [lp for lp in here if lp.update == update and measured[lp]]
            ws = sorted({lp.workers for lp in here})
            if not ws:
                continue
            best, model_best = [], []
            for w in ws:
                at_w = [lp for lp in here if lp.workers == w]
                top = max(at_w, key=lambda lp: statistics.fmean(measured[lp]))
                best.append(statistics.fmean(measured[top]))
                if inputs:
                    model_best.append(predict(inputs, top).images_per_sec)
            ax.plot(ws, best, "o-", color=colour, label=f"{update} (best P, placement)")
            if inputs:
                ax.plot(ws, model_best, "x:", color=colour, label=f"{update}, model")
        rr = [lp for lp in measured if lp.model == model and lp.rate == rate and lp.ps == 1]
        rr = sorted((lp for lp in rr if lp.update == PS and measured[lp]), key=lambda p: p.workers)
        if rr:
            ax.plot(
                [lp.workers for lp in rr],
                [statistics.fmean(measured[lp]) for lp in rr],
                "s--",
                color="grey",
                label="parameter_server, 1 PS",
            )
        ax.set_title(f"{model}, links shaped to {rate}")
        ax.set_xlabel("workers")
        ax.set_ylabel("images/sec (all workers)")
        ax.set_xticks(sorted({lp.workers for lp in measured if lp.model == model}))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = a.out / f"lab-{model}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path}")


def parse_points(text: str, models: list[str]) -> dict[str, list[tuple[int, int, str, str]]]:
    """``--points 8:1:ps:round_robin,8:0:car:-``: workers, PS, update (ps, dr, car), placement."""
    names = {"ps": PS, "dr": DR, "car": CAR}
    points = []
    for item in text.split(","):
        w, p, update, placement = item.split(":")
        points.append((int(w), int(p), names[update], placement))
    return {model: points for model in models}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--hosts", type=int, default=6)
    p.add_argument("--rates", default="1gbit,10gbit")
    p.add_argument("--models", default="inception3,resnet50")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--image", type=int, default=75)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--points", default=None, help="W:P:ps|dr|car:PLACEMENT,... (else --grid)")
    p.add_argument(
        "--own-cores",
        action="store_true",
        help="tasks do not contend for cores (a many-core machine): model without --shared-cores",
    )
    p.add_argument("--grid", choices=("full", "core"), default="full", help="core: see CORE")
    p.add_argument("--phase", choices=("calibrate", "sweep", "report", "all"), default="all")
    a = p.parse_args()
    a.out = a.out.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    a.rates = a.rates.split(",")
    a.models = a.models.split(",")
    a.points = parse_points(a.points, a.models) if a.points else None
    grid = a.points or POINTS
    counts = sorted({p[0] for m in a.models for p in grid.get(m, [])})
    a.worker_counts = ",".join(str(w) for w in counts)
    for rate in a.rates:
        ssh_hosts.parse_rate(rate)
    if a.phase != "report":
        problem = ssh_hosts.missing_requirements()
        if problem:
            print(problem, file=sys.stderr)
            return 2
        with ssh_hosts.session(a.hosts) as hosts:
            if a.phase in ("calibrate", "all"):
                calibrate(a, hosts)
            if a.phase in ("sweep", "all"):
                sweep(a, hosts)
    if a.phase in ("report", "all"):
        report(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
