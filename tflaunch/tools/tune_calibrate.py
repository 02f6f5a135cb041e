"""``tflaunch tune``'s measurements (phases 1 and 2 of :mod:`tflaunch.tools.tune`): the compute
of a lone worker and of W at once, bound as the file's plan binds them, and the link between a
worker host and a PS host; every run through the file's own backend (:mod:`tflaunch.launch`)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tflaunch import launch
from tflaunch.cluster.config import ClusterConfig
from tflaunch.cluster.plan import Plan
from tflaunch.errors import PlanError
from tflaunch.runtime.run import Run
from tflaunch.tools import perfmodel as pm
from tflaunch.tools import tune_settings as ts
from tflaunch.tools.perfmodel_inputs import compute_from_trace, link_from_netbench
from tflaunch.tools.tune_settings import TuneError
from tflaunch.tools.tune_verify import steps_for

PROBE_MODULE = "tflaunch.models.tune_probe"
PROBE_LINE = re.compile(r"^tune-probe: (\{.*\})\s*$", re.M)
VARIABLES_LINE = re.compile(r"^tune-variables: (\[.*\])\s*$", re.M)
RESULT_LINE = re.compile(r"^tune-result: (\{.*\})\s*$", re.M)
NETBENCH_CAP = 64 * 1024**2  # the largest netbench message
Echo = Callable[[str], None]
Variables = tuple[tuple[str, tuple[int, ...], int], ...]


@dataclass(frozen=True)
class TuneOptions:
    """``tflaunch tune``'s options."""

    steps: int = 10  # timed steps of each calibration worker
    warmup: int = 3
    max_ps: int | None = None  # default: max(the file's PS, its workers)
    verify: int = 0
    verify_steps: int = 6  # the fewest timed steps of a verify run (more where steps vary)
    verify_rounds: int = 3  # rounds of the verify race at the most
    verify_budget_s: float = 0.0  # no verify round starts that would pass it (0: no limit)
    apply: bool = False
    link: pm.Link | None = None  # given: no netbench
    model: str | None = None  # a program that is not the benchmark: its network's name
    batch_size: int | None = None  # ... and its batch per worker
    trace_steps: str = "3:3"
    runs_dir: str | None = None
    out: Path | None = None  # the runnable tuned file; default beside the cluster file
    force: bool = False  # out may replace a file tune did not write, or a symlink (not its target)
    updates: tuple[str, ...] = ()  # the grid, narrowed (empty: all the program allows)
    placements: tuple[str, ...] = ()
    transfers: tuple[str, ...] = ()
    ps_hosts: tuple[str, ...] = ts.PS_HOSTS


@dataclass
class Calibration:
    """What the measurements gave the model (written to tune.json)."""

    compute_s: float = 0.0
    lone_img_s: float | None = None
    together_img_s: float | None = None
    shared_cores: bool = False
    compute_at: tuple[tuple[int, float], ...] = ()
    cores_per_host: int = 0  # 0: not known (a traced program's run does not say)
    host_cores: dict[str, int] = dataclasses.field(default_factory=dict)  # plan host: usable
    step_times: tuple[float, ...] = ()  # the lone worker's timed steps
    link: dict[str, float] = dataclasses.field(default_factory=dict)
    loopback: dict[str, float] = dataclasses.field(default_factory=dict)  # within a host
    nic: bool = False
    runs: dict[str, str] = dataclasses.field(default_factory=dict)
    phases_s: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Program:
    """The file's program as tune sees it."""

    argv: tuple[str, ...]
    benchmark: bool
    model: str
    num_classes: int
    batch_size: int
    knobs: ts.Knobs

    @classmethod
    def of(cls, config: ClusterConfig, options: TuneOptions) -> Program:
        argv = config.program.argv
        benchmark = ts.BENCHMARK_MODULE in argv
        if benchmark:
            model = ts.flag_value(argv, "--model") or "inception3"
            batch = int(ts.flag_value(argv, "--batch_size") or 32)
            classes = int(ts.flag_value(argv, "--num_classes") or 1001)
        else:
            if not options.model or not options.batch_size:
                raise TuneError(
                    f"{config.source}: the program is not tflaunch.models.benchmark, so tune "
                    "cannot read its network and batch from its flags: give --model NAME (a "
                    "network of 'tflaunch placement --model', e.g. mnist) and --batch-size N."
                )
            model, batch, classes = options.model, options.batch_size, 1001
        knobs = ts.Knobs.of(argv).limited(options.updates, options.placements, options.transfers)
        return cls(tuple(argv), benchmark, model, classes, batch, knobs)


class TuneInterrupted(TuneError):
    """A run of tune's was stopped (Ctrl-C, a signal, ``tflaunch down``): tune stops too."""


class Calibrator:
    """The measuring half of one tune: the file, the run directory, what was measured."""

    def __init__(
        self,
        config: ClusterConfig,
        program: Program,
        options: TuneOptions,
        run: Run,
        cal: Calibration,
        say: Echo,
    ) -> None:
        self.config, self.program, self.options = config, program, options
        self.run, self.cal, self.say = run, cal, say
        self.runs_dir = str(run.dir / "runs")
        self.inputs: pm.Inputs | None = None

    def timed(self, name: str, body: Callable[[], Any]) -> Any:
        started = time.monotonic()
        self.say(f"== {name} ==")
        try:
            return body()
        finally:
            self.cal.phases_s[name] = round(time.monotonic() - started, 1)
            self.say(f"{name}: {self.cal.phases_s[name]:.1f} s")

    # -- running clusters ---------------------------------------------------------------------

    def launch(self, label: str, config: ClusterConfig) -> Run:
        """Run ``config`` to its end through its backend, its output in ``<label>.log``."""
        log = self.run.dir / f"{label}.log"
        with log.open("w", encoding="utf-8") as out, contextlib.redirect_stdout(out):
            sub, outcome = launch.run_cluster(config, self.runs_dir)
        self.cal.runs[label] = sub.id
        if outcome.interrupted:
            raise TuneInterrupted(f"interrupted during {label} (exit {outcome.code}).")
        if outcome.code != 0:
            raise TuneError(
                f"the {label} run failed (exit {outcome.code}); its output is in {log} and "
                f"its run directory {sub.dir}."
            )
        return sub

    def training_logs(self, sub: Run, count: int) -> list[str]:
        """The logs of the first ``count`` training tasks (the chief first)."""
        names = [f"chief-{i}.log" for i in range(self.config.roles.chief)]
        names += [f"worker-{i}.log" for i in range(self.config.roles.worker)]
        texts = []
        for name in names[:count]:
            try:
                texts.append(sub.log_path(name).read_text(encoding="utf-8", errors="replace"))
            except FileNotFoundError:
                raise TuneError(f"no log {name} in {sub.dir}: the task did not run.") from None
        return texts

    # -- phase 1: compute ---------------------------------------------------------------------

    def compute(self) -> Variables:
        if not self.program.benchmark:
            return self.traced_compute()
        workers = self.config.roles.worker + self.config.roles.chief
        lone = self.probe_run("lone", 1, variables=True)
        self.cal.lone_img_s = lone["rates"][0]
        self.cal.cores_per_host = lone["cores"]
        self.cal.host_cores = host_cores(lone["probes"], launch.plan_cluster(self.config))
        self.cal.step_times = lone["step_times"][0]
        self.cal.compute_s = self.program.batch_size / lone["rates"][0]
        self.say(
            f"a lone worker: {lone['rates'][0]:.2f} img/s ({self.cal.compute_s * 1e3:.0f} ms a "
            f"step of {self.program.batch_size}) on {lone['cores']} core(s)"
        )
        kind = core_sharing(lone["probes"])
        self.cal.shared_cores = kind == "shared"
        if workers > 1 and kind == "shared":
            self.say("the workers share cores (one machine, overlapping cores): a queue for them")
        elif workers > 1 and kind == "apart":
            self.say("each worker on a machine of its own: no contention between them")
        elif workers > 1:
            # as many timed steps as the lone worker's spread asks for (its median over W
            # workers is steadier still), not more than --steps
            steps = steps_for(self.cal.step_times, min(3, self.options.steps), self.options.steps)
            together = self.probe_run("together", workers, steps)
            rate = statistics.median(together["rates"])
            self.cal.together_img_s = rate
            self.cal.compute_at = ((workers, self.program.batch_size / rate),)
            self.say(
                f"{workers} lone workers at once on cores of their own: {rate:.2f} img/s each "
                f"({relative_speed(rate, self.cal.lone_img_s)} than alone, {steps} timed steps): "
                "the contention input"
            )
        if lone["variables"] is None:
            raise TuneError("the lone worker reported no variables; see the lone run's log.")
        return lone["variables"]

    def probe_run(self, label: str, count: int, steps: int = 0, variables: bool = False) -> dict:
        """The file's plan with every task a probe and the first ``count`` workers computing
        (``steps`` timed steps each; 0: ``--steps``); with ``variables``, the first also reports
        the model's variables (its benchmark builds them: no TensorFlow process of their own)."""
        steps = steps or self.options.steps
        argv = timed_argv(self.program.argv, steps, self.options.warmup)
        flags = ["--port", "{port}", "--run", str(count), *(["--variables"] if variables else [])]
        config = replace(
            self.config,
            name=f"{self.config.name}-{label}",
            program=replace(self.config.program, argv=tuple(self.probe_argv(argv, flags))),
        )
        sub = self.launch(label, config)
        texts = self.training_logs(sub, self.config.roles.worker + self.config.roles.chief)
        rates, probes, variables, steps = [], [], None, []
        for i, text in enumerate(texts):
            probes += [json.loads(m) for m in PROBE_LINE.findall(text)]
            if i >= count:
                continue
            result = benchmark_result(text, f"a {label} worker", sub)
            rates.append(result.worker)
            steps.append(result.step_times)
            if result.variables is not None:
                variables = result.variables
        cores = min((int(p.get("cores", 0)) for p in probes), default=0)
        return {
            "rates": rates, "cores": cores, "variables": variables, "probes": probes,
            "step_times": steps,
        }  # fmt: skip

    def probe_argv(self, argv: Sequence[str], flags: Sequence[str]) -> list[str]:
        """Every task of the plan runs :mod:`tflaunch.models.tune_probe` around ``argv``."""
        python = argv[0] if list(argv[1:2]) == ["-m"] else self.python()
        probe = [python, "-m", PROBE_MODULE, "--job", "{job_name}", "--index", "{task_index}"]
        return [*probe, "--chief", str(self.config.roles.chief), *flags, "--", *argv]

    def python(self) -> str:
        return launch.backend_for(self.config.backend).python(self.config)

    def traced_compute(self) -> Variables:
        """Any program: one worker traced; its step time less communication."""
        from tflaunch.launchers.base import LaunchOptions
        from tflaunch.runtime.run import new_run_id

        roles = replace(self.config.roles, worker=1, chief=0, evaluator=0)
        config = replace(self.config, name=f"{self.config.name}-traced", roles=roles)
        run_id = new_run_id(config.name)
        config, request = launch.traced(config, self.runs_dir, run_id, self.options.trace_steps)
        log = self.run.dir / "traced.log"
        with log.open("w", encoding="utf-8") as out, contextlib.redirect_stdout(out):
            outcome = launch.up(
                config,
                self.config.source,
                self.runs_dir,
                run_id,
                options=LaunchOptions(trace=request),
            )
        self.cal.runs["traced"] = run_id
        if isinstance(outcome, str) or outcome.code != 0:
            raise TuneError(f"the traced one-worker run failed; see {log}.")
        sub = Run.open(self.runs_dir, run_id)
        compute_s, worker, steps = compute_from_trace(sub.dir / "trace")
        self.cal.compute_s = compute_s
        self.cal.lone_img_s = self.program.batch_size / compute_s
        self.cal.shared_cores = bool(
            not self.config.placement.cpus_per_task
            and len({t.host for t in launch.plan_cluster(self.config).tasks}) == 1
        )
        self.say(
            f"{worker}'s {steps} traced steps: {compute_s * 1e3:.0f} ms each without "
            f"communication ({self.cal.lone_img_s:.2f} img/s at batch {self.program.batch_size})"
        )
        return model_variables(self.program.model, self.program.num_classes)

    # -- phase 2: network ---------------------------------------------------------------------

    def network(self, variables: Sequence[tuple[str, tuple[int, ...], int]]) -> pm.Inputs:
        from tflaunch.tools import netbench_command as nb

        sizes = netbench_sizes(variables)
        if self.options.link is not None:
            link = self.options.link
            self.cal.nic = len(launch.backend_for(self.config.backend).hosts(self.config)) > 1
            self.say("link given (--link): no netbench")
        else:
            config = pair_config(self.config)
            options: dict[str, object] = {"min_repeats": 3, "max_seconds": 0.3}
            # netbench's other workers leave once their part is done, and with no PS test they
            # have none: the first worker would time transfers with a task that is gone. A PS
            # test of the smallest network keeps them until it has timed its pairs.
            if config.roles.worker > 1:
                options |= {"ps_model": "mnist", "ps_steps": 2}
            else:
                options |= {"ps_model": nb.NO_PS_MODEL}
            argv = nb.program_argv(self.python(), sizes, options)
            config = replace(config, program=replace(config.program, argv=tuple(argv)))
            sub = self.launch("netbench", config)
            result = nb.read_result(sub.log_path("worker-0.log"))
            write_json(self.run.dir / "netbench.json", result)
            (self.run.dir / "netbench.txt").write_text("\n".join(nb.report_lines(result)) + "\n")
            with contextlib.suppress(Exception):  # the plot is a picture; no matplotlib, none
                nb.plot(result, self.run.dir / "netbench.png")
            link, loopback = split_links(result)
            self.cal.nic = loopback is not link
            if self.cal.nic and loopback is not None:
                self.cal.loopback = {
                    "latency_s": loopback.latency_s,
                    "bandwidth": loopback.bandwidth,
                }
        self.cal.link = {"latency_s": link.latency_s, "bandwidth": link.bandwidth}
        self.say(
            f"link: {link.latency_s * 1e6:.0f} µs, {link.bandwidth / 1e6:.0f} MB/s"
            + (" between hosts (a NIC per host)" if self.cal.nic else " on one host (loopback)")
            + (
                f"; within a host {self.cal.loopback['bandwidth'] / 1e6:.0f} MB/s"
                if self.cal.loopback
                else ""
            )
        )
        self.inputs = pm.Inputs(
            self.cal.compute_s,
            self.program.batch_size,
            tuple(variables),
            link,
            0.0,
            self.cal.nic,
            self.cal.shared_cores,
            self.cal.compute_at,
        )
        write_json(self.run.dir / "inputs.json", self.inputs.to_dict())
        return self.inputs


def pair_config(config: ClusterConfig) -> ClusterConfig:
    """One PS and two workers of the file's hosts, the PS beside the first worker and the
    second on another host where the plan allows: the link between hosts and the loopback
    within one, in one run; else one PS and one worker on the one host."""
    roles = replace(config.roles, ps=1, worker=2, chief=0, evaluator=0)
    base = replace(
        config,
        name=f"{config.name}-netbench",
        roles=roles,
        placement=replace(config.placement, ps="colocated", ps_per_host=None, workers_per_host=1),
    )
    try:
        plan = launch.plan_cluster(base)
        if len({t.host for t in plan.tasks}) > 1:
            return base
    except PlanError:
        pass
    return replace(base, roles=replace(roles, worker=1), placement=config.placement)


def split_links(result: dict) -> tuple[pm.Link, pm.Link | None]:
    """netbench's figures between hosts and within one: (the link between hosts, or the
    loopback when every pair was on one host; the loopback when measured, else None)."""
    rows = result.get("point_to_point") or []
    across = [r for r in rows if r["src_host"] != r["dst_host"]]
    within = [r for r in rows if r["src_host"] == r["dst_host"]]
    loopback = link_from_netbench({**result, "point_to_point": within}) if within else None
    if not across:
        if loopback is None:
            raise TuneError("netbench measured no pair of tasks.")
        return loopback, loopback
    return link_from_netbench({**result, "point_to_point": across}), loopback


def host_cores(probes: Sequence[dict], plan: Plan) -> dict[str, int]:
    """Per host of the plan, the cores its probes said the host lets tasks use (their agent's)."""
    hosts = {t.name: t.host for t in plan.tasks}
    out: dict[str, int] = {}
    for probe in probes:
        host, cores = hosts.get(str(probe.get("task"))), probe.get("host_cores")
        if host is not None and isinstance(cores, int) and cores > 0:
            out[host] = min(out.get(host, cores), cores)
    return out


def relative_speed(rate: float, alone: float) -> str:
    """How a worker among W compared with one alone: "1.20x slower", or "1.21x faster" (noise,
    or the lone run's warm-up: on cores of their own W at once measured faster than one alone
    on the lent 16-core machine, and was printed as "0.83x slower")."""
    if rate <= alone:
        return f"{alone / rate:.2f}x slower"
    return f"{rate / alone:.2f}x faster"


def core_sharing(probes: Sequence[dict]) -> str:
    """How the training tasks' cores relate, from their probes: ``shared`` (two on one kernel
    with overlapping cores: namespace hosts or containers of one machine, or unpinned tasks of
    one host), ``disjoint`` (several on one kernel, each on cores of its own: contention for
    caches and memory only) or ``apart`` (each on a machine of its own)."""
    by_kernel: dict[str, list[set[int]]] = {}
    for probe in probes:
        by_kernel.setdefault(str(probe.get("kernel")), []).append(set(probe.get("cpus") or ()))
    together = [sets for sets in by_kernel.values() if len(sets) > 1]
    if not together:
        return "apart"
    for sets in together:
        for i, a in enumerate(sets):
            if any(a & b for b in sets[i + 1 :]):
                return "shared"
    return "disjoint"


def netbench_sizes(variables: Sequence[tuple[str, tuple[int, ...], int]]) -> list[int]:
    """1 KiB for the latency, and the largest variable and the whole model (at most 64 MiB) for
    the bandwidth's slope: the sizes a PS's transfers are made of."""
    sizes = [math.prod(shape) * size for _, shape, size in variables]
    total = min(sum(sizes), NETBENCH_CAP)
    largest = min(max(sizes, default=0), total // 2)
    return sorted({1024, max(largest, 64 * 1024), max(total, 256 * 1024)})


def model_variables(model: str, num_classes: int) -> Variables:
    """The network's trainable variables, built once by the probe in a process of its own on
    this machine (TensorFlow's, and its log level, stay out of tune's process)."""
    from tflaunch.models.registry import UnknownModelError, get_model_spec
    from tflaunch.tools.placement_command import require_tensorflow

    try:
        get_model_spec(model)
    except UnknownModelError as exc:
        raise TuneError(str(exc)) from None
    require_tensorflow("tune", "builds the model's variables")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}  # the graph build's C++ chatter
    argv = [sys.executable, "-m", PROBE_MODULE, "--print-variables", f"{model}:{num_classes}"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    found = VARIABLES_LINE.findall(done.stdout)
    if done.returncode != 0 or not found:
        raise TuneError(
            f"building {model}'s variables failed (exit {done.returncode}): "
            + (done.stderr.strip().splitlines() or ["no output"])[-1]
        )
    try:
        return parse_variables(json.loads(found[-1]))
    except ValueError as exc:
        raise TuneError(f"building {model}'s variables gave a malformed list: {exc}.") from None


def parse_variables(rows: object) -> Variables:
    """A model's variables as a probe reported them (``[[name, [dims], dtype size], ...]``),
    checked: the line comes from a task's log, so anything else is a ``ValueError`` that says
    what is wrong."""
    if not isinstance(rows, list) or not rows:
        raise ValueError(
            f"expected a non-empty list of [name, shape, dtype size], got {rows!r:.80}"
        )
    out = []
    for i, row in enumerate(rows):
        if not (isinstance(row, list) and len(row) == 3):
            raise ValueError(f"variable {i}: expected [name, shape, dtype size], got {row!r:.80}")
        name, shape, size = row
        dims_ok = isinstance(shape, list) and all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        )
        if not isinstance(name, str) or not dims_ok:
            raise ValueError(f"variable {i}: expected a name and a list of sizes, got {row!r:.80}")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= 16:
            raise ValueError(f"variable {i}: dtype size {size!r:.20} is not 0 to 16 bytes")
        out.append((name, tuple(shape), size))
    return tuple(out)


def timed_argv(argv: Sequence[str], steps: int, warmup: int) -> list[str]:
    """The benchmark's ``argv`` for ``steps`` timed steps after ``warmup``, one report."""
    out = list(argv)
    for flag, value in (
        ("--num_batches", steps),
        ("--num_warmup_batches", warmup),
        ("--display_every", steps),
    ):
        out = ts.with_flag(out, flag, str(value))
    return out


@dataclass(frozen=True)
class BenchResult:
    """What one training task of the benchmark measured: its own images/sec, the cluster's
    (the sum over the workers, on the chief or worker 0) and its timed steps' seconds."""

    worker: float
    total: float
    step_times: tuple[float, ...]
    variables: Variables | None = None  # the model's, where the probe was asked for them


def benchmark_result(text: str, who: str, sub: Run) -> BenchResult:
    """The benchmark's ``--result_json`` figures a probe relayed (``tune-result:``) in a task's
    output."""
    found = RESULT_LINE.findall(text)
    if not found:
        raise TuneError(f"{who} reported no benchmark result; see {sub.dir}.")
    try:
        data = json.loads(found[-1])
        rates = data["images_per_sec"]
        steps = tuple(float(s) for s in data["step_times"])
        variables = parse_variables(data["variables"]) if "variables" in data else None
        return BenchResult(float(rates["worker"]), float(rates["total"]), steps, variables)
    except (ValueError, TypeError, KeyError) as exc:
        raise TuneError(f"{who} reported a malformed result ({exc!r}); see {sub.dir}.") from None


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
