"""``tflaunch tune CLUSTER_FILE``: from a cluster file to its fastest settings, measured on that
cluster, in minutes.

Phases, each timed and printed, all through the file's own backend (:mod:`tflaunch.launch`, the
path ``up`` takes), everything measured kept in one run directory (``<runs_dir>/<name>-tune-…``):

1. compute: the file's own plan runs :mod:`tflaunch.models.tune_probe` in every task's place, so
   each worker is bound as the real run binds it but computes alone: first one lone worker, then
   (where workers share hosts or cores) all W at once, the contention input. Each probe prints
   its cores, the first the model's variables (sized on the cluster: no TensorFlow here). A
   program other than ``tflaunch.models.benchmark`` instead runs once as one worker with
   ``--trace``; its step time less communication is the compute (``model --from-run``).
2. network: ``netbench`` between a worker host and a PS host of the plan (dedicated when the
   hosts allow, so the link crosses a NIC), at sizes from the model's variables.
3. model: :mod:`tflaunch.tools.perfmodel` over every setting the file allows
   (:mod:`tflaunch.tools.tune_settings`), each checked by planning it on the backend's hosts.
4. the ranked table, the top's margin, where the model is out of its depth; ``tuned.yaml``;
   ``--verify K`` runs the top K for a few timed steps and picks by measurement when the
   measured order differs; ``--apply`` starts the tuned file.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import yaml

from tflaunch import launch
from tflaunch.cluster.config import ClusterConfig, load_config
from tflaunch.errors import PlanError
from tflaunch.runtime.run import Run
from tflaunch.tools import perfmodel as pm
from tflaunch.tools import tune_model
from tflaunch.tools import tune_settings as ts
from tflaunch.tools.tune_calibrate import (
    TOTAL_RATE,
    Calibration,
    Calibrator,
    Echo,
    Program,
    TuneOptions,
    write_json,
)
from tflaunch.tools.tune_model import Layout
from tflaunch.tools.tune_settings import Ranked, Setting, TuneError


def tune(cluster_file: str, options: TuneOptions, echo: Echo) -> int:
    """The whole command; returns the exit code (the applied run's, or 0)."""
    config = load_config(cluster_file)
    raw = yaml.safe_load(Path(cluster_file).read_text(encoding="utf-8"))
    program = Program.of(config, options)
    workers = config.roles.worker + config.roles.chief
    if workers < 1:
        raise TuneError(f"{config.source}: roles has no worker to tune for.")
    launch.plan_cluster(config)  # a file whose own plan fails is refused before anything runs
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

    cal = Calibration()
    session = Session(config, program, options, run, cal, say)
    state, code = "failed", 1
    try:
        variables = session.timed("compute", session.compute)
        inputs = session.timed("network", lambda: session.network(variables))
        ranked = session.timed("model", lambda: session.model(inputs, workers))
        if options.verify:
            ranked = session.timed("verify", lambda: session.verify(ranked))
        winner = ranked[0]
        if options.verify:
            winner, lines = ts.pick_by_measurement(ranked[: options.verify])
            for line in lines:
                say(line)
        session.pick = winner
        path = session.write_tuned(cluster_file, raw, winner)
        say(f"total {sum(cal.phases_s.values()):.1f} s; everything measured is in {run.dir}")
        state, code = "succeeded", 0
    finally:
        write_json(run.dir / "tune.json", session.document())
        (run.dir / "tune.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
        run.update_meta(state=state, exit_code=code, ended=time.time())
    if not options.apply:
        echo(f"start it with: tflaunch up {path}")
        return 0
    tuned = load_config(path)
    echo(f"applying: tflaunch up {path}")
    outcome = launch.up(tuned, str(path), options.runs_dir)
    return 0 if isinstance(outcome, str) else outcome.code


def workers_per_host(config: ClusterConfig) -> int:
    """The most training tasks the file's own plan puts on one host."""
    counts: dict[str, int] = {}
    for task in launch.plan_cluster(config).tasks:
        if task.job in ("chief", "worker"):
            counts[task.host] = counts.get(task.host, 0) + 1
    return max(counts.values(), default=1)


class Session(Calibrator):
    """One tune: the measurements, then the model, the verification and the tuned file."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ranked: list[Ranked] = []
        self.pick: Ranked | None = None  # what tuned.yaml holds (after --verify, by measurement)
        self.workers_per_host = workers_per_host(self.config)

    def model(self, inputs: pm.Inputs, workers: int) -> list[Ranked]:
        max_ps = self.options.max_ps or max(self.config.roles.ps, workers)
        settings = ts.enumerate_settings(max_ps, self.program.knobs, self.options.ps_hosts)
        layouts = self.layouts(settings)
        feasible = [st for st in settings if layouts.get((st.ps, st.ps_hosts))]
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
        for st in feasible:
            layout = layouts[(st.ps, st.ps_hosts)]
            p = tune_model.predict_setting(inputs, layout, st, loopback, ctx.sync)
            row = Ranked(st, p.images_per_sec, p.step_s, p.bound)
            rows.append(replace(row, notes=ts.caveats(row, ctx)))
        self.ranked = ts.rank(rows)
        skipped = len(settings) - len(feasible)
        self.say(f"mode: {self.program.knobs.mode}")
        self.say(
            f"{len(feasible)} settings ranked"
            + (f" ({skipped} left out: their plan does not fit the hosts)" if skipped else "")
        )
        for line in ts.table_lines(self.ranked, limit=12):
            self.say(line)
        for line in ts.verdict(self.ranked):
            self.say(line)
        if not self.ranked:
            raise TuneError("no setting of the grid can be planned on this file's hosts.")
        return self.ranked

    def layouts(self, settings: Sequence[Setting]) -> dict[tuple[int, str], Layout | None]:
        """Per (PS count, PS hosts): where the setting's plan puts the workers and the PS, or
        None when the backend cannot plan it on its hosts."""
        out: dict[tuple[int, str], Layout | None] = {}
        for st in settings:
            key = (st.ps, st.ps_hosts)
            if key in out:
                continue
            try:
                plan = launch.plan_cluster(self.setting_config(st, self.program.argv))
            except PlanError:
                out[key] = None
                continue
            training = [t.host for t in plan.tasks if t.job in ("chief", "worker")]
            out[key] = Layout(tuple(training), tuple(t.host for t in plan.tasks if t.job == "ps"))
        return out

    def setting_config(self, s: Setting, argv: Sequence[str]) -> ClusterConfig:
        placement = self.config.placement
        if s.update != ts.ALL_REDUCE and s.ps_hosts == "dedicated":
            spread = placement.workers_per_host or self.workers_per_host
            placement = replace(
                placement, ps="dedicated", ps_per_host=None, workers_per_host=spread
            )
        elif s.update != ts.ALL_REDUCE:
            placement = replace(placement, ps="colocated")
        argv = ts.setting_argv(argv, s, self.program.knobs)
        return replace(
            self.config,
            roles=replace(self.config.roles, ps=s.ps),
            placement=placement,
            program=replace(self.config.program, argv=tuple(argv)),
        )

    # -- phase 4: verify, write ---------------------------------------------------------------

    def verify(self, ranked: list[Ranked]) -> list[Ranked]:
        """The top K settings for a few timed steps each; measured beside predicted."""
        if not self.program.benchmark:
            self.say("--verify measures tflaunch.models.benchmark's images/sec; skipped")
            return ranked
        out = list(ranked)
        for i, row in enumerate(ranked[: self.options.verify]):
            argv = list(self.program.argv)
            for flag, value in (
                ("--num_batches", self.options.verify_steps),
                ("--num_warmup_batches", self.options.warmup),
                ("--display_every", self.options.verify_steps),
            ):
                argv = ts.with_flag(argv, flag, str(value))
            config = self.setting_config(row.setting, argv)
            config = replace(config, name=f"{self.config.name}-verify{i + 1}")
            measured = None
            try:
                sub = self.launch(f"verify{i + 1}", config)
                totals = TOTAL_RATE.findall(self.training_logs(sub, 1)[0])
                measured = float(totals[-1]) if totals else None
            except TuneError as err:
                self.say(f"verify {row.setting.label}: {err}")
            out[i] = replace(row, measured=measured)
            shown = f"{measured:.2f}" if measured is not None else "failed"
            self.say(
                f"verify {i + 1}: {row.setting.label}: predicted {row.images_per_sec:.2f}, "
                f"measured {shown} img/s"
            )
        self.ranked = out
        for line in ts.table_lines(out, limit=max(self.options.verify, 5)):
            self.say(line)
        return out

    def write_tuned(self, cluster_file: str, raw: dict, winner: Ranked) -> Path:
        """tuned.yaml in the run directory, and the runnable copy beside the cluster file (its
        relative paths, such as ssh.identity_file or program.workdir, stay right there)."""
        argv = ts.setting_argv(self.program.argv, winner.setting, self.program.knobs)
        doc = ts.tuned_document(raw, winner.setting, argv, self.workers_per_host)
        measured = f", measured {winner.measured:.2f}" if winner.measured is not None else ""
        header = (
            f"# tflaunch tune {Path(cluster_file).name} (run {self.run.id}): "
            f"{winner.setting.label}, predicted {winner.images_per_sec:.2f} img/s{measured}\n"
        )
        text = header + yaml.safe_dump(doc, sort_keys=False, width=100)
        source = Path(cluster_file)
        path = self.options.out or source.with_name(f"{source.stem}.tuned.yaml")
        path.write_text(text, encoding="utf-8")
        (self.run.dir / "tuned.yaml").write_text(text, encoding="utf-8")
        tuned = load_config(path)  # it must validate and plan, or tune has a bug to show
        launch.plan_cluster(tuned)
        self.say(f"wrote {path} (and {self.run.dir / 'tuned.yaml'})")
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
                }
                for r in self.ranked
            ],
            "pick": self.pick.setting.to_dict() if self.pick else None,
            "sync": self.program.knobs.sync,
        }
