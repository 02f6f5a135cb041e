"""``tflaunch tune CLUSTER_FILE``: from a cluster file to its fastest settings, measured on that
cluster, in minutes.

Phases, each timed and printed, all through the file's own backend (:mod:`tflaunch.launch`, the
path ``up`` takes), everything measured kept in one run directory (``<runs_dir>/<name>-tune-…``):

1. compute: the file's own plan runs :mod:`tflaunch.models.tune_probe` in every task's place, so
   each worker is bound as the real run binds it but computes alone: first one lone worker, then
   (where workers share hosts or cores) all W at once, the contention input. Each probe prints
   its cores and its host's, the first the model's variables (sized on the cluster: no
   TensorFlow here). A program other than ``tflaunch.models.benchmark`` instead runs once as one
   worker with ``--trace``; its step time less communication is the compute (``model
   --from-run``).
2. network: ``netbench`` between a worker host and a PS host of the plan (dedicated when the
   hosts allow, so the link crosses a NIC), at sizes from the model's variables.
3. model: :mod:`tflaunch.tools.perfmodel` over every setting the file allows
   (:mod:`tflaunch.tools.tune_settings`) that can run: each is planned on the backend's hosts
   and given the checks ``up`` makes (the backend's checks from here, and the cores each host
   lets tasks use, as calibration measured them); one that fails is left out, with the reason.
4. the ranked table, the top's margin, where the model is out of its depth (such a setting is
   not picked unmeasured); ``--verify K`` races the top K (:mod:`tflaunch.tools.tune_verify`);
   ``tuned.yaml``; ``--apply`` starts the tuned file.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from tflaunch import launch
from tflaunch.cluster.config import ClusterConfig
from tflaunch.cluster.plan import Plan
from tflaunch.errors import PlanError
from tflaunch.runtime.run import Run
from tflaunch.tools import perfmodel as pm
from tflaunch.tools import tune_model
from tflaunch.tools import tune_settings as ts
from tflaunch.tools.tune_calibrate import (
    Calibration,
    Calibrator,
    Echo,
    Program,
    TuneInterrupted,
    TuneOptions,
    benchmark_result,
    timed_argv,
    write_json,
)
from tflaunch.tools.tune_file import ClusterFile, check_tuned_path, write_tuned
from tflaunch.tools.tune_model import Layout
from tflaunch.tools.tune_settings import Ranked, Setting, TuneError
from tflaunch.tools.tune_verify import Race, relative_spread, steps_for

# A verify run's timed steps: at least --verify-steps, at most this many times as many.
VERIFY_STEPS_FACTOR = 4


def tune(cluster_file: str, options: TuneOptions, echo: Echo) -> int:
    """The whole command; returns the exit code (the applied run's, or 0)."""
    file = ClusterFile.read(cluster_file)
    config = file.config
    program = Program.of(config, options)
    workers = config.roles.worker + config.roles.chief
    if workers < 1:
        raise TuneError(f"{config.source}: roles has no worker to tune for.")
    check_tuned_path(file, options.out, options.force)  # refused now, not after measuring
    calibrated, problem = calibration_config(config)  # refused now if not even workers run
    run = Run.create(
        options.runs_dir or config.runs_dir,
        f"{config.name}-tune",
        None,
        int(config.run_dir_mode, 8),
    )
    run.update_meta(
        run_id=run.id,
        name=f"{config.name}-tune",
        backend=config.backend,
        state="running",
        cluster_file=str(Path(cluster_file).resolve()),
        created=time.time(),
    )
    echo(f"tune {cluster_file}: {workers} worker(s), backend {config.backend}, run {run.id}")
    text: list[str] = []

    def say(line: str) -> None:
        text.append(line)
        echo(line)

    if problem:
        say(f"the file's own setting cannot start here ({problem}): calibrating without its PS")
    cal = Calibration()
    calibrator = Calibrator(calibrated, program, options, run, cal, say)
    session = Session(file, program, options, cal, say)
    state, code = "failed", 1
    try:
        variables = calibrator.timed("compute", calibrator.compute)
        inputs = calibrator.timed("network", lambda: calibrator.network(variables))
        session.inputs = inputs
        ranked = calibrator.timed("model", lambda: session.model(inputs, workers))
        if options.verify:
            ranked = calibrator.timed("verify", lambda: session.verify(ranked, calibrator))
        path = session.write(run)
        say(phases_line(cal.phases_s) + f"; everything measured is in {run.dir}")
        state, code = "succeeded", 0
    finally:
        write_json(run.dir / "tune.json", session.document())
        (run.dir / "tune.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
        run.update_meta(state=state, exit_code=code, ended=time.time())
    if not options.apply:
        echo(f"start it with: tflaunch up {path}")
        return 0
    echo(f"applying: tflaunch up {path}")
    assert session.tuned is not None  # written above
    outcome = launch.up(session.tuned, str(path), options.runs_dir)  # as validated, not re-read
    return 0 if isinstance(outcome, str) else outcome.code


def phases_line(phases_s: dict[str, float]) -> str:
    """Each phase's time and the total, in one line."""
    parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases_s.items())
    return f"phases: {parts}; total {sum(phases_s.values()):.1f} s"


def calibration_config(config: ClusterConfig) -> tuple[ClusterConfig, str | None]:
    """What calibration runs: the file's own setting, or where that cannot start here the file
    without its PS (a PS's probe only holds its cores, so the workers compute alike), and why
    the file's own cannot. TuneError when not even the workers alone can start: then no
    setting can."""
    problem = setting_problem(config, {})
    if problem is None:
        return config, None
    bare = replace(config, roles=replace(config.roles, ps=0))
    bare_problem = setting_problem(bare, {}) if config.roles.ps else problem
    if bare_problem is not None:
        raise TuneError(
            f"{config.source}: not even the file's workers can start here, so no setting can: "
            f"{bare_problem}."
        )
    return bare, problem


def setting_problem(config: ClusterConfig, host_cores: dict[str, int]) -> str | None:
    """:func:`runnable_problem` of ``config``'s plan, or why it does not plan."""
    try:
        plan = launch.plan_cluster(config)
    except PlanError as err:
        return f"its plan does not fit the hosts: {err}"
    return runnable_problem(config, plan, host_cores)


def runnable_problem(config: ClusterConfig, plan: Plan, host_cores: dict[str, int]) -> str | None:
    """Why the setting's cluster could not start, as ``up`` would refuse it: the backend's
    checks from here (local: cores, ports, programs; every backend: addresses), then each
    host's cores as calibration measured them against the tasks' binding. None: it can run."""
    problems = launch.problems_here(config, plan)
    if problems:
        return problems[0].rstrip(".")
    for host in plan.hosts_with_tasks():
        tasks = list(plan.tasks_on(host.name))
        slots = max((max(t.cpus) + 1 for t in tasks if t.cpus), default=0)
        cores = host_cores.get(host.name)
        if cores and slots > cores:
            return (
                f"{host.name} lets tasks use {cores} cores, but placement.cpus_per_task binds "
                f"its {len(tasks)} tasks to {slots}"
            )
    return None


class Session:
    """One tune after its measurements: what can run, the model's ranking, the verification,
    the pick, tuned.yaml and tune.json."""

    def __init__(
        self, file: ClusterFile, program: Program, options: TuneOptions, cal: Calibration,
        say: Echo,
    ) -> None:  # fmt: skip
        self.file, self.config, self.program = file, file.config, program
        self.options, self.cal, self.say = options, cal, say
        self.inputs: pm.Inputs | None = None
        self.ranked: list[Ranked] = []
        self.left_out: list[tuple[Setting, str]] = []
        self.verified: dict[Setting, dict] = {}  # the race's runs of each verified setting
        self.pick: Ranked | None = None  # what tuned.yaml holds
        self.tuned: ClusterConfig | None = None  # its configuration, as written and validated

    def model(self, inputs: pm.Inputs, workers: int) -> list[Ranked]:
        """Every setting that can run, ranked by the model; the rest left out with a reason."""
        max_ps = self.options.max_ps or max(self.config.roles.ps, workers)
        settings = ts.enumerate_settings(max_ps, self.program.knobs, self.options.ps_hosts)
        layouts = self.layouts(settings)
        planned = {key: v for key, v in layouts.items() if isinstance(v, Layout)}
        runnable = [st for st in settings if (st.ps, st.ps_hosts) in planned]
        self.left_out = [
            (st, str(layouts[(st.ps, st.ps_hosts)])) for st in settings if st not in runnable
        ]
        ctx = ts.Context(
            workers,
            self.cal.cores_per_host,
            inputs.link.bandwidth,
            inputs.model_bytes,
            self.cal.shared_cores,
            tuple(w for w, _ in self.cal.compute_at),
            nic=inputs.nic,
            sync=self.program.knobs.sync,
        )
        loop = self.cal.loopback
        loopback = pm.Link(loop["latency_s"], loop["bandwidth"]) if loop else None
        rows = []
        for st in runnable:
            layout = planned[(st.ps, st.ps_hosts)]
            modelled = ts.modelled_as(st, inputs.nic)
            p = tune_model.predict_setting(inputs, layout, modelled, loopback, ctx.sync)
            row = Ranked(st, p.images_per_sec, p.step_s, p.bound)
            rows.append(replace(row, notes=ts.caveats(row, ctx)))
        self.ranked = ts.rank(rows)
        self.say(f"mode: {self.program.knobs.mode}")
        ranked_line = f"{len(runnable)} setting{'' if len(runnable) == 1 else 's'} ranked"
        self.say(ranked_line + self.left_out_summary())
        for line in ts.left_out_lines(self.left_out):
            self.say(line)
        for line in ts.table_lines(self.ranked, limit=12):
            self.say(line)
        for line in ts.verdict(self.ranked):
            self.say(line)
        if not self.ranked:
            reason = self.left_out[0][1] if self.left_out else "the grid is empty"
            raise TuneError(f"no setting of the grid can run on this file's hosts ({reason}).")
        return self.ranked

    def left_out_summary(self) -> str:
        if not self.left_out:
            return ""
        return f"; {len(self.left_out)} left out: they cannot run on these hosts"

    def layouts(self, settings: Sequence[Setting]) -> dict[tuple[int, str], Layout | str]:
        """Per (PS count, PS hosts): where the setting's plan puts the workers and the PS, or
        why it cannot run (its plan fails, or it fails the checks ``up`` makes)."""
        out: dict[tuple[int, str], Layout | str] = {}
        for st in settings:
            key = (st.ps, st.ps_hosts)
            if key in out:
                continue
            config = self.setting_config(st, self.program.argv)
            try:
                plan = launch.plan_cluster(config)
            except PlanError as err:
                out[key] = f"its plan does not fit the hosts: {err}"
                continue
            problem = runnable_problem(config, plan, self.cal.host_cores)
            if problem:
                out[key] = problem
                continue
            training = [t.host for t in plan.tasks if t.job in ("chief", "worker")]
            out[key] = Layout(tuple(training), tuple(t.host for t in plan.tasks if t.job == "ps"))
        return out

    def setting_config(self, s: Setting, argv: Sequence[str], name: str = "") -> ClusterConfig:
        """The file with ``s`` applied (as tuned.yaml applies it) to the program's ``argv``."""
        return self.file.config_with(s, ts.setting_argv(argv, s, self.program.knobs), name)

    # -- phase 4: verify, pick, write ---------------------------------------------------------

    def verify(self, ranked: list[Ranked], calibrator: Calibrator) -> list[Ranked]:
        """Race the top K settings (:class:`~tflaunch.tools.tune_verify.Race`); the measured
        ones first, the pick at the top."""
        if not self.program.benchmark:
            self.say("--verify measures tflaunch.models.benchmark's images/sec; skipped")
            return ranked
        least = self.options.verify_steps
        steps = steps_for(self.cal.step_times, least, least * VERIFY_STEPS_FACTOR)
        self.say(
            f"{steps} timed steps a run (calibration's steps vary by "
            f"{100 * relative_spread(self.cal.step_times):.1f} %); at most "
            f"{self.options.verify_rounds} rounds"
            + (f", {self.options.verify_budget_s:.0f} s" if self.options.verify_budget_s else "")
        )
        argv = timed_argv(self.program.argv, steps, self.options.warmup)
        top = ranked[: self.options.verify]
        letters = {r.setting: chr(ord("A") + i) for i, r in enumerate(top)}

        def measure(row: Ranked, round_no: int) -> float | None:
            label = f"verify-{letters[row.setting]}{round_no}"
            config = self.setting_config(row.setting, argv, f"{self.config.name}-{label}")
            probe = calibrator.probe_argv(config.program.argv, ["--report"])
            config = replace(config, program=replace(config.program, argv=tuple(probe)))
            try:
                sub = calibrator.launch(label, config)
                text = calibrator.training_logs(sub, 1)[0]
                value = benchmark_result(text, f"the {label} run", sub).total
            except TuneInterrupted:
                raise  # stopped, not failed: the race ends with the tune
            except TuneError as err:
                self.say(f"{label} {row.setting.label}: {err}")
                return None
            self.say(f"{label}: {row.setting.label}: {value:.2f} img/s")
            return value

        for row, letter in letters.items():
            self.say(f"{letter}: {row.label}")
        outcome = Race(top, measure, self.options.verify_rounds, self.options.verify_budget_s).run()
        for line in outcome.lines:
            self.say(line)
        for e in outcome.entries:
            self.verified[e.row.setting] = {
                "runs": list(e.runs),
                "spread": relative_spread(e.runs),
                "failed": e.failed,
                "dropped_after_round": e.dropped_after,
                "within_noise": e in outcome.within_noise,
            }
        measured = {e.row.setting: e.mean for e in outcome.entries if e.runs}
        rows = [replace(r, measured=measured.get(r.setting)) for r in ranked]
        first = next((r for r in rows if r.setting == outcome.pick.row.setting), rows[0])
        self.ranked = ts.measured_first(rows, first)
        for line in ts.table_lines(self.ranked, limit=max(self.options.verify, 5)):
            self.say(line)
        error = ts.model_error_line(self.ranked)
        if error:
            self.say(error)
        return self.ranked

    def choose(self) -> Ranked:
        """The setting tuned.yaml holds: the first of the ranking (after --verify, the race's
        pick), unless the model is out of its depth for it and it was not measured: then the
        best setting within the model's depth."""
        top = self.ranked[0]
        if top.measured is not None or not top.notes:
            return top
        within = next((r for r in self.ranked if not r.notes), None)
        if within is None:
            return top
        self.say(
            f"{top.setting.label} is predicted first but outside the model's depth; not picked "
            f"unmeasured: picking {within.setting.label} (measure both with --verify K)"
        )
        return within

    def write(self, run: Run) -> Path:
        self.pick = self.choose()
        argv = ts.setting_argv(self.program.argv, self.pick.setting, self.program.knobs)
        path, self.tuned = write_tuned(
            self.file, self.pick, argv, run.id, run.dir, self.options.out, self.options.force
        )
        self.say(f"wrote {path} (and {run.dir / 'tuned.yaml'})")
        return path

    def document(self) -> dict:
        return {
            "calibration": dataclasses.asdict(self.cal),
            "inputs": self.inputs.to_dict() if self.inputs else None,
            "ranked": [
                {
                    **r.setting.to_dict(),
                    "images_per_sec": r.images_per_sec,
                    "step_s": r.step_s,
                    "bound": r.bound,
                    "notes": list(r.notes),
                    "measured": r.measured,
                    **({"verify": self.verified[r.setting]} if r.setting in self.verified else {}),
                }
                for r in self.ranked
            ],
            "left_out": [{**s.to_dict(), "reason": reason} for s, reason in self.left_out],
            "pick": self.pick.setting.to_dict() if self.pick else None,
            "sync": self.program.knobs.sync,
        }
