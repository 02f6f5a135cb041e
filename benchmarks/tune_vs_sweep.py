"""``tflaunch tune``'s pick and wall time against a full sweep of the same grid, on shaped links
(SSH test hosts) or on one many-core machine (the local backend, tasks bound to cores).

    sudo python benchmarks/tune_vs_sweep.py --out DIR [--backend ssh|local] [--hosts 4]
        [--cases 2:1gbit:resnet50,3:1gbit:inception3,...] [--max-ps 2]
        [--updates parameter_server,collective_all_reduce] [--placements round_robin,lpt]
        [--transfers none] [--batch 2] [--image 75] [--steps 6] [--warmup 2]
        [--verify K] [--verify-steps 3] [--cpus-per-task C] [--repeats R] [--budget S] [--sync]
        [--phase run|report|repredict]

Per case (workers : link rate : model, ``inception3@32`` for a batch other than ``--batch``), a cluster file of W workers and 1 PS running
``tflaunch.models.benchmark`` at a small batch of small images:

* ``--backend ssh``: on N SSH test hosts (tests/hosts/ssh_hosts.py, its lock held for the whole
  run) whose private links are shaped to the rate (``1gbit``, ``10gbit``);
* ``--backend local``: on this machine, every task bound to ``--cpus-per-task`` cores of its own
  (``placement.cpus_per_task``, as the real run binds them); the rate is ``loopback`` (tasks of
  one host talk over it, unshaped; the model's ``--no-nic`` case). For the lent many-core
  machine, where TensorFlow is carried (docs/performance.md, "tune against a full sweep").

1. tune: ``tflaunch tune FILE`` over the grid (``--max-ps``, ``--updates``, ``--placements``,
   ``--transfers``; ``--verify K``: its top K run for ``--verify-steps`` timed steps each, and
   its pick is the measured best of them), timed end to end, verification included; its pick is
   ``tune.json``'s ``pick``.
2. sweep: every setting tune ranked (the same grid, the same settings that plan on the hosts),
   each run once (``--repeats R``: R times, the mean) through ``tflaunch up`` of that setting's
   cluster file (what tune writes as ``tuned.yaml``), timed; a run's figure is worker 0's
   ``total images/sec``.
3. the table: the sweep's best, tune's pick and its rate measured in the sweep, whether it is
   within 5 % of the best, both wall times and their ratio.

Resumable: each case's progress (tune's result, each sweep point) is kept in ``DIR/CASE/
case.json`` as it comes, and a finished case is appended to ``DIR/results.json``; a later call
with the same arguments goes on where the last stopped and skips finished cases. ``--budget S``
starts no new run (tune or a sweep point) once S seconds are spent, so that a call fits a time
limit. ``--phase report`` prints the table from ``results.json`` (no hosts needed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import checkout_python  # noqa: E402
from tflaunch.cluster.config import load_config  # noqa: E402
from tflaunch.tools import bench_sweep as bench  # noqa: E402
from tflaunch.tools import tune_settings as ts  # noqa: E402
from tflaunch.tools.tune_file import ClusterFile  # noqa: E402

WITHIN = 0.05
FIELDS = ("ps", "update", "strategy", "transfer", "ps_hosts")


def cluster_file(a: argparse.Namespace, hosts, path: Path, workers: int, model: str) -> Path:
    python = local_python(a.out) if a.backend == "local" else ssh_python(a.out)
    network, batch = model_batch(model, a.batch)
    argv = [
        python, "-m", "tflaunch.models.benchmark", "--model", network,
        "--batch_size", str(batch), "--image_size", str(a.image), "--num_batches", str(a.steps),
        "--num_warmup_batches", str(a.warmup), "--data_format", "NHWC",
        "--display_every", str(a.steps),
    ]  # fmt: skip
    if a.intra:
        argv += ["--num_intra_threads", str(a.intra)]
    if a.sync:
        argv += ["--cross_replica_sync"]
    data: dict = {
        "name": path.stem,
        "backend": a.backend,
        "program": {"argv": argv, "workdir": str(ROOT)},
        "roles": {"ps": 1, "worker": workers},
        "ports": {"ps": 23000, "worker": 23100},
        "supervision": {"grace_period": 2, "ready_timeout": 300, "finish_timeout": 900},
        "runs_dir": str(a.out / "runs"),
    }
    if a.backend == "local":
        if a.cpus_per_task:
            data["placement"] = {"cpus_per_task": a.cpus_per_task}
    else:
        data["hosts"] = [
            {"name": h.name, "connect": h.public_address, "address": h.private_address}
            for h in hosts.hosts
        ]
        data["ssh"] = {
            "user": "root",
            "identity_file": str(hosts.client_key),
            "known_hosts": str(hosts.known_hosts),
            "python": python,
            "remote_runs_dir": str(a.out / "remote"),
        }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def case_name(a: argparse.Namespace, workers: int, rate: str, model: str) -> str:
    return f"w{workers}-{rate}-{model}" + ("-sync" if a.sync else "")


def model_batch(model: str, batch: int) -> tuple[str, int]:
    """``inception3@32``: the network and its batch per worker (``--batch`` without ``@``)."""
    network, _, given = model.partition("@")
    return network, int(given) if given else batch


def local_python(folder: Path) -> str:
    """An interpreter that imports this checkout's tflaunch and keeps the caller's PYTHONPATH
    (where carried wheels, TensorFlow's among them, are)."""
    return _python(folder / f"python-{ROOT.name}-local", f"{ROOT}${{PYTHONPATH:+:$PYTHONPATH}}")


def ssh_python(folder: Path) -> str:
    """``ssh.python``: sshd hands remote commands a fresh environment, so this checkout and the
    caller's PYTHONPATH (where carried wheels, TensorFlow's among them, are) are written in."""
    given = os.environ.get("PYTHONPATH")
    if not given:
        return checkout_python(folder, ROOT)
    return _python(folder / f"python-{ROOT.name}-ssh", f"{ROOT}:{given}")


def _python(path: Path, pythonpath: str) -> str:
    path.write_text(f'#!/bin/sh\nPYTHONPATH={pythonpath} exec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return str(path)


def tflaunch(*args: str, log: Path) -> tuple[int, str, float]:
    """Run a tflaunch command, its output into ``log``; (exit code, output, seconds)."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "tflaunch", *args], cwd=ROOT, text=True, capture_output=True
    )
    seconds = time.monotonic() - started
    log.write_text(proc.stdout + proc.stderr)
    return proc.returncode, proc.stdout, seconds


def grid_args(a: argparse.Namespace) -> list[str]:
    out = ["--max-ps", str(a.max_ps)]
    for flag in ("updates", "placements", "transfers"):
        if getattr(a, flag):
            out += [f"--{flag}", getattr(a, flag)]
    if a.verify:
        out += ["--verify", str(a.verify), "--verify-steps", str(a.verify_steps)]
        out += ["--verify-rounds", str(a.verify_rounds)]
    return out


class OutOfBudget(Exception):
    """``--budget`` is spent: the case goes on in a later call."""


class Budget:
    def __init__(self, seconds: float) -> None:
        self.seconds, self.started = seconds, time.monotonic()

    def check(self) -> None:
        if self.seconds and time.monotonic() - self.started >= self.seconds:
            raise OutOfBudget


def mean_rate(runs: list[float | None]) -> float | None:
    """A point's figure: the mean of its runs, or None when any failed (a setting that fails
    now and then is not one to pick)."""
    if not runs or any(r is None for r in runs):
        return None
    return round(statistics.fmean(runs), 2)


def pick_index(document: dict, settings: list[ts.Setting]) -> int:
    """Tune's pick among the ranked settings: ``tune.json``'s ``pick`` (after ``--verify``, the
    measured best of the top K), else the top of the ranking."""
    pick = document.get("pick")
    if not pick:
        return 0
    return settings.index(ts.Setting(**{k: pick[k] for k in FIELDS}))


def run_case(
    a: argparse.Namespace, hosts, workers: int, rate: str, model: str, budget: Budget
) -> dict:
    """One case, resumed from ``case.json``; raises OutOfBudget when the budget ends it early."""
    name = case_name(a, workers, rate, model)
    folder = a.out / name
    folder.mkdir(parents=True, exist_ok=True)
    state_path = folder / "case.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {}

    def save() -> None:
        state_path.write_text(json.dumps(state, indent=1))

    if hosts is not None:
        from tests.hosts import ssh_hosts  # the SSH hosts' module needs pytest: here only

        ssh_hosts.shape(hosts, rate)
    path = folder / "cluster.yaml"
    if "tune" not in state:
        budget.check()
        cluster_file(a, hosts, path, workers, model)
        print(f"== {name}: tune", flush=True)
        tune_args = ["--steps", str(a.steps), "--warmup", str(a.warmup), *grid_args(a)]
        code, out, tune_s = tflaunch("tune", str(path), *tune_args, log=folder / "tune.log")
        if code != 0:
            raise SystemExit(f"tune failed ({code}); see {folder / 'tune.log'}")
        print("\n".join(line for line in out.splitlines() if not line.startswith("[")), flush=True)
        tune_dir = Path(_tune_dir_of(folder / "tune.log"))
        state["tune"] = {"seconds": tune_s, "dir": str(tune_dir)}
        save()
    tune_dir = Path(state["tune"]["dir"])
    document = json.loads((tune_dir / "tune.json").read_text())
    ranked = document["ranked"]
    settings = [ts.Setting(**{k: r[k] for k in FIELDS}) for r in ranked]
    file = ClusterFile.read(path)
    knobs = ts.Knobs.of(file.config.program.argv)
    sweep = state.setdefault("sweep", [])
    for i, (setting, row) in enumerate(zip(settings, ranked, strict=True), 1):
        if i <= len(sweep):
            continue
        budget.check()
        argv = ts.setting_argv(file.config.program.argv, setting, knobs)
        point = folder / f"point{i}.yaml"
        point.write_text(yaml.safe_dump(file.document_with(setting, argv)))
        print(f"== {name}: sweep {i}/{len(settings)} {setting.label}", flush=True)
        runs, seconds = [], 0.0
        for r in range(a.repeats):
            log = folder / (f"point{i}.log" if r == 0 else f"point{i}-{r + 1}.log")
            code, out, took = tflaunch("up", str(point), log=log)
            seconds += took
            runs.append(bench.parse_total(out) if code == 0 else None)
        measured = mean_rate(runs)
        print(
            f"   {measured if measured is not None else 'FAILED'} img/s "
            f"{'(runs ' + ', '.join(str(x) for x in runs) + ') ' if len(runs) > 1 else ''}"
            f"(predicted {row['images_per_sec']:.2f}) in {seconds:.0f} s",
            flush=True,
        )
        sweep.append(
            {
                **setting.to_dict(),
                "predicted": row["images_per_sec"],
                "verified": row.get("measured"),
                "measured": measured,
                "runs": runs,
                "seconds": seconds,
            }
        )
        save()
    full = ts.enumerate_settings(a.max_ps, knobs)
    if a.backend == "ssh":
        full = [
            s
            for s in full
            if s.ps_hosts != "dedicated" or s.ps + workers / file.workers_per_host <= a.hosts
        ]
    else:  # one host: no PS host of its own
        full = [s for s in full if s.ps_hosts != "dedicated"]
    return {
        "case": name,
        "backend": a.backend,
        "full_grid_points": len(full),  # every setting tune ranks when the grid is not narrowed
        "workers": workers,
        "rate": rate,
        "model": model,
        "verify": a.verify,
        "tune_s": state["tune"]["seconds"],
        "tune_dir": str(tune_dir),
        "tune_phases_s": document["calibration"]["phases_s"],
        "sweep_s": sum(p["seconds"] for p in sweep),
        "pick": pick_index(document, settings),
        "verify_spread": verify_spread(document),
        "sweep": sweep,
    }


def verify_spread(document: dict) -> float | None:
    """The verify race's run-to-run spread, pooled over its settings' runs (None: no race)."""
    from tflaunch.tools.tune_verify import pooled_spread

    spread, df = pooled_spread(
        [(r.get("verify") or {}).get("runs") or [] for r in document["ranked"]]
    )
    return spread if df else None


def label(row: dict) -> str:
    return ts.Setting(
        **{k: row[k] for k in ("ps", "update", "strategy", "transfer", "ps_hosts")}
    ).label


def report(out: Path) -> None:
    results = (
        json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else []
    )
    print("\n".join(table_lines(results)))
    verify_lines([r for r in results if not r.get("verify")])


def table_lines(results: list[dict]) -> list[str]:
    """The table, one row per case: the sweep's best, tune's pick (after ``--verify K`` when it
    ran with it) and the pick's rate measured in the sweep, both wall times and their ratio; then
    the count of picks within 5 % and of cases at most 1/5 of the sweep's time, and the model's
    error over every point."""
    header = (
        "| setting | points | sweep best | img/s | tune's pick | its img/s (sweep) | of best "
        "| tune s | sweep s | ratio | full grid: points, est. sweep s, ratio |"
    )
    lines = [header, "|---" * 11 + "|"]
    hits = fast = rows = 0
    for r in results:
        measured = [p for p in r["sweep"] if p["measured"] is not None]
        if not measured:
            continue
        rows += 1
        best = max(measured, key=lambda p: p["measured"])
        pick = r["sweep"][r["pick"]]
        pick_rate = pick["measured"]
        share = pick_rate / best["measured"] if pick_rate is not None else None
        within = share is not None and share >= 1 - WITHIN
        hits += within
        ratio = r["tune_s"] / r["sweep_s"]
        fast += ratio <= 0.2
        # The full grid's sweep, estimated: the measured points' mean time x its points.
        full_s = r["sweep_s"] / len(r["sweep"]) * r["full_grid_points"]
        how = f" (verify {r['verify']})" if r.get("verify") else " (model)"
        network, at, batch = r["model"].partition("@")
        setting = f"{r['workers']} workers, {r['rate']}, {network}{f' batch {batch}' if at else ''}"
        runs = max(len(p.get("runs") or [None]) for p in r["sweep"])  # --repeats
        points = f"{len(measured)}/{len(r['sweep'])}{f', {runs} runs each' if runs > 1 else ''}"
        lines.append(
            f"| {setting} | {points} | {label(best)} | "
            f"{best['measured']:.2f} | {label(pick)}{how} | "
            f"{'failed' if pick_rate is None else f'{pick_rate:.2f}'} | "
            f"{'-' if share is None else f'{100 * share:.0f} %'} | "
            f"{r['tune_s']:.0f} | {r['sweep_s']:.0f} | {ratio:.2f} | "
            f"{r['full_grid_points']}, {full_s:.0f}, {r['tune_s'] / full_s:.2f} |"
        )
    errors = [
        abs(p["predicted"] / p["measured"] - 1)
        for r in results
        for p in r["sweep"]
        if p["measured"]
    ]
    if rows:
        lines += [
            "",
            f"tune's pick within {100 * WITHIN:.0f} % of the sweep's best in {hits} of {rows} "
            f"settings; tune's time at most 1/5 of the sweep's in {fast} of {rows}",
        ]
    if errors:
        lines.append(
            f"model error over every point: median {100 * statistics.median(errors):.1f} %, "
            f"largest {100 * max(errors):.1f} %"
        )
    spreads = [f"{r['case']} {spread_text(r)}" for r in results if spread_text(r)]
    if spreads:
        lines.append("run-to-run spread: " + "; ".join(spreads))
    return lines


def spread_text(case: dict) -> str:
    """A case's run-to-run spread: the median over the sweep's points run more than once
    (``--repeats``), and the verify race's pooled spread (tune.json's ``verify`` runs)."""
    from tflaunch.tools.tune_verify import relative_spread

    repeated = [
        relative_spread(p["runs"])
        for p in case["sweep"]
        if len(p.get("runs") or []) > 1 and None not in p["runs"]
    ]
    parts = [f"sweep {100 * statistics.median(repeated):.1f} %"] if repeated else []
    if case.get("verify_spread") is not None:
        parts.append(f"verify {100 * case['verify_spread']:.1f} %")
    # A setting tune's verify ran and the sweep ran again: two runs of one point (same steps
    # when --verify-steps is --steps), their difference over their mean.
    twice = [(p["verified"], p["measured"]) for p in case["sweep"] if p.get("verified")]
    if twice := [f"{200 * abs(a - b) / (a + b):.1f}" for a, b in twice if b]:
        parts.append(f"verify vs sweep run of one setting {', '.join(twice)} %")
    return ", ".join(parts)


def verify_lines(results: list[dict], k: int = 2) -> None:
    """What ``tune --verify K`` would have picked: the best measured of its top K, taken from
    the sweep's own runs of those settings (not runs of their own), at the cost of those runs'
    time on top of tune's (cases run without ``--verify``)."""
    if not results:
        return
    print(f"\nwith --verify {k} (the sweep's runs of tune's top {k} stand in for verify's):")
    for r in results:
        top = [p for p in r["sweep"][:k] if p["measured"] is not None]
        measured = [p for p in r["sweep"] if p["measured"] is not None]
        if not top or not measured:
            continue
        pick = max(top, key=lambda p: p["measured"])
        best = max(measured, key=lambda p: p["measured"])
        within = pick["measured"] >= (1 - WITHIN) * best["measured"]
        seconds = r["tune_s"] + sum(p["seconds"] for p in r["sweep"][:k])
        print(
            f"  {r['case']}: {label(pick)} {pick['measured']:.2f} img/s, "
            f"{100 * pick['measured'] / best['measured']:.0f} % of the best "
            f"({'within' if within else 'not within'} 5 %), {seconds:.0f} s against the "
            f"sweep's {r['sweep_s']:.0f} s ({seconds / r['sweep_s']:.2f})"
        )


def repredict(out: Path, given_loopback=None) -> None:
    """Each case's sweep against what the present model predicts from that case's own
    calibration (its tune run's inputs.json) for the same settings, each placed by its point's
    plan: for a model changed after the sweep was measured. Needs no hosts."""
    from tflaunch import launch
    from tflaunch.tools import tune_model
    from tflaunch.tools.perfmodel_inputs import load_inputs
    from tflaunch.tools.tune_calibrate import split_links

    results = json.loads((out / "results.json").read_text())
    for r in results:
        folder = out / r["case"]
        tune_dir = Path(r.get("tune_dir") or _tune_dir_of(folder / "tune.log"))
        if not tune_dir.exists():  # a results folder kept elsewhere: its runs/ID beside it
            tune_dir = out / "runs" / tune_dir.name
        inputs = load_inputs(tune_dir / "inputs.json")
        # the program's mode, which tune kept (tune.json's "sync"; older runs: asynchronous)
        sync = json.loads((tune_dir / "tune.json").read_text()).get("sync", False)
        loopback = None
        if (tune_dir / "netbench.json").exists():
            _, loopback = split_links(json.loads((tune_dir / "netbench.json").read_text()))
        if loopback is None and given_loopback is not None:
            loopback = given_loopback
            print(f"{r['case']}: its netbench measured no loopback; using --loopback")
        rows = []
        for i, point in enumerate(r["sweep"], 1):
            plan = launch.plan_cluster(load_config(folder / f"point{i}.yaml"))
            layout = tune_model.Layout(
                tuple(t.host for t in plan.tasks if t.job in ("chief", "worker")),
                tuple(t.host for t in plan.tasks if t.job == "ps"),
            )
            setting = ts.Setting(**{k: point[k] for k in FIELDS})
            modelled = ts.modelled_as(setting, inputs.nic)  # as tune predicts it
            p = tune_model.predict_setting(inputs, layout, modelled, loopback, sync)
            rows.append(
                ts.Ranked(setting, p.images_per_sec, p.step_s, p.bound, measured=point["measured"])
            )
        ranked = ts.rank(rows)
        pick = ranked[0]
        measured = [x for x in rows if x.measured is not None]
        best = max(measured, key=lambda x: x.measured)
        errors = [abs(x.images_per_sec / x.measured - 1) for x in measured]
        within = pick.measured is not None and pick.measured >= (1 - WITHIN) * best.measured
        print(
            f"{r['case']}: present model picks {pick.setting.label} (predicted "
            f"{pick.images_per_sec:.2f}, measured {pick.measured}); sweep best "
            f"{best.setting.label} {best.measured:.2f}; within 5 %: {'yes' if within else 'no'}; "
            f"median error {100 * statistics.median(errors):.1f} %"
        )
        for x in sorted(rows, key=lambda x: -(x.measured or 0)):
            print(
                f"    {x.setting.label:45s} measured {x.measured}  predicted {x.images_per_sec:.2f} ({x.bound})"
            )


def _tune_dir_of(log: Path) -> str:
    """The tune run's directory, from its first line ("tune FILE: W worker(s), backend B, run
    ID"; the runs are in the output folder's ``runs``)."""
    first = next(line for line in log.read_text().splitlines() if line.startswith("tune "))
    run_id = first.rsplit(" run ", 1)[1].strip()
    return str(log.parent.parent / "runs" / run_id)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--backend", choices=("ssh", "local"), default="ssh")
    p.add_argument("--hosts", type=int, default=4, help="ssh: how many test hosts")
    p.add_argument(
        "--cases", default="2:1gbit:resnet50", help="W:RATE:MODEL[@BATCH],... (batch: --batch)"
    )
    p.add_argument("--max-ps", type=int, default=2)
    p.add_argument("--updates", default="parameter_server,collective_all_reduce")
    p.add_argument("--placements", default="round_robin,lpt")
    p.add_argument("--transfers", default="none")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--image", type=int, default=75)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--intra", type=int, default=0, help="--num_intra_threads (0: TF's default)")
    p.add_argument(
        "--sync",
        action="store_true",
        help="the program runs synchronous PS steps (--cross_replica_sync), which tune keeps",
    )
    p.add_argument(
        "--cpus-per-task",
        type=int,
        default=0,
        help="local: cores bound to each task (placement.cpus_per_task; 0: unbound)",
    )
    p.add_argument(
        "--repeats", type=int, default=1, help="runs of each sweep point (its figure: their mean)"
    )
    p.add_argument("--verify", type=int, default=0, metavar="K", help="tune --verify K")
    p.add_argument("--verify-steps", type=int, default=3)
    p.add_argument("--verify-rounds", type=int, default=3, help="tune --verify-rounds")
    p.add_argument(
        "--budget",
        type=float,
        default=0,
        metavar="S",
        help="start no run once S seconds are spent (0: no limit); the next call goes on",
    )
    p.add_argument("--phase", choices=("run", "report", "repredict"), default="run")
    p.add_argument(
        "--loopback",
        default=None,
        metavar="US,MB_S",
        help="repredict: the loopback for cases whose netbench did not measure one",
    )
    a = p.parse_args()
    a.out = a.out.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.phase == "run":
        try:
            cases = parse_cases(a.cases, a.backend)
        except ValueError as err:
            print(f"--cases {a.cases!r}: {err}", file=sys.stderr)
            return 2
        store = a.out / "results.json"
        done = {r["case"] for r in json.loads(store.read_text())} if store.exists() else set()
        todo = [c for c in cases if case_name(a, *c) not in done]
        budget = Budget(a.budget)
        if a.backend == "ssh":
            from tests.hosts import ssh_hosts

            problem = ssh_hosts.missing_requirements()
            if problem:
                print(problem, file=sys.stderr)
                return 2
            with ssh_hosts.session(a.hosts) as hosts:
                run_cases(a, hosts, todo, budget, store)
        else:
            run_cases(a, None, todo, budget, store)
    if a.phase == "repredict":
        from tflaunch.tools.perfmodel_inputs import parse_link

        repredict(a.out, parse_link(a.loopback) if a.loopback else None)
        return 0
    report(a.out)
    return 0


def parse_cases(text: str, backend: str) -> list[tuple[int, str, str]]:
    """``W:RATE:MODEL,...``; the local backend's rate is ``loopback`` (one host, unshaped)."""
    cases = []
    for item in text.split(","):
        parts = item.split(":")
        if len(parts) != 3 or not parts[0].isdigit() or int(parts[0]) < 1:
            raise ValueError(f"{item!r} is not W:RATE:MODEL (e.g. 8:1gbit:inception3@32)")
        workers, rate, model = int(parts[0]), parts[1], parts[2]
        network, _, batch = model.partition("@")
        if not network or (batch and (not batch.isdigit() or int(batch) < 1)):
            raise ValueError(f"{item!r}: MODEL is a network, or NETWORK@BATCH (inception3@32)")
        if backend == "local" and rate != "loopback":
            raise ValueError(
                f"{item!r}: the local backend's tasks talk over loopback: RATE is loopback"
            )
        if backend == "ssh" and rate == "loopback":
            raise ValueError(f"{item!r}: the SSH hosts' links are shaped: give a rate (1gbit)")
        cases.append((workers, rate, model))
    return cases


def run_cases(a: argparse.Namespace, hosts, todo, budget: Budget, store: Path) -> None:
    for workers, rate, model in todo:
        try:
            result = run_case(a, hosts, workers, rate, model, budget)
        except OutOfBudget:
            print(f"budget of {a.budget:.0f} s spent: run the same command again to go on")
            return
        done = json.loads(store.read_text()) if store.exists() else []
        store.write_text(json.dumps([*done, result], indent=1))
        report(a.out)


if __name__ == "__main__":
    sys.exit(main())
