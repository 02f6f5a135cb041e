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

from tflaunch import launch
from tflaunch.cluster.config import ClusterConfig, load_config
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
    TuneOptions,
    benchmark_result,
    timed_argv,
    write_json,
)
from tflaunch.tools.tune_file import ClusterFile, write_tuned
from tflaunch.tools.tune_model import Layout
from tflaunch.tools.tune_settings import Ranked, Setting, TuneError


def tune(cluster_file: str, options: TuneOptions, echo: Echo) -> int:
    """The whole command; returns the exit code (the applied run's, or 0)."""
    file = ClusterFile.read(cluster_file)
    config = file.config
    program = Program.of(config, options)
    workers = config.roles.worker + config.roles.chief
    if workers < 1:
        raise TuneError(f"{config.source}: roles has no worker to tune for.")
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
    calibrator = Calibrator(config, program, options, run, cal, say)
    session = Session(file, calibrator)
    state, code = "failed", 1
    try:
        variables = calibrator.timed("compute", calibrator.compute)
        inputs = calibrator.timed("network", lambda: calibrator.network(variables))
        ranked = calibrator.timed("model", lambda: session.model(inputs, workers))
        if options.verify:
            ranked = calibrator.timed("verify", lambda: session.verify(ranked))
        winner = ranked[0]
        if options.verify:
            winner, lines = ts.pick_by_measurement(ranked[: options.verify])
            for line in lines:
                say(line)
        session.pick = winner
        argv = ts.setting_argv(program.argv, winner.setting, program.knobs)
        path = write_tuned(file, winner, argv, run.id, run.dir, options.out)
        say(f"wrote {path} (and {run.dir / 'tuned.yaml'})")
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


class Session:
    """One tune after its measurements: the model's ranking, the verification, tune.json."""

    def __init__(self, file: ClusterFile, calibrator: Calibrator) -> None:
        self.file, self.calibrator = file, calibrator
        self.config, self.program = file.config, calibrator.program
        self.options, self.cal, self.say = calibrator.options, calibrator.cal, calibrator.say
        self.ranked: list[Ranked] = []
        self.pick: Ranked | None = None  # what tuned.yaml holds (after --verify, by measurement)

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

    def setting_config(self, s: Setting, argv: Sequence[str], name: str = "") -> ClusterConfig:
        """The file with ``s`` applied (as tuned.yaml applies it) to the program's ``argv``."""
        return self.file.config_with(s, ts.setting_argv(argv, s, self.program.knobs), name)

    # -- phase 4: verify, write ---------------------------------------------------------------

    def verify(self, ranked: list[Ranked]) -> list[Ranked]:
        """The top K settings for a few timed steps each; measured beside predicted."""
        if not self.program.benchmark:
            self.say("--verify measures tflaunch.models.benchmark's images/sec; skipped")
            return ranked
        out = list(ranked)
        calibrator = self.calibrator
        argv = timed_argv(self.program.argv, self.options.verify_steps, self.options.warmup)
        for i, row in enumerate(ranked[: self.options.verify]):
            label = f"verify{i + 1}"
            config = self.setting_config(row.setting, argv, f"{self.config.name}-{label}")
            probe = calibrator.probe_argv(config.program.argv, ["--report"])
            config = replace(config, program=replace(config.program, argv=tuple(probe)))
            measured = None
            try:
                sub = calibrator.launch(label, config)
                text = calibrator.training_logs(sub, 1)[0]
                measured = benchmark_result(text, f"the {label} run", sub).total
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

    def document(self) -> dict:
        return {
            "calibration": dataclasses.asdict(self.cal),
            "inputs": self.calibrator.inputs.to_dict() if self.calibrator.inputs else None,
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
